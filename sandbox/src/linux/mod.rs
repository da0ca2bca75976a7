//! Linux enforcement, applied by a freshly exec'd, single-threaded process to itself.
//!
//! Order (each step relies on the previous one):
//! 1. close inherited descriptors except the keep-list ([`hygiene`]);
//! 2. rebuild the environment (helper allowlist or keep as-is);
//! 3. `no_new_privs`;
//! 4. user + mount (+ network) namespace: `/` read-only, writable roots re-bound writable,
//!    protected subpaths re-bound read-only, deny entries masked ([`namespaces`]); then
//!    `chdir` back into the cwd so it resolves through the new mounts;
//! 5. Landlock: every filesystem right of the running ABI, TCP rights when the network is
//!    off, signal and abstract-socket scoping ([`landlock`]) — after the mounts, because a
//!    Landlock domain may no longer change mounts;
//! 6. seccomp, last, because it forbids `unshare` and `mount` ([`seccomp`]).
//!
//! A rule that only a missing layer could enforce fails the whole call unless
//! [`EnforceOptions::best_effort`] is set.

pub mod hygiene;
pub mod landlock;
pub mod namespaces;
pub mod seccomp;
pub mod seccomp_policy;

use std::os::fd::RawFd;
use std::path::PathBuf;

use serde::Serialize;

use crate::policy::ResolvedPolicy;

/// How the environment is rebuilt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnvMode {
    /// Keep only [`hygiene::HELPER_ENV_ALLOWLIST`] (helpers: never `HOME`, tokens, ...).
    HelperAllowlist,
    /// Keep the environment as given (spawned commands: the supervisor already built it).
    Keep,
}

/// Whether to try the namespace layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NamespaceMode {
    /// Use user + mount (+ net) namespaces when the kernel allows them.
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
    /// has it, seccomp `FLAG_LOG`); set by the denial audit ([`crate::audit`]).
    pub audit_log: bool,
}

impl EnforceOptions {
    /// Options for a spawned command: keep stdio and the environment, namespaces on, strict.
    pub fn for_command() -> Self {
        Self {
            best_effort: false,
            keep_fds: vec![0, 1, 2],
            env: EnvMode::Keep,
            namespaces: NamespaceMode::Auto,
            audit_log: false,
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
        }
    }
}

/// What [`restrict_current_process`] applied.
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
    /// Landlock failed or was not fully enforced.
    #[error(transparent)]
    Landlock(#[from] landlock::LandlockError),
    /// Seccomp failed.
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// Re-entering the working directory after the mount changes failed.
    #[error("re-entering working directory {path} after mount setup failed: {source}")]
    Chdir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: nix::Error,
    },
}

/// Confines the calling process according to `policy`. Irreversible.
///
/// Call it from a freshly exec'd, single-threaded process before it reads any path or runs
/// any command; then `execve` the command (or do the file operations).
///
/// # Errors
/// [`SandboxError`] naming the step that failed; with `best_effort` unset, also when a rule
/// of the policy cannot be enforced by the layers available on this machine.
pub fn restrict_current_process(
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
    let ns_result = match options.namespaces {
        NamespaceMode::Auto => namespaces::enter(policy),
        NamespaceMode::Off => Err(namespaces::NamespaceError::Disabled),
    };
    match ns_result {
        Ok(ns) => report.namespaces = ns,
        Err(err) => {
            if let Some(rule) = narrowing.first().filter(|_| !options.best_effort) {
                return Err(SandboxError::NamespaceRequired {
                    rule: rule.clone(),
                    cause: err.to_string(),
                });
            }
            if err.is_partial() && !options.best_effort {
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
        }
    }
    if report.namespaces.mount
        && let Some(path) = cwd
    {
        nix::unistd::chdir(&path).map_err(|source| SandboxError::Chdir { path, source })?;
    }

    report.landlock = landlock::install(
        policy,
        options.best_effort,
        options.audit_log,
        &mut report.warnings,
    )?;
    report.seccomp = seccomp::install_on_current_thread(seccomp::Variant {
        network_allowed: policy.network_allowed(),
        audit: options.audit_log,
    })?;
    Ok(report)
}
