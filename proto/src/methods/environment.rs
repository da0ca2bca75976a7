//! `environment/info`: what a harness needs to know about the machine before it runs anything.
//!
//! `shell` is the reference protocol's answer (the reference harness runs commands with the
//! local user's shell and refuses a requested shell when this call fails); every other field is
//! this server's addition, absent from the reference, and ignored by its client.

use serde::{Deserialize, Serialize};

use crate::uri::FileUri;

/// Result of `environment/info` (params absent, `null` or `{}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentInfo {
    /// The server user's login shell.
    pub shell: ShellInfo,
    /// The server's working directory, as a `file:` URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<FileUri>,
    /// Operating system, as Rust names it (`linux`, `macos`).
    #[serde(default)]
    pub os: String,
    /// CPU architecture, as Rust names it (`x86_64`, `aarch64`).
    #[serde(default)]
    pub arch: String,
    /// What this host's sandbox can enforce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSupport>,
    /// How this server contains process trees and what enforces each limit here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<ContainmentSupport>,
}

/// How process trees are tracked and killed on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Tracking {
    /// Each process gets its own cgroup v2 leaf, killed with `cgroup.kill`: nothing escapes by
    /// `setsid`, `setpgid` or double fork.
    CgroupV2,
    /// Process groups, with the server as child subreaper so orphans come back to it; a
    /// descendant that leaves its group escapes `process/terminate` and session expiry (not the
    /// server's own shutdown). A sandboxed command is still contained by its PID namespace.
    ProcessGroup,
}

/// `containment` of `environment/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainmentSupport {
    /// How trees are tracked and killed.
    pub tracking: Tracking,
    /// The cgroup v2 directory holding this server's process cgroups, when `tracking` is
    /// `cgroupV2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// What enforces each limit here (`none`: a start asking for it fails unless
    /// `bestEffort`).
    pub limits: LimitsSupport,
    /// The limits every start gets unless it sets its own (`exec-server --default-limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_limits: Option<crate::methods::process::Limits>,
    /// The `processes` a sandboxed start gets when neither it nor `--default-limits` sets one:
    /// the sandbox's share of the host's tasks (an eighth of the fewest of `kernel.pid_max`,
    /// `kernel.threads-max` and the server's `RLIMIT_NPROC`, at most 8,192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_processes: Option<u64>,
    /// Why something weaker than a cgroup is used, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// What enforces each limit of `process/start` on this host (for a start without a sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LimitsSupport {
    /// `memoryBytes`.
    pub memory_bytes: crate::methods::process::Enforcement,
    /// `processes`.
    pub processes: crate::methods::process::Enforcement,
    /// `cpuSeconds`.
    pub cpu_seconds: crate::methods::process::Enforcement,
    /// `wallSeconds`.
    pub wall_seconds: crate::methods::process::Enforcement,
    /// `fileSizeBytes`.
    pub file_size_bytes: crate::methods::process::Enforcement,
    /// `openFiles`.
    pub open_files: crate::methods::process::Enforcement,
    /// `inotifyInstances` (held by a sandbox only, so for a start without one `none`; as the
    /// four below).
    #[serde(default = "no_sandbox")]
    pub inotify_instances: crate::methods::process::Enforcement,
    /// `inotifyWatches`.
    #[serde(default = "no_sandbox")]
    pub inotify_watches: crate::methods::process::Enforcement,
    /// `pendingSignals`.
    #[serde(default = "no_sandbox")]
    pub pending_signals: crate::methods::process::Enforcement,
    /// `messageQueueBytes`.
    #[serde(default = "no_sandbox")]
    pub message_queue_bytes: crate::methods::process::Enforcement,
    /// `ptys`.
    #[serde(default = "no_sandbox")]
    pub ptys: crate::methods::process::Enforcement,
}

/// What holds a pool bound for a start without a sandbox: nothing.
fn no_sandbox() -> crate::methods::process::Enforcement {
    crate::methods::process::Enforcement::None
}

/// The shell of `environment/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ShellInfo {
    /// Short name: `bash`, `zsh`, `sh`, `fish`, ... (the executable's file name).
    pub name: String,
    /// The shell's native absolute path (not a URI, as in the reference).
    pub path: String,
}

/// What a `sandbox` on this host can enforce, as `sandbox-run --explain` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSupport {
    /// `sandbox-run` was found and answered; when false the other fields say nothing and
    /// `error` says why.
    pub available: bool,
    /// The running kernel's Landlock ABI version (0: no Landlock).
    #[serde(default)]
    pub landlock_abi: u32,
    /// Unprivileged user namespaces work here (mount, PID, IPC and network namespaces, read-only
    /// re-binds of protected paths).
    #[serde(default)]
    pub user_namespaces: bool,
    /// `auditDenials` can report denials (the kernel audit log is readable: the server runs as
    /// root).
    #[serde(default)]
    pub audit_denials: bool,
    /// The network modes a `sandbox` may ask for (`off`, `on`).
    #[serde(default)]
    pub network_modes: Vec<String>,
    /// How this host keeps pathname unix sockets outside a sandbox's writable roots (and not
    /// named by `allowUnixSockets`) out of reach: `landlock` (Landlock ABI 9 and later) or
    /// `seccomp-notify` (a seccomp user-notification handler outside the command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unix_sockets: Option<String>,
    /// Why the probe failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
