//! What one destination's tunnels may carry and which requests may be sent to it.

use super::{METHODS_KEY, PATHS_KEY};

/// The requests one `allow` pattern admits: `None` methods or empty paths admit any.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RequestRule {
    /// Allowed methods (sorted), or any.
    pub methods: Option<Vec<String>>,
    /// Allowed path prefixes (sorted), or any when empty.
    pub paths: Vec<String>,
    /// `inspect=true`: TLS to what the pattern allows is terminated by the proxy (a
    /// per-sandbox CA) so that the requests inside are checked too.
    pub inspect: bool,
}

impl RequestRule {
    /// Whether the rule limits anything.
    pub fn is_limited(&self) -> bool {
        self.methods.is_some() || !self.paths.is_empty()
    }

    /// Whether a request `method` for `target` (origin form: `/path?query`) is admitted.
    pub fn permits(&self, method: &str, target: &str) -> bool {
        let method_ok = self
            .methods
            .as_ref()
            .is_none_or(|methods| methods.iter().any(|m| m == method));
        method_ok
            && (self.paths.is_empty()
                || (plain_path(target)
                    .is_some_and(|path| self.paths.iter().any(|p| path.starts_with(p.as_str())))))
    }
}

/// The path of an origin-form `target` (the query cut off), when a prefix can be compared
/// with it as any server will read it: starting with `/`; no dot segment (`..`, `.`, also with
/// a `;` parameter, `..;`, which Java servers resolve); no percent-encoded dot, slash,
/// backslash or percent (`%2e`, `%2f`, `%5c`, `%25`, any case: decoded once or twice, they
/// could make one); no backslash; no `//`.
pub(super) fn plain_path(target: &str) -> Option<&str> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let lower = path.to_ascii_lowercase();
    let dot_segment = path.split('/').any(|segment| {
        let name = segment.split(';').next().unwrap_or_default();
        name == "." || name == ".."
    });
    let encoded = ["%2e", "%2f", "%5c", "%25"]
        .iter()
        .any(|code| lower.contains(code));
    (path.starts_with('/')
        && !dot_segment
        && !encoded
        && !path.contains('\\')
        && !path.contains("//"))
    .then_some(path)
}

/// What requests to one destination may be: any, or those some limiting pattern admits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RequestScope {
    /// Some matching pattern limits nothing.
    #[default]
    Any,
    /// Every matching pattern limits its requests; a request passes when one admits it.
    Limited(Vec<RequestRule>),
}

impl RequestScope {
    /// Whether `method` for `target` (origin form) may be sent.
    pub fn permits(&self, method: &str, target: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Limited(rules) => rules.iter().any(|rule| rule.permits(method, target)),
        }
    }

    /// Whether requests are limited (so a tunnel that hides them is refused).
    pub fn is_limited(&self) -> bool {
        matches!(self, Self::Limited(_))
    }

    /// Whether requests are limited and a limiting pattern asks for `inspect=true`: the proxy
    /// terminates TLS to the destination and checks the requests inside.
    pub fn inspects(&self) -> bool {
        match self {
            Self::Any => false,
            Self::Limited(rules) => rules.iter().any(|rule| rule.inspect),
        }
    }

    /// The limits in pattern words, for refusals (`methods=GET,HEAD paths=/simple/`; one
    /// alternative per pattern, joined with " or ").
    pub fn describe(&self) -> String {
        match self {
            Self::Any => "any request".to_owned(),
            Self::Limited(rules) => rules
                .iter()
                .map(|rule| {
                    let mut words = Vec::new();
                    if let Some(methods) = &rule.methods {
                        words.push(format!("{METHODS_KEY}={}", methods.join(",")));
                    }
                    if !rule.paths.is_empty() {
                        words.push(format!("{PATHS_KEY}={}", rule.paths.join(",")));
                    }
                    words.join(" ")
                })
                .collect::<Vec<_>>()
                .join(" or "),
        }
    }
}

/// What an `allow` pattern says its tunnels may carry (`tunnel=...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TunnelSetting {
    /// `tls-only`: TLS from the first byte, every plaintext ClientHello's server name checked.
    TlsOnly,
    /// `any`: any protocol; the TLS ClientHellos found in it are still checked.
    Any,
}

impl TunnelSetting {
    pub(super) fn parse(text: &str) -> Option<Self> {
        match text {
            "tls-only" => Some(Self::TlsOnly),
            "any" => Some(Self::Any),
            _ => None,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::TlsOnly => "tls-only",
            Self::Any => "any",
        }
    }
}

/// What the egress proxy lets through one tunnel (or one plain-HTTP connection), from the
/// narrowest to the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TunnelMode {
    /// TLS from the first byte; the server name of every plaintext ClientHello must be the
    /// tunnel's host. The default on [`TLS_ONLY_PORTS`].
    TlsOnly,
    /// TLS as [`Self::TlsOnly`], or HTTP/1.x whose every request names the tunnel's host; any
    /// other protocol is refused. The default on every other port.
    Checked,
    /// Any bytes; every TLS ClientHello found in the plaintext is still checked.
    Any,
}

impl TunnelMode {
    /// The name the policy uses (`checked` is the default's, which has no key).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TlsOnly => "tls-only",
            Self::Checked => "checked (TLS or Host-checked HTTP)",
            Self::Any => "any",
        }
    }
}

/// Ports whose tunnels carry TLS only unless a pattern says otherwise.
pub const TLS_ONLY_PORTS: [u16; 1] = [443];
