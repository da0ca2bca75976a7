//! Why a launcher could not set up or start a command: typed per stage, and the [`FailureKind`]
//! its `Reply::Failed` carries so that the server (and a log) get the cause, not only a
//! sentence.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::launch::LaunchError;
use crate::linux::SandboxError;
use crate::linux::mounts::MountError;
use crate::linux::namespaces::NamespaceError;
use crate::linux::seccomp::SeccompError;

/// The stage a launcher failed in (`kind` of `Reply::Failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureKind {
    /// The policy is one a launcher does not serve (one-shot `sandbox-run` does).
    Unsupported,
    /// Confining the launcher itself: `no_new_privs`, its namespaces, the shared mounts.
    Confinement,
    /// The server sent a message the protocol does not allow.
    Protocol,
    /// Making the command's PID 1 (its channel, status pipe, namespaces, pidfd).
    Pid1,
    /// Handing the command to its PID 1.
    Handover,
}

/// Why a launcher could not set up or start a command.
#[derive(Debug, thiserror::Error)]
pub enum LaunchFailure {
    /// An unrestricted policy runs without a sandbox.
    #[error("an unrestricted policy needs no launcher")]
    Unrestricted,
    /// Each allowlisted network gets its own egress proxy from a `sandbox-run` of its own.
    #[error("a network allowlist is started one sandbox-run at a time")]
    EgressAllowlist,
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("no_new_privs: {0}")]
    NoNewPrivs(#[source] nix::Error),
    /// The launcher's namespaces could not be entered.
    #[error("{0}")]
    Namespaces(#[from] NamespaceError),
    /// The layout the commands share could not be mounted.
    #[error("{0}")]
    SharedMounts(#[from] MountError),
    /// A start message that is not `start` or `start:N`.
    #[error("unknown launcher message {body}")]
    UnknownMessage {
        /// The message, escaped.
        body: String,
    },
    /// A start whose descriptor count does not fit its `start:N`.
    #[error(
        "a start carries the memfd, stdin, stdout, stderr, then cgroups; {next} of its {count} \
         descriptors cannot be for the next command"
    )]
    DescriptorsForNext {
        /// N of `start:N`.
        next: usize,
        /// Descriptors received.
        count: usize,
    },
    /// A start with too few or too many descriptors.
    #[error(
        "a start carries 4 to {max} descriptors (memfd, stdin, stdout, stderr, cgroups), got \
         {count}"
    )]
    StartDescriptors {
        /// The most a start may carry.
        max: usize,
        /// Descriptors received.
        count: usize,
    },
    /// Making the command's PID 1 failed at step `what`.
    #[error("{what}: {source}")]
    Pid1 {
        /// The step: "PID 1's channel", "creating the command's PID, mount and IPC namespaces", ...
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Sending the command to its PID 1 failed (twice: a fresh PID 1 was tried too).
    #[error("handing the command to its PID 1: {source}")]
    Handover {
        /// The OS error of the second attempt.
        source: io::Error,
    },
}

impl FailureKind {
    /// Its wire name (as serialized): `unsupported`, `confinement`, `protocol`, `pid1`,
    /// `handover`.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Unsupported => "unsupported",
            FailureKind::Confinement => "confinement",
            FailureKind::Protocol => "protocol",
            FailureKind::Pid1 => "pid1",
            FailureKind::Handover => "handover",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl LaunchFailure {
    /// The stage that failed.
    pub fn kind(&self) -> FailureKind {
        match self {
            LaunchFailure::Unrestricted | LaunchFailure::EgressAllowlist => {
                FailureKind::Unsupported
            }
            LaunchFailure::NoNewPrivs(_)
            | LaunchFailure::Namespaces(_)
            | LaunchFailure::SharedMounts(_) => FailureKind::Confinement,
            LaunchFailure::UnknownMessage { .. }
            | LaunchFailure::DescriptorsForNext { .. }
            | LaunchFailure::StartDescriptors { .. } => FailureKind::Protocol,
            LaunchFailure::Pid1 { .. } => FailureKind::Pid1,
            LaunchFailure::Handover { .. } => FailureKind::Handover,
        }
    }

    /// A step of making PID 1 failed.
    pub(super) fn pid1(what: &'static str) -> impl Fn(nix::Error) -> LaunchFailure {
        move |source| LaunchFailure::Pid1 {
            what,
            source: source.into(),
        }
    }
}

/// Why a command's PID 1 could not prepare or start its command. PID 1 reports it on the
/// command's stderr and exits 125, as a one-shot `sandbox-run` does (see `launcher::pid1`).
#[derive(Debug, thiserror::Error)]
pub enum Pid1SetupError {
    /// Writing `0` to a cgroup's `cgroup.procs` failed.
    #[error("joining the command's cgroup failed: {0}")]
    JoinCgroup(#[source] nix::Error),
    /// Closing what PID 1 inherited from the launcher (or, later, its channel) failed.
    #[error("closing the {what} failed: {source}")]
    CloseInherited {
        /// "launcher's descriptors" or "channel".
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The per-command mounts (`/proc`, `/dev`, private directories) failed.
    #[error("{0}")]
    Mounts(#[from] MountError),
    /// Entering the working directory, dropping capabilities, Landlock, or starting the
    /// command under its filters failed.
    #[error("{0}")]
    Sandbox(#[from] SandboxError),
    /// The seccomp program could not be built.
    #[error("{0}")]
    Seccomp(#[from] SeccompError),
    /// Blocking the forwarded signals or making their signalfd failed.
    #[error("signalfd: {0}")]
    Signals(#[source] nix::Error),
    /// Placing a received stdio descriptor on 0, 1 or 2 failed.
    #[error("placing the command's stdio failed: {0}")]
    Stdio(#[source] io::Error),
    /// The start's memfd could not be read as a [`super::StartCommand`].
    #[error("{0}")]
    Command(#[from] LaunchError),
    /// The command could not be started under its filters.
    #[error("cannot start the command: {0}")]
    Start(#[source] SandboxError),
    /// The start carried no memfd.
    #[error("no command")]
    NoCommand,
    /// The command is for another working directory, or has no program.
    #[error("a launcher for {} got a command for {} (argv {argv:?})", launcher.display(), cwd.display())]
    WrongCommand {
        /// The launcher's working directory.
        launcher: PathBuf,
        /// The command's.
        cwd: PathBuf,
        /// Its argv.
        argv: Vec<String>,
    },
}

/// Why the launcher stopped.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// The socket failed.
    #[error("the launcher socket failed: {source}")]
    Socket {
        /// The OS error.
        source: io::Error,
    },
    /// The first message was not a setup with its request.
    #[error("the launcher's first message must be `setup` with a launch request: {reason}")]
    Setup {
        /// What was wrong.
        reason: String,
    },
    /// Blocking or reading `SIGCHLD` failed.
    #[error("watching the launcher's children failed: {source}")]
    Signals {
        /// The OS error.
        source: nix::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_names_its_stage() {
        assert_eq!(LaunchFailure::Unrestricted.kind(), FailureKind::Unsupported);
        assert_eq!(
            LaunchFailure::NoNewPrivs(nix::Error::EPERM).kind(),
            FailureKind::Confinement
        );
        assert_eq!(
            LaunchFailure::StartDescriptors { max: 8, count: 2 }.kind(),
            FailureKind::Protocol
        );
        assert_eq!(
            serde_json::to_value(FailureKind::Pid1).unwrap(),
            serde_json::json!("pid1")
        );
    }
}
