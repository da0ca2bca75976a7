//! What the outer `sandbox-run` hands the proxy, and what the proxy reports back.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::policy::network::{Decision, EgressRules, Host, Refusal, suggested_rule};

/// `text` with every control character (C0, DEL, C1) and bidirectional formatting character
/// written as a Rust escape (`\n`, `\u{1b}`, `\u{202e}`): one line that shows what it says.
/// Printable text, backslashes included, is left alone, so escaping twice changes nothing.
pub fn escape_control(text: &str) -> String {
    let bidi = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(|c| c.is_control() || bidi(c)) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() || bidi(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The proxy's whole configuration (JSON in a sealed memfd, read once before it confines
/// itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// The allowlist.
    pub rules: EgressRules,
    /// The supervisor's own TCP ports: refused on every local address even when a pattern
    /// allows them.
    pub denied_ports: Vec<u16>,
    /// Name to address mapping consulted before the system resolver (hosts-file format).
    pub hosts: Vec<(String, IpAddr)>,
    /// The `Proxy-Authorization` value sent to the upstream proxy
    /// ([`EgressRules::upstream`]), read from the credentials file by the outer: it lives in
    /// this sealed memfd and the proxy's memory, never in an argument or the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_authorization: Option<String>,
    /// Ask before refusing a name the allowlist does not allow ([`super::ask`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<super::ask::AskConfig>,
    /// The roots (PEM) an inspected destination's certificate is verified against, instead of
    /// the host's trust store. For tests: a local server with a certificate from a test CA is
    /// trusted by the proxy alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_roots: Option<Vec<String>>,
}

/// One decision of the proxy (a JSON line on its event descriptor).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressEvent {
    /// When (RFC 3339, UTC, milliseconds).
    pub time: String,
    /// Whether the connection was let through.
    pub allowed: bool,
    /// How the client asked: `connect`, `http` or `socks5`.
    pub protocol: String,
    /// The host as the client named it (normalised).
    pub host: String,
    /// The port.
    pub port: u16,
    /// Allowed: the pattern that allowed it. Refused: the pattern that would allow it, or why
    /// none would.
    pub rule: String,
    /// Refused: why, in plain words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Allowed though the allowlist refuses it: who approved it, for what scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// An approval given when the proxy asked ([`super::ask`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Who approved it: `terminal` (`sandbox-run --ask`) or `client` (exec-server's client).
    pub by: String,
    /// `connection`, `process` or `session`; `remembered` when an earlier approval for the
    /// process covered it.
    pub scope: String,
}

impl EgressEvent {
    /// An allowed destination.
    pub fn allowed(protocol: &str, host: &Host, port: u16, rule: &str) -> Self {
        Self {
            time: now_rfc3339(),
            allowed: true,
            protocol: protocol.to_owned(),
            host: host.to_string(),
            port,
            rule: rule.to_owned(),
            reason: None,
            approval: None,
        }
    }

    /// A destination the allowlist refuses, let through by an approval.
    pub fn approved(protocol: &str, host: &Host, port: u16, approval: Approval) -> Self {
        let rule = format!("approved by the {} ({})", approval.by, approval.scope);
        Self {
            approval: Some(approval),
            ..Self::allowed(protocol, host, port, &rule)
        }
    }

    /// A refused destination; `rule` says what would allow it. Every text is escaped
    /// ([`escape_control`]): names a client chose (an SNI, a Host header) end up in them.
    pub fn refused(protocol: &str, host: &str, port: u16, rule: String, reason: String) -> Self {
        Self {
            time: now_rfc3339(),
            allowed: false,
            protocol: escape_control(protocol),
            host: escape_control(host),
            port,
            rule: escape_control(&rule),
            reason: Some(escape_control(&reason)),
            approval: None,
        }
    }

    /// The refusal for a name the allowlist does not allow.
    pub fn from_decision(protocol: &str, host: &Host, port: u16, decision: &Decision) -> Self {
        match decision {
            Decision::Allowed(rule) => Self::allowed(protocol, host, port, rule),
            Decision::Denied(Refusal::NotAllowed) => Self::refused(
                protocol,
                &host.to_string(),
                port,
                format!("--allow-domain {}", suggested_rule(host, port)),
                "not in the allowlist".to_owned(),
            ),
            Decision::Denied(Refusal::DeniedByRule(rule)) => Self::refused(
                protocol,
                &host.to_string(),
                port,
                format!("remove the deny pattern {rule:?}"),
                format!("denied by the pattern {rule:?}"),
            ),
        }
    }

    /// `host:port` (`[v6]:port` for IPv6 literals, which [`Host`]'s display already brackets).
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The one-line message `sandbox-run` prints for a refusal when no audit runs, control
    /// characters escaped (the event comes from the proxy, which handles what the command
    /// sent: it cannot forge lines on the terminal).
    pub fn describe(&self) -> String {
        escape_control(&format!(
            "egress proxy refused {} ({}): {}; to allow it: {}",
            self.address(),
            self.protocol,
            self.reason.as_deref().unwrap_or("refused"),
            self.rule
        ))
    }

    /// The denial record of a refusal (layer `proxy`, operation `net.connect`).
    pub fn to_denial(&self) -> crate::denial::Denial {
        crate::denial::Denial {
            time: self.time.clone(),
            pid: None,
            exe: None,
            layer: crate::denial::Layer::Proxy,
            operation: "net.connect".to_owned(),
            path: None,
            address: Some(self.address()),
            syscall: None,
            errno: None,
            allow_rule: self.rule.clone(),
        }
    }
}

/// The current time as RFC 3339 UTC with milliseconds (no time-zone database needed).
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:03}Z",
        now.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }

    #[test]
    fn control_characters_are_escaped_in_refusals_and_their_line() {
        let forged = "evil.test\nsandbox-run: forged\u{1b}[31m\u{202e}";
        let event = EgressEvent::refused(
            "connect",
            forged,
            443,
            format!("open the tunnel to {forged}"),
            format!("name {forged}"),
        );
        let escaped = "evil.test\\nsandbox-run: forged\\u{1b}[31m\\u{202e}";
        assert_eq!(event.host, escaped);
        assert_eq!(event.rule, format!("open the tunnel to {escaped}"));
        let line = event.describe();
        assert!(!line.chars().any(char::is_control), "{line}");
        assert!(line.contains(escaped), "{line}");
        // The control: printable text, backslashes included, is left as it is.
        assert_eq!(escape_control("a.test:443 \\n ok"), "a.test:443 \\n ok");
        assert_eq!(escape_control(escaped), escaped);
    }

    #[test]
    fn refusals_name_the_rule_that_would_allow_them() {
        let host = Host::parse("evil.example").unwrap();
        let event = EgressEvent::from_decision(
            "connect",
            &host,
            8443,
            &Decision::Denied(Refusal::NotAllowed),
        );
        assert_eq!(event.rule, "--allow-domain evil.example:8443");
        let denial = event.to_denial();
        assert_eq!(denial.address.as_deref(), Some("evil.example:8443"));
        assert_eq!(denial.operation, "net.connect");
    }
}
