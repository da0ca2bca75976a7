//! Linux enforcement.
//!
//! Two ways in, one set of layers:
//! - a **command** (`sandbox-run`, [`command::run`]) runs in new user, mount, PID and IPC
//!   namespaces (and a network namespace unless the network is fully on) under a small PID 1 that
//!   forwards signals, reaps orphans and ends with the command, so nothing the command started
//!   outlives it;
//! - a **helper** (`fs-helper`, [`restrict_current_process`]) confines itself in place: it never
//!   forks, so it needs no PID namespace.
//!
//! Order (each step relies on the previous one):
//! 1. close inherited descriptors except the keep-list, rebuild the environment ([`hygiene`]);
//! 2. `no_new_privs`;
//! 3. the namespaces ([`namespaces`]) and the mount layout ([`mounts`]): `/` read-only, writable
//!    roots re-bound writable, protected paths read-only, denied and hidden paths masked,
//!    private `/tmp`, `/run`, `/dev` and `/proc`; built from descriptors, so a path swapped
//!    for a symlink cannot redirect it; then back into the working directory, which now
//!    resolves through the new mounts;
//! 4. every capability dropped for good (`drop_all_capabilities`), whoever runs
//!    the sandbox;
//! 5. Landlock ([`landlock`]): every filesystem right of the running ABI, TCP (all ports with
//!    the network off; all but the egress proxy's connect port with an allowlist; the
//!    supervisor's own ports with it on), signal and abstract-socket
//!    scoping; after the mounts, because a Landlock domain may no longer change mounts;
//! 6. seccomp ([`seccomp`]), last: a default-deny allow-list that also forbids `mount` and
//!    `unshare`. A process that starts a command (PID 1, or `sandbox-run` without namespaces)
//!    starts it first (`unix_sockets::start_command`): the command's process installs its own
//!    filter (with the listener the starter keeps, when the host needs the unix-socket
//!    notifier) and the main one, then execs; the starter installs the main one on itself
//!    right after (under the denial audit the main filter refuses new filters).
//!
//! A rule that only a missing layer could enforce fails the whole call unless
//! [`EnforceOptions::best_effort`] is set.

pub mod command;
pub mod hygiene;
mod init;
pub use init::{TmpView, command_layout};
pub mod landlock;
pub mod launcher;
pub mod mounts;
pub mod namespaces;
mod pty;
pub mod seccomp;
pub mod seccomp_policy;
pub mod spec;
pub mod unix_refusals;
pub mod unix_sockets;

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::policy::ResolvedPolicy;

/// How the environment is rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnvMode {
    /// Keep only [`hygiene::HELPER_ENV_ALLOWLIST`] (helpers: never `HOME`, tokens, ...).
    HelperAllowlist,
    /// Keep the environment as given (`sandbox-run` run by a user: the command gets it).
    Keep,
}

/// Whether to try the namespace layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamespaceMode {
    /// Use namespaces when the kernel allows them.
    Auto,
    /// Do not use namespaces (Landlock + seccomp only).
    Off,
}

/// Options for [`restrict_current_process`].
#[derive(Clone, Debug)]
pub struct EnforceOptions {
    /// Run even if a layer the policy needs is missing (reported, not fatal).
    pub best_effort: bool,
    /// Descriptors to keep open (usually 0, 1, 2 and a helper's socket).
    pub keep_fds: Vec<RawFd>,
    /// Environment handling.
    pub env: EnvMode,
    /// Namespace layer.
    pub namespaces: NamespaceMode,
    /// Log denials to the kernel audit after `execve` (Landlock `LOG_NEW_EXEC_ON` when the ABI
    /// has it, seccomp `FLAG_LOG`) and refuse nested Landlock/seccomp; set by the denial audit
    /// (the `audit` crate).
    pub audit_log: bool,
    /// The egress proxy's port on the sandbox's loopback: with a network allowlist, the only
    /// TCP port Landlock lets the command connect to.
    pub egress_port: Option<u16>,
}

impl EnforceOptions {
    /// Options for a command run without the namespace layer: keep stdio and the
    /// environment, strict.
    pub fn for_command() -> Self {
        Self {
            best_effort: false,
            keep_fds: vec![0, 1, 2],
            env: EnvMode::Keep,
            namespaces: NamespaceMode::Auto,
            audit_log: false,
            egress_port: None,
        }
    }

    /// Options for a helper: allowlisted environment, keep stdio plus `extra_fds`.
    pub fn for_helper(extra_fds: &[RawFd]) -> Self {
        let mut keep_fds = vec![0, 1, 2];
        keep_fds.extend_from_slice(extra_fds);
        Self {
            best_effort: false,
            keep_fds,
            env: EnvMode::HelperAllowlist,
            namespaces: NamespaceMode::Auto,
            audit_log: false,
            egress_port: None,
        }
    }
}

/// What the layers applied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnforcementReport {
    /// Landlock layer.
    pub landlock: landlock::LandlockReport,
    /// Namespace layer.
    pub namespaces: namespaces::NamespaceReport,
    /// Names of the seccomp filters installed (empty: none).
    pub seccomp: Vec<String>,
    /// `PR_SET_NO_NEW_PRIVS` is set.
    pub no_new_privs: bool,
    /// Every capability set (bounding, permitted, effective, inheritable, ambient) is empty.
    pub capabilities_dropped: bool,
    /// How pathname unix sockets outside the writable roots are kept out (`None`: the
    /// filesystem is unrestricted, every socket is reachable).
    pub unix_sockets: Option<unix_sockets::Mechanism>,
    /// Why a layer is missing or weaker, when best effort let it pass.
    pub warnings: Vec<String>,
}

/// Why confinement failed. The process must not go on to run anything.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// Closing inherited descriptors failed.
    #[error("closing inherited file descriptors failed: {source}")]
    CloseFds {
        /// The OS error.
        source: std::io::Error,
    },
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("setting no_new_privs failed: {source}")]
    NoNewPrivs {
        /// The OS error.
        source: nix::Error,
    },
    /// The namespace layer failed while the policy needs it.
    #[error(
        "rule {rule} needs the mount-namespace layer, which is unavailable ({cause}); \
         pass --best-effort to run without it"
    )]
    NamespaceRequired {
        /// The rule only that layer enforces.
        rule: String,
        /// Why the layer is unavailable.
        cause: String,
    },
    /// Namespace setup failed after it had started (the process is half-configured).
    #[error(transparent)]
    Namespace(#[from] namespaces::NamespaceError),
    /// Dropping capabilities failed.
    #[error("dropping every capability failed: {source}")]
    Capabilities {
        /// The OS error.
        source: std::io::Error,
    },
    /// Landlock failed or was not fully enforced.
    #[error(transparent)]
    Landlock(#[from] landlock::LandlockError),
    /// Seccomp failed.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// The sandbox's own terminal could not be set up.
    #[error("setting up the sandbox's terminal failed: {source}")]
    Terminal {
        /// The OS error.
        source: std::io::Error,
    },
    /// The egress proxy's listener could not be set up in the sandbox's network namespace.
    #[error("setting up the egress proxy's listener in the sandbox failed: {source}")]
    Egress {
        /// The OS error.
        source: std::io::Error,
    },
    /// A network allowlist needs the network-namespace layer.
    #[error(
        "a network allowlist needs the namespace layer (the command's own network namespace),          which is unavailable or disabled ({cause}); without it the allowlist cannot be enforced"
    )]
    EgressNeedsNamespace {
        /// Why the layer is unavailable.
        cause: String,
    },
    /// The command's process could not be started with its own seccomp filter.
    #[error("starting the command failed: {source}")]
    Spawn {
        /// The OS error.
        source: std::io::Error,
    },
    /// The holder of the command's seccomp listener could not install its own filter.
    #[error("installing the seccomp filter failed: {source}")]
    HolderSeccomp {
        /// The OS error.
        source: std::io::Error,
    },
    /// Entering the working directory after the mount changes failed.
    #[error("entering working directory {path} in the sandbox failed: {source}")]
    Chdir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The layout a helper gets: a private `/dev`, but the host's `/tmp` and `/run` (its file
/// operations are about the host's files; it connects to no socket).
fn helper_layout() -> mounts::Layout {
    mounts::Layout {
        proc: false,
        dev: true,
        private_dirs: Vec::new(),
        overlay_dirs: Vec::new(),
        carry: Vec::new(),
    }
}

/// Confines the calling process according to `policy`, in place. Irreversible.
///
/// Call it from a freshly exec'd, single-threaded process before it reads any path or runs
/// any command; then do the file operations (a helper) or `execve` the command (a command run
/// without namespaces).
///
/// # Errors
/// [`SandboxError`] naming the step that failed; with `best_effort` unset, also when a rule
/// of the policy cannot be enforced by the layers available on this machine.
pub fn restrict_current_process(
    policy: &ResolvedPolicy,
    options: &EnforceOptions,
) -> Result<EnforcementReport, SandboxError> {
    let mut report = restrict_current_process_but_seccomp(policy, options)?;
    if !policy.is_unrestricted() {
        report.seccomp = seccomp::install_on_current_thread(seccomp_variant(policy, options))?;
    }
    Ok(report)
}

/// [`restrict_current_process`] without its last step, the seccomp filter: a process that
/// starts a command holding a seccomp listener (`unix_sockets::start_command`) installs it
/// after the command has installed its own.
pub(crate) fn restrict_current_process_but_seccomp(
    policy: &ResolvedPolicy,
    options: &EnforceOptions,
) -> Result<EnforcementReport, SandboxError> {
    hygiene::close_inherited_fds(&options.keep_fds)
        .map_err(|source| SandboxError::CloseFds { source })?;
    hygiene::rebuild_env(options.env);
    let mut report = EnforcementReport::default();
    if policy.is_unrestricted() {
        return Ok(report);
    }
    nix::sys::prctl::set_no_new_privs().map_err(|source| SandboxError::NoNewPrivs { source })?;
    report.no_new_privs = true;

    let cwd = nix::unistd::getcwd().ok();
    let narrowing = namespaces::rules_needing_namespace(policy);
    let entered = match options.namespaces {
        NamespaceMode::Auto => namespaces::unshare_for_current_process(policy),
        NamespaceMode::Off => Err(namespaces::NamespaceError::Disabled),
    };
    let private_dev = match entered {
        Ok(mut ns) => {
            let layout = helper_layout();
            if ns.mount {
                let applied = mounts::apply(&mounts::mount_plan(policy, &layout))
                    .map_err(namespaces::NamespaceError::from)?;
                ns.mounts = applied.ops;
                report.warnings.extend(applied.warnings);
            }
            report.namespaces = ns;
            layout.dev
        }
        Err(err) => {
            tolerate_missing_namespaces(err, &narrowing, options.best_effort, &mut report)?;
            false
        }
    };
    if report.namespaces.mount
        && let Some(path) = cwd
    {
        enter_directory(&path)?;
    }
    let ttys = if private_dev {
        landlock::private_ttys()
    } else {
        landlock::session_ttys()
    };
    confine_but_seccomp(policy, &ttys, options, &mut report)?;
    Ok(report)
}

/// What to do when the namespace layer is missing: fail when a rule needs it (unless best
/// effort), else record why.
fn tolerate_missing_namespaces(
    err: namespaces::NamespaceError,
    narrowing: &[String],
    best_effort: bool,
    report: &mut EnforcementReport,
) -> Result<(), SandboxError> {
    if let Some(rule) = narrowing.first().filter(|_| !best_effort) {
        return Err(SandboxError::NamespaceRequired {
            rule: rule.clone(),
            cause: err.to_string(),
        });
    }
    if err.is_partial() && !best_effort {
        return Err(err.into());
    }
    if !matches!(err, namespaces::NamespaceError::Disabled) {
        report
            .warnings
            .push(format!("namespace layer not applied: {err}"));
    }
    for rule in narrowing {
        report.warnings.push(format!(
            "rule {rule} is not enforced (needs the namespace layer)"
        ));
    }
    Ok(())
}

/// `chdir` into `path` inside the new mount layout, without following symlinks (the working
/// directory was resolved with the policy; a symlink there now is a swap).
pub(crate) fn enter_directory(path: &Path) -> Result<(), SandboxError> {
    let chdir_error = |source: std::io::Error| SandboxError::Chdir {
        path: path.to_owned(),
        source,
    };
    let dir = crate::sys::open_no_symlinks(None, path).map_err(chdir_error)?;
    nix::unistd::fchdir(&dir).map_err(|e| chdir_error(e.into()))
}

/// The seccomp program `policy` and `options` call for.
pub(crate) fn seccomp_variant(
    policy: &ResolvedPolicy,
    options: &EnforceOptions,
) -> seccomp::Variant {
    seccomp::Variant {
        network_allowed: policy.network_allowed(),
        audit: options.audit_log,
    }
}

/// Steps 4 and 5: capabilities and Landlock (seccomp comes once the command has started, see
/// [`unix_sockets::start_command`]).
pub(crate) fn confine_but_seccomp(
    policy: &ResolvedPolicy,
    ttys: &[PathBuf],
    options: &EnforceOptions,
    report: &mut EnforcementReport,
) -> Result<(), SandboxError> {
    report.unix_sockets = if policy.restricts_filesystem() {
        Some(unix_sockets::Mechanism::of_this_host())
    } else {
        None
    };
    drop_capabilities(report.namespaces.user)
        .map_err(|source| SandboxError::Capabilities { source })?;
    report.capabilities_dropped = true;
    report.landlock = landlock::install_on_current_process(
        policy,
        ttys,
        &landlock::NetOptions {
            best_effort: options.best_effort,
            log_after_exec: options.audit_log,
            egress_port: options.egress_port,
        },
        &mut report.warnings,
    )?;
    Ok(())
}

/// Drops every capability. In its own user namespace a process holds `CAP_SETPCAP` and can lock
/// the securebits and empty the bounding set; an unprivileged process outside one holds nothing
/// to drop but must still end with empty sets, which is checked.
fn drop_capabilities(in_own_user_namespace: bool) -> std::io::Result<()> {
    match crate::sys::drop_all_capabilities() {
        Ok(()) => Ok(()),
        Err(err) if in_own_user_namespace || nix::unistd::geteuid().is_root() => Err(err),
        Err(_) => crate::sys::require_no_capabilities(),
    }
}
