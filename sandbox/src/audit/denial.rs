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
    /// The policy rule that would allow it, or why none would.
    pub allow_rule: String,
}

impl Denial {
    /// The identity of a distinct denial (what SARIF and the summary de-duplicate on).
    pub fn key(&self) -> (Layer, &str, Option<&str>, Option<&str>) {
        (
            self.layer,
            self.operation.as_str(),
            self.path.as_deref(),
            self.address.as_deref(),
        )
    }

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
    /// Every record up to the end of the run arrived (drain marker seen, nothing dropped).
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
        self.audit && self.landlock && self.seccomp && self.mount && self.complete
    }
}
