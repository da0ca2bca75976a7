//! A validated allowlist and the decisions it makes about destinations.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::address::{canonical_ip, is_special_address};
use super::error::{NetworkError, PatternError};
use super::pattern::{Host, HostPattern};
use super::request::{RequestScope, TLS_ONLY_PORTS, TunnelMode, TunnelSetting};
use super::{MAX_EGRESS_PATTERNS, NAMED_SETS};
use crate::policy::PolicyError;

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
