//! The seccomp layer, generated from `policies/seccomp/*.json` (firecracker's JSON shape; every
//! rule and every argument condition carries a `comment`, which [`load`] requires).
//!
//! Filters installed:
//! - `x32_guard` (x86_64 only, hand-written BPF): kills any other architecture (`int 0x80`
//!   enters as i386) and refuses x32 syscall numbers (`nr | 0x40000000`), which would
//!   otherwise slip past rules written for x86_64 numbers;
//! - `restrictions` (`EPERM`): ptrace, process_vm_*, io_uring_*, bpf, perf_event_open, keyring,
//!   the mount family, unshare/setns, namespace-creating clone, TIOCSTI/TIOCLINUX (32-bit
//!   compare), module and kexec calls;
//! - `clone3` (`ENOSYS`): its flags are in memory, so libc is made to fall back to `clone`;
//! - `no_network` (`EPERM`, only with the network off): `socket`/`socketpair` of any family
//!   but `AF_UNIX`. `connect`, `sendmsg` and friends stay allowed: without a non-unix socket
//!   they can only reach unix sockets (which a helper's `SCM_RIGHTS` needs).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, TargetArch};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `policies/seccomp/restrictions.json`.
pub const RESTRICTIONS_JSON: &str = include_str!("../../../policies/seccomp/restrictions.json");
/// `policies/seccomp/no-network.json`.
pub const NO_NETWORK_JSON: &str = include_str!("../../../policies/seccomp/no-network.json");

/// One filter in firecracker's shape.
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

/// One rule: the syscall matches when all `args` conditions hold.
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

/// Why the seccomp layer failed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// A policy file does not match the shape.
    #[error("seccomp policy {file} is malformed: {message}")]
    Policy {
        /// The file.
        file: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Compiling or installing failed.
    #[error("seccomp filter {name}: {message}")]
    Install {
        /// The filter.
        name: String,
        /// The error.
        message: String,
    },
}

/// Parses one embedded policy file, requiring a non-empty comment on every rule and condition.
///
/// # Errors
/// [`SeccompError::Policy`] naming the file and the problem.
pub fn load(file: &'static str, text: &str) -> Result<BTreeMap<String, Filter>, SeccompError> {
    let filters: BTreeMap<String, Filter> =
        serde_json::from_str(text).map_err(|err| SeccompError::Policy {
            file,
            message: err.to_string(),
        })?;
    for (name, filter) in &filters {
        for rule in &filter.filter {
            let uncommented = rule.comment.trim().is_empty()
                || rule.args.iter().any(|c| c.comment.trim().is_empty());
            if uncommented {
                return Err(SeccompError::Policy {
                    file,
                    message: format!("{name}: rule for {} lacks a comment", rule.syscall),
                });
            }
        }
    }
    Ok(filters)
}

/// The filters that apply, in installation order.
///
/// # Errors
/// As [`load`].
pub fn filters_for(network_allowed: bool) -> Result<Vec<(String, Filter)>, SeccompError> {
    let mut filters: Vec<(String, Filter)> = load("restrictions.json", RESTRICTIONS_JSON)?
        .into_iter()
        .collect();
    if !network_allowed {
        filters.extend(load("no-network.json", NO_NETWORK_JSON)?);
    }
    Ok(filters)
}

/// A readable rendering of the rule list (golden-tested).
pub fn render(filters: &[(String, Filter)]) -> String {
    let mut out = String::new();
    for (name, filter) in filters {
        out.push_str(&format!(
            "[{name}] match={} mismatch={}\n",
            filter.match_action, filter.mismatch_action
        ));
        for rule in &filter.filter {
            let conds: Vec<String> = rule
                .args
                .iter()
                .map(|c| format!("arg{} {} {} {:#x}", c.index, c.len, c.op, c.val))
                .collect();
            out.push_str(&format!("  {} {}\n", rule.syscall, conds.join(" && ")));
        }
    }
    out
}

/// Compiles `filters` for `arch` into BPF programs.
///
/// # Errors
/// [`SeccompError::Install`] when seccompiler rejects a filter (e.g. an unknown syscall name).
pub fn compile(
    filters: &[(String, Filter)],
    arch: TargetArch,
) -> Result<Vec<(String, BpfProgram)>, SeccompError> {
    filters
        .iter()
        .map(|(name, filter)| {
            let install_err = |message: String| SeccompError::Install {
                name: name.clone(),
                message,
            };
            let json = serde_json::to_vec(&BTreeMap::from([(name.clone(), filter.clone())]))
                .map_err(|err| install_err(err.to_string()))?;
            let mut map = seccompiler::compile_from_json(json.as_slice(), arch)
                .map_err(|err| install_err(err.to_string()))?;
            let program = map
                .remove(name)
                .ok_or_else(|| install_err("missing after compilation".to_owned()))?;
            Ok((name.clone(), program))
        })
        .collect()
}

/// Installs the filters on the calling thread (the process is single-threaded here).
/// `no_new_privs` must already be set.
///
/// # Errors
/// [`SeccompError`] when a filter cannot be compiled or installed.
pub fn install(network_allowed: bool) -> Result<Vec<String>, SeccompError> {
    let arch =
        TargetArch::try_from(std::env::consts::ARCH).map_err(|err| SeccompError::Install {
            name: "arch".to_owned(),
            message: err.to_string(),
        })?;
    let mut programs = Vec::new();
    #[cfg(target_arch = "x86_64")]
    programs.push(("x32_guard".to_owned(), x32_guard()));
    programs.extend(compile(&filters_for(network_allowed)?, arch)?);
    let mut installed = Vec::new();
    for (name, program) in programs {
        seccompiler::apply_filter(&program).map_err(|err| SeccompError::Install {
            name: name.clone(),
            message: err.to_string(),
        })?;
        installed.push(name);
    }
    Ok(installed)
}

/// Kills foreign-architecture syscalls and refuses x32 ones with `EPERM`.
#[cfg(target_arch = "x86_64")]
pub fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_ERRNO_EPERM: u32 = 0x0005_0000 | 1;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let insn = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_ARCH),
        insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        insn(BPF_LD_W_ABS, 0, 0, OFFSET_NR),
        insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET_K, 0, 0, RET_ERRNO_EPERM),
        insn(BPF_RET_K, 0, 0, RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_compiles_for_every_supported_arch() {
        for network in [false, true] {
            let filters = filters_for(network).unwrap();
            for arch in ["x86_64", "aarch64", "riscv64"] {
                let arch = TargetArch::try_from(arch).unwrap();
                let programs = compile(&filters, arch).unwrap();
                assert_eq!(programs.len(), filters.len());
            }
        }
    }

    #[test]
    fn uncommented_rules_are_rejected() {
        let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "ptrace", "comment": " "}]}}"#;
        assert!(load("test.json", text).is_err());
        let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "ptrace"}]}}"#;
        assert!(load("test.json", text).is_err());
    }

    #[test]
    fn ioctl_rules_compare_32_bits() {
        let filters = filters_for(true).unwrap();
        let ioctl: Vec<&Rule> = filters
            .iter()
            .flat_map(|(_, f)| f.filter.iter())
            .filter(|r| r.syscall == "ioctl")
            .collect();
        assert!(!ioctl.is_empty());
        assert!(
            ioctl
                .iter()
                .all(|r| r.args.iter().all(|c| c.len == "dword"))
        );
    }
}
