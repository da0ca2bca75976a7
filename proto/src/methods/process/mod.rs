//! `process/*` params, results and notifications. `process/start`'s params and result live in
//! `start`, `process/list`'s in `list`, the `limits` of `process/start` and how they are applied
//! in `limits`; all are re-exported here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod binary;
mod limits;
mod list;
mod start;

pub use limits::{AppliedLimit, AppliedLimits, Enforcement, LimitName, LimitScope, Limits};
pub use list::{ListParams, ListResult, LiveResources, ProcessInfo, ProcessState};
pub use start::{EnvInherit, EnvPolicy, StartParams, StartResult};

fn is_false(value: &bool) -> bool {
    !*value
}

/// Why a process ended, where the kernel or the server can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ExitReason {
    /// The memory limit's OOM killer killed a process of the tree (`memory.events` /
    /// `memory.oom_control` `oom_kill`).
    Oom,
    /// The CPU limit: SIGXCPU from `RLIMIT_CPU`, SIGKILL past it, or the tree's budget spent.
    CpuLimit,
    /// `wallSeconds` passed and the tree was killed.
    WallTimeout,
    /// `process/terminate`, session expiry or server shutdown.
    Terminated,
    /// Another signal.
    Signal,
    /// It exited by itself.
    Exit,
}

/// Params of `process/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadParams {
    /// The process.
    pub process_id: String,
    /// Return events with `seq > afterSeq`; absent means from the oldest retained.
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// Byte budget for returned chunks (at least one chunk is returned if any exists).
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Wait up to this long for something new when nothing is available yet.
    #[serde(default)]
    pub wait_ms: Option<u64>,
    /// Return denial records numbered after this one (records are numbered from 1 per process,
    /// apart from `seq`); absent means from the oldest retained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_denial: Option<u64>,
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output of a pipe-mode process.
    Stdout,
    /// Standard error of a pipe-mode process.
    Stderr,
    /// The terminal of a PTY-mode process.
    Pty,
}

/// One retained output chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OutputChunk {
    /// The event sequence number.
    pub seq: u64,
    /// The stream.
    pub stream: OutputStream,
    /// Base64 bytes.
    pub chunk: String,
}

/// Result of `process/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadResult {
    /// Chunks after the cursor, in seq order.
    pub chunks: Vec<OutputChunk>,
    /// Pass `nextSeq - 1` as `afterSeq` to continue; covers exit and close events.
    pub next_seq: u64,
    /// The process has exited (its exit event is at or before `nextSeq - 1`).
    pub exited: bool,
    /// Exit code; 128+n when killed by signal n.
    pub exit_code: Option<i32>,
    /// The signal number that killed the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it ended (as in `process/exited`), once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_reason: Option<ExitReason>,
    /// Seq of the exit event, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_seq: Option<u64>,
    /// What the tree used (as in `process/exited`), once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_usage: Option<ResourceUsage>,
    /// All output was read to EOF and the process exited.
    pub closed: bool,
    /// Seq of the close event, once closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_seq: Option<u64>,
    /// Why the process failed outside its own control (spawn or I/O failure).
    pub failure: Option<String>,
    /// Output after the cursor was already dropped by the retention limit.
    #[serde(default)]
    pub output_dropped: bool,
    /// Oldest seq still retained (present when `outputDropped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_retained_seq: Option<u64>,
    /// Output chunks of this process dropped so far, all before `firstRetainedSeq` (its own
    /// `OUTPUT_RETENTION_BYTES`, or the server's cap on retained output taking its oldest).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_dropped_chunks: u64,
    /// Their bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub output_dropped_bytes: u64,
    /// Denial records of a process started with `auditDenials` numbered after `afterDenial`
    /// (the newest `MAX_DENIALS_RETAINED` and `MAX_DENIAL_BYTES_RETAINED` are kept; not part of
    /// the seq sequence). Their bytes count toward `maxBytes`, after the chunks'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<Value>,
    /// Denial records dropped because more than `MAX_DENIALS_RETAINED` records or
    /// `MAX_DENIAL_BYTES_RETAINED` bytes arrived.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub denials_dropped: u64,
    /// One past the number of the last denial record this answer covers: pass
    /// `nextDenial - 1` as `afterDenial` to continue. Present for audited processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_denial: Option<u64>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Longest denial record (one JSON line) `sandbox-run --audit-fd` may write; the server drops
/// longer ones. Shared by the audit writer and the server.
pub const MAX_DENIAL_RECORD_BYTES: usize = 64 * 1024;

/// Bytes of denial records the server keeps per audited process for `process/read` (oldest
/// dropped first). An audit writer producing more per process only loses the oldest.
pub const MAX_DENIAL_BYTES_RETAINED: usize = 256 * 1024;

/// `process/denied` notification: one record from the sandbox's denial audit (the objects
/// `sandbox-run --audit` writes; see docs/audit.md). Not numbered in the event sequence, but in
/// the process's own denial numbering (`number`, from 1, as `afterDenial` counts), so a client
/// that resumes reads exactly the records it missed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeniedNotification {
    /// The process.
    pub process_id: String,
    /// The record's number (absent from servers older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u64>,
    /// The record.
    pub denial: Value,
}

/// Params of `process/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WriteParams {
    /// The process.
    pub process_id: String,
    /// Base64 bytes for stdin (may be empty).
    pub chunk: String,
    /// Idempotency key: a retried write with the same id is applied once.
    #[serde(default)]
    pub write_id: Option<String>,
    /// Close stdin after writing `chunk`.
    #[serde(default)]
    pub close: bool,
}

/// Result of `process/write`: a status, never an error for the process's state (the reference
/// client turns `stdinClosed` into "its stdin is closed" but an error into "the process failed").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    /// What became of the write.
    pub status: WriteStatus,
}

/// `process/write` statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum WriteStatus {
    /// Written (also a deduplicated retry of an applied `writeId`).
    Accepted,
    /// No process with this id in the session.
    UnknownProcess,
    /// The process cannot take input: started without `pipeStdin` or a PTY, stdin closed
    /// (`close: true` or by the process), or the process exited.
    StdinClosed,
    /// A `process/start` with this id is still in progress.
    Starting,
}

/// Signals a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum SignalName {
    /// SIGINT.
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hangup,
}

/// Params of `process/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SignalParams {
    /// The process.
    pub process_id: String,
    /// The signal, sent to the process group.
    pub signal: SignalName,
}

/// Params of `process/resize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ResizeParams {
    /// The process (must be PTY-backed).
    pub process_id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// Params of `process/terminate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TerminateParams {
    /// The process.
    pub process_id: String,
}

/// Result of `process/terminate` and `process/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunningResult {
    /// Whether the process was running when the signal was sent.
    pub running: bool,
}

/// `process/output` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OutputNotification {
    /// The process.
    pub process_id: String,
    /// Event sequence number (shared with exited and closed).
    pub seq: u64,
    /// The stream.
    pub stream: OutputStream,
    /// Base64 bytes.
    pub chunk: String,
}

/// What a process's whole tree used, measured when its leader exited (`usage` of
/// `process/exited` and `process/read`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ResourceUsage {
    /// CPU time, user + system, of the tree (its cgroup's `cpu.stat`; without cgroups, of the
    /// leader and the descendants it reaped), in milliseconds.
    pub cpu_millis: u64,
    /// Time from the start to the leader's exit, in milliseconds.
    pub wall_millis: u64,
    /// Peak memory of the tree (its memory cgroup's `memory.peak`, or
    /// `memory.max_usage_in_bytes` on cgroup v1); absent where the host gives the tree no
    /// memory cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_memory_bytes: Option<u64>,
    /// Peak resident memory of the largest single process among the leader and the
    /// descendants it reaped (`ru_maxrss`); absent where the leader is not the server's own
    /// child (sandboxed starts through a launcher).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
}

impl ResourceUsage {
    /// A usage record.
    pub fn new(
        cpu_millis: u64,
        wall_millis: u64,
        peak_memory_bytes: Option<u64>,
        max_rss_bytes: Option<u64>,
    ) -> Self {
        Self {
            cpu_millis,
            wall_millis,
            peak_memory_bytes,
            max_rss_bytes,
        }
    }
}

/// `process/exited` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExitedNotification {
    /// The process.
    pub process_id: String,
    /// Event sequence number.
    pub seq: u64,
    /// Exit code; 128+n when killed by signal n.
    pub exit_code: i32,
    /// The signal number that killed the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it ended, where the kernel or the server can tell (additive: older clients ignore
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ExitReason>,
    /// What the tree used (additive: older clients ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResourceUsage>,
}

/// `process/closed` notification: exited and both streams at EOF; the last event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ClosedNotification {
    /// The process.
    pub process_id: String,
    /// Event sequence number.
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_without_limits_parses_and_serializes_without_them() {
        let params: StartParams = serde_json::from_value(serde_json::json!({
            "processId": "p", "argv": ["true"], "cwd": "/tmp"
        }))
        .unwrap();
        assert_eq!(params.limits, None);
        assert!(
            serde_json::to_value(&params)
                .unwrap()
                .get("limits")
                .is_none()
        );
    }

    #[test]
    fn limits_refuse_unknown_keys_and_lay_over_defaults_key_by_key() {
        let misspelt = serde_json::from_value::<Limits>(serde_json::json!({"memoryByte": 1}));
        assert!(
            misspelt.is_err(),
            "a misspelt limit must not silently not apply"
        );
        let defaults: Limits =
            serde_json::from_value(serde_json::json!({"memoryBytes": 100, "processes": 10}))
                .unwrap();
        let asked: Limits =
            serde_json::from_value(serde_json::json!({"processes": 5, "bestEffort": true}))
                .unwrap();
        let merged = asked.over(&defaults);
        assert_eq!(
            (merged.memory_bytes, merged.processes, merged.best_effort),
            (Some(100), Some(5), true)
        );
        assert!(Limits::default().is_empty() && !merged.is_empty());
    }

    #[test]
    fn exit_reasons_use_their_wire_names() {
        let exited = ExitedNotification {
            process_id: "p".into(),
            seq: 2,
            exit_code: 137,
            signal: Some(9),
            reason: Some(ExitReason::WallTimeout),
            usage: Some(ResourceUsage::new(1500, 2000, None, Some(4096))),
        };
        let wire = serde_json::to_value(&exited).unwrap();
        assert_eq!(wire["reason"], serde_json::json!("wallTimeout"));
        assert_eq!(
            wire["usage"],
            serde_json::json!({"cpuMillis": 1500, "wallMillis": 2000, "maxRssBytes": 4096})
        );
        for name in LimitName::ALL {
            assert_eq!(serde_json::to_value(name).unwrap(), name.as_str());
        }
    }
}
