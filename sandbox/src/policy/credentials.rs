//! The built-in deny set of well-known credential stores (`policies/credential-stores.toml`).
//!
//! Under the built-in read-only and workspace-write profiles (`deny_credential_stores = true`)
//! each store in the home directory of the resolving process becomes a deny rule (masked by the
//! mount layer, `EACCES`), unless the policy lifts it by name. The home directory comes from the
//! resolving process ([`super::ResolveContext`]: its `$HOME`, else its uid's passwd entry), never
//! from a command's `env`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::PolicyError;

/// The data file, embedded at build time.
const CREDENTIAL_STORES_TOML: &str = include_str!("../../../policies/credential-stores.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoresFile {
    store: Vec<Store>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Store {
    path: String,
    #[allow(dead_code)]
    comment: String,
}

/// The stores, as written in the data file (`~/.ssh`, ...). A unit test parses the file, so the
/// empty fallback is unreachable while it parses.
pub fn credential_stores() -> &'static [String] {
    static PARSED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    PARSED.get_or_init(|| {
        toml::from_str::<StoresFile>(CREDENTIAL_STORES_TOML)
            .map(|file| file.store.into_iter().map(|s| s.path).collect())
            .unwrap_or_default()
    })
}

/// The store a lift names, in its canonical spelling (`.aws`, `~/.aws` and `~/.aws/` all name
/// `~/.aws`).
///
/// # Errors
/// [`PolicyError::UnknownCredentialStore`] for a name that is not in the set.
pub fn canonical_store(name: &str) -> Result<&'static str, PolicyError> {
    let trimmed = name.trim_end_matches('/');
    let relative = trimmed.strip_prefix("~/").unwrap_or(trimmed);
    credential_stores()
        .iter()
        .find(|store| store.strip_prefix("~/") == Some(relative))
        .map(String::as_str)
        .ok_or_else(|| PolicyError::UnknownCredentialStore {
            name: name.to_owned(),
            known: credential_stores().join(", "),
        })
}

/// The paths to deny: every store not lifted, in every home.
///
/// # Errors
/// As [`canonical_store`], for a lift that names no store.
pub fn denied_paths(homes: &[PathBuf], lifted: &[String]) -> Result<Vec<PathBuf>, PolicyError> {
    let lifted = lifted
        .iter()
        .map(|name| canonical_store(name))
        .collect::<Result<Vec<_>, _>>()?;
    let mut paths = Vec::new();
    for store in credential_stores() {
        if lifted.contains(&store.as_str()) {
            continue;
        }
        let relative = store.strip_prefix("~/").unwrap_or(store);
        for home in homes {
            paths.push(home.join(relative));
        }
    }
    Ok(paths)
}

/// The home directory of the calling process: `$HOME` when it is absolute, else the passwd
/// home of its effective uid (the home every tool of this process would use).
pub fn homes_of_current_process() -> Vec<PathBuf> {
    let usable = |home: &Path| home.is_absolute() && home != Path::new("/");
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
        && usable(&home)
    {
        return vec![home];
    }
    #[cfg(target_os = "linux")]
    if let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::geteuid())
        && usable(&user.dir)
    {
        return vec![user.dir];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_data_file_parses_and_names_every_store_under_home() {
        let file: StoresFile = toml::from_str(CREDENTIAL_STORES_TOML).unwrap();
        assert!(file.store.len() >= 14);
        for store in &file.store {
            assert!(store.path.starts_with("~/."), "{}", store.path);
            assert!(!store.comment.is_empty(), "{} has no comment", store.path);
        }
        assert_eq!(credential_stores().len(), file.store.len());
    }

    #[test]
    fn a_lift_removes_one_store_and_an_unknown_lift_fails() {
        let homes = [PathBuf::from("/h")];
        let all = denied_paths(&homes, &[]).unwrap();
        assert!(all.contains(&PathBuf::from("/h/.ssh")));
        assert!(all.contains(&PathBuf::from("/h/.cargo/credentials.toml")));
        let lifted = denied_paths(&homes, &[".aws/".to_owned()]).unwrap();
        assert_eq!(lifted.len(), all.len() - 1);
        assert!(!lifted.contains(&PathBuf::from("/h/.aws")));
        assert!(denied_paths(&homes, &["~/.bashrc".to_owned()]).is_err());
    }
}
