//! The data of a run that the stages of the process chain share (what to run, how, how it
//! ended, PID 1's status message), in a leaf below them: `command` (the outer), `init` (PID 1),
//! `launcher` and the audit import it downward instead of each other.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;

use super::NamespaceMode;

/// Status message from PID 1 to the outer: kind byte, then the value (little-endian i32).
pub const STATUS_EXITED: u8 = 1;
/// The command was killed by a signal.
pub const STATUS_SIGNALED: u8 = 2;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Program and arguments (the program is searched in the command's `PATH`).
    pub argv: Vec<OsString>,
    /// The command's complete environment; `sandbox-run` itself never runs with it.
    pub env: Vec<(OsString, OsString)>,
    /// The working directory (absolute).
    pub cwd: PathBuf,
    /// Its rlimits (set right before `execve`) and wall-clock time.
    pub limits: crate::limits::CommandLimits,
}

/// How to run it.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Run even if a layer the policy needs is missing (reported on stderr).
    pub best_effort: bool,
    /// Namespace layer.
    pub namespaces: NamespaceMode,
    /// The denial audit runs (log denials, refuse nested Landlock/seccomp).
    pub audit_log: bool,
    /// Print the enforcement report as JSON on stderr before the command starts.
    pub report: bool,
    /// Descriptors besides 0-2 a process confined in place (without namespaces) keeps open
    /// until it execs.
    pub keep_fds: Vec<RawFd>,
    /// Names the egress proxy resolves without DNS (hosts-file mapping; allowlist only).
    pub egress_hosts: Vec<(String, std::net::IpAddr)>,
    /// Where every egress decision (allowed ones too) goes as a JSON line, opened before the
    /// command starts.
    pub egress_log: Option<std::sync::Arc<std::fs::File>>,
    /// The `Proxy-Authorization` value for the upstream proxy (`Basic ...`, from
    /// `--upstream-proxy-credentials`), handed to the egress proxy in its sealed configuration.
    pub upstream_authorization: Option<String>,
    /// Whom the outer asks when the policy asks before refusing (`network.ask`): `None`, no
    /// one (refusals are final).
    pub ask: Option<AskOptions>,
    /// Repeated SIGINT/SIGTERM escalate (see the `outer` module): the first is forwarded, the second
    /// terminates the sandbox (SIGTERM, SIGKILL after [`INTERRUPT_GRACE`]), the third kills it.
    pub escalate_interrupts: bool,
}

/// Whom the outer asks before an egress refusal is final, and how long the proxy waits.
#[derive(Clone, Debug)]
pub struct AskOptions {
    /// The --ask-fd peer (exec-server); `None`: the controlling terminal.
    pub peer: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// How long a connection is held for the answer.
    pub timeout: std::time::Duration,
}

/// How long, after a second interrupt, the command has to end on SIGTERM before the sandbox is
/// killed.
pub const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
}

impl Ended {
    /// The shell's view: the status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(code) => code,
            Ended::Signaled(signal) => 128 + signal,
        }
    }
}
