//! Hosts and the patterns that match them (see the grammar in the module docs above).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::address::canonical_ip;
use super::error::{HostNameError, NetworkError, PatternError};
use super::request::{RequestRule, TunnelSetting, plain_path};
use super::{
    DEFAULT_ALLOWED_PORTS, INSPECT_KEY, MAX_HOST_NAME_BYTES, METHODS_KEY, PATHS_KEY,
    READ_ONLY_METHODS, TUNNEL_KEY,
};
use crate::policy::PolicyError;

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
    /// What tunnels to what it allows may carry; `None`: the port's default ([`TunnelMode`](super::request::TunnelMode)).
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
