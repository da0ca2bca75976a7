//! What can be wrong with a `network` value or an egress pattern.

use super::NAMED_SETS;

/// What is wrong with a `network` value or an egress pattern.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A mode string other than `"off"` / `"on"` (`"restricted"` / `"enabled"`).
    #[error(
        "network {mode:?} is unknown (expected \"off\", \"on\" or {{\"allow\": [...], \"deny\": [...]}})"
    )]
    UnknownMode {
        /// The mode given.
        mode: String,
    },
    /// The value has none of the accepted shapes.
    #[error(
        "network is malformed (expected \"off\", \"on\" or {{\"allow\": [PATTERN, ...], \"deny\": \
         [PATTERN, ...]}} with no other keys; got {value})"
    )]
    Malformed {
        /// The value given.
        value: serde_json::Value,
    },
    /// More patterns than [`MAX_EGRESS_PATTERNS`](super::MAX_EGRESS_PATTERNS) once named sets are expanded.
    #[error(
        "the allowlist expands to more than {limit} patterns (MAX_EGRESS_PATTERNS); use *.suffix patterns"
    )]
    TooManyPatterns {
        /// The limit.
        limit: usize,
    },
    /// `@NAME` names no shipped set.
    #[error(
        "unknown named set {name:?} (expected one of: {})",
        NAMED_SETS.iter().map(|(set, _)| format!("@{set}")).collect::<Vec<_>>().join(", ")
    )]
    UnknownSet {
        /// The item as written (with its `@`).
        name: String,
    },
    /// `upstream` is not a usable proxy URL.
    #[error("upstream proxy {url:?}: {reason} (expected http://HOST:PORT)")]
    Upstream {
        /// The URL as written.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An egress pattern is malformed.
    #[error(
        "egress pattern {pattern:?}: {source} (expected HOST, *.DOMAIN or an IP literal, \
         optionally :PORT, e.g. \"*.crates.io\", \"github.com:443\", \"[::1]:8080\")"
    )]
    Pattern {
        /// The pattern as written.
        pattern: String,
        /// What is wrong with it.
        #[source]
        source: PatternError,
    },
}

/// What is wrong with one egress pattern.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    /// The port is not 1 to 65535.
    #[error("port {port:?} is not a number from 1 to 65535")]
    Port {
        /// The port as written.
        port: String,
    },
    /// `[` without `]`.
    #[error("unclosed '['")]
    UnclosedBracket,
    /// Something other than `:PORT` after `]`.
    #[error("unexpected {rest:?} after ']'")]
    AfterBracket {
        /// What follows the `]`.
        rest: String,
    },
    /// `*.TLD`.
    #[error("a wildcard must keep at least two labels (*.example.com, not *.com)")]
    WildcardTooWide,
    /// A `*` that is not a leading `*.` label.
    #[error(
        "'*' is only allowed as a leading \"*.\" label; to allow everything use network \"on\""
    )]
    WildcardInside,
    /// The host is not a valid name.
    #[error(transparent)]
    Host(#[from] HostNameError),
    /// A setting after the pattern other than `tunnel=`, `methods=` or `paths=`.
    #[error(
        "{setting:?} is not a pattern setting (expected tunnel=tls-only or tunnel=any, methods=GET,HEAD or methods=read-only, paths=/PREFIX,..., inspect=true)"
    )]
    Setting {
        /// The setting as written.
        setting: String,
    },
    /// `tunnel=` on a `deny` pattern.
    #[error("tunnel= applies to allow patterns only")]
    TunnelOnDeny,
    /// `methods=` or `paths=` on a `deny` pattern.
    #[error("methods= and paths= apply to allow patterns only")]
    RequestsOnDeny,
    /// `methods=`/`paths=` with `tunnel=any`: the requests of an unknown protocol cannot be
    /// checked.
    #[error("methods= and paths= need checked HTTP; tunnel=any carries bytes nobody checks")]
    RequestsWithAnyTunnel,
    /// `inspect=true` without `methods=`/`paths=`: nothing to check in what it would decrypt.
    #[error("inspect=true needs methods= or paths= (there is nothing else to check inside)")]
    InspectWithoutRequests,
    /// A method that is not an HTTP token of capitals.
    #[error("{method:?} is not an HTTP method (capital letters, as GET; or methods=read-only)")]
    Method {
        /// The method as written.
        method: String,
    },
    /// A path prefix that does not start with `/` or holds what a prefix cannot hold.
    #[error(
        "{path:?} is not a path prefix (it starts with '/', and holds no whitespace, ',', '?', '#', '%', '\\' or dot segment)"
    )]
    PathPrefix {
        /// The prefix as written.
        path: String,
    },
    /// The same setting twice.
    #[error("{key}= is given twice")]
    Repeated {
        /// The setting's key.
        key: &'static str,
    },
}

/// A host that is neither an IP literal nor a valid DNS name.
#[derive(Debug, thiserror::Error)]
#[error("{host:?} is not a valid host name ({reason})")]
pub struct HostNameError {
    /// The host as given.
    pub host: String,
    /// Which rule it breaks.
    pub reason: &'static str,
}
