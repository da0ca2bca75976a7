//! The seccomp layer: an allow-list generated from `policies/seccomp/*.json` (firecracker's
//! JSON shape; every rule and every argument condition carries a `comment`, which
//! [`super::seccomp_policy::parse`] requires).
//!
//! One program is installed, chained from these parts (the first part that refuses decides):
//! - `x32_guard` (x86_64 only, hand-written BPF): kills any other architecture (`int 0x80`
//!   enters as i386) and refuses x32 syscall numbers (`nr | 0x40000000`), which would
//!   otherwise slip past rules written for x86_64 numbers;
//! - `restrictions` (`EPERM`): calls that are dangerous whatever else is allowed (ptrace,
//!   process_vm_*, io_uring_*, bpf, perf_event_open, keyrings, the mount family, unshare/setns,
//!   namespace-creating clone, TIOCSTI/TIOCLINUX, modules, kexec, ...), so their refusal reads as
//!   "not permitted";
//! - `audit` (`EPERM`, only under the denial audit): a nested Landlock domain or seccomp filter,
//!   which could hide the command's own denials from the report;
//! - `allow` (default `ENOSYS`): the reviewed allow-list, with argument filters where a call is
//!   only safe on the caller itself (prlimit64, setpriority, sched_set*, ioprio_set, NUMA page
//!   moves: pid/who 0), on some of its arguments (clone without namespace flags, ioctl without
//!   TIOCSTI/TIOCLINUX, personality), or must not create set-user-ID/set-group-ID files (open,
//!   creat, chmod family, mknod). Sockets: with the network off only `AF_UNIX`; with it on also
//!   `AF_NETLINK`, and `AF_INET`/`AF_INET6` stream and datagram sockets of protocol 0, TCP, UDP
//!   or ICMP (MPTCP and SCTP connect where Landlock's TCP rule does not look); in both variants
//!   no TCP Fast Open (`MSG_FASTOPEN` on the send calls, `TCP_FASTOPEN_CONNECT`) and no TCP
//!   repair options, so every TCP connection passes `connect(2)`. Anything not listed, including every syscall added to
//!   the kernel after the list was reviewed, gets `ENOSYS` (so libc falls back, as on an older
//!   kernel): `clone3` among them, whose flags live in memory a filter cannot read, and the
//!   native AIO calls (`io_setup` allocates from the host-wide `fs.aio-max-nr`, which nothing
//!   bounds per sandbox; libaio users and glibc's POSIX AIO fall back to threads). Every admitted
//!   call that allocates from a pool the host shares says in its comment which bound holds it.
//!
//! `build.rs` compiles the JSON to BPF for the target architecture at build time ([`compiled`]);
//! [`install_on_current_thread`] chains the parts into one program ([`chain`]) and makes one `seccomp(2)` call, so
//! nothing is parsed or compiled on the way to `execve`. The JSON is still parsed by
//! [`filters_for`] for `--explain` and the golden rule lists, and a test checks that a fresh
//! compile of it equals the embedded bytecode.

use seccompiler::{BpfProgram, TargetArch, sock_filter};

use super::seccomp_policy::{self, Filter};

/// BPF compiled from `policies/seccomp/*.json` by `build.rs` for the target architecture;
/// `None` when seccompiler does not support the architecture.
pub mod compiled {
    use seccompiler::sock_filter;

    /// One compiled filter.
    pub type Program = &'static [sock_filter];

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
/// `policies/seccomp/audit.json`.
pub const AUDIT_JSON: &str = include_str!("../../../policies/seccomp/audit.json");
/// `policies/seccomp/allow.json`.
pub const ALLOW_JSON: &str = include_str!("../../../policies/seccomp/allow.json");

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

/// Which variant of the program: the network on or off, and whether the denial audit runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Sockets of network families may be created.
    pub network_allowed: bool,
    /// The denial audit runs (its refusals apply and denials are logged).
    pub audit: bool,
}

fn parse_file(file: &'static str, text: &str, name: &str) -> Result<Filter, SeccompError> {
    let policy = |message: String| SeccompError::Policy { file, message };
    seccomp_policy::parse(text)
        .map_err(policy)?
        .remove(name)
        .ok_or_else(|| policy(format!("no filter named {name:?}")))
}

/// The filters that apply to `variant` on `arch`, in installation order (after `x32_guard`).
///
/// # Errors
/// [`SeccompError::Policy`] when an embedded file is malformed.
pub fn filters_for_arch(
    variant: Variant,
    arch: &str,
) -> Result<Vec<(String, Filter)>, SeccompError> {
    let mut parts = vec![(
        "restrictions",
        parse_file("restrictions.json", RESTRICTIONS_JSON, "restrictions")?,
    )];
    if variant.audit {
        parts.push(("audit", parse_file("audit.json", AUDIT_JSON, "audit")?));
    }
    parts.push(("allow", parse_file("allow.json", ALLOW_JSON, "allow")?));
    Ok(parts
        .into_iter()
        .map(|(name, filter)| {
            let selected = seccomp_policy::select(&filter, arch, variant.network_allowed);
            (name.to_owned(), selected)
        })
        .collect())
}

/// [`filters_for_arch`] for the architecture this crate was built for.
///
/// # Errors
/// As [`filters_for_arch`].
pub fn filters_for(variant: Variant) -> Result<Vec<(String, Filter)>, SeccompError> {
    filters_for_arch(variant, std::env::consts::ARCH)
}

/// Every syscall name the allow-list admits for `variant` on this architecture (with or without
/// argument conditions), sorted.
///
/// # Errors
/// As [`filters_for_arch`].
pub fn allowed_syscalls(variant: Variant) -> Result<Vec<String>, SeccompError> {
    let mut names: Vec<String> = filters_for(variant)?
        .into_iter()
        .filter(|(name, _)| name == "allow")
        .flat_map(|(_, filter)| filter.filter)
        .map(|rule| rule.syscall)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
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

/// The whole program of `variant` as reviewers read it: `x32_guard`'s instructions as
/// installed, then every rule of the parts that follow (golden-tested).
///
/// # Errors
/// As [`filters_for`].
pub fn render_variant(variant: Variant) -> Result<String, SeccompError> {
    let mut out = String::new();
    #[cfg(target_arch = "x86_64")]
    {
        out.push_str("[x32_guard]\n");
        out.push_str(&disassemble(&x32_guard()));
    }
    out.push_str(&render(&filters_for(variant)?));
    Ok(out)
}

/// A listing of a classic-BPF program (the instructions [`x32_guard`] uses), one per line.
pub fn disassemble(program: &[sock_filter]) -> String {
    let describe_ret = |k: u32| match k & 0xffff_0000 {
        0x8000_0000 => "KILL_PROCESS".to_owned(),
        0x0005_0000 => format!("ERRNO({})", k & 0xffff),
        0x7fc0_0000 => "USER_NOTIF".to_owned(),
        SECCOMP_RET_ALLOW => "ALLOW".to_owned(),
        other => format!("{other:#x}"),
    };
    program
        .iter()
        .enumerate()
        .map(|(at, insn)| {
            let text = match insn.code {
                0x20 if insn.k == 0 => "ld nr".to_owned(),
                0x20 if insn.k == 4 => "ld arch".to_owned(),
                0x20 => format!("ld [{}]", insn.k),
                0x15 => format!("jeq {:#x} ? +{} : +{}", insn.k, insn.jt, insn.jf),
                0x35 => format!("jge {:#x} ? +{} : +{}", insn.k, insn.jt, insn.jf),
                0x54 => format!("and {:#x}", insn.k),
                0x05 => format!("ja +{}", insn.k),
                0x06 => format!("ret {}", describe_ret(insn.k)),
                code => format!("op {code:#x} k {:#x}", insn.k),
            };
            format!("  {at}: {text}\n")
        })
        .collect()
}

/// Compiles `filters` (already selected for `arch`) into BPF programs.
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
            if name == "allow" {
                let arch_name = arch_name(arch);
                let table = crate::syscall_table::for_arch(arch_name)
                    .ok_or_else(|| install_err(format!("no syscall table for {arch_name}")))?;
                let number = |name: &str| table.iter().find(|(_, n)| *n == name).map(|(nr, _)| *nr);
                let program = seccomp_policy::compile_allow_list(filter, arch_name, number)
                    .map_err(install_err)?
                    .into_iter()
                    .map(|(code, jt, jf, k)| sock_filter { code, jt, jf, k })
                    .collect();
                return Ok((name.clone(), program));
            }
            let json = seccomp_policy::seccompiler_json(name, filter).map_err(install_err)?;
            let mut map = seccompiler::compile_from_json(json.as_slice(), arch)
                .map_err(|err| install_err(err.to_string()))?;
            let program = map
                .remove(name)
                .ok_or_else(|| install_err("missing after compilation".to_owned()))?;
            Ok((name.clone(), program))
        })
        .collect()
}

/// Rust's name of a seccompiler target.
fn arch_name(arch: TargetArch) -> &'static str {
    match arch {
        TargetArch::x86_64 => "x86_64",
        TargetArch::aarch64 => "aarch64",
        TargetArch::riscv64 => "riscv64",
    }
}

/// The embedded, compiled parts for `variant`, in installation order (without `x32_guard`).
///
/// # Errors
/// [`SeccompError::Install`] when there is no compiled program for this architecture.
pub fn compiled_parts(
    variant: Variant,
) -> Result<Vec<(&'static str, &'static [sock_filter])>, SeccompError> {
    let unsupported = || SeccompError::Install {
        name: "arch".to_owned(),
        message: format!(
            "no seccomp filters are compiled for {}",
            std::env::consts::ARCH
        ),
    };
    let (restrictions, audit, allow) = if variant.network_allowed {
        (
            compiled::RESTRICTIONS_NETWORK_ON,
            compiled::AUDIT_NETWORK_ON,
            compiled::ALLOW_NETWORK_ON,
        )
    } else {
        (
            compiled::RESTRICTIONS_NETWORK_OFF,
            compiled::AUDIT_NETWORK_OFF,
            compiled::ALLOW_NETWORK_OFF,
        )
    };
    let mut parts = vec![("restrictions", restrictions.ok_or_else(unsupported)?)];
    if variant.audit {
        parts.push(("audit", audit.ok_or_else(unsupported)?));
    }
    parts.push(("allow", allow.ok_or_else(unsupported)?));
    Ok(parts)
}

/// The program [`install_on_current_thread`] applies: `x32_guard` (x86_64) and the compiled parts of `variant`,
/// chained into one, with the names of its parts.
///
/// # Errors
/// [`SeccompError::Install`] when there is no compiled program for this architecture or the
/// parts cannot be chained.
pub fn program_for(variant: Variant) -> Result<(Vec<String>, BpfProgram), SeccompError> {
    let mut parts: Vec<(&str, &[sock_filter])> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    let guard = x32_guard();
    #[cfg(target_arch = "x86_64")]
    parts.push(("x32_guard", &guard));
    parts.extend(compiled_parts(variant)?);
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

/// Installs the program for `variant` on the calling thread (the process is single-threaded
/// here), in one `seccomp(2)` call. `no_new_privs` must already be set.
///
/// # Errors
/// [`SeccompError`] when the program cannot be built or installed.
pub fn install_on_current_thread(variant: Variant) -> Result<Vec<String>, SeccompError> {
    let (names, program) = program_for(variant)?;
    // The denial audit wants SECCOMP records for the errno actions (FLAG_LOG).
    let installed = if variant.audit {
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

/// The program of a variant, built ahead so that installing it allocates nothing (in a child
/// that shares its parent's memory, or on a start's path).
pub struct Prepared {
    names: Vec<String>,
    program: Vec<libc::sock_filter>,
    logged: bool,
}

impl Prepared {
    /// Builds the program of `variant`.
    ///
    /// # Errors
    /// As [`program_for`].
    pub fn new(variant: Variant) -> Result<Self, SeccompError> {
        let (names, program) = program_for(variant)?;
        Ok(Self {
            names,
            program: program
                .iter()
                .map(|insn| libc::sock_filter {
                    code: insn.code,
                    jt: insn.jt,
                    jf: insn.jf,
                    k: insn.k,
                })
                .collect(),
            logged: variant.audit,
        })
    }

    /// The names of its parts.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether its refusals are logged (the denial audit).
    pub fn logged(&self) -> bool {
        self.logged
    }

    /// Installs it on the calling thread. `no_new_privs` must be set.
    ///
    /// # Errors
    /// The OS error of `seccomp(2)`.
    pub fn install_on_current_thread(&self) -> std::io::Result<()> {
        let flags = if self.logged {
            crate::sys::SECCOMP_FILTER_FLAG_LOG
        } else {
            0
        };
        crate::sys::install_filter_on_current_thread(&self.program, flags).map(|_| ())
    }
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

    const VARIANTS: [Variant; 4] = [
        Variant {
            network_allowed: false,
            audit: false,
        },
        Variant {
            network_allowed: true,
            audit: false,
        },
        Variant {
            network_allowed: false,
            audit: true,
        },
        Variant {
            network_allowed: true,
            audit: true,
        },
    ];

    #[test]
    fn every_variant_compiles_for_every_supported_arch() {
        for variant in VARIANTS {
            for arch in ["x86_64", "aarch64", "riscv64"] {
                let filters = filters_for_arch(variant, arch).unwrap();
                let target = TargetArch::try_from(arch).unwrap();
                let programs = compile(&filters, target).unwrap();
                assert_eq!(programs.len(), filters.len());
            }
        }
    }

    #[test]
    fn embedded_programs_equal_a_fresh_compile_of_the_json() {
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        for variant in VARIANTS {
            let fresh = compile(&filters_for(variant).unwrap(), arch).unwrap();
            let embedded: Vec<(String, BpfProgram)> = compiled_parts(variant)
                .unwrap()
                .into_iter()
                .map(|(name, program)| (name.to_owned(), program.to_vec()))
                .collect();
            assert_eq!(embedded, fresh, "rebuild: build.rs output is stale");
        }
    }

    #[test]
    fn the_allow_list_refuses_by_default_with_enosys_and_the_refusals_with_eperm() {
        for variant in VARIANTS {
            let filters = filters_for(variant).unwrap();
            let allow = &filters.last().unwrap().1;
            assert_eq!(allow.mismatch_action, serde_json::json!({"errno": 38}));
            assert_eq!(allow.match_action, serde_json::json!("allow"));
            for (name, filter) in &filters[..filters.len() - 1] {
                assert_eq!(filter.mismatch_action, serde_json::json!("allow"), "{name}");
                assert_eq!(
                    filter.match_action,
                    serde_json::json!({"errno": 1}),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn the_compact_allow_list_admits_exactly_the_listed_numbers() {
        for variant in VARIANTS {
            let allowed: Vec<i64> = allowed_syscalls(variant)
                .unwrap()
                .iter()
                .map(|name| crate::audit::syscalls::number(name).unwrap())
                .collect();
            let (_, allow) = compiled_parts(variant)
                .unwrap()
                .into_iter()
                .find(|(name, _)| *name == "allow")
                .unwrap();
            assert!(allow.len() < 300, "{} instructions", allow.len());
            let arch = seccomp_policy::audit_arch(std::env::consts::ARCH).unwrap();
            for nr in 0..1024u32 {
                let data = SeccompData {
                    nr,
                    arch,
                    args: [0; 6],
                };
                let expected = if allowed.contains(&i64::from(nr)) {
                    SECCOMP_RET_ALLOW
                } else {
                    0x0005_0000 | 38
                };
                assert_eq!(run_bpf(allow, &data), expected, "nr {nr} {variant:?}");
            }
            let foreign = SeccompData {
                nr: 0,
                arch: 0x4000_0003,
                args: [0; 6],
            };
            assert_eq!(run_bpf(allow, &foreign), 0x8000_0000, "foreign arch");
        }
    }

    #[test]
    fn nothing_dangerous_is_on_the_allow_list() {
        for variant in VARIANTS {
            let allowed = allowed_syscalls(variant).unwrap();
            for refused in [
                "ptrace",
                "process_vm_readv",
                "process_vm_writev",
                "mount",
                "umount2",
                "open_tree",
                "move_mount",
                "fsopen",
                "fsmount",
                "mount_setattr",
                "unshare",
                "setns",
                "bpf",
                "perf_event_open",
                "keyctl",
                "io_uring_setup",
                "userfaultfd",
                "clone3",
                "openat2",
                "chroot",
                "pivot_root",
                "init_module",
                "kexec_load",
            ] {
                assert!(
                    !allowed.iter().any(|name| name == refused),
                    "{refused} is on the allow-list"
                );
            }
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

    /// What the chained program must decide: the parts in order, the first that does not
    /// allow decides.
    fn run_in_order(parts: &[(&str, &[sock_filter])], data: &SeccompData) -> u32 {
        parts
            .iter()
            .map(|(_, part)| run_bpf(part, data))
            .find(|ret| *ret != SECCOMP_RET_ALLOW)
            .unwrap_or(SECCOMP_RET_ALLOW)
    }

    #[test]
    fn chained_program_decides_like_its_parts_taken_in_order() {
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
        for variant in VARIANTS {
            let guard;
            let mut parts: Vec<(&str, &[sock_filter])> = Vec::new();
            if cfg!(target_arch = "x86_64") {
                guard = x32_guard_program();
                parts.push(("x32_guard", &guard));
            }
            parts.extend(compiled_parts(variant).unwrap());
            let (names, chained) = program_for(variant).unwrap();
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
                        let expected = run_in_order(&parts, &data);
                        assert_eq!(
                            run_bpf(&chained, &data),
                            expected,
                            "arch {arch:#x} nr {nr} args {args:x?} {variant:?}"
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
        assert!(seccomp_policy::parse(text).is_err());
        let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "ptrace"}]}}"#;
        assert!(seccomp_policy::parse(text).is_err());
        let text = r#"{"f": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "ptrace", "comment": "c", "network": "maybe"}]}}"#;
        assert!(seccomp_policy::parse(text).is_err());
    }

    #[test]
    fn ioctl_rules_compare_32_bits() {
        let filters = filters_for(VARIANTS[1]).unwrap();
        let ioctl: Vec<&seccomp_policy::Rule> = filters
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

    /// The kernel reads the socket calls' family, type, protocol, flags, level and option name
    /// as ints: a rule comparing 64 bits would let `value | 1 << 32` through.
    #[test]
    fn socket_rules_compare_32_bits() {
        for variant in VARIANTS {
            let filters = filters_for(variant).unwrap();
            let rules: Vec<&seccomp_policy::Rule> = filters
                .iter()
                .flat_map(|(_, f)| f.filter.iter())
                .filter(|r| {
                    [
                        "socket",
                        "socketpair",
                        "sendto",
                        "sendmsg",
                        "sendmmsg",
                        "setsockopt",
                    ]
                    .contains(&r.syscall.as_str())
                })
                .filter(|r| !r.args.is_empty())
                .collect();
            assert!(rules.len() >= 9, "{variant:?}: {rules:?}");
            assert!(
                rules
                    .iter()
                    .all(|r| r.args.iter().all(|c| c.len == "dword")),
                "{variant:?}"
            );
        }
    }
}
