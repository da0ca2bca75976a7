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
//!
//! `build.rs` compiles the JSON to BPF for the target architecture at build time ([`compiled`]);
//! [`install`] chains `x32_guard` and the compiled filters into one program ([`chain`]) and makes
//! one `seccomp(2)` call, so nothing is parsed or compiled on the way to `execve`. The JSON is
//! still parsed by [`filters_for`] for `--explain` and the golden rule lists, and a test checks
//! that a fresh compile of it equals the embedded bytecode.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, TargetArch, sock_filter};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// BPF compiled from `policies/seccomp/*.json` by `build.rs` for the target architecture:
/// `(filter name, program)` per filter, in installation order; `None` when seccompiler does not
/// support the architecture.
pub mod compiled {
    use seccompiler::sock_filter;

    /// Named programs in installation order.
    pub type Programs = &'static [(&'static str, &'static [sock_filter])];

    include!(concat!(env!("OUT_DIR"), "/seccomp_programs.rs"));
}

/// Most instructions the kernel accepts in one classic-BPF program (`BPF_MAXINSNS`).
const BPF_MAXINSNS: usize = 4096;
/// `SECCOMP_RET_ALLOW`.
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// Classic-BPF opcode parts used by [`chain`].
const BPF_CLASS_MASK: u16 = 0x07;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_OP_MASK: u16 = 0xf0;
const BPF_JA: u16 = 0x00;
const BPF_RET_K: u16 = BPF_RET;

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

/// The program [`install`] applies: `x32_guard` (x86_64) and the compiled filters that apply,
/// chained into one, with the names of its parts.
///
/// # Errors
/// [`SeccompError::Install`] when there is no compiled program for this architecture or the
/// parts cannot be chained.
pub fn program_for(network_allowed: bool) -> Result<(Vec<String>, BpfProgram), SeccompError> {
    let unsupported = || SeccompError::Install {
        name: "arch".to_owned(),
        message: format!(
            "no seccomp filters are compiled for {}",
            std::env::consts::ARCH
        ),
    };
    let mut parts: Vec<(&str, &[sock_filter])> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    let guard = x32_guard();
    #[cfg(target_arch = "x86_64")]
    parts.push(("x32_guard", &guard));
    parts.extend_from_slice(compiled::RESTRICTIONS.ok_or_else(unsupported)?);
    if !network_allowed {
        parts.extend_from_slice(compiled::NO_NETWORK.ok_or_else(unsupported)?);
    }
    let program = chain(&parts)?;
    Ok((
        parts.iter().map(|(name, _)| (*name).to_owned()).collect(),
        program,
    ))
}

/// Joins complete programs into one that returns the first action other than allow, taking
/// the parts in order: every `RET ALLOW` of a part but the last becomes a jump to the start of
/// the next part. For parts that never both refuse the same call (checked by a test for ours)
/// this decides exactly as installing them as separate filters, at the cost of one filter.
///
/// # Errors
/// [`SeccompError::Install`] when a part does not end in a constant return, jumps outside
/// itself, returns a computed value, or the result exceeds `BPF_MAXINSNS`.
pub fn chain(parts: &[(&str, &[sock_filter])]) -> Result<BpfProgram, SeccompError> {
    let total: usize = parts.iter().map(|(_, part)| part.len()).sum();
    if total > BPF_MAXINSNS {
        return Err(SeccompError::Install {
            name: "chain".to_owned(),
            message: format!("{total} instructions exceed BPF_MAXINSNS ({BPF_MAXINSNS})"),
        });
    }
    let mut program = Vec::with_capacity(total);
    for (index, (name, part)) in parts.iter().enumerate() {
        let malformed = |message: String| SeccompError::Install {
            name: (*name).to_owned(),
            message,
        };
        let last_part = index + 1 == parts.len();
        if part.last().is_none_or(|insn| insn.code != BPF_RET_K) {
            return Err(malformed("does not end in a constant return".to_owned()));
        }
        for (at, insn) in part.iter().enumerate() {
            let next = at + 1;
            let class = insn.code & BPF_CLASS_MASK;
            let targets_inside = match class {
                BPF_JMP if insn.code & BPF_OP_MASK == BPF_JA => {
                    usize::try_from(insn.k).is_ok_and(|k| next.saturating_add(k) < part.len())
                }
                BPF_JMP => {
                    next + usize::from(insn.jt) < part.len()
                        && next + usize::from(insn.jf) < part.len()
                }
                _ => true,
            };
            if !targets_inside {
                return Err(malformed(format!(
                    "instruction {at} jumps outside the filter"
                )));
            }
            if class == BPF_RET && insn.code != BPF_RET_K {
                return Err(malformed(format!(
                    "instruction {at} returns a computed value"
                )));
            }
            if insn.code == BPF_RET_K && insn.k == SECCOMP_RET_ALLOW && !last_part {
                let to_next_part = u32::try_from(part.len() - next)
                    .map_err(|_| malformed("too long".to_owned()))?;
                program.push(sock_filter {
                    code: BPF_JMP | BPF_JA,
                    jt: 0,
                    jf: 0,
                    k: to_next_part,
                });
            } else {
                program.push(insn.clone());
            }
        }
    }
    Ok(program)
}

/// Installs the filters on the calling thread (the process is single-threaded here) as one
/// program, in one `seccomp(2)` call. `no_new_privs` must already be set.
///
/// # Errors
/// [`SeccompError`] when the program cannot be built or installed.
pub fn install(network_allowed: bool, log: bool) -> Result<Vec<String>, SeccompError> {
    let (names, program) = program_for(network_allowed)?;
    // `log`: the denial audit wants SECCOMP records for the errno actions (FLAG_LOG).
    let installed = if log {
        crate::audit::sys::install_seccomp_filter_logged_on_current_thread(&program)
            .map_err(|err| err.to_string())
    } else {
        seccompiler::apply_filter(&program).map_err(|err| err.to_string())
    };
    installed.map_err(|message| SeccompError::Install {
        name: names.join("+"),
        message,
    })?;
    Ok(names)
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
    fn embedded_programs_equal_a_fresh_compile_of_the_json() {
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        for network in [false, true] {
            let fresh = compile(&filters_for(network).unwrap(), arch).unwrap();
            let mut embedded: Vec<(String, BpfProgram)> = Vec::new();
            for (name, program) in compiled::RESTRICTIONS.unwrap() {
                embedded.push(((*name).to_owned(), program.to_vec()));
            }
            if !network {
                for (name, program) in compiled::NO_NETWORK.unwrap() {
                    embedded.push(((*name).to_owned(), program.to_vec()));
                }
            }
            assert_eq!(embedded, fresh, "rebuild: build.rs output is stale");
        }
    }

    /// `struct seccomp_data` as the filters see it.
    struct SeccompData {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    /// A classic-BPF interpreter for the instructions seccompiler and `x32_guard` emit.
    fn run_bpf(program: &[sock_filter], data: &SeccompData) -> u32 {
        let word = |offset: u32| -> u32 {
            match offset {
                0 => data.nr,
                4 => data.arch,
                16..=63 => {
                    let arg = data.args[(offset as usize - 16) / 8];
                    if offset.is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                _ => panic!("load from offset {offset}"),
            }
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let insn = &program[pc];
            pc += 1;
            let jump = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
            match insn.code {
                0x20 => acc = word(insn.k),
                0x54 => acc &= insn.k,
                0x05 => pc += insn.k as usize,
                0x15 => pc += jump(acc == insn.k),
                0x25 => pc += jump(acc > insn.k),
                0x35 => pc += jump(acc >= insn.k),
                0x45 => pc += jump(acc & insn.k != 0),
                0x06 => return insn.k,
                code => panic!("unexpected opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// What the kernel returns for filters installed in this order: the most restrictive
    /// action wins, the most recently installed one on ties.
    fn run_stacked(parts: &[(&str, &[sock_filter])], data: &SeccompData) -> u32 {
        let action = |ret: u32| (ret & 0xffff_0000) as i32;
        let mut result = SECCOMP_RET_ALLOW;
        for (_, part) in parts.iter().rev() {
            let ret = run_bpf(part, data);
            if action(ret) < action(result) {
                result = ret;
            }
        }
        result
    }

    #[test]
    fn chained_program_decides_like_separately_installed_filters() {
        const AUDIT_ARCHES: [u32; 4] = [0xc000_003e, 0x4000_0003, 0xc000_00b7, 0xc000_00f3];
        const X32_SYSCALL_BIT: u32 = 0x4000_0000;
        let mut values: Vec<u64> = vec![0, 1, 2, 10, 16, 17, 0x5412, 0x541c, 0x5413, u64::MAX];
        values.extend((11..31).map(|bit| 1u64 << bit)); // every CLONE_NEW* flag and neighbours
        values.extend([0x5412 | (1 << 32), 1 | (1 << 32), 0x7e02_0000]);
        let mut arg_sets: Vec<[u64; 6]> = values.iter().map(|v| [*v; 6]).collect();
        for v in &values {
            arg_sets.push([*v, 0, 0, 0, 0, 0]);
            arg_sets.push([0, *v, 0, 0, 0, 0]);
        }
        for network in [false, true] {
            let guard;
            let mut parts: Vec<(&str, &[sock_filter])> = Vec::new();
            if cfg!(target_arch = "x86_64") {
                guard = x32_guard_program();
                parts.push(("x32_guard", &guard));
            }
            parts.extend_from_slice(compiled::RESTRICTIONS.unwrap());
            if !network {
                parts.extend_from_slice(compiled::NO_NETWORK.unwrap());
            }
            let (names, chained) = program_for(network).unwrap();
            assert_eq!(names.len(), parts.len());
            let (mut refused, mut checked) = (0, 0);
            for arch in AUDIT_ARCHES {
                for nr in (0..=512).chain((0..=512).map(|nr| nr | X32_SYSCALL_BIT)) {
                    for args in &arg_sets {
                        let data = SeccompData {
                            nr,
                            arch,
                            args: *args,
                        };
                        let expected = run_stacked(&parts, &data);
                        assert_eq!(
                            run_bpf(&chained, &data),
                            expected,
                            "arch {arch:#x} nr {nr} args {args:x?} network {network}"
                        );
                        refused += usize::from(expected != SECCOMP_RET_ALLOW);
                        checked += 1;
                    }
                }
            }
            assert!(refused > 0 && refused < checked, "{refused} of {checked}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn x32_guard_program() -> BpfProgram {
        x32_guard()
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn x32_guard_program() -> BpfProgram {
        unreachable!("x32_guard exists on x86_64 only")
    }

    #[test]
    fn chain_rejects_parts_that_jump_outside_themselves() {
        let ret_allow = sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        };
        let escaping = [
            sock_filter {
                code: 0x15,
                jt: 1,
                jf: 0,
                k: 0,
            },
            ret_allow.clone(),
        ];
        let ok = [ret_allow.clone()];
        assert!(chain(&[("escaping", &escaping), ("ok", &ok)]).is_err());
        let unterminated = [sock_filter {
            code: 0x20,
            jt: 0,
            jf: 0,
            k: 0,
        }];
        assert!(chain(&[("unterminated", &unterminated), ("ok", &ok)]).is_err());
        assert_eq!(chain(&[("ok", &ok), ("ok", &ok)]).unwrap().len(), 2);
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
