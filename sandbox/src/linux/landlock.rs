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
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
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

/// The terminals of the session: `/dev/tty` and whatever terminal stdin/stdout/stderr are.
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

/// Installs the ruleset on the calling process.
///
/// # Errors
/// [`LandlockError`] when Landlock is missing or not fully enforced (unless `best_effort`).
/// `log_after_exec` keeps logging denials after `execve` (ABI >= 7; the denial audit).
pub fn install(
    policy: &ResolvedPolicy,
    best_effort: bool,
    log_after_exec: bool,
    warnings: &mut Vec<String>,
) -> Result<LandlockReport, LandlockError> {
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
        ruleset = ruleset.handle_access(AccessFs::from_all(abi))?;
    }
    if !policy.network_allowed() && abi_number >= 4 {
        ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        report.tcp_denied = true;
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
        for rule in rules_for(policy, &session_ttys()) {
            let Some((fd, is_dir)) = open_path(&rule.path) else {
                continue;
            };
            created = created.add_rule(PathBeneath::new(fd, rights(rule.access, abi, is_dir)))?;
            report.rules += 1;
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
fn open_path(path: &Path) -> Option<(PathFd, bool)> {
    let is_dir = std::fs::metadata(path).ok()?.is_dir();
    PathFd::new(path).ok().map(|fd| (fd, is_dir))
}
