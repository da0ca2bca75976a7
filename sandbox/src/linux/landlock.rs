//! The Landlock layer: one ruleset holding filesystem rules, TCP rules and scopes.
//!
//! - One ruleset, not several stacked ones: stacked domains break cross-directory `rename`
//!   and `link` with `EXDEV` even inside one writable root.
//! - Every filesystem right of the *running* ABI is handled, so nothing new slips through.
//! - Compatibility is `HardRequirement` unless best effort was asked, and the returned status
//!   must be `FullyEnforced`: the crate's soft requirement silently drops the whole ruleset.
//! - The session's terminal gets read, write and ioctl: programs reopen `/dev/tty`.
//! - Landlock on ABI < 10 does not cover UDP; seccomp does (see [`super::seccomp`]).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use serde::Serialize;

use crate::policy::{self, ResolvedPolicy};
use crate::sys;

/// Rights a rule grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RuleAccess {
    /// Execute, read files, list directories.
    Read,
    /// Every filesystem right of the ABI.
    Write,
    /// Read, write and ioctl on a terminal device.
    Tty,
}

/// One Landlock path-beneath rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LandlockRule {
    /// The path the rule is attached to.
    pub path: PathBuf,
    /// What it grants.
    pub access: RuleAccess,
}

/// What the Landlock layer did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LandlockReport {
    /// The running kernel's ABI (0: no Landlock).
    pub abi: i32,
    /// `full`, `partial`, `none` or `skipped`.
    pub status: String,
    /// Filesystem rules added.
    pub rules: usize,
    /// TCP bind/connect are handled (denied).
    pub tcp_denied: bool,
    /// Signal and abstract-unix-socket scoping applied.
    pub scoped: bool,
}

/// Why the Landlock layer failed.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// The kernel has no Landlock.
    #[error(
        "Landlock is unavailable on this kernel; the filesystem policy cannot be enforced (pass --best-effort to run without it)"
    )]
    Unavailable,
    /// The crate refused or the kernel rejected the ruleset.
    #[error("building the Landlock ruleset failed: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    /// TCP port rules need Landlock ABI 4.
    #[error(
        "Landlock ABI {abi} cannot deny TCP ports (needs ABI 4), so the supervisor's own listener \
         would be reachable from a sandbox with the network on; pass --best-effort to run anyway"
    )]
    NoPortRules {
        /// The running ABI.
        abi: i32,
    },
    /// A rule's path became a symlink since the policy was resolved.
    #[error(
        "{path} became a symlink since the policy was resolved; refusing to attach its rule elsewhere"
    )]
    Changed {
        /// The path.
        path: PathBuf,
    },
    /// The kernel enforced less than asked.
    #[error(
        "Landlock enforced the ruleset only {status:?} (ABI {abi}); refusing to run partially confined"
    )]
    NotFullyEnforced {
        /// The status returned.
        status: String,
        /// The running ABI.
        abi: i32,
    },
}

/// The filesystem rules for `policy` (pure), plus terminal rules for `ttys`.
pub fn rules_for(policy: &ResolvedPolicy, ttys: &[PathBuf]) -> Vec<LandlockRule> {
    let mut rules: Vec<LandlockRule> = policy
        .rules()
        .iter()
        .filter_map(|rule| {
            match rule.access {
                policy::Access::Read => Some(RuleAccess::Read),
                policy::Access::Write => Some(RuleAccess::Write),
                policy::Access::Deny => None,
            }
            .map(|access| LandlockRule {
                path: rule.path.clone(),
                access,
            })
        })
        .collect();
    rules.extend(ttys.iter().map(|path| LandlockRule {
        path: path.clone(),
        access: RuleAccess::Tty,
    }));
    rules
}

/// The terminals of a sandbox with a private `/dev`: `/dev/tty` (the controlling terminal) and
/// its own devpts instance, which holds nothing but the sandbox's own terminals.
pub fn private_ttys() -> Vec<PathBuf> {
    vec![PathBuf::from("/dev/pts"), PathBuf::from("/dev/tty")]
}

/// The terminals of the session without a private `/dev`: `/dev/tty` and whatever terminal
/// stdin/stdout/stderr are.
pub fn session_ttys() -> Vec<PathBuf> {
    let mut ttys = vec![PathBuf::from("/dev/tty")];
    for fd in [
        std::io::stdin().as_fd(),
        std::io::stdout().as_fd(),
        std::io::stderr().as_fd(),
    ] {
        if nix::unistd::isatty(fd).unwrap_or(false)
            && let Ok(path) = nix::unistd::ttyname(fd)
        {
            ttys.push(path);
        }
    }
    ttys.sort();
    ttys.dedup();
    ttys
}

/// The filesystem rights a restricting ruleset handles: every right of the ABI, so a right no
/// rule grants is refused (`MakeChar` and `MakeBlock` included, though no rule grants them).
fn handled_fs(abi: ABI) -> BitFlags<AccessFs> {
    AccessFs::from_all(abi)
}

fn rights(access: RuleAccess, abi: ABI, is_dir: bool) -> BitFlags<AccessFs> {
    let all = match access {
        RuleAccess::Read => AccessFs::from_read(abi),
        // No sandboxed program needs to create device nodes.
        RuleAccess::Write => AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock),
        RuleAccess::Tty => {
            (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev)
                & AccessFs::from_all(abi)
        }
    };
    if is_dir {
        all
    } else {
        all & AccessFs::from_file(abi)
    }
}

/// How the ruleset is installed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetOptions {
    /// Run with whatever the ABI enforces (reported as warnings).
    pub best_effort: bool,
    /// Keep logging denials after `execve` (ABI >= 7; the denial audit).
    pub log_after_exec: bool,
    /// With a network allowlist: the egress proxy's port, the one TCP port connections may go
    /// to (binding stays denied).
    pub egress_port: Option<u16>,
}

/// The running kernel's Landlock ABI version (0 when Landlock is missing or disabled).
pub fn running_abi() -> i32 {
    sys::landlock_abi()
}

/// Installs the ruleset on the calling process: filesystem rules plus `ttys`, TCP (every port
/// denied with the network off; only connecting to the egress proxy with an allowlist; the
/// policy's denied ports with it on) and scopes.
///
/// # Errors
/// [`LandlockError`] when Landlock is missing or not fully enforced (unless `best_effort`), or a
/// rule's path became a symlink since the policy was resolved.
pub fn install_on_current_process(
    policy: &ResolvedPolicy,
    ttys: &[PathBuf],
    net: &NetOptions,
    warnings: &mut Vec<String>,
) -> Result<LandlockReport, LandlockError> {
    let best_effort = net.best_effort;
    let log_after_exec = net.log_after_exec;
    let abi_number = sys::landlock_abi();
    let mut report = LandlockReport {
        abi: abi_number,
        status: "skipped".to_owned(),
        ..LandlockReport::default()
    };
    if abi_number == 0 {
        if best_effort {
            warnings
                .push("Landlock unavailable: filesystem rules rely on namespaces only".to_owned());
            return Ok(report);
        }
        return Err(LandlockError::Unavailable);
    }
    let abi = ABI::from(abi_number);
    let level = if best_effort {
        CompatLevel::BestEffort
    } else {
        CompatLevel::HardRequirement
    };
    let mut ruleset = Ruleset::default().set_compatibility(level);
    if policy.restricts_filesystem() {
        ruleset = ruleset.handle_access(handled_fs(abi))?;
    }
    let deny_ports = policy.network_fully_on() && !policy.denied_tcp_ports.is_empty();
    let handle_tcp = !policy.network_fully_on() || deny_ports;
    if handle_tcp && abi_number >= 4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        report.tcp_denied = true;
    } else if deny_ports && !best_effort {
        return Err(LandlockError::NoPortRules { abi: abi_number });
    } else if deny_ports {
        warnings.push(format!(
            "Landlock ABI {abi_number} cannot deny TCP ports {:?}: the supervisor's own listener \
             is reachable from the sandbox",
            policy.denied_tcp_ports
        ));
    }
    if abi_number >= 6 {
        ruleset = ruleset.scope(Scope::from_all(abi))?;
        report.scoped = true;
    } else {
        warnings.push(format!(
            "Landlock ABI {abi_number} has no signal/abstract-socket scoping"
        ));
    }
    let mut created = ruleset.create()?;
    if policy.restricts_filesystem() {
        for rule in rules_for(policy, ttys) {
            let Some((fd, is_dir)) = open_path(&rule.path)? else {
                continue;
            };
            created = created.add_rule(PathBeneath::new(fd, rights(rule.access, abi, is_dir)))?;
            report.rules += 1;
        }
        if abi_number >= super::unix_sockets::LANDLOCK_UNIX_ABI {
            // ABI 9 handles LANDLOCK_ACCESS_FS_RESOLVE_UNIX with every right of the ABI: the
            // writable roots grant it, and so does a rule on each named socket.
            for socket in &policy.unix_sockets {
                let Some((fd, _)) = open_path(socket)? else {
                    continue;
                };
                created = created.add_rule(PathBeneath::new(fd, AccessFs::ResolveUnix))?;
                report.rules += 1;
            }
        }
    }
    if let (Some(port), true) = (
        net.egress_port,
        policy.egress().is_some() && report.tcp_denied,
    ) {
        // The sandbox's network namespace holds only `lo`: this rule reaches the proxy alone.
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    if deny_ports && report.tcp_denied {
        // Landlock's TCP rules only allow: every port but the denied ones.
        let denied = &policy.denied_tcp_ports;
        for port in (0..=u16::MAX).filter(|port| denied.binary_search(port).is_err()) {
            created = created.add_rule(NetPort::new(port, AccessNet::from_all(abi)))?;
        }
    }
    if log_after_exec && abi_number >= 7 {
        created = created.log_new_exec(true)?;
    }
    let status = created.restrict_self()?;
    report.status = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        RulesetStatus::NotEnforced => "none",
    }
    .to_owned();
    if status.ruleset != RulesetStatus::FullyEnforced {
        if !best_effort {
            return Err(LandlockError::NotFullyEnforced {
                status: report.status,
                abi: abi_number,
            });
        }
        warnings.push(format!("Landlock enforcement is {}", report.status));
    }
    Ok(report)
}

/// Opens `path` for a rule; `None` when it does not exist (a missing path needs no rule).
/// Policy paths are canonical, so no symlink is followed on the way: one planted since the
/// policy was resolved fails the start instead of attaching the rule elsewhere. `/dev` and
/// `/proc` are the sandbox's own and keep their usual links.
fn open_path(path: &Path) -> Result<Option<(std::os::fd::OwnedFd, bool)>, LandlockError> {
    let opened = if path.starts_with("/dev") || path.starts_with("/proc") {
        std::fs::File::open(path)
            .map(std::os::fd::OwnedFd::from)
            .or_else(|_| {
                nix::fcntl::open(
                    path,
                    nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(std::io::Error::from)
            })
    } else {
        crate::sys::open_no_symlinks(None, path)
    };
    match opened {
        Ok(fd) => {
            let is_dir = nix::sys::stat::fstat(&fd)
                .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                .unwrap_or(false);
            Ok(Some((fd, is_dir)))
        }
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => Err(LandlockError::Changed {
            path: path.to_owned(),
        }),
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every right of every ABI is handled (`kernel.rs`'s
    /// `landlock_alone_refuses_each_filesystem_right_it_was_not_given` probes each one the
    /// running kernel has), and a write rule grants every one but the device nodes.
    #[test]
    fn the_handled_set_is_the_abis_full_set() {
        let every_right = [
            AccessFs::Execute,
            AccessFs::WriteFile,
            AccessFs::ReadFile,
            AccessFs::ReadDir,
            AccessFs::RemoveDir,
            AccessFs::RemoveFile,
            AccessFs::MakeChar,
            AccessFs::MakeDir,
            AccessFs::MakeReg,
            AccessFs::MakeSock,
            AccessFs::MakeFifo,
            AccessFs::MakeBlock,
            AccessFs::MakeSym,
            AccessFs::Refer,
            AccessFs::Truncate,
            AccessFs::IoctlDev,
        ];
        for abi in [ABI::V1, ABI::V2, ABI::V3, ABI::V4, ABI::V5, ABI::V6] {
            let handled = handled_fs(abi);
            assert_eq!(handled, AccessFs::from_all(abi), "{abi:?}");
            let write = rights(RuleAccess::Write, abi, true);
            assert_eq!(
                write,
                handled & !(AccessFs::MakeChar | AccessFs::MakeBlock),
                "{abi:?}"
            );
        }
        let newest = handled_fs(ABI::V6);
        for right in every_right {
            assert!(newest.contains(right), "{right:?} is not handled");
        }
    }
}
