//! A process's events as a test reads them: binary output frames as notifications, the
//! collected output of a run, and event sequence numbers.

use super::*;

/// Output of a process collected until `process/closed`.
#[derive(Debug, Clone, Default)]
pub struct ProcessOutput {
    /// Every event (output, exited, closed) in arrival order.
    pub events: Vec<Value>,
    /// Decoded bytes of stream `stdout`.
    pub stdout: Vec<u8>,
    /// Decoded bytes of stream `stderr`.
    pub stderr: Vec<u8>,
    /// Decoded bytes of stream `pty`.
    pub pty: Vec<u8>,
    /// `exitCode` from `process/exited`.
    pub exit_code: Option<i64>,
    /// `signal` from `process/exited`.
    pub signal: Option<i64>,
}

impl ProcessOutput {
    /// stdout as text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// stderr as text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// pty output as text.
    pub fn pty_text(&self) -> String {
        String::from_utf8_lossy(&self.pty).into_owned()
    }
}

/// A binary `process/output` frame as the JSON notification it stands for, marked
/// `"frame": "binary"` (panics on a malformed frame: the server must never send one).
pub(crate) fn output_frame_as_notification(bytes: &[u8]) -> Value {
    let frame = OutputFrame::decode(bytes)
        .unwrap_or_else(|error| panic!("server sent a malformed output frame: {error}"));
    json!({
        "method": "process/output",
        "frame": "binary",
        "params": {
            "processId": frame.process_id,
            "stream": frame.stream,
            "chunk": crate::b64(frame.data),
            "seq": frame.seq,
        },
    })
}

/// Decode a list of process events.
pub fn decode_events(events: Vec<Value>) -> ProcessOutput {
    let mut out = ProcessOutput::default();
    for e in &events {
        let p = &e["params"];
        match e["method"].as_str() {
            Some("process/output") => {
                let bytes = unb64(p["chunk"].as_str().expect("chunk is a string"));
                match p["stream"].as_str() {
                    Some("stdout") => out.stdout.extend(bytes),
                    Some("stderr") => out.stderr.extend(bytes),
                    Some("pty") => out.pty.extend(bytes),
                    other => panic!("unknown stream {other:?} in {e}"),
                }
            }
            Some("process/exited") => {
                out.exit_code = p["exitCode"].as_i64();
                out.signal = p["signal"].as_i64();
            }
            _ => {}
        }
    }
    out.events = events;
    out
}

/// Seqs of a list of events, in order.
pub fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            e["params"]["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("event without integer seq: {e}"))
        })
        .collect()
}
