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
//! [`install_on_current_thread`] chains the parts into one program ([`chain`]), puts a binary
//! search over the syscall number in front of it ([`with_dispatch`]: every call whose action
//! does not depend on its arguments is decided in a few instructions, which is also what the
//! kernel walks for every syscall number when the filter is installed), and makes one
//! `seccomp(2)` call, so nothing is parsed or compiled on the way to `execve`. The JSON is still parsed by
//! [`filters_for`] for `--explain` and the golden rule lists, and a test checks that a fresh
//! compile of it equals the embedded bytecode.

mod bpf;
#[cfg(test)]
mod tests;

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

#[cfg(target_arch = "x86_64")]
pub use bpf::x32_guard;
pub use bpf::{chain, disassemble, with_dispatch};

/// `policies/seccomp/restrictions.json`.
pub const RESTRICTIONS_JSON: &str = include_str!("../../../../policies/seccomp/restrictions.json");
/// `policies/seccomp/audit.json`.
pub const AUDIT_JSON: &str = include_str!("../../../../policies/seccomp/audit.json");
/// `policies/seccomp/allow.json`.
pub const ALLOW_JSON: &str = include_str!("../../../../policies/seccomp/allow.json");

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
/// chained into one behind a search over the syscall number ([`with_dispatch`]), with the
/// names of its parts.
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
    let mut program = chain(&parts)?;
    // A search over the syscall number in front, so that neither the kernel (which walks the
    // program for every number when it is installed) nor a call walks the whole chain.
    if let Some(arch) = seccomp_policy::audit_arch(std::env::consts::ARCH) {
        program = with_dispatch(program, arch)?;
    }
    Ok((
        parts.iter().map(|(name, _)| (*name).to_owned()).collect(),
        program,
    ))
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
        crate::sys::install_seccomp_filter_logged_on_current_thread(&program)
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
