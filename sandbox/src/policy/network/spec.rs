//! The `network` value as written (TOML and the wire), before it is validated.

use serde::{Deserialize, Serialize};

use super::{INSPECT_KEY, METHODS_KEY, PATHS_KEY, TUNNEL_KEY};

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
        schemars(schema_with = "crate::policy::schema_aliases::network_mode")
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
    pub(super) fn to_pattern_text(&self) -> String {
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
