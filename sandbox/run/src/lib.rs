//! `sandbox-run`: resolve a policy once, then run a command in a sandbox of its own.
//!
//! Exit status: the program's own (or `sandbox-run` dies of the signal that killed it); 125
//! when the sandbox could not be set up (reason on stderr); 126/127 when the program could not
//! be executed / was not found.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::path::PathBuf;

use serde::Serialize;

use sandbox::policy::ResolvedPolicy;

mod cli;
pub mod env;
mod error;
pub(crate) mod option_error;
pub(crate) mod resolve;
pub use cli::{Cli, command};
pub use option_error::OptionError;
pub use resolve::{ResolveError, list_profiles, resolve_cli_policy, user_profile_dir};

pub use error::RunError;
pub use sandbox::exit::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

/// A resolved run: the policy, what to run, where.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The policy, resolved once.
    pub policy: ResolvedPolicy,
    /// Program and arguments.
    pub argv: Vec<OsString>,
    /// The command's environment.
    pub env: Vec<(OsString, OsString)>,
    /// The command's working directory.
    pub cwd: PathBuf,
    /// Best effort was asked.
    pub best_effort: bool,
    /// The command's rlimits and wall-clock time.
    pub limits: sandbox::limits::CommandLimits,
    /// The egress proxy's name mapping (`--egress-hosts`).
    pub egress_hosts: Vec<(String, std::net::IpAddr)>,
}

/// Resolves what the command line (or exec-server's launch request) asks for.
///
/// # Errors
/// [`RunError`] naming the problem: an option ([`OptionError`]) or the policy
/// ([`ResolveError`]).
pub fn prepare(cli: &Cli) -> Result<Prepared, RunError> {
    if let Some(fd) = cli.launch_fd {
        #[cfg(target_os = "linux")]
        let request =
            sandbox::launch::LaunchRequest::read_from_fd(fd).map_err(OptionError::from)?;
        // exec-server, which passes the descriptor, runs on Linux only.
        #[cfg(not(target_os = "linux"))]
        let request: sandbox::launch::LaunchRequest = {
            let _ = fd;
            return Err(OptionError::LinuxOnly {
                flag: "--launch-fd",
            }
            .into());
        };
        return Ok(Prepared {
            policy: request.policy,
            argv: request.argv.into_iter().map(OsString::from).collect(),
            env: request
                .env
                .into_iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
            cwd: request.cwd,
            best_effort: request.best_effort || cli.best_effort,
            limits: request.limits,
            egress_hosts: egress_hosts(cli)?,
        });
    }
    let (policy, cwd) = resolve_cli_policy(cli)?;
    Ok(Prepared {
        policy,
        argv: cli.command.clone(),
        env: env::command_env(std::env::vars_os(), &cli.env_flags()),
        cwd,
        best_effort: cli.best_effort,
        limits: cli_limits(cli)?,
        egress_hosts: egress_hosts(cli)?,
    })
}

/// The limits `--memory`, `--pids`, `--cpu-time` and `--wall-time` ask for.
///
/// # Errors
/// [`OptionError::PidsAsRoot`] for `--pids` as root without `--best-effort` (RLIMIT_NPROC does not bind
/// uid 0, so the limit would silently not apply).
fn cli_limits(cli: &Cli) -> Result<sandbox::limits::CommandLimits, RunError> {
    #[cfg(target_os = "linux")]
    if cli.pids.is_some() && !cli.best_effort && nix::unistd::geteuid().is_root() {
        return Err(OptionError::PidsAsRoot.into());
    }
    Ok(sandbox::limits::CommandLimits {
        cpu_seconds: cli.cpu_time,
        file_size_bytes: None,
        open_files: None,
        address_space_bytes: cli.memory,
        // Without --pids, the sandbox's share of the host's tasks: RLIMIT_NPROC is counted in
        // the sandbox's own user namespace, so the share is this sandbox's (the kernel does
        // not apply it to uid 0, which only exec-server's pids cgroup bounds).
        #[cfg(target_os = "linux")]
        processes: Some(
            cli.pids
                .unwrap_or_else(sandbox::limits::host_processes_share),
        ),
        #[cfg(not(target_os = "linux"))]
        processes: cli.pids,
        wall_seconds: cli.wall_time,
        pools: sandbox::limits::PoolLimits::default(),
    })
}

/// Whom the outer asks (`--ask-fd`'s peer, else the terminal) and for how long.
///
/// # Errors
/// [`OptionError`] for a bad --ask-timeout or an --ask-fd that is not open.
#[cfg(target_os = "linux")]
fn ask_options(cli: &Cli) -> Result<Option<sandbox::linux::command::AskOptions>, RunError> {
    use sandbox::egress::ask::{ASK_TIMEOUT, MAX_ASK_TIMEOUT};
    let timeout = match cli.ask_timeout {
        None => ASK_TIMEOUT,
        Some(seconds) if seconds > 0.0 && seconds <= MAX_ASK_TIMEOUT.as_secs_f64() => {
            std::time::Duration::from_secs_f64(seconds)
        }
        Some(seconds) => {
            return Err(OptionError::AskTimeout {
                seconds,
                max_seconds: MAX_ASK_TIMEOUT.as_secs(),
            }
            .into());
        }
    };
    let peer = match cli.ask_fd {
        Some(fd) => Some(std::sync::Arc::new(
            sandbox::linux::hygiene::take_inherited_fd(fd)
                .map_err(|source| OptionError::AskFd { fd, source })?,
        )),
        None => None,
    };
    Ok(Some(sandbox::linux::command::AskOptions { peer, timeout }))
}

/// The egress proxy's name mapping read from `--egress-hosts`.
fn egress_hosts(cli: &Cli) -> Result<Vec<(String, std::net::IpAddr)>, RunError> {
    match &cli.egress_hosts {
        Some(path) => Ok(sandbox::egress::hosts::load(path).map_err(OptionError::from)?),
        None => Ok(Vec::new()),
    }
}

/// `--explain` output (documented in `policies/README.md`).
#[derive(Debug, Serialize)]
pub struct Explain {
    /// The resolved policy.
    pub policy: ResolvedPolicy,
    /// The command that would run.
    pub command: Vec<String>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Whether best effort was asked.
    pub best_effort: bool,
    /// The allowances applied (`--allow`), already part of `policy`.
    pub allowances: Vec<String>,
    /// The layers.
    pub layers: serde_json::Value,
    /// Rules no available layer can enforce (the run would fail without --best-effort).
    pub unenforceable: Vec<String>,
}

/// Builds the `--explain` document.
#[cfg(target_os = "linux")]
pub fn explain(cli: &Cli, prepared: &Prepared) -> Explain {
    use sandbox::linux::{landlock, mounts, namespaces, seccomp};
    let policy = &prepared.policy;
    let abi = sandbox::linux::landlock::running_abi();
    let namespaces_on = !cli.no_namespaces && !policy.is_unrestricted();
    let userns = namespaces_on && namespaces::available();
    let needing = namespaces::rules_needing_namespace(policy);
    let unenforceable = if userns { Vec::new() } else { needing };
    let seccomp_filters: Vec<String> = if policy.is_unrestricted() {
        Vec::new()
    } else {
        let mut names = vec!["x32_guard".to_owned()];
        let variant = seccomp::Variant {
            network_allowed: policy.network_allowed(),
            audit: false,
        };
        if let Ok(filters) = seccomp::filters_for(variant) {
            names.extend(filters.into_iter().map(|(name, _)| name));
        }
        names
    };
    let layout = sandbox::linux::command_layout(policy, &prepared.cwd);
    let layers = serde_json::json!({
        "no_new_privs": !policy.is_unrestricted(),
        "capabilities": if policy.is_unrestricted() { "kept" } else { "all dropped" },
        "namespaces": {
            "enabled": namespaces_on,
            "available": userns,
            "pid": userns,
            "ipc": userns,
            "mount": userns,
            "network": userns && policy.needs_network_namespace(),
            "egress_proxy": policy.egress().is_some() && userns,
            "mounts": if userns { mounts::mount_plan(policy, &layout) } else { Vec::new() },
        },
        "landlock": {
            "abi": abi,
            "filesystem": policy.restricts_filesystem() && abi > 0,
            "tcp_denied": (!policy.network_fully_on() || !policy.denied_tcp_ports.is_empty()) && abi >= 4,
            "scoped": !policy.is_unrestricted() && abi >= 6,
            "rules": if policy.restricts_filesystem() {
                landlock::rules_for(policy, &if userns { landlock::private_ttys() } else { landlock::session_ttys() })
            } else {
                Vec::new()
            },
        },
        // What the command sees at /tmp, from the same decisions the layout is built from.
        "tmp": sandbox::linux::TmpView::of(policy, userns).on_this_host().describe(),
        "seccomp": { "filters": seccomp_filters },
        // What the command's processes get (with no --pids, the sandbox's share of the host's
        // tasks; RLIMIT_NPROC, which the kernel does not apply to uid 0) and its open files
        // (the bound on its descriptors in flight over unix sockets).
        "limits": {
            "processes": prepared.limits.processes,
            "processes_bound_here": !nix::unistd::geteuid().is_root(),
            "open_files": sandbox::limits::open_files_of_current_process(&prepared.limits),
        },
        // Pathname unix sockets: only inside the writable roots, or named. `mechanism` is
        // null when the filesystem is unrestricted (every socket is reachable then).
        "unix_sockets": {
            "mechanism": policy
                .restricts_filesystem()
                .then(|| sandbox::linux::unix_sockets::Mechanism::for_abi(abi)),
            "allowed": &policy.unix_sockets,
        },
    });
    Explain {
        policy: policy.clone(),
        command: prepared
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: prepared.cwd.clone(),
        best_effort: prepared.best_effort,
        allowances: cli.allowances.clone(),
        layers,
        unenforceable,
    }
}

/// The options `sandbox-run`'s flags select; opens the `--egress-log` file (before the command
/// starts, by descriptor, as the audit report: [`sandbox::report_file`]).
///
/// # Errors
/// [`RunError`] when the egress log cannot be created or the credentials read.
#[cfg(target_os = "linux")]
pub fn run_options(
    cli: &Cli,
    prepared: &Prepared,
    audit_log: bool,
    keep_fds: Vec<i32>,
) -> Result<sandbox::linux::command::RunOptions, RunError> {
    use sandbox::linux::NamespaceMode;
    use sandbox::report_file::ReportFile;
    let egress_log = match &cli.egress_log {
        None => None,
        Some(path) => match ReportFile::open(path, "egress log", &prepared.policy)? {
            ReportFile::File(file) => Some(std::sync::Arc::new(file)),
            ReportFile::Stdout => {
                return Err(OptionError::EgressLogStdout.into());
            }
        },
    };
    Ok(sandbox::linux::command::RunOptions {
        best_effort: prepared.best_effort,
        namespaces: if cli.no_namespaces {
            NamespaceMode::Off
        } else {
            NamespaceMode::Auto
        },
        audit_log,
        report: cli.report,
        keep_fds,
        egress_hosts: prepared.egress_hosts.clone(),
        egress_log,
        upstream_authorization: match &cli.upstream_proxy_credentials {
            Some(path) => Some(
                sandbox::egress::credentials::authorization_from_file(path)
                    .map_err(OptionError::from)?,
            ),
            None => None,
        },
        ask: ask_options(cli)?,
        // Run by hand: repeated interrupts escalate. Under exec-server (--launch-fd) every signal
        // is forwarded as sent, and the server terminates trees itself.
        escalate_interrupts: cli.launch_fd.is_none(),
    })
}

/// The command to run.
#[cfg(target_os = "linux")]
pub fn command_of(prepared: &Prepared) -> sandbox::linux::command::Command {
    sandbox::linux::command::Command {
        argv: prepared.argv.clone(),
        env: prepared.env.clone(),
        cwd: prepared.cwd.clone(),
        limits: prepared.limits.clone(),
    }
}

/// Runs the command in its sandbox; returns how it ended (the caller exits with it).
///
/// # Errors
/// [`RunError`]; the caller exits with [`RunError::exit_code`].
#[cfg(target_os = "linux")]
pub fn run(cli: &Cli) -> Result<sandbox::linux::command::Ended, RunError> {
    let prepared = prepare(cli)?;
    if cli.explain {
        let text =
            serde_json::to_string_pretty(&explain(cli, &prepared)).map_err(OptionError::from)?;
        println!("{text}");
        return Ok(sandbox::linux::command::Ended::Exited(0));
    }
    if prepared.argv.is_empty() {
        return Err(OptionError::NoProgram.into());
    }
    let options = run_options(cli, &prepared, false, Vec::new())?;
    sandbox::linux::command::run(&prepared.policy, &command_of(&prepared), &options, None)
        .map_err(RunError::from)
}

/// Runs the command under Seatbelt. Returns only on failure.
///
/// # Errors
/// [`RunError`]; the caller exits with [`RunError::exit_code`].
#[cfg(target_os = "macos")]
pub fn run(cli: &Cli) -> Result<std::convert::Infallible, RunError> {
    let prepared = prepare(cli)?;
    if prepared.policy.egress().is_some() && !cli.explain {
        return Err(OptionError::AllowlistNeedsLinux.into());
    }
    if cli.explain {
        let profile = sandbox::macos::seatbelt_profile(&prepared.policy);
        println!("{}", profile.map(|p| p.text).unwrap_or_default());
        std::process::exit(0);
    }
    let source = sandbox::macos::exec_under_seatbelt(&prepared.policy, &prepared.argv);
    Err(RunError::Exec {
        program: prepared
            .argv
            .first()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        source,
    })
}
