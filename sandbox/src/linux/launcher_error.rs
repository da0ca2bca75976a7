//! Why a launcher could not set up or start a command: typed per stage, and the [`FailureKind`]
//! its `Reply::Failed` carries so that the server (and a log) get the cause, not only a
//! sentence.

use std::io;

use serde::{Deserialize, Serialize};

use super::mounts::MountError;
use super::namespaces::NamespaceError;

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
