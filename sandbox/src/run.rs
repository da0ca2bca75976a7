//! `sandbox-run`: resolve a policy once, then run a command in a sandbox of its own.
//!
//! Exit status: the program's own (or `sandbox-run` dies of the signal that killed it); 125
//! when the sandbox could not be set up (reason on stderr); 126/127 when the program could not
//! be executed / was not found.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Serialize;

use crate::policy::{
    Allowance, AllowanceBases, ProfileFile, ResolveContext, ResolvedPolicy, SandboxSpec,
};

/// Exit status for a setup failure.
pub const EXIT_SETUP_FAILED: u8 = 125;
/// Exit status when the program exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit status when the program is not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// Run a command under an execward sandbox policy.
#[derive(Debug, Parser)]
#[command(
    name = "sandbox-run",
    version,
    after_help = "Examples:\n  \
        sandbox-run --policy workspace-write --cwd ~/proj -- cargo test\n  \
        sandbox-run --policy workspace-write --allow toolchain-caches -- cargo test\n  \
        sandbox-run --policy read-only -- cat /etc/hostname\n  \
        sandbox-run --policy ./my-profile.toml --allow-network -- curl https://example.com\n  \
        sandbox-run --allow-domain pypi.org --allow-domain files.pythonhosted.org -- pip install requests\n  \
        sandbox-run --policy '{\"profile\":\"workspace-write\",\"cwd\":\"file:///ws\"}' -- make\n  \
        sandbox-run --policy workspace-write --explain -- true\n\n\
        The command runs in its own user, mount, PID and IPC namespaces (and network namespace\n\
        when the network is off), with no capabilities, private /tmp, /run, /dev and /proc,\n\
        Landlock and a seccomp allow-list. When stdin or stdout is a terminal it gets a\n\
        terminal of its own. Nothing it starts outlives it.\n\n\
        Exit status: the program's (sandbox-run dies of the same signal when one killed it);\n\
        125 if the sandbox could not be set up; 126/127 if the program could not be\n\
        executed / was not found. Policies: see policies/README.md."
)]
pub struct Cli {
    /// Policy: a built-in name (read-only, workspace-write, danger-full-access), a profile
    /// file (*.toml, or any path containing '/'), or a JSON sandbox object (starts with '{').
    /// A profile file inside a writable root of the policy it produces is refused (the
    /// sandboxed command could rewrite it for the next run).
    #[arg(long, value_name = "NAME|FILE.toml|JSON", default_value = "read-only")]
    pub policy: String,
    /// The wire sandbox object as JSON (same as a `--policy` starting with '{').
    #[arg(long, value_name = "JSON", conflicts_with = "policy")]
    pub policy_json: Option<String>,
    /// The command's working directory, and the directory cwd-dependent rules (the workspace
    /// of workspace-write) resolve against. Default: the JSON policy's cwd when it has one,
    /// else the current directory. Must exist (see --create-missing).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Extra writable root (repeatable); .git/.agents/.codex inside stay read-only. Must
    /// exist (see --create-missing).
    #[arg(long = "writable-root", value_name = "DIR")]
    pub writable_roots: Vec<PathBuf>,
    /// Create a missing --cwd or --writable-root (mode 0755) instead of refusing it.
    #[arg(long)]
    pub create_missing: bool,
    /// Apply a named allowance from policies/allowances/ (repeatable): `toolchain-caches`
    /// makes the caches of cargo (registry, git checkouts, lock files), pip, npm and ccache
    /// writable, never their programs, configuration or shell start-up files. Paths come from
    /// this process's $CARGO_HOME, $XDG_CACHE_HOME and $HOME.
    #[arg(long = "allow", value_name = "NAME")]
    pub allowances: Vec<String>,
    /// Extra path to hide (masked by the namespace layer, refused by Landlock); repeatable.
    #[arg(long = "deny", value_name = "PATH")]
    pub denies: Vec<PathBuf>,
    /// Allow network access.
    #[arg(long, conflicts_with_all = ["allow_domains", "deny_domains"])]
    pub allow_network: bool,
    /// Limit the network to an allowlist and add PATTERN to it (repeatable): `host`,
    /// `*.domain`, an IP literal, each with an optional `:PORT` (default 80 and 443), or a
    /// named set such as `@package-registries`. The command reaches them only through the
    /// egress proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY are set for it).
    #[arg(long = "allow-domain", value_name = "PATTERN")]
    pub allow_domains: Vec<String>,
    /// Refuse PATTERN even when an --allow-domain pattern matches (repeatable; without a port:
    /// every port).
    #[arg(long = "deny-domain", value_name = "PATTERN")]
    pub deny_domains: Vec<String>,
    /// Names the egress proxy resolves without DNS, in hosts-file format (`ADDRESS NAME...`):
    /// local mirrors, air-gapped sites, tests.
    #[arg(long, value_name = "FILE")]
    pub egress_hosts: Option<PathBuf>,
    /// Write every egress decision, allowed destinations too, as JSON lines to FILE (created
    /// before the command starts): the allowlist a build needs.
    #[arg(long, value_name = "FILE")]
    pub egress_log: Option<PathBuf>,
    /// Run even if a layer the policy needs is unavailable (reported on stderr).
    #[arg(long)]
    pub best_effort: bool,
    /// Do not use namespaces (Landlock + seccomp only; no PID namespace, no private /tmp).
    #[arg(long)]
    pub no_namespaces: bool,
    /// Print the resolved rules and the layers that will apply, as JSON, and exit.
    #[arg(long)]
    pub explain: bool,
    /// Print the enforcement report as JSON on stderr before running the program.
    #[arg(long)]
    pub report: bool,
    /// Address space per process (RLIMIT_AS), e.g. 512M or 2G (suffixes K, M, G: powers of
    /// 1024). Bounds each process, not the tree: exec-server bounds a tree's memory with a
    /// cgroup instead.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Processes of the sandbox's user (RLIMIT_NPROC, counted in the sandbox's own user
    /// namespace). The kernel exempts uid 0, so as root this needs --best-effort (exec-server
    /// bounds a tree with a pids cgroup instead).
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// CPU seconds per process (RLIMIT_CPU: SIGXCPU at the limit, SIGKILL a second later).
    #[arg(long, value_name = "SECONDS")]
    pub cpu_time: Option<u64>,
    /// Wall-clock seconds; then the whole sandbox is killed (its output so far is delivered).
    #[arg(long, value_name = "SECONDS")]
    pub wall_time: Option<u64>,
    /// Internal (exec-server): read the resolved policy and the command from inherited
    /// descriptor N instead of the options above.
    #[arg(long, value_name = "N", hide = true, conflicts_with_all = ["policy_json", "cwd", "writable_roots", "allowances", "denies", "allow_network", "allow_domains", "deny_domains", "explain", "memory", "pids", "cpu_time", "wall_time"])]
    pub launch_fd: Option<i32>,
    /// The program and its arguments.
    #[arg(
        last = true,
        value_name = "PROGRAM [ARGS]...",
        required_unless_present = "launch_fd"
    )]
    pub command: Vec<OsString>,
}

/// The whole `sandbox-run` command line: [`Cli`] plus, on Linux, the denial audit's flags
/// (`--audit`, ...). `sandbox-run` parses with it; man pages and completions are generated
/// from it.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    #[cfg(target_os = "linux")]
    {
        use clap::Args;
        crate::audit::cli::AuditArgs::augment_args(Cli::command())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Cli::command()
    }
}

/// Why `sandbox-run` stopped before the program ran.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Policy or sandbox setup failed (exit 125).
    #[error("{0}")]
    Setup(String),
    /// `execve` failed (exit 126 or 127).
    #[error("cannot execute {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl RunError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Setup(_) => EXIT_SETUP_FAILED,
            RunError::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            RunError::Exec { .. } => EXIT_CANNOT_EXECUTE,
        }
    }
}

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
    pub limits: crate::limits::CommandLimits,
    /// The egress proxy's name mapping (`--egress-hosts`).
    pub egress_hosts: Vec<(String, std::net::IpAddr)>,
}

/// Resolves what the command line (or exec-server's launch request) asks for.
///
/// # Errors
/// [`RunError::Setup`] naming the problem.
pub fn prepare(cli: &Cli) -> Result<Prepared, RunError> {
    if let Some(fd) = cli.launch_fd {
        let request = crate::launch::LaunchRequest::read_from_fd(fd)
            .map_err(|err| RunError::Setup(err.to_string()))?;
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
        env: std::env::vars_os().collect(),
        cwd,
        best_effort: cli.best_effort,
        limits: cli_limits(cli)?,
        egress_hosts: egress_hosts(cli)?,
    })
}

/// The limits `--memory`, `--pids`, `--cpu-time` and `--wall-time` ask for.
///
/// # Errors
/// [`RunError::Setup`] for `--pids` as root without `--best-effort` (RLIMIT_NPROC does not bind
/// uid 0, so the limit would silently not apply).
fn cli_limits(cli: &Cli) -> Result<crate::limits::CommandLimits, RunError> {
    #[cfg(target_os = "linux")]
    if cli.pids.is_some() && !cli.best_effort && nix::unistd::geteuid().is_root() {
        return Err(RunError::Setup(
            "--pids cannot be enforced: it is RLIMIT_NPROC, which the kernel does not apply to \
             uid 0; run sandbox-run as another user or under exec-server (whose pids cgroup \
             bounds the tree), or pass --best-effort to run without it"
                .to_owned(),
        ));
    }
    Ok(crate::limits::CommandLimits {
        cpu_seconds: cli.cpu_time,
        file_size_bytes: None,
        open_files: None,
        address_space_bytes: cli.memory,
        processes: cli.pids,
        wall_seconds: cli.wall_time,
    })
}

/// `--memory`'s value: bytes, or a number with a K, M or G suffix (powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().last() {
        Some((at, suffix)) if suffix.is_ascii_alphabetic() => {
            let unit: u64 = match suffix.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix {suffix:?} (use K, M or G)")),
            };
            (&text[..at], unit)
        }
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("{text:?} is not a size (a positive number of bytes, or 512M, 2G)"))
}

/// The egress proxy's name mapping read from `--egress-hosts`.
fn egress_hosts(cli: &Cli) -> Result<Vec<(String, std::net::IpAddr)>, RunError> {
    match &cli.egress_hosts {
        Some(path) => crate::egress::hosts::load(path).map_err(|e| RunError::Setup(e.to_string())),
        None => Ok(Vec::new()),
    }
}

/// An existing directory for `--cwd`/`--writable-root`, created when asked; absolute.
fn existing_dir(flag: &str, path: &Path, create: bool) -> Result<PathBuf, RunError> {
    let absolute = match std::env::current_dir() {
        Ok(dir) if path.is_relative() => dir.join(path),
        _ => path.to_owned(),
    };
    match std::fs::metadata(&absolute) {
        Ok(meta) if meta.is_dir() => Ok(absolute),
        Ok(_) => Err(RunError::Setup(format!(
            "{flag} {} is not a directory",
            absolute.display()
        ))),
        Err(_) if create => std::fs::create_dir_all(&absolute)
            .map(|()| absolute.clone())
            .map_err(|err| {
                RunError::Setup(format!(
                    "{flag} {}: cannot create it: {err}",
                    absolute.display()
                ))
            }),
        Err(err) => Err(RunError::Setup(format!(
            "{flag} {} does not exist ({err}); create it first or pass --create-missing",
            absolute.display()
        ))),
    }
}

/// Resolves the policy the command line asks for and the command's working directory.
///
/// # Errors
/// [`RunError::Setup`] with the policy error's message, a missing directory, or a profile file
/// the policy would let the command rewrite.
pub fn resolve_cli_policy(cli: &Cli) -> Result<(ResolvedPolicy, PathBuf), RunError> {
    let setup = |err: crate::policy::PolicyError| RunError::Setup(err.to_string());
    let current = std::env::current_dir()
        .map_err(|err| RunError::Setup(format!("cannot read the current directory: {err}")))?;
    let cli_cwd = cli
        .cwd
        .as_deref()
        .map(|dir| existing_dir("--cwd", dir, cli.create_missing))
        .transpose()?;
    let roots = cli
        .writable_roots
        .iter()
        .map(|root| existing_dir("--writable-root", root, cli.create_missing))
        .collect::<Result<Vec<_>, _>>()?;
    let ctx = ResolveContext::from_env();
    let json = cli
        .policy_json
        .as_deref()
        .or_else(|| Some(cli.policy.as_str()).filter(|p| p.trim_start().starts_with('{')));
    let (mut policy, cwd, profile_file) = if let Some(json) = json {
        let mut spec = SandboxSpec::from_json(json).map_err(setup)?;
        if cli_cwd.is_some() {
            spec.cwd = cli_cwd.clone();
        }
        let cwd = match spec.cwd.clone() {
            Some(cwd) => existing_dir("the policy's cwd", &cwd, cli.create_missing)?,
            None => current.clone(),
        };
        spec.cwd = Some(cwd.clone());
        (spec.resolve_with(&ctx).map_err(setup)?, cwd, None)
    } else {
        let cwd = cli_cwd.unwrap_or(current.clone());
        if cli.policy.ends_with(".toml") || cli.policy.contains('/') {
            let path = current.join(&cli.policy);
            let profile = ProfileFile::load(&path).map_err(setup)?;
            let policy = profile.resolve(Some(&cwd), &[], &ctx).map_err(setup)?;
            (policy, cwd, Some(path))
        } else {
            let policy = SandboxSpec::named(&cli.policy, Some(cwd.clone()))
                .resolve_with(&ctx)
                .map_err(setup)?;
            (policy, cwd, None)
        }
    };
    for root in &roots {
        policy = policy.with_writable_root(root);
    }
    let bases = AllowanceBases::from_env();
    for name in &cli.allowances {
        policy = Allowance::builtin(name)
            .and_then(|allowance| allowance.apply(policy, &bases))
            .map_err(|err| RunError::Setup(err.to_string()))?;
    }
    if cli.allow_network {
        policy = policy.with_network(true);
    }
    if !cli.allow_domains.is_empty() || !cli.deny_domains.is_empty() {
        let base = policy.egress().cloned().unwrap_or_default();
        let rules = base
            .extended(&cli.allow_domains, &cli.deny_domains)
            .map_err(setup)?;
        policy = policy.with_network_policy(crate::policy::NetworkPolicy::Allowlist(rules));
    }
    for path in &cli.denies {
        policy = policy.with_hidden_path(&current.join(path));
    }
    if let Some(path) = profile_file {
        refuse_writable_profile(&policy, &path)?;
    }
    policy
        .refuse_planted_symlink(&cwd)
        .map_err(|err| RunError::Setup(format!("--cwd: {err}")))?;
    let cwd = std::fs::canonicalize(&cwd)
        .map_err(|err| RunError::Setup(format!("--cwd {}: {err}", cwd.display())))?;
    Ok((policy, cwd))
}

/// A profile file the sandboxed command could rewrite would confine the next run by the
/// command's rules, not the user's.
fn refuse_writable_profile(policy: &ResolvedPolicy, path: &Path) -> Result<(), RunError> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    for candidate in [path, canonical.as_path()] {
        if policy.restricts_filesystem() && policy.can_write(candidate) {
            return Err(RunError::Setup(format!(
                "profile file {} lies inside a writable root of the policy it defines, so the \
                 sandboxed command could rewrite it for the next run; keep it outside the \
                 writable roots (e.g. ~/.config/execward/)",
                candidate.display()
            )));
        }
    }
    Ok(())
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
    use crate::linux::{landlock, mounts, namespaces, seccomp};
    let policy = &prepared.policy;
    let abi = crate::sys::landlock_abi();
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
    let layout = crate::linux::command_layout(policy, &prepared.cwd);
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
        "seccomp": { "filters": seccomp_filters },
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
/// starts, by descriptor, as the audit report: [`crate::audit::output`]).
///
/// # Errors
/// [`RunError::Setup`] when the egress log cannot be created.
#[cfg(target_os = "linux")]
pub fn run_options(
    cli: &Cli,
    prepared: &Prepared,
    audit_log: bool,
    keep_fds: Vec<i32>,
) -> Result<crate::linux::command::RunOptions, RunError> {
    use crate::linux::NamespaceMode;
    let egress_log = match &cli.egress_log {
        None => None,
        Some(path) => match crate::audit::output::ReportFile::open(path, &prepared.policy)? {
            crate::audit::output::ReportFile::File(file) => Some(std::sync::Arc::new(file)),
            crate::audit::output::ReportFile::Stdout => {
                return Err(RunError::Setup(
                    "--egress-log needs a file path ('-' is not supported)".to_owned(),
                ));
            }
        },
    };
    Ok(crate::linux::command::RunOptions {
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
    })
}

/// The command to run.
#[cfg(target_os = "linux")]
pub fn command_of(prepared: &Prepared) -> crate::linux::command::Command {
    crate::linux::command::Command {
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
pub fn run(cli: &Cli) -> Result<crate::linux::command::Ended, RunError> {
    let prepared = prepare(cli)?;
    if cli.explain {
        let text = serde_json::to_string_pretty(&explain(cli, &prepared))
            .map_err(|err| RunError::Setup(err.to_string()))?;
        println!("{text}");
        return Ok(crate::linux::command::Ended::Exited(0));
    }
    if prepared.argv.is_empty() {
        return Err(RunError::Setup("no program given".to_owned()));
    }
    let options = run_options(cli, &prepared, false, Vec::new())?;
    crate::linux::command::run(&prepared.policy, &command_of(&prepared), &options, None)
        .map_err(from_command_error)
}

/// Maps the runner's error to `sandbox-run`'s.
#[cfg(target_os = "linux")]
pub fn from_command_error(err: crate::linux::command::CommandError) -> RunError {
    match err {
        crate::linux::command::CommandError::Exec { program, source } => {
            RunError::Exec { program, source }
        }
        other => RunError::Setup(other.to_string()),
    }
}

/// Runs the command under Seatbelt. Returns only on failure.
///
/// # Errors
/// [`RunError`]; the caller exits with [`RunError::exit_code`].
#[cfg(target_os = "macos")]
pub fn run(cli: &Cli) -> Result<std::convert::Infallible, RunError> {
    let prepared = prepare(cli)?;
    if prepared.policy.egress().is_some() && !cli.explain {
        return Err(RunError::Setup(
            "network allowlists need the egress proxy, which sandbox-run runs on Linux only; \
             use the network on or off here"
                .to_owned(),
        ));
    }
    if cli.explain {
        let profile = crate::macos::seatbelt_profile(&prepared.policy);
        println!("{}", profile.map(|p| p.text).unwrap_or_default());
        std::process::exit(0);
    }
    let source = crate::macos::exec_under_seatbelt(&prepared.policy, &prepared.argv);
    Err(RunError::Exec {
        program: prepared
            .argv
            .first()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        source,
    })
}
