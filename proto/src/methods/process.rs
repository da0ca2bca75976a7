//! `process/*` params, results and notifications.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::uri::FileUri;

/// Params of `process/start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartParams {
    /// Caller-chosen id, unique within the session.
    pub process_id: String,
    /// Program and arguments; must be non-empty.
    pub argv: Vec<String>,
    /// Working directory: a `file:` URI of an existing directory.
    pub cwd: FileUri,
    /// Exactly the child's environment (nothing is inherited from the server).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run under a pseudo-terminal (output stream `pty`).
    #[serde(default)]
    pub tty: bool,
    /// Keep stdin of a non-PTY process writable through `process/write`.
    #[serde(default)]
    pub pipe_stdin: bool,
    /// Override `argv[0]` as seen by the program.
    #[serde(default)]
    pub arg0: Option<String>,
    /// PTY width in columns (default 80).
    #[serde(default)]
    pub cols: Option<u16>,
    /// PTY height in rows (default 24).
    #[serde(default)]
    pub rows: Option<u16>,
    /// Run the command under this sandbox (see policies/README.md for the shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
    /// Report the sandbox's denials as `process/denied` notifications (needs `sandbox`; the
    /// kernel audit log is only readable when the server runs as root, otherwise the records
    /// say the audit is unavailable).
    #[serde(default)]
    pub audit_denials: bool,
}

/// Result of `process/start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartResult {
    /// The id from the request.
    pub process_id: String,
}

/// Params of `process/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
}

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    /// Seq of the exit event, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_seq: Option<u64>,
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
    /// Denial records of a process started with `auditDenials` (the newest
    /// `MAX_DENIALS_RETAINED`; not part of the seq sequence).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denials: Vec<Value>,
    /// Denial records dropped because more than `MAX_DENIALS_RETAINED` arrived.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub denials_dropped: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// `process/denied` notification: one record from the sandbox's denial audit (the objects
/// `sandbox-run --audit` writes; see docs/audit.md). Not numbered in the event sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeniedNotification {
    /// The process.
    pub process_id: String,
    /// The record.
    pub denial: Value,
}

/// Params of `process/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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

/// Result of `process/write`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    /// Always `"accepted"` (also for a deduplicated retry).
    pub status: String,
}

/// Signals a client may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignalParams {
    /// The process.
    pub process_id: String,
    /// The signal, sent to the process group.
    pub signal: SignalName,
}

/// Params of `process/resize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TerminateParams {
    /// The process.
    pub process_id: String,
}

/// Result of `process/terminate` and `process/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningResult {
    /// Whether the process was running when the signal was sent.
    pub running: bool,
}

/// `process/output` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// `process/exited` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

/// `process/closed` notification: exited and both streams at EOF; the last event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClosedNotification {
    /// The process.
    pub process_id: String,
    /// Event sequence number.
    pub seq: u64,
}
