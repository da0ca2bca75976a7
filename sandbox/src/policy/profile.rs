//! Named profiles: the TOML format of `policies/*.toml` and the built-in set embedded at build
//! time (the binary never reads its policy from the working directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::wire::{EntryPath, SpecialPath};
use super::{Access, PolicyError};

/// Subpaths of every writable root that stay read-only unless a profile says otherwise.
pub const DEFAULT_PROTECTED_SUBPATHS: &[&str] = &[".git", ".agents", ".codex"];

/// Built-in profiles, `(name, TOML text)`, embedded from `policies/`.
pub const BUILTIN_PROFILES: &[(&str, &str)] = &[
    (
        "read-only",
        include_str!("../../../policies/read-only.toml"),
    ),
    (
        "workspace-write",
        include_str!("../../../policies/workspace-write.toml"),
    ),
    (
        "danger-full-access",
        include_str!("../../../policies/danger-full-access.toml"),
    ),
];

/// A profile file (`policies/*.toml` or a user's own file in the same format).
///
/// ```toml
/// description = "..."
/// network = false            # or "on", or { allow = ["pypi.org", "*.crates.io"], deny = [] }
/// protected_subpaths = [".git", ".agents", ".codex"]
/// [filesystem]
/// ":root" = "read"
/// ":project_roots" = "write"
/// "/var/cache/ccache" = "write"
/// "**/*.pem" = "deny"
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = super::schema_aliases::profile_file_rules)
)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    /// Human description, shown by `--explain`.
    #[serde(default)]
    pub description: Option<String>,
    /// The network: `false`/`"off"`, `true`/`"on"`, or `{ allow = [...], deny = [...] }`.
    #[serde(default)]
    pub network: super::NetworkPolicy,
    /// No filesystem restriction at all (`filesystem` must then be empty).
    #[serde(default)]
    pub full_filesystem_access: bool,
    /// Subpaths of each writable root kept read-only; defaults to
    /// [`DEFAULT_PROTECTED_SUBPATHS`].
    #[serde(default)]
    pub protected_subpaths: Option<Vec<String>>,
    /// Directory depth a glob pattern is expanded to.
    #[serde(default)]
    pub glob_scan_max_depth: Option<usize>,
    /// Deny the well-known credential stores of the resolving process's home
    /// (`policies/credential-stores.toml`), except those in `readable_credential_stores`.
    #[serde(default)]
    pub deny_credential_stores: bool,
    /// Stores of the deny set left readable, named as in the data file (`"~/.aws"`).
    #[serde(default)]
    pub readable_credential_stores: Vec<String>,
    /// Pathname unix sockets (absolute) the command may connect to outside its writable roots
    /// (`allowUnixSockets` is accepted too).
    #[serde(default, alias = "allowUnixSockets")]
    pub allow_unix_sockets: Vec<String>,
    /// Path (absolute, `:special`, or glob) to access.
    #[serde(default)]
    pub filesystem: BTreeMap<String, Access>,
}

impl ProfileFile {
    /// Parses a profile from TOML text; `origin` names it in errors.
    ///
    /// # Errors
    /// [`PolicyError::ProfileFile`] when the TOML does not match the format, an entry key is
    /// neither absolute, special nor a glob, or full access is combined with entries.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let profile: ProfileFile =
            toml::from_str(text).map_err(|err| PolicyError::ProfileFile {
                origin: origin.to_owned(),
                message: err.to_string(),
            })?;
        if profile.full_filesystem_access && !profile.filesystem.is_empty() {
            return Err(PolicyError::ProfileFile {
                origin: origin.to_owned(),
                message:
                    "full_filesystem_access = true cannot be combined with [filesystem] entries"
                        .to_owned(),
            });
        }
        for name in &profile.readable_credential_stores {
            super::credentials::canonical_store(name).map_err(|err| PolicyError::ProfileFile {
                origin: origin.to_owned(),
                message: err.to_string(),
            })?;
        }
        for path in &profile.allow_unix_sockets {
            super::wire::parse_abs("allow_unix_sockets", path).map_err(|err| {
                PolicyError::ProfileFile {
                    origin: origin.to_owned(),
                    message: err.to_string(),
                }
            })?;
        }
        for key in profile.filesystem.keys() {
            parse_entry_key(key).map_err(|err| PolicyError::ProfileFile {
                origin: origin.to_owned(),
                message: err.to_string(),
            })?;
        }
        Ok(profile)
    }

    /// Loads a profile file from disk.
    ///
    /// # Errors
    /// [`PolicyError::ReadProfile`] when the file cannot be read, else as [`Self::parse`].
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::ReadProfile {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The entries as typed paths.
    pub(crate) fn entries(&self) -> Vec<(EntryPath, Access)> {
        self.filesystem
            .iter()
            .filter_map(|(key, access)| parse_entry_key(key).ok().map(|path| (path, *access)))
            .collect()
    }

    /// The protected subpaths in force for this profile.
    pub(crate) fn protected(&self) -> Vec<String> {
        match &self.protected_subpaths {
            Some(list) => list.clone(),
            None => DEFAULT_PROTECTED_SUBPATHS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        }
    }
}

/// The built-in profile called `name`.
///
/// # Errors
/// [`PolicyError::UnknownProfile`] for any other name.
pub fn builtin_profile(name: &str) -> Result<ProfileFile, PolicyError> {
    // Parsed once: the texts are part of the binary, and every sandboxed start resolves one.
    static PARSED: std::sync::OnceLock<Vec<Option<ProfileFile>>> = std::sync::OnceLock::new();
    let index = BUILTIN_PROFILES
        .iter()
        .position(|(builtin, _)| *builtin == name)
        .ok_or_else(|| PolicyError::UnknownProfile {
            name: name.to_owned(),
        })?;
    let parsed = PARSED.get_or_init(|| {
        BUILTIN_PROFILES
            .iter()
            .map(|(builtin, text)| ProfileFile::parse(text, builtin).ok())
            .collect()
    });
    match &parsed[index] {
        Some(profile) => Ok(profile.clone()),
        // Unreachable while the built-in texts parse (a unit test parses each): the error.
        None => ProfileFile::parse(BUILTIN_PROFILES[index].1, name),
    }
}

/// `; did you mean "NAME"?` when a built-in profile name is within two edits of `name` (a typo,
/// a missing dash, `_` for `-`), else nothing.
pub(crate) fn did_you_mean(name: &str) -> String {
    BUILTIN_PROFILES
        .iter()
        .map(|(builtin, _)| (edit_distance(&name.to_ascii_lowercase(), builtin), *builtin))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map_or_else(String::new, |(_, builtin)| {
            format!("; did you mean {builtin:?}?")
        })
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Parses a `[filesystem]` key: `:root`, `:minimal`, `:project_roots[/SUB]`, `:cwd`,
/// `:tmpdir`, `:slash_tmp`, an absolute path, or a glob (may be relative to cwd).
pub(crate) fn parse_entry_key(key: &str) -> Result<EntryPath, PolicyError> {
    if let Some(special) = key.strip_prefix(':') {
        let (name, subpath) = match special.split_once('/') {
            Some((name, sub)) => (name, Some(PathBuf::from(sub))),
            None => (special, None),
        };
        let value = match (name, subpath) {
            ("root", None) => SpecialPath::Root,
            ("minimal", None) => SpecialPath::Minimal,
            ("project_roots" | "workspace_roots", subpath) => SpecialPath::ProjectRoots { subpath },
            ("cwd" | "current_working_directory", None) => SpecialPath::CurrentWorkingDirectory,
            ("tmpdir", None) => SpecialPath::Tmpdir,
            ("slash_tmp", None) => SpecialPath::SlashTmp,
            _ => {
                return Err(PolicyError::Shape {
                    message: format!(
                        "unknown special path {key:?} (expected :root, :minimal, \
                         :project_roots[/SUB], :cwd, :tmpdir or :slash_tmp)"
                    ),
                });
            }
        };
        return Ok(EntryPath::Special { value });
    }
    if super::glob::is_glob(key) {
        return Ok(EntryPath::GlobPattern {
            pattern: key.to_owned(),
        });
    }
    if Path::new(key).is_absolute() {
        return Ok(EntryPath::Path {
            path: key.to_owned(),
        });
    }
    Err(PolicyError::Shape {
        message: format!(
            "filesystem key {key:?} must be an absolute path, a :special path or a glob pattern"
        ),
    })
}
