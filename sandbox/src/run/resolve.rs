//! Resolving the command line's policy, its directories and allowances, into a
//! [`ResolvedPolicy`].

use std::path::{Path, PathBuf};

use super::{Cli, RunError};
use crate::policy::{
    Allowance, AllowanceBases, ProfileFile, ResolveContext, ResolvedPolicy, SandboxSpec,
};

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
        spec.readable_credential_stores
            .extend(cli.allow_credential_stores.iter().cloned());
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
            let mut profile = ProfileFile::load(&path).map_err(setup)?;
            for name in &cli.allow_credential_stores {
                crate::policy::credentials::canonical_store(name).map_err(setup)?;
            }
            profile
                .readable_credential_stores
                .extend(cli.allow_credential_stores.iter().cloned());
            let policy = profile.resolve(Some(&cwd), &[], &ctx).map_err(setup)?;
            (policy, cwd, Some(path))
        } else {
            let mut spec = SandboxSpec::named(&cli.policy, Some(cwd.clone()));
            spec.readable_credential_stores = cli.allow_credential_stores.clone();
            let policy = spec.resolve_with(&ctx).map_err(setup)?;
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
    // Every running server's secrets, read here, before anything is confined.
    #[cfg(target_os = "linux")]
    {
        policy = crate::servers::read_registered()
            .map_err(|err| RunError::Setup(err.to_string()))?
            .apply(policy);
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
