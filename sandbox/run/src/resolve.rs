//! Resolving the command line's policy, its directories and allowances, into a
//! [`ResolvedPolicy`].

use std::path::{Path, PathBuf};

use crate::cli::Cli;
use sandbox::policy::{
    Allowance, AllowanceBases, PolicyError, ProfileFile, ResolveContext, ResolvedPolicy,
    SandboxSpec,
};

/// Why the command line's policy could not be resolved (`sandbox-run` exits 125).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// `--cwd`, `--writable-root` or the policy's cwd names something that is no directory.
    #[error("{flag} {} is not a directory", path.display())]
    NotADirectory {
        /// Which option or field named it.
        flag: &'static str,
        /// The path, absolute.
        path: PathBuf,
    },
    /// A directory that does not exist, without `--create-missing`.
    #[error(
        "{flag} {} does not exist ({source}); create it first or pass --create-missing",
        path.display()
    )]
    MissingDirectory {
        /// Which option or field named it.
        flag: &'static str,
        /// The path, absolute.
        path: PathBuf,
        /// The OS error of `stat`.
        source: std::io::Error,
    },
    /// `--create-missing` could not create a directory.
    #[error("{flag} {}: cannot create it: {source}", path.display())]
    CreateDirectory {
        /// Which option or field named it.
        flag: &'static str,
        /// The path, absolute.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The current directory cannot be read.
    #[error("cannot read the current directory: {0}")]
    CurrentDirectory(#[source] std::io::Error),
    /// The policy (JSON, profile file, named profile, a flag's addition) is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// An `--allow` allowance is unknown or does not apply.
    #[error(transparent)]
    Allowance(#[from] sandbox::policy::AllowanceError),
    /// An option that needs a network allowlist on a policy without one.
    #[error(
        "{flag} needs a network allowlist (--allow-domain, or a policy whose network is \
         {{\"allow\": [...]}})"
    )]
    NeedsAllowlist {
        /// `--ask` or `--upstream-proxy`.
        flag: &'static str,
    },
    /// The running servers' registry could not be read (their secrets must be hidden).
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Registry(#[from] sandbox::servers::RegistryError),
    /// A path the policy names has a symlink the command could have planted.
    #[error("{what}: {source}")]
    PlantedSymlink {
        /// "profile file", "--cwd", "--writable-root" or "--deny".
        what: &'static str,
        /// The policy's refusal.
        source: PolicyError,
    },
    /// The working directory cannot be canonicalized.
    #[error("--cwd {}: {source}", path.display())]
    Canonicalize {
        /// The working directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A profile file inside a writable root of the policy it defines.
    #[error(
        "profile file {} lies inside a writable root of the policy it defines, so the \
         sandboxed command could rewrite it for the next run; keep it outside the writable \
         roots (e.g. ~/.config/execward/)",
        path.display()
    )]
    WritableProfile {
        /// The profile file (as named, or canonical).
        path: PathBuf,
    },
}

fn planted(what: &'static str) -> impl Fn(PolicyError) -> ResolveError {
    move |source| ResolveError::PlantedSymlink { what, source }
}

/// An existing directory for `--cwd`/`--writable-root`, created when asked; absolute.
fn existing_dir(flag: &'static str, path: &Path, create: bool) -> Result<PathBuf, ResolveError> {
    let absolute = match std::env::current_dir() {
        Ok(dir) if path.is_relative() => dir.join(path),
        _ => path.to_owned(),
    };
    match std::fs::metadata(&absolute) {
        Ok(meta) if meta.is_dir() => Ok(absolute),
        Ok(_) => Err(ResolveError::NotADirectory {
            flag,
            path: absolute,
        }),
        Err(_) if create => std::fs::create_dir_all(&absolute)
            .map(|()| absolute.clone())
            .map_err(|source| ResolveError::CreateDirectory {
                flag,
                path: absolute.clone(),
                source,
            }),
        Err(source) => Err(ResolveError::MissingDirectory {
            flag,
            path: absolute,
            source,
        }),
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
    let builtin = sandbox::policy::BUILTIN_PROFILES
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
    for (name, text) in sandbox::policy::BUILTIN_PROFILES {
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
        let shadowed = sandbox::policy::BUILTIN_PROFILES
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
/// [`ResolveError`]: the policy's error, a missing directory, or a profile file the policy
/// would let the command rewrite.
pub fn resolve_cli_policy(cli: &Cli) -> Result<(ResolvedPolicy, PathBuf), ResolveError> {
    let current = std::env::current_dir().map_err(ResolveError::CurrentDirectory)?;
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
        let mut spec = SandboxSpec::from_json(json)?;
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
        (spec.resolve_with(&ctx)?, cwd, None)
    } else {
        let cwd = cli_cwd.unwrap_or(current.clone());
        if cli.policy.ends_with(".toml") || cli.policy.contains('/') {
            let path = current.join(&cli.policy);
            let mut profile = ProfileFile::load(&path)?;
            for name in &cli.allow_credential_stores {
                sandbox::policy::credentials::canonical_store(name)?;
            }
            profile
                .readable_credential_stores
                .extend(cli.allow_credential_stores.iter().cloned());
            let policy = profile.resolve(Some(&cwd), &[], &ctx)?;
            (policy, cwd, Some(path))
        } else if let Some(path) = user_profile(&cli.policy) {
            let profile = ProfileFile::load(&path)?;
            let policy = profile.resolve(Some(&cwd), &[], &ctx)?;
            (policy, cwd, Some(path))
        } else {
            let mut spec = SandboxSpec::named(&cli.policy, Some(cwd.clone()));
            spec.readable_credential_stores = cli.allow_credential_stores.clone();
            let policy = spec.resolve_with(&ctx)?;
            (policy, cwd, None)
        }
    };
    for root in &roots {
        policy = policy.with_writable_root(root);
    }
    for socket in &cli.allow_unix_sockets {
        policy = policy.with_allowed_unix_socket(&current.join(socket))?;
    }
    let bases = AllowanceBases::from_env();
    for name in &cli.allowances {
        policy = Allowance::builtin(name).and_then(|allowance| allowance.apply(policy, &bases))?;
    }
    if cli.allow_network {
        policy = policy.with_network(true);
    }
    if !cli.allow_domains.is_empty() || !cli.deny_domains.is_empty() {
        let base = policy.egress().cloned().unwrap_or_default();
        let rules = base.extended(&cli.allow_domains, &cli.deny_domains)?;
        policy = policy.with_network_policy(sandbox::policy::NetworkPolicy::Allowlist(rules));
    }
    if cli.ask {
        let Some(rules) = policy.egress().cloned() else {
            return Err(ResolveError::NeedsAllowlist { flag: "--ask" });
        };
        policy = policy.with_network_policy(sandbox::policy::NetworkPolicy::Allowlist(
            sandbox::policy::EgressRules { ask: true, ..rules },
        ));
    }
    if let Some(url) = &cli.upstream_proxy {
        let upstream = sandbox::policy::network::UpstreamProxy::parse(url)?;
        let Some(rules) = policy.egress().cloned() else {
            return Err(ResolveError::NeedsAllowlist {
                flag: "--upstream-proxy",
            });
        };
        policy = policy.with_network_policy(sandbox::policy::NetworkPolicy::Allowlist(
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
        policy = sandbox::servers::read_registered()?.apply(policy);
    }
    if let Some(path) = profile_file {
        refuse_writable_profile(&policy, &path)?;
        policy
            .refuse_planted_symlink(&path)
            .map_err(planted("profile file"))?;
    }
    policy
        .refuse_planted_symlink(&cwd)
        .map_err(planted("--cwd"))?;
    for root in &roots {
        policy
            .refuse_planted_symlink(root)
            .map_err(planted("--writable-root"))?;
    }
    for path in &cli.denies {
        policy
            .refuse_planted_symlink(&current.join(path))
            .map_err(planted("--deny"))?;
    }
    let cwd = std::fs::canonicalize(&cwd).map_err(|source| ResolveError::Canonicalize {
        path: cwd.clone(),
        source,
    })?;
    Ok((policy.with_working_directory(&cwd), cwd))
}

/// A profile file the sandboxed command could rewrite would confine the next run by the
/// command's rules, not the user's.
fn refuse_writable_profile(policy: &ResolvedPolicy, path: &Path) -> Result<(), ResolveError> {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    for candidate in [path, canonical.as_path()] {
        if policy.restricts_filesystem() && policy.can_write(candidate) {
            return Err(ResolveError::WritableProfile {
                path: candidate.to_owned(),
            });
        }
    }
    Ok(())
}
