//! `process/list`: the session's processes, their lifecycle and what they use now.

use serde::{Deserialize, Serialize};

use super::{AppliedLimits, ExitReason, ResourceUsage};

/// Params of `process/list`: none (the calling session's processes are listed).
pub type ListParams = crate::methods::Empty;

/// Result of `process/list`: the calling session's processes (started ones still in its table:
/// running, exited, or closed and not yet dropped from the table), ordered by start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ListResult {
    /// The processes.
    pub processes: Vec<ProcessInfo>,
}

impl ListResult {
    /// A list of `processes`.
    pub fn new(processes: Vec<ProcessInfo>) -> Self {
        Self { processes }
    }
}

/// Where a listed process is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ProcessState {
    /// Its leader has not exited.
    Running,
    /// Its leader exited; output may still be arriving.
    Exited,
    /// Exited and both streams at EOF (`process/closed` was sent).
    Closed,
}

/// One process of `process/list` (and of `GET /status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ProcessInfo {
    /// The caller's id.
    pub process_id: String,
    /// Lifecycle state.
    pub state: ProcessState,
    /// The leader's pid (also its process group), in the server's PID namespace.
    pub pid: i32,
    /// When it started, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Whether it runs under a sandbox.
    pub sandboxed: bool,
    /// Whether it runs under a pseudo-terminal.
    pub tty: bool,
    /// The limits in force and how each is enforced (as `process/start` answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AppliedLimits>,
    /// What the tree uses now, while it runs, where its cgroup tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<LiveResources>,
    /// What the tree used, once the leader exited (as `process/exited` reported it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<ResourceUsage>,
    /// Exit code, once exited; 128+n when killed by signal n.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it ended, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ExitReason>,
}

impl ProcessInfo {
    /// A running process with nothing measured yet.
    pub fn new(process_id: String, pid: i32, started_at_ms: u64) -> Self {
        Self {
            process_id,
            state: ProcessState::Running,
            pid,
            started_at_ms,
            sandboxed: false,
            tty: false,
            limits: None,
            resources: None,
            usage: None,
            exit_code: None,
            signal: None,
            reason: None,
        }
    }
}

/// What a running tree uses now, read from its cgroups; a field is absent where the host gives
/// the tree no cgroup with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LiveResources {
    /// Memory charged to the tree now (`memory.current`, `memory.usage_in_bytes` on v1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_current_bytes: Option<u64>,
    /// Peak memory so far (`memory.peak`, `memory.max_usage_in_bytes` on v1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// CPU time, user + system, of the tree so far (`cpu.stat` `usage_usec`), milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
}

impl LiveResources {
    /// A measurement.
    pub fn new(
        memory_current_bytes: Option<u64>,
        memory_peak_bytes: Option<u64>,
        cpu_millis: Option<u64>,
    ) -> Self {
        Self {
            memory_current_bytes,
            memory_peak_bytes,
            cpu_millis,
        }
    }
}
