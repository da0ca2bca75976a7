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
//!   the requests inside (the `egress` crate's `terminate`). A path prefix applies to the request target without its
//!   query; a target with a dot segment (`..;` too), an encoded dot, slash, backslash or
//!   percent, a backslash or `//` is refused where a prefix applies (a server could read it
//!   as another path).
//!
//! Names are compared case-insensitively after IDNA normalisation (`bücher.example` and
//! `xn--bcher-kva.example` are one host). `deny` wins over `allow`. A destination that
//! resolves to a loopback, private, link-local or otherwise special address is refused unless
//! an `allow` pattern names that address itself (so a public name rebound to `127.0.0.1`
//! reaches nothing local).

mod address;
mod error;
mod pattern;
mod request;
mod rules;
mod spec;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use super::PolicyError;

pub use address::{canonical_ip, is_special_address};
pub use error::{HostNameError, NetworkError, PatternError};
pub use pattern::{Host, HostMatch, HostPattern, suggested_rule};
pub use request::{RequestRule, RequestScope, TLS_ONLY_PORTS, TunnelMode, TunnelSetting};
pub use rules::{DEFAULT_UPSTREAM_PORT, Decision, EgressRules, Refusal, UpstreamProxy};
pub use spec::{AllowEntry, AllowTable, AllowlistSpec, MethodsSpec, NetworkSetting};

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
        include_str!("../../../../policies/egress/package-registries.txt"),
    ),
    (
        "git-hosts",
        include_str!("../../../../policies/egress/git-hosts.txt"),
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
