//! What `exec` says on stderr and exits with: audit records, interrupts and why a command
//! ended, in words; the exit status for a remote exit code.

use proto::methods::process::{ExitReason, Limits, SignalName};

use super::EXEC_FAILURE_STATUS;

/// The stderr line for one record of the denial audit (docs/audit.md): a denial with what
/// would allow it, or the coverage summary at the end; `None` for the per-group summaries.
/// Every value is the server's: control characters are escaped so none reaches the terminal.
pub fn describe_denial(record: &serde_json::Value) -> Option<String> {
    let text = |key: &str| {
        record
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(|value| {
                value
                    .chars()
                    .map(|c| match c.is_control() {
                        true => c.escape_unicode().to_string(),
                        false => c.to_string(),
                    })
                    .collect::<String>()
            })
    };
    match record.get("kind").and_then(serde_json::Value::as_str)? {
        "denial" => {
            let operation = text("operation").unwrap_or_else(|| "?".into());
            let target = text("path")
                .or_else(|| text("address"))
                .unwrap_or_else(|| "?".into());
            let mut line = format!("denied {operation} {target}");
            if let Some(exe) = text("exe") {
                line.push_str(&format!(" by {exe}"));
            }
            if let Some(rule) = text("allow_rule") {
                line.push_str(&format!(" — allow: {rule}"));
            }
            Some(line)
        }
        "coverage" => {
            if record.get("audit").and_then(serde_json::Value::as_bool) == Some(false) {
                return Some(
                    "audit: the server cannot read the kernel audit log (it must run as root), so \
                     no denial could be seen; this is not a clean report"
                        .into(),
                );
            }
            let denials = record
                .get("denials")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let complete = record.get("complete").and_then(serde_json::Value::as_bool);
            Some(format!(
                "audit: {denials} denial(s){}",
                if complete == Some(false) {
                    " (incomplete: some layers could not be observed; see docs/audit.md)"
                } else {
                    ""
                }
            ))
        }
        _ => None,
    }
}

pub(super) fn signal_label(signal: SignalName) -> &'static str {
    match signal {
        SignalName::Interrupt => "SIGINT",
        SignalName::Terminate => "SIGTERM",
        SignalName::Kill => "SIGKILL",
        SignalName::Hangup => "SIGHUP",
    }
}

/// The status to exit with once the command ended, after saying why on stderr when it was not
/// an exit of its own.
pub(super) fn finish(exit: Option<(i32, Option<ExitReason>)>, limits: &Option<Limits>) -> u8 {
    let (code, reason) = exit.unwrap_or((0, None));
    if let Some(why) = reason.and_then(|reason| describe_exit(reason, code, limits.as_ref())) {
        eprintln!("exec-server exec: {why}");
    }
    exit_status(code)
}

/// Why a command ended, in words, when it was not a normal exit (pure: unit-tested).
pub fn describe_exit(reason: ExitReason, code: i32, limits: Option<&Limits>) -> Option<String> {
    let limit = |value: Option<u64>, unit: fn(u64) -> String| {
        value.map_or_else(String::new, |value| format!(" (limit {})", unit(value)))
    };
    let limits = limits.cloned().unwrap_or_default();
    let signal = code - 128;
    Some(match reason {
        ExitReason::Exit => return None,
        ExitReason::Oom => format!(
            "killed: out of memory{}",
            limit(limits.memory_bytes, human_bytes)
        ),
        ExitReason::WallTimeout => format!(
            "killed: wall-clock limit reached{}",
            limit(limits.wall_seconds, |s| format!("{s} s"))
        ),
        ExitReason::CpuLimit => format!(
            "killed: CPU time limit reached{}",
            limit(limits.cpu_seconds, |s| format!("{s} CPU-seconds"))
        ),
        ExitReason::Terminated => {
            "terminated (process/terminate, the session's end or the server's shutdown)".to_owned()
        }
        ExitReason::Signal if signal > 0 => format!("killed by signal {signal}"),
        ExitReason::Signal => "killed by a signal".to_owned(),
    })
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| bytes >= *size && bytes.is_multiple_of(*size))
        .map_or_else(
            || format!("{bytes} bytes"),
            |(size, unit)| format!("{} {unit}", bytes / size),
        )
}

/// The exit status for a remote exit code (already 128+n for signal n).
pub fn exit_status(code: i32) -> u8 {
    u8::try_from(code.clamp(0, 255)).unwrap_or(EXEC_FAILURE_STATUS)
}
