//! The report model: one [`Denial`] per denied access, and the [`Coverage`] that says what the
//! collector could see (so an empty list is never mistaken for "nothing was denied").

use serde::{Deserialize, Serialize};

/// Which layer refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layer {
    /// Landlock (kernel record `LANDLOCK_ACCESS`).
    Landlock,
    /// seccomp (kernel record `SECCOMP`).
    Seccomp,
    /// The read-only mount layer of the namespace (`EROFS`, seen as a failed syscall).
    Mount,
    /// A sandboxed helper (`fs-helper`) reported the denial itself.
    Helper,
    /// The egress proxy refused a connection (network allowlist).
    Proxy,
    /// The pathname unix-socket gate refused a `connect` (a socket outside the writable roots
    /// that `allowUnixSockets` does not name; seccomp user notification, where Landlock cannot
    /// mediate unix sockets).
    UnixSockets,
    /// A syscall of the command tree failed with `EACCES` or `EPERM` and no layer's record
    /// accounts for it: a file's own mode or owner, a capability the sandbox does not grant,
    /// or a layer the audit cannot see. Reported because the audit cannot tell them apart.
    Unexplained,
}

impl Layer {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
            Layer::Mount => "mount",
            Layer::Helper => "helper",
            Layer::Proxy => "proxy",
            Layer::UnixSockets => "unix-sockets",
            Layer::Unexplained => "unexplained",
        }
    }
}

/// One denied access of the sandboxed command tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// When the kernel logged it (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// The process that was refused (absent when the kernel record does not say).
    pub pid: Option<u32>,
    /// Its executable.
    pub exe: Option<String>,
    /// The refusing layer.
    pub layer: Layer,
    /// What was refused: Landlock's access name (`fs.write_file`, `fs.make_reg`,
    /// `net.connect_tcp`, ...), the same vocabulary for the mount layer, or the syscall name
    /// for seccomp (`socket`, `ptrace`, ...).
    pub operation: String,
    /// The path, when known (for `fs.make_*`/`fs.remove_*` Landlock names the directory).
    pub path: Option<String>,
    /// The network address, when known (`127.0.0.1:80` from Landlock; seccomp records carry
    /// no syscall arguments, so a refused `socket()` has none).
    pub address: Option<String>,
    /// The syscall, when known.
    pub syscall: Option<String>,
    /// The error the syscall returned (`EACCES`, `EPERM`, `EROFS`), when the kernel recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    /// The policy rule that would allow it, or why none would. Filled in by
    /// [`super::aggregate::Aggregate`] for the denials it keeps (it costs a policy lookup).
    pub allow_rule: String,
}

impl Denial {
    /// `path`, else `address`, else `-`.
    pub fn target(&self) -> &str {
        self.path
            .as_deref()
            .or(self.address.as_deref())
            .unwrap_or("-")
    }
}

/// What the collector could observe for this run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Kernel audit records were collected at all.
    pub audit: bool,
    /// Landlock denials are logged and attributed.
    pub landlock: bool,
    /// seccomp denials are logged and attributed.
    pub seccomp: bool,
    /// Read-only-mount (`EROFS`) denials are observed.
    pub mount: bool,
    /// `EACCES`/`EPERM` failures of the command tree that no layer logged are observed (and
    /// reported as layer `unexplained`).
    #[serde(default)]
    pub unexplained: bool,
    /// Nothing could have been hidden: every record up to the end of the run arrived (drain
    /// marker seen, nothing dropped by the socket or the kernel) and the command did not try
    /// to stack a Landlock domain or seccomp filter of its own.
    pub complete: bool,
    /// Why something above is false, in plain words.
    pub gaps: Vec<String>,
}

impl Coverage {
    /// Coverage when nothing could be collected.
    pub fn blind(reason: impl Into<String>) -> Self {
        Self {
            gaps: vec![reason.into()],
            ..Self::default()
        }
    }

    /// True when every layer was observed completely.
    pub fn is_full(&self) -> bool {
        self.audit
            && self.landlock
            && self.seccomp
            && self.mount
            && self.unexplained
            && self.complete
    }
}
