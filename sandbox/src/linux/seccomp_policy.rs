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

/// One classic-BPF instruction: `(code, jt, jf, k)`.
pub type Insn = (u16, u8, u8, u32);

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// `AUDIT_ARCH_*` of a supported architecture (Rust's `target_arch` name).
pub fn audit_arch(arch: &str) -> Option<u32> {
    match arch {
        "x86_64" => Some(0xc000_003e),
        "aarch64" => Some(0xc000_00b7),
        "riscv64" => Some(0xc000_00f3),
        _ => None,
    }
}

/// Compiles the allow-list (rules without argument conditions, `match_action` `allow`,
/// `mismatch_action` `{"errno": N}`) into a compact program: the allowed syscall numbers as
/// ranges (`jge lo; jgt hi`), so a 290-name list is about 150 instructions instead of the
/// ~1,500 of a rule-by-rule compile, which the kernel converts and JIT-compiles on every
/// sandbox start. A foreign architecture is killed.
///
/// # Errors
/// A message when a rule has conditions (they belong in `restrictions.json`), a name has no
/// number on `arch`, the actions are not the expected ones, or the program's jumps do not fit.
pub fn compile_allow_list(
    filter: &Filter,
    arch: &str,
    number: impl Fn(&str) -> Option<i64>,
) -> Result<Vec<Insn>, String> {
    let audit = audit_arch(arch).ok_or_else(|| format!("no AUDIT_ARCH for {arch}"))?;
    if filter.match_action != serde_json::json!("allow") {
        return Err("the allow-list's match_action must be \"allow\"".to_owned());
    }
    let errno = filter
        .mismatch_action
        .get("errno")
        .and_then(Value::as_u64)
        .and_then(|e| u32::try_from(e).ok())
        .ok_or_else(|| "the allow-list's mismatch_action must be {\"errno\": N}".to_owned())?;
    let mut numbers = Vec::new();
    for rule in &filter.filter {
        if !rule.args.is_empty() {
            return Err(format!(
                "allow-list rule for {} has argument conditions; refuse the arguments in \
                 restrictions.json instead",
                rule.syscall
            ));
        }
        let nr = number(&rule.syscall)
            .and_then(|nr| u32::try_from(nr).ok())
            .ok_or_else(|| format!("{} has no syscall number on {arch}", rule.syscall))?;
        numbers.push(nr);
    }
    numbers.sort_unstable();
    numbers.dedup();
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for nr in numbers {
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == nr => *hi = nr,
            _ => ranges.push((nr, nr)),
        }
    }
    let body: usize = ranges
        .iter()
        .map(|(lo, hi)| if lo == hi { 1 } else { 2 })
        .sum();
    let first = 4; // ld arch; jeq; ret kill; ld nr
    let deny = first + body;
    let allow = deny + 1;
    let offset = |from: usize, to: usize| {
        u8::try_from(to - from - 1)
            .map_err(|_| "the allow-list's ranges need jumps longer than 255".to_owned())
    };
    let mut program: Vec<Insn> = vec![
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        (BPF_JEQ_K, 1, 0, audit),
        (BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
    ];
    for (lo, hi) in ranges {
        let at = program.len();
        if lo == hi {
            program.push((BPF_JEQ_K, offset(at, allow)?, 0, lo));
        } else {
            // Below `lo`: no later (higher) range matches either.
            program.push((BPF_JGE_K, 0, offset(at, deny)?, lo));
            program.push((BPF_JGT_K, 0, offset(at + 1, allow)?, hi));
        }
    }
    program.push((BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno));
    program.push((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW));
    Ok(program)
}
