//! The network part of a policy: `off`, `on`, or an allowlist of host patterns enforced by the
//! egress proxy ([`crate::egress`]).
//!
//! Pattern grammar (one string each):
//! - `example.com` — exactly that host;
//! - `*.example.com` — any subdomain of it (not `example.com` itself: list both);
//! - `192.0.2.7`, `[2001:db8::1]` — an IP literal (an IP is reachable only when listed);
//! - each optionally followed by `:PORT`; without a port an `allow` pattern means ports 80 and
//!   443, a `deny` pattern every port;
//! - `@NAME` — a named set shipped in `policies/egress/NAME.txt` (e.g. `@package-registries`),
//!   expanded when the policy is parsed;
//! - an `allow` pattern optionally followed by ` tunnel=tls-only` or ` tunnel=any` (in TOML and
//!   on the wire also `{pattern = "...", tunnel = "any"}`): what the tunnel to a destination it
//!   allows may carry ([`TunnelMode`]). Without it: TLS only on port 443, and TLS or HTTP (every
//!   request's `Host` checked) on every other port; an unknown protocol needs `tunnel=any`;
//! - an `allow` pattern optionally followed by ` methods=GET,HEAD` (or the shorthand
//!   ` methods=read-only`: GET, HEAD and OPTIONS) and/or ` paths=/simple/,/packages/` (in TOML
//!   and on the wire also `{pattern = "...", methods = ["GET"], paths = ["/simple/"]}`): the
//!   requests it allows ([`RequestScope`]). A destination every matching pattern limits is
//!   reached by plain HTTP only (each request of a connection checked); a TLS tunnel to it
//!   hides its requests and is refused, unless a limiting pattern adds ` inspect=true` (table
//!   form `inspect = true`): the proxy then terminates the TLS with a per-sandbox CA and checks
//!   the requests inside (`crate::egress::terminate`). A path prefix applies to the request target without its
//!   query; a target with a dot segment (`..;` too), an encoded dot, slash, backslash or
//!   percent, a backslash or `//` is refused where a prefix applies (a server could read it
//!   as another path).
//!
//! Names are compared case-insensitively after IDNA normalisation (`bücher.example` and
//! `xn--bcher-kva.example` are one host). `deny` wins over `allow`. A destination that
//! resolves to a loopback, private, link-local or otherwise special address is refused unless
//! an `allow` pattern names that address itself (so a public name rebound to `127.0.0.1`
//! reaches nothing local).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::PolicyError;

/// Ports an `allow` pattern without `:PORT` covers.
pub const DEFAULT_ALLOWED_PORTS: [u16; 2] = [80, 443];

/// Most patterns one allowlist may hold after named sets are expanded: the proxy checks every
/// connection against all of them, and the policy comes from any client.
pub const MAX_EGRESS_PATTERNS: usize = 1024;

/// Longest host name accepted (DNS limit, RFC 1035).
pub const MAX_HOST_NAME_BYTES: usize = 253;

/// Named pattern sets, `(name, text)`: one pattern a line, `#` comments. Embedded at build time.
pub const NAMED_SETS: &[(&str, &str)] = &[
    (
        "package-registries",
        include_str!("../../../policies/egress/package-registries.txt"),
    ),
    (
        "git-hosts",
        include_str!("../../../policies/egress/git-hosts.txt"),
    ),
];

/// The network policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(try_from = "NetworkSetting", into = "NetworkSetting")]
pub enum NetworkPolicy {
    /// No network: the command gets a network namespace with nothing in it.
    #[default]
    Off,
    /// Full network access.
    On,
    /// Only the destinations the rules allow, through the egress proxy.
    Allowlist(EgressRules),
}

impl From<bool> for NetworkPolicy {
    fn from(on: bool) -> Self {
        if on { Self::On } else { Self::Off }
    }
}

impl NetworkPolicy {
    /// Parses the `network` value of a profile or wire object: `"off"`, `"on"`, a boolean, or
    /// `{"allow": [...], "deny": [...]}`.
    ///
    /// # Errors
    /// [`PolicyError::Network`] naming the bad value or pattern.
    pub fn from_setting(setting: NetworkSetting) -> Result<Self, PolicyError> {
        match setting {
            NetworkSetting::Switch(on) => Ok(Self::from(on)),
            NetworkSetting::Mode(mode) => match mode.as_str() {
                "off" | "restricted" => Ok(Self::Off),
                "on" | "enabled" => Ok(Self::On),
                _ => Err(NetworkError::UnknownMode { mode }.into()),
            },
            NetworkSetting::Allowlist(spec) => {
                let allow: Vec<String> =
                    spec.allow.iter().map(AllowEntry::to_pattern_text).collect();
                let mut rules = EgressRules::parse(&allow, &spec.deny)?;
                rules.ask = spec.ask;
                match spec.upstream {
                    Some(url) => Ok(Self::Allowlist(
                        rules.with_upstream(Some(UpstreamProxy::parse(&url)?)),
                    )),
                    None => Ok(Self::Allowlist(rules)),
                }
            }
        }
    }
}

impl TryFrom<NetworkSetting> for NetworkPolicy {
    type Error = PolicyError;

    fn try_from(setting: NetworkSetting) -> Result<Self, PolicyError> {
        Self::from_setting(setting)
    }
}

impl From<NetworkPolicy> for NetworkSetting {
    fn from(policy: NetworkPolicy) -> Self {
        match policy {
            NetworkPolicy::Off => Self::Mode("off".to_owned()),
            NetworkPolicy::On => Self::Mode("on".to_owned()),
            NetworkPolicy::Allowlist(rules) => Self::Allowlist(AllowlistSpec {
                allow: rules
                    .allow
                    .iter()
                    .map(|p| AllowEntry::Pattern(p.to_string()))
                    .collect(),
                deny: rules.deny.iter().map(ToString::to_string).collect(),
                upstream: rules.upstream.as_ref().map(ToString::to_string),
                ask: rules.ask,
            }),
        }
    }
}

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
    /// More patterns than [`MAX_EGRESS_PATTERNS`] once named sets are expanded.
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

/// The `network` value as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum NetworkSetting {
    /// `true` / `false`.
    Switch(bool),
    /// `"off"` / `"on"` (the reference's `"restricted"` / `"enabled"` too).
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "super::schema_aliases::network_mode")
    )]
    Mode(String),
    /// An allowlist.
    Allowlist(AllowlistSpec),
}

/// `{"allow": [...], "deny": [...]}` as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AllowlistSpec {
    /// Patterns to allow.
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
    /// Patterns to refuse even when an `allow` pattern matches.
    #[serde(default)]
    pub deny: Vec<String>,
    /// An upstream HTTP proxy (`"http://HOST:PORT"`) every allowed connection leaves through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Ask (the terminal, or exec-server's client) before a destination no `allow` pattern
    /// matches is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ask: bool,
}

/// One `allow` item as written: a pattern string, or `{"pattern": "...", "tunnel": "any"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum AllowEntry {
    /// `"HOST[:PORT][ tunnel=MODE]"`.
    Pattern(String),
    /// The table form.
    Table(AllowTable),
}

/// `{"pattern": "...", "tunnel": "tls-only" | "any"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AllowTable {
    /// The pattern (without a `tunnel=` suffix).
    pub pattern: String,
    /// What its tunnels may carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<String>,
    /// The request methods it allows: a list, or `"read-only"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<MethodsSpec>,
    /// The request path prefixes it allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// Terminate TLS to what it allows so that `methods`/`paths` are checked inside.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inspect: bool,
}

/// `methods` as written in the table form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum MethodsSpec {
    /// A shorthand (`"read-only"`).
    Named(String),
    /// The methods.
    List(Vec<String>),
}

impl AllowEntry {
    /// The one-string form every parser reads.
    fn to_pattern_text(&self) -> String {
        match self {
            Self::Pattern(text) => text.clone(),
            Self::Table(table) => {
                let mut text = table.pattern.clone();
                if let Some(tunnel) = &table.tunnel {
                    text.push_str(&format!(" {TUNNEL_KEY}={tunnel}"));
                }
                match &table.methods {
                    Some(MethodsSpec::Named(name)) => {
                        text.push_str(&format!(" {METHODS_KEY}={name}"));
                    }
                    Some(MethodsSpec::List(methods)) => {
                        text.push_str(&format!(" {METHODS_KEY}={}", methods.join(",")));
                    }
                    None => {}
                }
                if let Some(paths) = &table.paths {
                    text.push_str(&format!(" {PATHS_KEY}={}", paths.join(",")));
                }
                if table.inspect {
                    text.push_str(&format!(" {INSPECT_KEY}=true"));
                }
                text
            }
        }
    }
}

/// The key of a pattern's tunnel setting (`pypi.org tunnel=any`).
const TUNNEL_KEY: &str = "tunnel";
/// The key of a pattern's methods (`pypi.org methods=GET,HEAD`).
const METHODS_KEY: &str = "methods";
/// The key of a pattern's path prefixes (`pypi.org paths=/simple/`).
const PATHS_KEY: &str = "paths";
/// The key of a pattern's TLS inspection (`pypi.org methods=read-only inspect=true`).
const INSPECT_KEY: &str = "inspect";
/// `methods=read-only`.
pub const READ_ONLY_METHODS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];

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
fn plain_path(target: &str) -> Option<&str> {
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
    fn parse(text: &str) -> Option<Self> {
        match text {
            "tls-only" => Some(Self::TlsOnly),
            "any" => Some(Self::Any),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
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

/// A validated allowlist.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressRules {
    /// Allowed destinations.
    pub allow: Vec<HostPattern>,
    /// Refused destinations (win over `allow`).
    pub deny: Vec<HostPattern>,
    /// Where allowed connections leave: through this HTTP proxy (CONNECT), else directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamProxy>,
    /// Ask before a destination no `allow` pattern matches is refused (`deny` patterns are
    /// final): `sandbox-run` asks its terminal, exec-server its client (`egress/approve`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ask: bool,
}

/// An upstream HTTP proxy (`http://HOST:PORT`): allowed connections leave through it with
/// `CONNECT host:port`. Credentials never live in the URL (it ends up in policies, command
/// lines and `--explain`): `sandbox-run --upstream-proxy-credentials FILE` gives them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UpstreamProxy {
    /// The proxy's host.
    pub host: Host,
    /// Its port.
    pub port: u16,
}

impl UpstreamProxy {
    /// Parses `http://HOST[:PORT]` (port 3128 when absent; a trailing `/` is accepted).
    ///
    /// # Errors
    /// [`NetworkError::Upstream`] naming what is wrong: another scheme, credentials in the
    /// URL, a path, a bad host or port.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let bad = |reason: &str| -> PolicyError {
            NetworkError::Upstream {
                url: text.to_owned(),
                reason: reason.to_owned(),
            }
            .into()
        };
        let rest = text
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// upstream proxies are supported"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('@') {
            return Err(bad("credentials do not belong in the URL; give them with \
                 --upstream-proxy-credentials FILE"));
        }
        if rest.contains(['/', '?', '#']) {
            return Err(bad("an upstream proxy URL has no path"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => (
                host,
                port.parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
            ),
            _ => (rest, DEFAULT_UPSTREAM_PORT),
        };
        let host = Host::parse(host).map_err(|err| bad(&err.to_string()))?;
        Ok(Self { host, port })
    }
}

/// The port of an upstream proxy URL without one (the usual HTTP proxy port).
pub const DEFAULT_UPSTREAM_PORT: u16 = 3128;

impl fmt::Display for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}:{}", self.host, self.port)
    }
}

impl TryFrom<String> for UpstreamProxy {
    type Error = PolicyError;

    fn try_from(text: String) -> Result<Self, PolicyError> {
        Self::parse(&text)
    }
}

impl From<UpstreamProxy> for String {
    fn from(upstream: UpstreamProxy) -> Self {
        upstream.to_string()
    }
}

impl EgressRules {
    /// Parses and validates `allow` and `deny`, expanding `@NAME` sets.
    ///
    /// # Errors
    /// [`PolicyError::Network`] naming the bad pattern, an unknown set, or too many patterns.
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Self, PolicyError> {
        let rules = Self {
            allow: parse_list(allow)?,
            deny: parse_list(deny)?,
            upstream: None,
            ask: false,
        };
        if let Some(pattern) = rules.deny.iter().find(|p| p.tunnel.is_some()) {
            return Err(NetworkError::Pattern {
                pattern: pattern.to_string(),
                source: PatternError::TunnelOnDeny,
            }
            .into());
        }
        if let Some(pattern) = rules.deny.iter().find(|p| p.requests.is_limited()) {
            return Err(NetworkError::Pattern {
                pattern: pattern.to_string(),
                source: PatternError::RequestsOnDeny,
            }
            .into());
        }
        if rules.allow.len() + rules.deny.len() > MAX_EGRESS_PATTERNS {
            return Err(NetworkError::TooManyPatterns {
                limit: MAX_EGRESS_PATTERNS,
            }
            .into());
        }
        Ok(rules)
    }

    /// Adds `allow` and `deny` patterns (the command line's `--allow-domain`/`--deny-domain`).
    ///
    /// # Errors
    /// As [`Self::parse`].
    pub fn extended(&self, allow: &[String], deny: &[String]) -> Result<Self, PolicyError> {
        let mut all_allow: Vec<String> = self.allow.iter().map(ToString::to_string).collect();
        all_allow.extend_from_slice(allow);
        let mut all_deny: Vec<String> = self.deny.iter().map(ToString::to_string).collect();
        all_deny.extend_from_slice(deny);
        let mut rules = Self::parse(&all_allow, &all_deny)?.with_upstream(self.upstream.clone());
        rules.ask = self.ask;
        Ok(rules)
    }

    /// These rules with allowed connections leaving through `upstream` (or directly).
    pub fn with_upstream(mut self, upstream: Option<UpstreamProxy>) -> Self {
        self.upstream = upstream;
        self
    }

    /// What a tunnel to `host:port` may carry: the widest setting of the `allow` patterns that
    /// match it (a pattern adds to what others allow, it never narrows them), each pattern
    /// without a setting counting as its port's default ([`TunnelMode`]).
    pub fn tunnel_mode(&self, host: &Host, port: u16) -> TunnelMode {
        let default = if TLS_ONLY_PORTS.contains(&port) {
            TunnelMode::TlsOnly
        } else {
            TunnelMode::Checked
        };
        self.allow
            .iter()
            .filter(|p| p.matches(host, port, false))
            .map(|p| match p.tunnel {
                None => default,
                Some(TunnelSetting::TlsOnly) => TunnelMode::TlsOnly,
                Some(TunnelSetting::Any) => TunnelMode::Any,
            })
            .max()
            .unwrap_or(default)
    }

    /// The requests `host:port` may be sent: any when one matching `allow` pattern limits
    /// nothing, else those one of the matching patterns admits.
    pub fn request_scope(&self, host: &Host, port: u16) -> RequestScope {
        let mut rules = Vec::new();
        for pattern in self.allow.iter().filter(|p| p.matches(host, port, false)) {
            if !pattern.requests.is_limited() {
                return RequestScope::Any;
            }
            rules.push(pattern.requests.clone());
        }
        if rules.is_empty() {
            RequestScope::Any
        } else {
            RequestScope::Limited(rules)
        }
    }

    /// Whether some `allow` pattern asks for `inspect=true` (the proxy then makes its CA).
    pub fn inspects_any(&self) -> bool {
        self.allow.iter().any(|p| p.requests.inspect)
    }

    /// Whether `host:port` may be reached by name (before its addresses are checked).
    pub fn decide(&self, host: &Host, port: u16) -> Decision {
        if let Some(rule) = self.deny.iter().find(|p| p.matches(host, port, true)) {
            return Decision::Denied(Refusal::DeniedByRule(rule.to_string()));
        }
        match self.allow.iter().find(|p| p.matches(host, port, false)) {
            Some(rule) => Decision::Allowed(rule.to_string()),
            None => Decision::Denied(Refusal::NotAllowed),
        }
    }

    /// Whether the resolved address `ip` of an allowed destination may be connected to: a
    /// public address always, a special one ([`is_special_address`]) or one of this host's own
    /// (`is_host_address`, asked with the [`canonical_ip`] form: every interface, v4 and v6,
    /// read fresh by the caller) only when an `allow` pattern names it (and no `deny` pattern
    /// does).
    pub fn address_allowed(
        &self,
        ip: IpAddr,
        port: u16,
        is_host_address: &dyn Fn(IpAddr) -> bool,
    ) -> bool {
        let ip = canonical_ip(ip);
        let literal = Host::Ip(ip);
        if self.deny.iter().any(|p| p.matches(&literal, port, true)) {
            return false;
        }
        let local = is_special_address(ip) || is_host_address(ip);
        !local || self.allow.iter().any(|p| p.matches(&literal, port, false))
    }
}

fn parse_list(items: &[String]) -> Result<Vec<HostPattern>, PolicyError> {
    let mut out = Vec::new();
    for item in items {
        let item = item.trim();
        if let Some(name) = item.strip_prefix('@') {
            let (_, text) = NAMED_SETS
                .iter()
                .find(|(set, _)| *set == name)
                .ok_or_else(|| NetworkError::UnknownSet {
                    name: item.to_owned(),
                })?;
            for line in text.lines() {
                let line = line.split('#').next().unwrap_or_default().trim();
                if !line.is_empty() {
                    out.push(HostPattern::parse(line)?);
                }
            }
        } else {
            out.push(HostPattern::parse(item)?);
        }
        if out.len() > MAX_EGRESS_PATTERNS {
            return Err(NetworkError::TooManyPatterns {
                limit: MAX_EGRESS_PATTERNS,
            }
            .into());
        }
    }
    out.sort_by_key(ToString::to_string);
    out.dedup();
    Ok(out)
}

/// The outcome of [`EgressRules::decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed by this pattern.
    Allowed(String),
    /// Refused.
    Denied(Refusal),
}

/// Why a destination was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `allow` pattern matches.
    NotAllowed,
    /// This `deny` pattern matches.
    DeniedByRule(String),
}

/// A destination host: a normalised name or an IP literal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lowercase ASCII (IDNA) name without a trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// Parses a host as a client names it (`Example.COM.`, `bücher.example`, `10.0.0.1`,
    /// `[::1]` or `::1`).
    ///
    /// # Errors
    /// [`HostNameError`] when it is neither an IP literal nor a valid DNS name.
    pub fn parse(text: &str) -> Result<Self, HostNameError> {
        let bare = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Self::Ip(canonical_ip(ip)));
        }
        normalize_name(text).map(Self::Name)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Lowercase, IDNA (UTS 46) to ASCII, no trailing dot; letters, digits, `-` and `_` only.
fn normalize_name(text: &str) -> Result<String, HostNameError> {
    let bad = |reason: &'static str| HostNameError {
        host: text.to_owned(),
        reason,
    };
    let trimmed = text.strip_suffix('.').unwrap_or(text);
    if trimmed.is_empty() {
        return Err(bad("empty"));
    }
    let ascii = idna::domain_to_ascii(trimmed).map_err(|_| bad("IDNA normalisation failed"))?;
    if ascii.len() > MAX_HOST_NAME_BYTES {
        return Err(bad("longer than 253 bytes"));
    }
    for label in ascii.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("a label is empty or longer than 63 bytes"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad("only letters, digits, '-' and '_' are allowed"));
        }
    }
    Ok(ascii.to_ascii_lowercase())
}

/// Which hosts a pattern covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostMatch {
    /// Exactly this host.
    Exact(Host),
    /// Any strict subdomain of this name (`*.NAME`).
    Subdomains(String),
}

/// One validated pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern {
    /// The hosts.
    pub host: HostMatch,
    /// The port, or `None`: ports 80 and 443 for `allow`, every port for `deny`.
    pub port: Option<u16>,
    /// What tunnels to what it allows may carry; `None`: the port's default ([`TunnelMode`]).
    pub tunnel: Option<TunnelSetting>,
    /// The requests it allows (unlimited by default).
    pub requests: RequestRule,
}

impl HostPattern {
    /// Parses one pattern (see the module docs).
    ///
    /// # Errors
    /// [`PolicyError::Network`] naming the pattern and the expected form.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let bad = |source: PatternError| NetworkError::Pattern {
            pattern: text.to_owned(),
            source,
        };
        let text = text.trim();
        // The settings are the trailing words with a `=`; everything before them is the host
        // (a space inside it makes it an invalid host, reported as such).
        let words: Vec<&str> = text.split_whitespace().collect();
        let first_setting = words
            .iter()
            .rposition(|word| !word.contains('='))
            .map_or(0, |last_host_word| last_host_word + 1);
        let host_text = words[..first_setting].join(" ");
        let (text, words) = (host_text.as_str(), words[first_setting..].iter().copied());
        let mut tunnel = None;
        let mut requests = RequestRule::default();
        let mut seen_paths = false;
        for setting in words {
            let (key, value) = setting.split_once('=').ok_or_else(|| {
                bad(PatternError::Setting {
                    setting: setting.to_owned(),
                })
            })?;
            let unknown = || {
                bad(PatternError::Setting {
                    setting: setting.to_owned(),
                })
            };
            match key {
                TUNNEL_KEY => {
                    if tunnel.is_some() {
                        return Err(bad(PatternError::Repeated { key: TUNNEL_KEY }).into());
                    }
                    tunnel = Some(TunnelSetting::parse(value).ok_or_else(unknown)?);
                }
                METHODS_KEY => {
                    if requests.methods.is_some() {
                        return Err(bad(PatternError::Repeated { key: METHODS_KEY }).into());
                    }
                    requests.methods = Some(parse_methods(value).map_err(bad)?);
                }
                INSPECT_KEY => {
                    if requests.inspect {
                        return Err(bad(PatternError::Repeated { key: INSPECT_KEY }).into());
                    }
                    if value != "true" {
                        return Err(unknown().into());
                    }
                    requests.inspect = true;
                }
                PATHS_KEY => {
                    if seen_paths {
                        return Err(bad(PatternError::Repeated { key: PATHS_KEY }).into());
                    }
                    seen_paths = true;
                    requests.paths = parse_paths(value).map_err(bad)?;
                }
                _ => return Err(unknown().into()),
            }
        }
        if requests.inspect && !requests.is_limited() {
            return Err(bad(PatternError::InspectWithoutRequests).into());
        }
        if requests.is_limited() && tunnel == Some(TunnelSetting::Any) {
            return Err(bad(PatternError::RequestsWithAnyTunnel).into());
        }
        let (host, port) = split_port(text).map_err(bad)?;
        let host = if let Some(suffix) = host.strip_prefix("*.") {
            let name = normalize_name(suffix).map_err(|e| bad(e.into()))?;
            if !name.contains('.') {
                return Err(bad(PatternError::WildcardTooWide).into());
            }
            HostMatch::Subdomains(name)
        } else if host.contains('*') {
            return Err(bad(PatternError::WildcardInside).into());
        } else {
            HostMatch::Exact(Host::parse(host).map_err(|e| bad(e.into()))?)
        };
        Ok(Self {
            host,
            port,
            tunnel,
            requests,
        })
    }

    /// Whether the pattern covers `host:port`; `every_port_by_default` for deny patterns.
    pub fn matches(&self, host: &Host, port: u16, every_port_by_default: bool) -> bool {
        let canonical;
        let host = match host {
            Host::Ip(ip) => {
                canonical = Host::Ip(canonical_ip(*ip));
                &canonical
            }
            name => name,
        };
        let port_ok = match self.port {
            Some(p) => p == port,
            None => every_port_by_default || DEFAULT_ALLOWED_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (HostMatch::Exact(Host::Ip(expected)), Host::Ip(ip)) => {
                    canonical_ip(*expected) == *ip
                }
                (HostMatch::Exact(expected), host) => expected == host,
                (HostMatch::Subdomains(suffix), Host::Name(name)) => name
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                (HostMatch::Subdomains(_), Host::Ip(_)) => false,
            }
    }
}

/// Splits `host[:port]` (`[v6]:port`, bare v6 without a port).
fn split_port(text: &str) -> Result<(&str, Option<u16>), PatternError> {
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| PatternError::Port { port: p.to_owned() })
    };
    if text.starts_with('[') {
        let end = text.find(']').ok_or(PatternError::UnclosedBracket)?;
        let rest = &text[end + 1..];
        return match rest.strip_prefix(':') {
            Some(port) => Ok((&text[..=end], Some(parse_port(port)?))),
            None if rest.is_empty() => Ok((&text[..=end], None)),
            None => Err(PatternError::AfterBracket {
                rest: rest.to_owned(),
            }),
        };
    }
    if text.matches(':').count() > 1 {
        // A bare IPv6 literal.
        return Ok((text, None));
    }
    match text.split_once(':') {
        Some((host, port)) => Ok((host, Some(parse_port(port)?))),
        None => Ok((text, None)),
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Exact(host) => write!(f, "{host}")?,
            HostMatch::Subdomains(suffix) => write!(f, "*.{suffix}")?,
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        if let Some(tunnel) = self.tunnel {
            write!(f, " {TUNNEL_KEY}={}", tunnel.as_str())?;
        }
        if let Some(methods) = &self.requests.methods {
            write!(f, " {METHODS_KEY}={}", methods.join(","))?;
        }
        if !self.requests.paths.is_empty() {
            write!(f, " {PATHS_KEY}={}", self.requests.paths.join(","))?;
        }
        if self.requests.inspect {
            write!(f, " {INSPECT_KEY}=true")?;
        }
        Ok(())
    }
}

/// `GET,HEAD` or `read-only`, sorted and deduplicated.
fn parse_methods(value: &str) -> Result<Vec<String>, PatternError> {
    let mut methods: Vec<String> = if value == "read-only" {
        READ_ONLY_METHODS.iter().map(|m| (*m).to_owned()).collect()
    } else {
        value
            .split(',')
            .map(|method| {
                let ok = !method.is_empty()
                    && method.len() <= 32
                    && method.bytes().all(|b| b.is_ascii_uppercase());
                if ok {
                    Ok(method.to_owned())
                } else {
                    Err(PatternError::Method {
                        method: method.to_owned(),
                    })
                }
            })
            .collect::<Result<_, _>>()?
    };
    methods.sort();
    methods.dedup();
    Ok(methods)
}

/// `/a/,/b` path prefixes, sorted and deduplicated.
fn parse_paths(value: &str) -> Result<Vec<String>, PatternError> {
    let mut paths = value
        .split(',')
        .map(|path| {
            let ok = path.len() <= 256
                && !path.contains(['?', '#', '%', '\\'])
                && !path.chars().any(|c| c.is_whitespace() || c.is_control())
                && plain_path(path) == Some(path);
            if ok {
                Ok(path.to_owned())
            } else {
                Err(PatternError::PathPrefix {
                    path: path.to_owned(),
                })
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    paths.sort();
    paths.dedup();
    Ok(paths)
}

impl TryFrom<String> for HostPattern {
    type Error = PolicyError;

    fn try_from(text: String) -> Result<Self, PolicyError> {
        Self::parse(&text)
    }
}

impl From<HostPattern> for String {
    fn from(pattern: HostPattern) -> String {
        pattern.to_string()
    }
}

/// The pattern that would allow `host:port` (what a denial record suggests).
pub fn suggested_rule(host: &Host, port: u16) -> String {
    if DEFAULT_ALLOWED_PORTS.contains(&port) {
        host.to_string()
    } else {
        format!("{host}:{port}")
    }
}

/// Addresses reached only when an `allow` pattern names them: unspecified, loopback, private
/// (RFC 1918, unique-local), shared (100.64/10), link-local (cloud metadata), multicast,
/// broadcast, documentation and benchmarking ranges; embedded IPv4 forms are looked through
/// ([`canonical_ip`]).
pub fn is_special_address(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (segments[0] & 0xfe00) == 0xfc00
                || (segments[0] & 0xffc0) == 0xfe80
                || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    }
}

/// The one form of an address every allow and deny check compares: an IPv6 address that
/// carries an IPv4 address the packets end up at is that IPv4 address. Looked through:
/// IPv4-mapped (`::ffff:a.b.c.d`, what a dual-stack socket connects to over IPv4),
/// IPv4-translated (`::ffff:0:a.b.c.d`, SIIT), IPv4-compatible (`::a.b.c.d`, deprecated; not
/// `::` or `::1`), and the NAT64 prefixes with the address in the last 32 bits
/// (`64:ff9b::/96`, RFC 6052, and the local-use `64:ff9b:1::/48`, RFC 8215). Used by the
/// egress proxy and `http/request` alike.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    let s = v6.segments();
    let [.., hi, lo] = s;
    let embedded = IpAddr::V4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
    let compatible = s[..6] == [0; 6] && hi != 0;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    let local_nat64 = s[..3] == [0x64, 0xff9b, 1];
    if mapped || translated || compatible || nat64 || local_nat64 {
        embedded
    } else {
        ip
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn rules(allow: &[&str], deny: &[&str]) -> EgressRules {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        EgressRules::parse(&owned(allow), &owned(deny)).unwrap()
    }

    fn name(text: &str) -> Host {
        Host::parse(text).unwrap()
    }

    fn hosts(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("h{i}.{prefix}.test")).collect()
    }

    #[test]
    fn request_rules_parse_in_both_forms_and_limit_only_when_every_match_limits() {
        let limited = rules(
            &[
                "pypi.org methods=read-only paths=/simple/,/packages/",
                "files.test methods=GET",
            ],
            &[],
        );
        let scope = limited.request_scope(&name("pypi.org"), 443);
        assert!(scope.is_limited());
        assert!(scope.permits("GET", "/simple/requests/"));
        assert!(scope.permits("HEAD", "/packages/x.whl?sha=1"));
        for (method, target) in [
            ("POST", "/simple/requests/"),
            ("PUT", "/packages/x"),
            ("GET", "/legacy/"),
            ("GET", "/simple/../legacy/"),
            ("GET", "/simple/%2e%2e/legacy/"),
            ("GET", "/simple/%2F..%2Flegacy"),
            ("GET", "/simple\\..\\legacy"),
            ("GET", "/simple/..;/legacy"),
            ("GET", "/simple/%252e%252e/legacy"),
            ("GET", "//evil/simple/"),
            ("GET", "simple/"),
            ("get", "/simple/"),
        ] {
            assert!(!scope.permits(method, target), "{method} {target}");
        }
        assert_eq!(
            scope.describe(),
            "methods=GET,HEAD,OPTIONS paths=/packages/,/simple/"
        );
        let files = limited.request_scope(&name("files.test"), 80);
        assert!(files.permits("GET", "/anything") && !files.permits("POST", "/anything"));
        // One matching pattern without limits lifts them.
        let both = rules(&["pypi.org methods=GET", "pypi.org:443"], &[]);
        assert_eq!(
            both.request_scope(&name("pypi.org"), 443),
            RequestScope::Any
        );
        assert!(both.request_scope(&name("pypi.org"), 80).is_limited());
        // The table form says the same, and prints back as the string form.
        let table: AllowEntry = serde_json::from_value(serde_json::json!(
            {"pattern": "pypi.org", "methods": "read-only", "paths": ["/simple/"]}
        ))
        .unwrap();
        let pattern = HostPattern::parse(&table.to_pattern_text()).unwrap();
        assert_eq!(
            pattern.to_string(),
            "pypi.org methods=GET,HEAD,OPTIONS paths=/simple/"
        );
        assert_eq!(HostPattern::parse(&pattern.to_string()).unwrap(), pattern);
    }

    #[test]
    fn inspect_parses_in_both_forms_and_inspects_only_limited_destinations() {
        let rules = EgressRules::parse(
            &[
                "a.test methods=read-only inspect=true".to_owned(),
                "b.test methods=GET".to_owned(),
            ],
            &[],
        )
        .unwrap();
        assert!(rules.inspects_any());
        let a = Host::parse("a.test").unwrap();
        assert!(rules.request_scope(&a, 443).inspects());
        assert!(
            !rules
                .request_scope(&Host::parse("b.test").unwrap(), 443)
                .inspects()
        );
        assert_eq!(
            rules.allow[0].to_string(),
            "a.test methods=GET,HEAD,OPTIONS inspect=true"
        );
        // An unlimited pattern for the same host lifts the limits, and with them inspection.
        let wider = rules.extended(&["a.test".to_owned()], &[]).unwrap();
        assert!(!wider.request_scope(&a, 443).inspects());
        let table: AllowEntry = serde_json::from_str(
            r#"{"pattern": "a.test", "methods": "read-only", "inspect": true}"#,
        )
        .unwrap();
        assert_eq!(
            table.to_pattern_text(),
            "a.test methods=read-only inspect=true"
        );
        assert!(
            !EgressRules::parse(&["a.test methods=GET".to_owned()], &[])
                .unwrap()
                .inspects_any()
        );
    }

    #[test]
    fn request_rules_that_cannot_hold_are_refused_when_parsed() {
        let owned = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        for (allow, deny, says) in [
            (
                &["a.test methods=get"][..],
                &[][..],
                "is not an HTTP method",
            ),
            (&["a.test methods="], &[], "is not an HTTP method"),
            (&["a.test paths=simple/"], &[], "is not a path prefix"),
            (&["a.test paths=/a/../b"], &[], "is not a path prefix"),
            (&["a.test paths=/a%2f"], &[], "is not a path prefix"),
            (&["a.test methods=GET methods=POST"], &[], "given twice"),
            (
                &["a.test methods=GET tunnel=any"],
                &[],
                "tunnel=any carries",
            ),
            (&["a.test verbs=GET"], &[], "is not a pattern setting"),
            (&["a.test inspect=true"], &[], "inspect=true needs methods="),
            (
                &["a.test methods=GET inspect=yes"],
                &[],
                "is not a pattern setting",
            ),
            (
                &["a.test methods=GET inspect=true inspect=true"],
                &[],
                "given twice",
            ),
            (&[], &["a.test methods=GET"], "apply to allow patterns only"),
        ] {
            let error = EgressRules::parse(&owned(allow), &owned(deny))
                .err()
                .unwrap_or_else(|| panic!("{allow:?} {deny:?} was accepted"))
                .to_string();
            assert!(error.contains(says), "{allow:?} {deny:?}: {error}");
        }
    }

    #[test]
    fn an_allowlist_holds_max_egress_patterns_and_one_more_is_refused() {
        let at_limit = EgressRules::parse(&hosts("a", MAX_EGRESS_PATTERNS), &[]).unwrap();
        assert_eq!(at_limit.allow.len(), MAX_EGRESS_PATTERNS);
        for (allow, deny) in [
            (hosts("a", MAX_EGRESS_PATTERNS + 1), Vec::new()),
            (hosts("a", MAX_EGRESS_PATTERNS), hosts("d", 1)),
        ] {
            let err = EgressRules::parse(&allow, &deny).unwrap_err().to_string();
            assert!(err.contains("MAX_EGRESS_PATTERNS"), "{err}");
        }
        // Counted after named sets expand.
        let set = EgressRules::parse(&["@package-registries".to_owned()], &[])
            .unwrap()
            .allow
            .len();
        let mut allow = hosts("a", MAX_EGRESS_PATTERNS - set);
        allow.push("@package-registries".to_owned());
        EgressRules::parse(&allow, &[]).unwrap();
        allow.push("one-more.test".to_owned());
        let err = EgressRules::parse(&allow, &[]).unwrap_err().to_string();
        assert!(err.contains("MAX_EGRESS_PATTERNS"), "{err}");
    }

    #[test]
    fn exact_host_allows_default_ports_only() {
        let r = rules(&["pypi.org"], &[]);
        assert_eq!(
            r.decide(&name("pypi.org"), 443),
            Decision::Allowed("pypi.org".into())
        );
        assert_eq!(
            r.decide(&name("pypi.org"), 80),
            Decision::Allowed("pypi.org".into())
        );
        assert_eq!(
            r.decide(&name("pypi.org"), 22),
            Decision::Denied(Refusal::NotAllowed)
        );
        assert_eq!(
            r.decide(&name("evil.pypi.org"), 443),
            Decision::Denied(Refusal::NotAllowed)
        );
    }

    #[test]
    fn wildcard_matches_subdomains_not_the_domain_or_lookalikes() {
        let r = rules(&["*.crates.io"], &[]);
        assert!(matches!(
            r.decide(&name("static.crates.io"), 443),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            r.decide(&name("a.b.crates.io"), 443),
            Decision::Allowed(_)
        ));
        for host in ["crates.io", "evilcrates.io", "crates.io.evil.com"] {
            assert_eq!(
                r.decide(&name(host), 443),
                Decision::Denied(Refusal::NotAllowed),
                "{host}"
            );
        }
    }

    #[test]
    fn deny_wins_over_allow_on_every_port() {
        let r = rules(
            &["*.example.com", "example.com:8443"],
            &["secret.example.com"],
        );
        assert_eq!(
            r.decide(&name("secret.example.com"), 443),
            Decision::Denied(Refusal::DeniedByRule("secret.example.com".into()))
        );
        assert!(matches!(
            r.decide(&name("www.example.com"), 443),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            r.decide(&name("example.com"), 8443),
            Decision::Allowed(_)
        ));
    }

    #[test]
    fn names_are_case_insensitive_and_idna_normalised() {
        let r = rules(&["Bücher.Example"], &[]);
        assert_eq!(r.allow[0].to_string(), "xn--bcher-kva.example");
        assert!(matches!(
            r.decide(&name("xn--BCHER-kva.example."), 443),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            r.decide(&name("BÜCHER.example"), 443),
            Decision::Allowed(_)
        ));
    }

    #[test]
    fn ip_literals_are_reached_only_when_listed() {
        let r = rules(&["*.example.com", "127.0.0.1:8080", "[::1]:9000"], &[]);
        assert_eq!(
            r.decide(&name("93.184.216.34"), 443),
            Decision::Denied(Refusal::NotAllowed)
        );
        assert!(matches!(
            r.decide(&name("127.0.0.1"), 8080),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            r.decide(&name("[::1]"), 9000),
            Decision::Allowed(_)
        ));
        assert!(r.address_allowed("127.0.0.1".parse().unwrap(), 8080, &|_| false));
        assert!(!r.address_allowed("127.0.0.1".parse().unwrap(), 8081, &|_| false));
        assert!(!r.address_allowed("169.254.169.254".parse().unwrap(), 80, &|_| false));
        assert!(!r.address_allowed("::ffff:10.0.0.1".parse().unwrap(), 443, &|_| false));
        assert!(r.address_allowed("93.184.216.34".parse().unwrap(), 443, &|_| false));
    }

    #[test]
    fn embedded_ipv4_forms_are_checked_as_their_ipv4_address() {
        let r = rules(&["*.example.com", "127.0.0.1:8080"], &["11.22.33.5"]);
        for form in [
            "11.22.33.5",
            "::ffff:11.22.33.5",
            "::ffff:0:11.22.33.5",
            "::11.22.33.5",
            "64:ff9b::11.22.33.5",
            "64:ff9b:1::11.22.33.5",
        ] {
            let ip: IpAddr = form.parse().unwrap();
            assert_eq!(
                canonical_ip(ip),
                "11.22.33.5".parse::<IpAddr>().unwrap(),
                "{form}"
            );
            assert!(
                !r.address_allowed(ip, 443, &|_| false),
                "{form} passed the deny pattern"
            );
            assert!(
                matches!(r.decide(&Host::Ip(ip), 443), Decision::Denied(_)),
                "{form}"
            );
        }
        for form in ["::ffff:127.0.0.1", "64:ff9b::7f00:1", "::127.0.0.1"] {
            let ip: IpAddr = form.parse().unwrap();
            assert!(is_special_address(ip), "{form}");
            assert!(
                r.address_allowed(ip, 8080, &|_| false),
                "{form}: the named address"
            );
            assert!(!r.address_allowed(ip, 8081, &|_| false), "{form}");
        }
        // The control: public addresses, and IPv6 addresses that carry none, stay themselves.
        assert!(r.address_allowed("11.22.33.6".parse().unwrap(), 443, &|_| false));
        assert!(r.address_allowed("::ffff:11.22.33.6".parse().unwrap(), 443, &|_| false));
        for form in ["::1", "::", "2001:db8::1", "2606:4700::1"] {
            let ip: IpAddr = form.parse().unwrap();
            assert_eq!(canonical_ip(ip), ip, "{form}");
        }
        assert_eq!(name("[::ffff:10.0.0.1]"), name("10.0.0.1"));
    }

    #[test]
    fn the_hosts_own_addresses_are_reached_only_when_named() {
        let r = rules(&["*.example.com", "11.22.33.5:8080"], &[]);
        let own: [IpAddr; 2] = [
            "11.22.33.5".parse().unwrap(),
            "2606:4700::5".parse().unwrap(),
        ];
        let is_own = |ip: IpAddr| own.contains(&ip);
        for form in ["11.22.33.5", "::ffff:11.22.33.5", "2606:4700::5"] {
            let ip: IpAddr = form.parse().unwrap();
            assert!(!r.address_allowed(ip, 443, &is_own), "{form}");
            // The control: not an address of this host, so public.
            assert!(r.address_allowed(ip, 443, &|_| false), "{form}");
        }
        assert!(r.address_allowed("11.22.33.5".parse().unwrap(), 8080, &is_own));
        assert!(r.address_allowed("11.22.33.6".parse().unwrap(), 443, &is_own));
    }

    #[test]
    fn bad_patterns_are_refused_with_the_expected_form() {
        for bad in [
            "*",
            "*.com",
            "a*.example.com",
            "example.com:0",
            "example.com:99999",
            "exa mple.com",
            "",
            "@no-such-set",
        ] {
            let err = EgressRules::parse(&[bad.to_owned()], &[]).unwrap_err();
            assert!(err.to_string().contains("expected"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_bad_pattern_names_the_pattern_and_its_fault_once() {
        let fault = |text: &str| match EgressRules::parse(&[text.to_owned()], &[]) {
            Err(PolicyError::Network(NetworkError::Pattern { pattern, source })) => {
                (pattern, source)
            }
            other => panic!("{text}: expected a pattern error, got {other:?}"),
        };
        let (pattern, source) = fault("example.com:0");
        assert_eq!(pattern, "example.com:0");
        assert!(matches!(source, PatternError::Port { port } if port == "0"));
        assert!(matches!(fault("*.com").1, PatternError::WildcardTooWide));
        assert!(matches!(
            fault("a*.example.com").1,
            PatternError::WildcardInside
        ));
        assert!(matches!(fault("[::1]x").1, PatternError::AfterBracket { rest } if rest == "x"));
        let (_, source) = fault("exa mple.com");
        assert!(
            matches!(&source, PatternError::Host(HostNameError { host, .. }) if host == "exa mple.com"),
            "{source:?}"
        );
        let message = EgressRules::parse(&["exa mple.com".to_owned()], &[])
            .unwrap_err()
            .to_string();
        assert_eq!(
            message.matches("invalid network policy").count(),
            1,
            "{message}"
        );
    }

    #[test]
    fn named_sets_expand_and_every_shipped_line_parses() {
        let r = rules(&["@package-registries"], &[]);
        assert!(matches!(
            r.decide(&name("pypi.org"), 443),
            Decision::Allowed(_)
        ));
        assert!(matches!(
            r.decide(&name("static.crates.io"), 443),
            Decision::Allowed(_)
        ));
        assert_eq!(
            r.decide(&name("example.com"), 443),
            Decision::Denied(Refusal::NotAllowed)
        );
        rules(&["@git-hosts"], &[]);
    }

    #[test]
    fn tunnel_settings_parse_in_every_form_and_the_widest_matching_one_applies() {
        let r = rules(
            &[
                "db.corp.test:5432 tunnel=any",
                "*.corp.test:5432",
                "web.test",
                "tls.test:8443  tunnel=tls-only",
            ],
            &[],
        );
        let mode = |h: &str, p: u16| r.tunnel_mode(&name(h), p);
        assert_eq!(mode("db.corp.test", 5432), TunnelMode::Any);
        assert_eq!(mode("x.corp.test", 5432), TunnelMode::Checked);
        assert_eq!(mode("web.test", 443), TunnelMode::TlsOnly);
        assert_eq!(mode("web.test", 80), TunnelMode::Checked);
        assert_eq!(mode("tls.test", 8443), TunnelMode::TlsOnly);
        assert_eq!(
            r.allow.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "*.corp.test:5432",
                "db.corp.test:5432 tunnel=any",
                "tls.test:8443 tunnel=tls-only",
                "web.test"
            ]
        );
        // The table form, on the wire and in TOML, means the same and round-trips as text.
        let wire: NetworkPolicy = serde_json::from_str(
            r#"{"allow": [{"pattern": "db.test:5432", "tunnel": "any"}, "web.test"]}"#,
        )
        .unwrap();
        #[derive(Deserialize)]
        struct Profile {
            network: NetworkPolicy,
        }
        let toml: Profile = toml::from_str(
            "network = { allow = [{ pattern = \"db.test:5432\", tunnel = \"any\" }, \"web.test\"] }",
        )
        .unwrap();
        assert_eq!(wire, toml.network);
        let NetworkPolicy::Allowlist(parsed) = &wire else {
            panic!("{wire:?}");
        };
        assert_eq!(parsed.tunnel_mode(&name("db.test"), 5432), TunnelMode::Any);
        let json = serde_json::to_string(&wire).unwrap();
        assert_eq!(
            json,
            r#"{"allow":["db.test:5432 tunnel=any","web.test"],"deny":[]}"#
        );
        assert_eq!(serde_json::from_str::<NetworkPolicy>(&json).unwrap(), wire);
        // Unknown settings, modes and keys, and a setting on a deny pattern, fail closed.
        for bad in [
            "db.test tunnel=sometimes",
            "db.test mode=any",
            "db.test tunnel=",
        ] {
            let err = EgressRules::parse(&[bad.to_owned()], &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains("tunnel=any"), "{bad}: {err}");
        }
        let err = EgressRules::parse(&[], &["db.test tunnel=any".to_owned()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("allow patterns only"), "{err}");
        assert!(
            serde_json::from_str::<NetworkPolicy>(
                r#"{"allow": [{"pattern": "db.test", "tunnel": "any", "extra": 1}]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn wire_forms_round_trip() {
        for (text, expected) in [
            (r#""off""#, NetworkPolicy::Off),
            (r#"true"#, NetworkPolicy::On),
            (r#""enabled""#, NetworkPolicy::On),
        ] {
            let parsed: NetworkPolicy = serde_json::from_str(text).unwrap();
            assert_eq!(parsed, expected);
        }
        let parsed: NetworkPolicy =
            serde_json::from_str(r#"{"allow": ["PyPI.org", "*.crates.io:443"], "deny": []}"#)
                .unwrap();
        let json = serde_json::to_string(&parsed).unwrap();
        assert_eq!(
            json,
            r#"{"allow":["*.crates.io:443","pypi.org"],"deny":[]}"#
        );
        assert!(serde_json::from_str::<NetworkPolicy>(r#"{"allow": [], "extra": 1}"#).is_err());
        assert!(serde_json::from_str::<NetworkPolicy>(r#""sometimes""#).is_err());
    }
}
