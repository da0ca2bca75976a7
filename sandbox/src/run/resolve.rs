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

/// Where a user's own named profiles live: `$XDG_CONFIG_HOME/execward/profiles` or
/// `~/.config/execward/profiles` (of the caller's environment: `sandbox-run`'s caller is the
/// trusted party, the command never sees this).
pub fn user_profile_dir() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_CONFIG_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".config")))
        .map(|config| config.join("execward").join("profiles"))
}

/// `NAME.toml` in [`user_profile_dir`] for a name that is no built-in (built-ins win, so a file
/// there cannot change what `read-only` means).
fn user_profile(name: &str) -> Option<PathBuf> {
    let builtin = crate::policy::BUILTIN_PROFILES
        .iter()
        .any(|(builtin, _)| *builtin == name);
    let plain = !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\']);
    if builtin || !plain {
        return None;
    }
    let path = user_profile_dir()?.join(format!("{name}.toml"));
    path.is_file().then_some(path)
}

/// `--list-profiles`: every name `--policy` takes, with its description.
pub fn list_profiles() -> String {
    let mut out = String::from("built-in profiles:\n");
    for (name, text) in crate::policy::BUILTIN_PROFILES {
        let description = ProfileFile::parse(text, name)
            .ok()
            .and_then(|p| p.description)
            .unwrap_or_default();
        out.push_str(&format!("  {name:<20} {description}\n"));
    }
    let Some(dir) = user_profile_dir() else {
        out.push_str("user profiles: none (neither $XDG_CONFIG_HOME nor $HOME is set)\n");
        return out;
    };
    let mut user: Vec<(String, String)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".toml")?
                .to_owned();
            let description = match ProfileFile::load(&path) {
                Ok(profile) => profile.description.unwrap_or_default(),
                Err(err) => format!("(unusable: {err})"),
            };
            Some((name, description))
        })
        .collect();
    user.sort();
    out.push_str(&format!("user profiles ({}):\n", dir.display()));
    if user.is_empty() {
        out.push_str("  none\n");
    }
    for (name, description) in user {
        let shadowed = crate::policy::BUILTIN_PROFILES
            .iter()
            .any(|(builtin, _)| *builtin == name);
        let note = if shadowed {
            " (ignored: a built-in has this name)"
        } else {
            ""
        };
        out.push_str(&format!("  {name:<20} {description}{note}\n"));
    }
    out
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
        } else if let Some(path) = user_profile(&cli.policy) {
            let profile = ProfileFile::load(&path).map_err(setup)?;
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
    for socket in &cli.allow_unix_sockets {
        policy = policy
            .with_allowed_unix_socket(&current.join(socket))
            .map_err(setup)?;
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
    if cli.ask {
        let Some(rules) = policy.egress().cloned() else {
            return Err(RunError::Setup(
                "--ask needs a network allowlist (--allow-domain, or a policy whose network is \
                 {\"allow\": [...]})"
                    .to_owned(),
            ));
        };
        policy = policy.with_network_policy(crate::policy::NetworkPolicy::Allowlist(
            crate::policy::EgressRules { ask: true, ..rules },
        ));
    }
    if let Some(url) = &cli.upstream_proxy {
        let upstream = crate::policy::network::UpstreamProxy::parse(url).map_err(setup)?;
        let Some(rules) = policy.egress().cloned() else {
            return Err(RunError::Setup(
                "--upstream-proxy needs a network allowlist (--allow-domain, or a policy whose \
                 network is {\"allow\": [...]})"
                    .to_owned(),
            ));
        };
        policy = policy.with_network_policy(crate::policy::NetworkPolicy::Allowlist(
            rules.with_upstream(Some(upstream)),
        ));
    }
    for path in &cli.denies {
        let path = current.join(path);
        if std::fs::symlink_metadata(&path).is_err() {
            // Not an error: a script may deny a path that only some machines have. But a typo
            // would otherwise leave the real file readable without a word.
            eprintln!(
                "sandbox-run: warning: --deny {}: no such file or directory, so nothing is hidden \
                 there (check the spelling; what the command creates there later is not hidden \
                 either)",
                path.display()
            );
        }
        policy = policy.with_hidden_path(&path);
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
        policy
            .refuse_planted_symlink(&path)
            .map_err(|err| RunError::Setup(format!("profile file: {err}")))?;
    }
    policy
        .refuse_planted_symlink(&cwd)
        .map_err(|err| RunError::Setup(format!("--cwd: {err}")))?;
    for root in &roots {
        policy
            .refuse_planted_symlink(root)
            .map_err(|err| RunError::Setup(format!("--writable-root: {err}")))?;
    }
    for path in &cli.denies {
        policy
            .refuse_planted_symlink(&current.join(path))
            .map_err(|err| RunError::Setup(format!("--deny: {err}")))?;
    }
    let cwd = std::fs::canonicalize(&cwd)
        .map_err(|err| RunError::Setup(format!("--cwd {}: {err}", cwd.display())))?;
    Ok((policy.with_working_directory(&cwd), cwd))
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
