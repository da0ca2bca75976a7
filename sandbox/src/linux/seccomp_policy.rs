//! The seccomp policy files as data (firecracker's JSON shape plus two selectors): parsing,
//! the rule that every rule and condition says why it exists, and picking the rules of one
//! variant. Shared, through `#[path]`, by `build.rs` (which compiles the variants to BPF) and by
//! [`super::seccomp`] (`--explain`, golden lists, and the test that the embedded BPF is fresh), so
//! the two cannot select differently.
//!
//! The files, in installation order:
//! - `restrictions.json`: calls refused with `EPERM` whatever the allow-list says, so a refusal
//!   of a dangerous call reads as "not permitted";
//! - `audit.json`: calls refused only under the denial audit (a command must not hide its own
//!   denials behind a nested Landlock domain or seccomp filter);
//! - `allow.json`: the allow-list. Everything it does not name gets `ENOSYS`, so a syscall added
//!   to the kernel later is refused until someone reviews it, and libc falls back as it does on
//!   an older kernel.
//!
//! Selectors on a rule: `arches` (the rule exists only on these architectures, e.g. x86_64's
//! legacy `open`) and `network` (`"on"` or `"off"`: the rule belongs to that network variant
//! only).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The policy files and the name of the one filter each holds, in installation order.
pub const POLICY_FILES: [(&str, &str); 3] = [
    ("restrictions.json", "restrictions"),
    ("audit.json", "audit"),
    ("allow.json", "allow"),
];

/// One filter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Action when no rule matches.
    pub mismatch_action: Value,
    /// Action when a rule matches.
    pub match_action: Value,
    /// The rules.
    pub filter: Vec<Rule>,
}

/// One rule: the syscall matches when all `args` conditions hold (rules for the same syscall
/// are alternatives).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Syscall name.
    pub syscall: String,
    /// Conditions (all must hold).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Condition>,
    /// Why the rule exists (required).
    pub comment: String,
    /// Architectures the syscall exists on (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arches: Vec<String>,
    /// The network variant the rule belongs to (`"on"`/`"off"`; absent: both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// A condition on one argument.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Argument index.
    pub index: u8,
    /// `dword` (32-bit) or `qword`.
    #[serde(rename = "type")]
    pub len: String,
    /// `eq`, `ne`, `{"masked_eq": MASK}`, ...
    pub op: Value,
    /// Value compared.
    pub val: u64,
    /// What is compared and why (required).
    pub comment: String,
}

/// Parses one policy file and checks that every rule and condition carries a comment and
/// every selector is known.
///
/// # Errors
/// A message naming the problem (the caller names the file).
pub fn parse(text: &str) -> Result<BTreeMap<String, Filter>, String> {
    let filters: BTreeMap<String, Filter> =
        serde_json::from_str(text).map_err(|err| err.to_string())?;
    for (name, filter) in &filters {
        for rule in &filter.filter {
            let uncommented = rule.comment.trim().is_empty()
                || rule.args.iter().any(|c| c.comment.trim().is_empty());
            if uncommented {
                return Err(format!("{name}: rule for {} lacks a comment", rule.syscall));
            }
            if let Some(network) = rule.network.as_deref()
                && network != "on"
                && network != "off"
            {
                return Err(format!(
                    "{name}: rule for {}: network must be \"on\" or \"off\" (got {network:?})",
                    rule.syscall
                ));
            }
        }
    }
    Ok(filters)
}

/// The rules of `filter` that apply on `arch` with the network on or off.
pub fn select(filter: &Filter, arch: &str, network_allowed: bool) -> Filter {
    let variant = if network_allowed { "on" } else { "off" };
    Filter {
        mismatch_action: filter.mismatch_action.clone(),
        match_action: filter.match_action.clone(),
        filter: filter
            .filter
            .iter()
            .filter(|rule| rule.arches.is_empty() || rule.arches.iter().any(|a| a == arch))
            .filter(|rule| rule.network.as_deref().is_none_or(|n| n == variant))
            .cloned()
            .collect(),
    }
}

/// The JSON seccompiler reads for one selected filter (the selectors removed).
///
/// # Errors
/// The serializer's message.
pub fn seccompiler_json(name: &str, filter: &Filter) -> Result<Vec<u8>, String> {
    let mut plain = filter.clone();
    for rule in &mut plain.filter {
        rule.arches.clear();
        rule.network = None;
    }
    serde_json::to_vec(&BTreeMap::from([(name, plain)])).map_err(|err| err.to_string())
}
