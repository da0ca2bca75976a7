//! `sandbox-run`: resolve a policy, confine this process, then `execve` the command.
//!
//! Exit status: the program's own; 125 when the sandbox could not be set up (reason on
//! stderr); 126/127 when the program could not be executed (reported by `sandbox-run` itself,
//! since a spawner such as portable-pty reports a failed exec as success).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Serialize;

use crate::policy::{ProfileFile, ResolveContext, ResolvedPolicy, SandboxSpec};

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
        sandbox-run --policy read-only -- cat /etc/hostname\n  \
        sandbox-run --policy ./my-profile.toml --allow-network -- curl https://example.com\n  \
        sandbox-run --policy '{\"profile\":\"workspace-write\",\"cwd\":\"file:///ws\"}' -- make\n  \
        sandbox-run --policy workspace-write --explain -- true\n\n\
        Exit status: the program's; 125 if the sandbox could not be set up; 126/127 if the\n\
        program could not be executed / was not found. Policies: see policies/README.md."
)]
pub struct Cli {
    /// Policy: a built-in name (read-only, workspace-write, danger-full-access), a profile
    /// file (*.toml, or any path containing '/'), or a JSON sandbox object (starts with '{').
    #[arg(long, value_name = "NAME|FILE.toml|JSON", default_value = "read-only")]
    pub policy: String,
    /// The wire sandbox object as JSON (same as a `--policy` starting with '{').
    #[arg(long, value_name = "JSON", conflicts_with = "policy")]
    pub policy_json: Option<String>,
    /// Directory cwd-dependent rules resolve against (default: the JSON's cwd, else the
    /// current directory). The program itself runs in the current directory.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Extra writable root (repeatable); .git/.agents/.codex inside stay read-only.
    #[arg(long = "writable-root", value_name = "DIR")]
    pub writable_roots: Vec<PathBuf>,
    /// Extra path to deny (masked by the namespace layer, refused by Landlock); repeatable.
    /// exec-server passes its own unix socket here so sandboxed commands cannot reach it.
    #[arg(long = "deny", value_name = "PATH")]
    pub denies: Vec<PathBuf>,
    /// Allow network access.
    #[arg(long)]
    pub allow_network: bool,
    /// Run even if a layer the policy needs is unavailable (reported on stderr).
    #[arg(long)]
    pub best_effort: bool,
    /// Do not use user/mount/network namespaces (Landlock + seccomp only).
    #[arg(long)]
    pub no_namespaces: bool,
    /// Print the resolved rules and the layers that will apply, as JSON, and exit.
    #[arg(long)]
    pub explain: bool,
    /// Print the enforcement report as JSON on stderr before running the program.
    #[arg(long)]
    pub report: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM [ARGS]...")]
    pub command: Vec<OsString>,
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

/// Resolves the policy the command line asks for.
///
/// # Errors
/// [`RunError::Setup`] with the policy error's message.
pub fn resolve_cli_policy(cli: &Cli) -> Result<ResolvedPolicy, RunError> {
    let setup = |err: crate::policy::PolicyError| RunError::Setup(err.to_string());
    let current = std::env::current_dir().ok();
    let absolute = |p: &Path| match &current {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p.to_owned(),
    };
    let cli_cwd = cli.cwd.as_deref().map(absolute);
    let ctx = ResolveContext::from_env();
    let json = cli
        .policy_json
        .as_deref()
        .or_else(|| Some(cli.policy.as_str()).filter(|p| p.trim_start().starts_with('{')));
    let mut policy = if let Some(json) = json {
        let mut spec = SandboxSpec::from_json(json).map_err(setup)?;
        if cli_cwd.is_some() {
            spec.cwd = cli_cwd;
        }
        spec.resolve_with(&ctx).map_err(setup)?
    } else {
        let cwd = cli_cwd.or_else(|| current.clone());
        if cli.policy.ends_with(".toml") || cli.policy.contains('/') {
            let profile = ProfileFile::load(Path::new(&cli.policy)).map_err(setup)?;
            profile.resolve(cwd.as_deref(), &[], &ctx).map_err(setup)?
        } else {
            SandboxSpec::named(&cli.policy, cwd)
                .resolve_with(&ctx)
                .map_err(setup)?
        }
    };
    for root in &cli.writable_roots {
        policy = policy.with_writable_root(&absolute(root));
    }
    if cli.allow_network {
        policy = policy.with_network(true);
    }
    if policy.restricts_filesystem() {
        for path in &cli.denies {
            policy = policy.with_denied_path(&absolute(path));
        }
    }
    Ok(policy)
}

/// `--explain` output (documented in `policies/README.md`).
#[derive(Debug, Serialize)]
pub struct Explain {
    /// The resolved policy.
    pub policy: ResolvedPolicy,
    /// The command that would run.
    pub command: Vec<String>,
    /// Whether best effort was asked.
    pub best_effort: bool,
    /// The layers.
    pub layers: serde_json::Value,
    /// Rules no available layer can enforce (the run would fail without --best-effort).
    pub unenforceable: Vec<String>,
}

/// Builds the `--explain` document.
#[cfg(target_os = "linux")]
pub fn explain(cli: &Cli, policy: &ResolvedPolicy) -> Explain {
    use crate::linux::{landlock, namespaces, seccomp};
    let abi = crate::sys::landlock_abi();
    let namespaces_on = !cli.no_namespaces && !policy.is_unrestricted();
    let userns = namespaces_on && crate::sys::can_unshare_user_namespace();
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
    let layers = serde_json::json!({
        "no_new_privs": !policy.is_unrestricted(),
        "namespaces": {
            "enabled": namespaces_on,
            "available": userns,
            "mount": userns && policy.restricts_filesystem(),
            "network": userns && !policy.network_allowed(),
            "mounts": if userns { namespaces::mount_plan(policy) } else { Vec::new() },
        },
        "landlock": {
            "abi": abi,
            "filesystem": policy.restricts_filesystem() && abi > 0,
            "tcp_denied": !policy.network_allowed() && abi >= 4,
            "scoped": !policy.is_unrestricted() && abi >= 6,
            "rules": if policy.restricts_filesystem() {
                landlock::rules_for(policy, &landlock::session_ttys())
            } else {
                Vec::new()
            },
        },
        "seccomp": { "filters": seccomp_filters },
    });
    Explain {
        policy: policy.clone(),
        command: cli
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        best_effort: cli.best_effort,
        layers,
        unenforceable,
    }
}

/// Confines this process and `execve`s the command. Returns only on failure.
///
/// # Errors
/// [`RunError`]; the caller exits with [`RunError::exit_code`].
#[cfg(target_os = "linux")]
pub fn run(cli: &Cli) -> Result<std::convert::Infallible, RunError> {
    use crate::linux::{EnforceOptions, NamespaceMode, restrict_current_process};
    use std::os::unix::process::CommandExt;
    let policy = resolve_cli_policy(cli)?;
    if cli.explain {
        let text = serde_json::to_string_pretty(&explain(cli, &policy))
            .map_err(|err| RunError::Setup(err.to_string()))?;
        println!("{text}");
        std::process::exit(0);
    }
    let mut options = EnforceOptions::for_command();
    options.best_effort = cli.best_effort;
    if cli.no_namespaces {
        options.namespaces = NamespaceMode::Off;
    }
    let report = restrict_current_process(&policy, &options)
        .map_err(|err| RunError::Setup(err.to_string()))?;
    for warning in &report.warnings {
        eprintln!("sandbox-run: warning: {warning}");
    }
    if cli.report {
        eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    let (program, args) = cli
        .command
        .split_first()
        .ok_or_else(|| RunError::Setup("no program given".to_owned()))?;
    // Command::exec only returns on failure; the environment and cwd are inherited as-is.
    let source = std::process::Command::new(program).args(args).exec();
    Err(RunError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    })
}

/// Runs the command under Seatbelt. Returns only on failure.
///
/// # Errors
/// [`RunError`]; the caller exits with [`RunError::exit_code`].
#[cfg(target_os = "macos")]
pub fn run(cli: &Cli) -> Result<std::convert::Infallible, RunError> {
    let policy = resolve_cli_policy(cli)?;
    if cli.explain {
        let profile = crate::macos::seatbelt_profile(&policy);
        println!("{}", profile.map(|p| p.text).unwrap_or_default());
        std::process::exit(0);
    }
    let source = crate::macos::exec_under_seatbelt(&policy, &cli.command);
    Err(RunError::Exec {
        program: cli
            .command
            .first()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        source,
    })
}
