//! The denial record every enforcement layer emits: one [`Denial`] per denied access, the
//! [`Coverage`] that says what the audit collector could see (so an empty list is never mistaken
//! for "nothing was denied"), and the caps on its text fields ([`cap_field`]).
//!
//! A leaf: it imports nothing of the crate, so the enforcement layers (`linux`, `egress`) can
//! emit denials and the audit (above the sandbox) can read them.

use std::fmt::Write as _;

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
    /// `audit::aggregate::Aggregate` (the `audit` crate) for the denials it keeps (it costs a policy lookup).
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

/// Longest path (or path prefix) of a denial, in bytes of its JSON encoding: the kernel
/// records paths up to `PATH_MAX` (4096) and a control character escapes to six bytes
/// (`\u0001`), so a command could otherwise make one path cost 24 KiB.
pub const MAX_PATH_FIELD_BYTES: usize = 1024;
/// Longest other text field (`exe`, `operation`, `syscall`, `address`, `errno`, times), in
/// bytes of its JSON encoding. `exe` is the command's choice too.
pub const MAX_TEXT_FIELD_BYTES: usize = 256;

/// Marker appended to a capped field: `…[+N bytes]` (N: how many bytes of the original were cut).
const TRUNCATION_MARKER_MAX_BYTES: usize = 24;

/// `text` capped to `max` bytes of JSON string encoding (quotes excluded), cut at a character
/// boundary and marked `…[+N bytes]` when cut.
pub fn cap_field(text: &str, max: usize) -> String {
    if json_len(text) <= max {
        return text.to_owned();
    }
    let budget = max.saturating_sub(TRUNCATION_MARKER_MAX_BYTES);
    let mut used = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        let cost = json_char_len(c);
        if used + cost > budget {
            break;
        }
        used += cost;
        end = at + c.len_utf8();
    }
    let mut out = text[..end].to_owned();
    let _ = write!(out, "…[+{} bytes]", text.len() - end);
    out
}

/// [`cap_field`] without a copy when `text` is short enough.
pub fn cap_cow(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max / 6 || json_len(text) <= max {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(cap_field(text, max))
    }
}

/// Caps an optional field.
pub fn cap_opt(text: Option<String>, max: usize) -> Option<String> {
    text.map(|t| {
        if t.len() <= max / 6 {
            // Cannot exceed `max` even if every character escapes to six bytes.
            t
        } else {
            cap_field(&t, max)
        }
    })
}

/// Bytes of `text` inside a JSON string (as `serde_json` writes it).
pub fn json_len(text: &str) -> usize {
    text.chars().map(json_char_len).sum()
}

fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{08}' | '\u{0c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn short_fields_stay_as_they_are() {
        assert_eq!(cap_field("/etc/passwd", 64), "/etc/passwd");
        assert_eq!(cap_opt(Some("/x".to_owned()), 64).as_deref(), Some("/x"));
    }

    #[test]
    fn long_fields_are_cut_by_their_encoded_length_and_marked() {
        let controls = "\u{1}".repeat(4000);
        let capped = cap_field(&controls, MAX_PATH_FIELD_BYTES);
        let encoded = serde_json::to_string(&capped).unwrap();
        assert!(
            encoded.len() - 2 <= MAX_PATH_FIELD_BYTES,
            "{}",
            encoded.len()
        );
        assert!(
            capped.ends_with(&format!("…[+{} bytes]", 4000 - 166)),
            "{capped}"
        );
        let wide = "é".repeat(3000);
        let capped = cap_field(&wide, 100);
        assert!(serde_json::to_string(&capped).unwrap().len() - 2 <= 100);
        assert!(capped.starts_with("éé"));
    }
}
