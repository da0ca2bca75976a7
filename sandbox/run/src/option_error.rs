//! Why `sandbox-run` cannot honour one of its options (`sandbox-run` exits 125). Apart from
//! [`crate::resolve`] (the policy) and the sandbox's own setup (`linux::command`).

use std::os::fd::RawFd;

/// An option `sandbox-run` cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum OptionError {
    /// `--launch-fd`'s request could not be read.
    #[error(transparent)]
    LaunchRequest(#[from] sandbox::launch::LaunchError),
    /// An option for a Linux-only mechanism on another system.
    #[error("{flag} is Linux only")]
    LinuxOnly {
        /// The option.
        flag: &'static str,
    },
    /// `--pids` as root without `--best-effort`: RLIMIT_NPROC does not bind uid 0, so the
    /// limit would silently not apply.
    #[error(
        "--pids cannot be enforced: it is RLIMIT_NPROC, which the kernel does not apply to uid \
         0; run sandbox-run as another user or under exec-server (whose pids cgroup bounds the \
         tree), or pass --best-effort to run without it"
    )]
    PidsAsRoot,
    /// `--ask-timeout` out of range.
    #[error(
        "--ask-timeout {seconds} is out of range (more than 0, at most {max_seconds} seconds: \
         MAX_ASK_TIMEOUT)"
    )]
    AskTimeout {
        /// What was asked.
        seconds: f64,
        /// The most allowed.
        max_seconds: u64,
    },
    /// `--ask-fd` is not an open descriptor.
    #[error("--ask-fd {fd}: {source}")]
    AskFd {
        /// The descriptor.
        fd: RawFd,
        /// The OS error.
        source: std::io::Error,
    },
    /// `--egress-hosts` could not be read.
    #[error(transparent)]
    EgressHosts(#[from] sandbox::egress::hosts::HostsError),
    /// `--egress-log -`.
    #[error("--egress-log needs a file path ('-' is not supported)")]
    EgressLogStdout,
    /// `--upstream-proxy-credentials` could not be read.
    #[error(transparent)]
    UpstreamCredentials(#[from] sandbox::egress::credentials::UpstreamError),
    /// `--explain`'s report could not be rendered.
    #[error("{0}")]
    Explain(#[from] serde_json::Error),
    /// No program after the options.
    #[error("no program given")]
    NoProgram,
    /// A network allowlist where the egress proxy does not run.
    #[error(
        "network allowlists need the egress proxy, which sandbox-run runs on Linux only; use the \
         network on or off here"
    )]
    AllowlistNeedsLinux,
}
