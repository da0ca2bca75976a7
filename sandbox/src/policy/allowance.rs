//! Named allowances: documented sets of paths, as data in `policies/allowances/`, that widen a
//! resolved policy for one purpose (`toolchain-caches`: the caches a build fills), applied with
//! `sandbox-run --allow NAME`.
//!
//! An allowance names its paths from a base taken from the resolving process's environment
//! (`:cargo_home`, `:cache_home`, `:home`), never from the command's. Every `write` entry is
//! checked against the allowance's `never` list (programs and configuration that run or steer
//! later runs outside the sandbox) twice: as written, when the file is parsed, and once resolved,
//! so an odd environment (`XDG_CACHE_HOME=~/.config`) cannot turn a cache entry into a
//! configuration directory.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::resolve::{normalize_existing, normalize_rules, protect_subpaths};
use super::{Access, DEFAULT_PROTECTED_SUBPATHS, FilesystemPolicy, PathRule, ResolvedPolicy};

/// Built-in allowances, `(name, TOML text)`, embedded from `policies/allowances/`.
pub const BUILTIN_ALLOWANCES: &[(&str, &str)] = &[(
    "toolchain-caches",
    include_str!("../../../policies/allowances/toolchain-caches.toml"),
)];

/// Why an allowance could not be loaded or applied. Each message names the allowance.
#[derive(Debug, thiserror::Error)]
pub enum AllowanceError {
    /// No built-in allowance has this name.
    #[error("unknown allowance {name:?} (expected one of: {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// The TOML does not have the allowance format.
    #[error("allowance {name}: {source}")]
    Format {
        /// The allowance.
        name: String,
        /// What is wrong and what is expected.
        #[source]
        source: AllowanceFormatError,
    },
    /// A `write` entry is, contains or lies inside a path of the `never` list.
    #[error(
        "allowance {name}: entry {entry} would make {never} writable or lies inside it; \
         programs and configuration that run outside the sandbox later are never allowed"
    )]
    Never {
        /// The allowance.
        name: String,
        /// The entry (as written, or resolved).
        entry: String,
        /// The `never` path it overlaps.
        never: String,
    },
    /// A resolved path passes a symlink a sandboxed command could have planted.
    #[error("allowance {name}: {source}")]
    Policy {
        /// The allowance.
        name: String,
        /// The policy error.
        source: super::PolicyError,
    },
}

/// What is wrong with an allowance file's shape.
#[derive(Debug, thiserror::Error)]
pub enum AllowanceFormatError {
    /// It is not TOML of the allowance's shape.
    #[error("{0}")]
    Toml(#[source] toml::de::Error),
    /// A path is not `:BASE/SUBPATH`.
    #[error(
        "path {path:?} must be :BASE/SUBPATH with BASE one of :{} (a base itself is never \
         allowed: a command could create any file there)",
        BASE_NAMES.join(", :")
    )]
    NotBased {
        /// The path as written.
        path: String,
    },
    /// A path starts from a base that does not exist.
    #[error(
        "path {path:?} starts from unknown base :{base} (expected :{})",
        BASE_NAMES.join(", :")
    )]
    UnknownBase {
        /// The path as written.
        path: String,
        /// The base named.
        base: String,
    },
    /// A path's subpath is empty or holds `.` or `..`.
    #[error("path {path:?} must name a relative subpath below its base, without '.' or '..'")]
    Subpath {
        /// The path as written.
        path: String,
    },
    /// An entry without a comment.
    #[error("entry {path} needs a comment saying why it is allowed")]
    MissingComment {
        /// The entry's path.
        path: String,
    },
    /// A `deny` entry.
    #[error("entry {path} is deny; an allowance only grants write (or keeps read-only)")]
    DenyEntry {
        /// The entry's path.
        path: String,
    },
}

/// One path of an allowance.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    /// `:base/sub/path`.
    path: String,
    /// `write`, or `read` to keep a path inside a written one read-only.
    access: Access,
    /// Why the path is here (required, like the seccomp rules' comments).
    comment: String,
}

/// The TOML format of `policies/allowances/*.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowanceFile {
    description: String,
    #[serde(rename = "entry")]
    entries: Vec<Entry>,
    never: Vec<String>,
}

/// Where the bases of entry paths point, read from the resolving process's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowanceBases {
    /// `$HOME` when absolute.
    pub home: Option<PathBuf>,
    /// `$CARGO_HOME` when absolute, else `$HOME/.cargo`.
    pub cargo_home: Option<PathBuf>,
    /// `$XDG_CACHE_HOME` when absolute, else `$HOME/.cache`.
    pub cache_home: Option<PathBuf>,
}

impl AllowanceBases {
    /// The bases from the current process's environment.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name).map(PathBuf::from))
    }

    /// The bases from `var` (a lookup of environment variables).
    pub fn from_vars(var: impl Fn(&str) -> Option<PathBuf>) -> Self {
        let absolute = |name: &str| var(name).filter(|path| path.is_absolute());
        let home = absolute("HOME");
        let under_home = |sub: &str| home.as_ref().map(|home| home.join(sub));
        Self {
            cargo_home: absolute("CARGO_HOME").or_else(|| under_home(".cargo")),
            cache_home: absolute("XDG_CACHE_HOME").or_else(|| under_home(".cache")),
            home,
        }
    }

    fn base(&self, name: &str) -> Option<&Path> {
        match name {
            "home" => self.home.as_deref(),
            "cargo_home" => self.cargo_home.as_deref(),
            "cache_home" => self.cache_home.as_deref(),
            _ => None,
        }
    }
}

/// The bases an entry path may start from.
const BASE_NAMES: &[&str] = &["cargo_home", "cache_home", "home"];

/// `:base/sub` split into the base's name and the relative subpath; the subpath must be
/// non-empty and stay below the base.
fn split_key(key: &str) -> Result<(&str, &Path), AllowanceFormatError> {
    let Some((base, sub)) = key.strip_prefix(':').and_then(|rest| rest.split_once('/')) else {
        return Err(AllowanceFormatError::NotBased {
            path: key.to_owned(),
        });
    };
    if !BASE_NAMES.contains(&base) {
        return Err(AllowanceFormatError::UnknownBase {
            path: key.to_owned(),
            base: base.to_owned(),
        });
    }
    let sub = Path::new(sub);
    let plain = sub.components().all(|c| matches!(c, Component::Normal(_)));
    if sub.as_os_str().is_empty() || !plain {
        return Err(AllowanceFormatError::Subpath {
            path: key.to_owned(),
        });
    }
    Ok((base, sub))
}

/// Two paths overlap when one is the other or lies inside it.
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A loaded allowance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowance {
    name: String,
    file: AllowanceFile,
}

impl Allowance {
    /// The built-in allowance called `name`.
    ///
    /// # Errors
    /// [`AllowanceError::Unknown`] for another name; [`AllowanceError::Format`] or
    /// [`AllowanceError::Never`] if the embedded file is wrong (a test checks it is not).
    pub fn builtin(name: &str) -> Result<Self, AllowanceError> {
        let (_, text) = BUILTIN_ALLOWANCES
            .iter()
            .find(|(builtin, _)| *builtin == name)
            .ok_or_else(|| AllowanceError::Unknown {
                name: name.to_owned(),
                known: BUILTIN_ALLOWANCES
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Self::parse(name, text)
    }

    /// Parses an allowance from TOML text and checks its entries against its `never` list.
    ///
    /// # Errors
    /// [`AllowanceError::Format`] for a malformed file, an entry or `never` path that is not
    /// `:BASE/SUBPATH`, an empty comment or a `deny` entry; [`AllowanceError::Never`] for a
    /// `write` entry that overlaps a `never` path.
    pub fn parse(name: &str, text: &str) -> Result<Self, AllowanceError> {
        let format = |source: AllowanceFormatError| AllowanceError::Format {
            name: name.to_owned(),
            source,
        };
        let file: AllowanceFile =
            toml::from_str(text).map_err(|err| format(AllowanceFormatError::Toml(err)))?;
        for never in &file.never {
            split_key(never).map_err(format)?;
        }
        for entry in &file.entries {
            let (base, sub) = split_key(&entry.path).map_err(format)?;
            if entry.comment.trim().is_empty() {
                return Err(format(AllowanceFormatError::MissingComment {
                    path: entry.path.clone(),
                }));
            }
            if entry.access == Access::Deny {
                return Err(format(AllowanceFormatError::DenyEntry {
                    path: entry.path.clone(),
                }));
            }
            if entry.access != Access::Write {
                continue;
            }
            for never in &file.never {
                let (never_base, never_sub) = split_key(never).map_err(format)?;
                if base == never_base && overlaps(sub, never_sub) {
                    return Err(AllowanceError::Never {
                        name: name.to_owned(),
                        entry: entry.path.clone(),
                        never: never.clone(),
                    });
                }
            }
        }
        Ok(Self {
            name: name.to_owned(),
            file,
        })
    }

    /// The allowance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its one-line description.
    pub fn description(&self) -> &str {
        &self.file.description
    }

    /// The entries resolved against `bases`, `(absolute path, access)`, in file order. Entries
    /// whose base is unknown are left out.
    ///
    /// # Errors
    /// [`AllowanceError::Never`] when a resolved `write` path overlaps a resolved `never` path.
    pub fn resolve(
        &self,
        bases: &AllowanceBases,
    ) -> Result<Vec<(PathBuf, Access)>, AllowanceError> {
        let resolve = |key: &str| -> Option<PathBuf> {
            let (base, sub) = split_key(key).ok()?;
            Some(bases.base(base)?.join(sub))
        };
        let never: Vec<(PathBuf, &String)> = self
            .file
            .never
            .iter()
            .filter_map(|key| Some((normalize_existing(&resolve(key)?), key)))
            .collect();
        let mut resolved = Vec::new();
        for entry in &self.file.entries {
            let Some(path) = resolve(&entry.path) else {
                continue;
            };
            let path = normalize_existing(&path);
            if entry.access == Access::Write
                && let Some((_, key)) = never.iter().find(|(never, _)| overlaps(&path, never))
            {
                return Err(AllowanceError::Never {
                    name: self.name.clone(),
                    entry: format!("{} ({})", entry.path, path.display()),
                    never: (*key).clone(),
                });
            }
            resolved.push((path, entry.access));
        }
        Ok(resolved)
    }

    /// `policy` widened by this allowance: each `write` entry becomes a writable root (its
    /// `.git`, `.agents` and `.codex` stay read-only, as for `--writable-root`), each `read`
    /// entry a read-only path inside it. A policy that does not restrict the filesystem is
    /// returned unchanged.
    ///
    /// # Errors
    /// As [`Self::resolve`]; [`AllowanceError::Policy`] when a path passes a symlink in a
    /// directory the policy lets sandboxed commands write.
    pub fn apply(
        &self,
        mut policy: ResolvedPolicy,
        bases: &AllowanceBases,
    ) -> Result<ResolvedPolicy, AllowanceError> {
        let resolved = self.resolve(bases)?;
        for (path, _) in &resolved {
            policy
                .refuse_planted_symlink(path)
                .map_err(|source| AllowanceError::Policy {
                    name: self.name.clone(),
                    source,
                })?;
        }
        let layers = policy.private_layers();
        if let FilesystemPolicy::Restricted { rules } = &mut policy.filesystem {
            let mut all = std::mem::take(rules);
            let mut reads = Vec::new();
            for (path, access) in resolved {
                match access {
                    Access::Write => all.push(PathRule { path, access }),
                    _ => reads.push(PathRule { path, access }),
                }
            }
            let protected: Vec<String> = DEFAULT_PROTECTED_SUBPATHS
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            let mut all = protect_subpaths(all, &protected, &layers);
            all.extend(reads);
            *rules = normalize_rules(all, &layers);
        }
        Ok(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn bases() -> AllowanceBases {
        AllowanceBases::from_vars(|name| match name {
            "HOME" => Some(PathBuf::from("/nonexistent-home")),
            _ => None,
        })
    }

    fn toolchain_caches() -> Allowance {
        Allowance::builtin("toolchain-caches").unwrap()
    }

    #[test]
    fn bases_follow_cargo_home_and_xdg_cache_home_else_home() {
        assert_eq!(
            bases(),
            AllowanceBases {
                home: Some("/nonexistent-home".into()),
                cargo_home: Some("/nonexistent-home/.cargo".into()),
                cache_home: Some("/nonexistent-home/.cache".into()),
            }
        );
        let custom = AllowanceBases::from_vars(|name| match name {
            "HOME" => Some("/h".into()),
            "CARGO_HOME" => Some("/opt/cargo".into()),
            "XDG_CACHE_HOME" => Some("relative/ignored".into()),
            _ => None,
        });
        assert_eq!(custom.cargo_home, Some("/opt/cargo".into()));
        assert_eq!(custom.cache_home, Some("/h/.cache".into()));
        assert_eq!(
            AllowanceBases::from_vars(|_| None),
            AllowanceBases::default()
        );
    }

    #[test]
    fn toolchain_caches_resolves_to_the_caches_and_lock_files() {
        let resolved = toolchain_caches().resolve(&bases()).unwrap();
        let written: Vec<String> = resolved
            .iter()
            .filter(|(_, access)| *access == Access::Write)
            .map(|(path, _)| path.display().to_string())
            .collect();
        assert_eq!(
            written,
            [
                "/nonexistent-home/.cargo/registry",
                "/nonexistent-home/.cargo/git",
                "/nonexistent-home/.cargo/.package-cache",
                "/nonexistent-home/.cargo/.package-cache-mutate",
                "/nonexistent-home/.cargo/.global-cache",
                "/nonexistent-home/.cache/pip",
                "/nonexistent-home/.npm/_cacache",
                "/nonexistent-home/.npm/_logs",
                "/nonexistent-home/.cache/ccache",
            ]
        );
    }

    #[test]
    fn toolchain_caches_never_makes_programs_configuration_or_shell_files_writable() {
        let home = Path::new("/nonexistent-home");
        let base = ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: vec![PathRule {
                    path: "/".into(),
                    access: Access::Read,
                }],
            },
            false,
        );
        let policy = toolchain_caches().apply(base, &bases()).unwrap();
        for never in [
            ".cargo",
            ".cargo/bin/cargo",
            ".cargo/env",
            ".cargo/config.toml",
            ".cargo/config",
            ".cargo/credentials.toml",
            ".cargo/new-file",
            ".cache",
            ".cache/other-tool",
            ".cache/ccache/ccache.conf",
            ".npm",
            ".npm/_npx/1/node_modules/x",
            ".npmrc",
            ".config/pip/pip.conf",
            ".rustup/toolchains/x/bin/rustc",
            ".bashrc",
            ".profile",
            ".zshrc",
            ".local/bin/tool",
            ".gitconfig",
        ] {
            assert!(
                !policy.can_write(&home.join(never)),
                "{never} must not be writable"
            );
        }
        for cache in [
            ".cargo/registry/src/index.crates.io-x/itoa-1.0.0/src/lib.rs",
            ".cargo/git/checkouts/x/abc/src/lib.rs",
            ".cargo/.package-cache",
            ".cache/pip/wheels/x.whl",
            ".npm/_cacache/index-v5/x",
            ".cache/ccache/0/x",
        ] {
            assert!(
                policy.can_write(&home.join(cache)),
                "{cache} must be writable"
            );
        }
    }

    #[test]
    fn a_resolved_entry_inside_a_never_path_is_refused() {
        // $XDG_CACHE_HOME pointing into ~/.config would make ~/.config/pip writable.
        let odd = AllowanceBases::from_vars(|name| match name {
            "HOME" => Some("/h".into()),
            "XDG_CACHE_HOME" => Some("/h/.config".into()),
            _ => None,
        });
        let err = toolchain_caches().resolve(&odd).unwrap_err();
        assert!(
            matches!(&err, AllowanceError::Never { never, .. } if never == ":home/.config"),
            "{err}"
        );
    }

    #[test]
    fn malformed_allowances_are_refused_with_the_expected_form() {
        let parse = |text: &str| Allowance::parse("test", text).unwrap_err().to_string();
        let entry = |path: &str, access: &str, comment: &str| {
            format!(
                "description = \"d\"\nnever = [\":cargo_home/bin\"]\n[[entry]]\npath = \"{path}\"\naccess = \"{access}\"\ncomment = \"{comment}\"\n"
            )
        };
        assert!(parse(&entry(":cargo_home", "write", "c")).contains(":BASE/SUBPATH"));
        assert!(parse(&entry(":nowhere/x", "write", "c")).contains("unknown base"));
        assert!(parse(&entry(":home/../etc", "write", "c")).contains("without '.' or '..'"));
        assert!(parse(&entry("/etc", "write", "c")).contains(":BASE/SUBPATH"));
        assert!(parse(&entry(":home/x", "write", " ")).contains("needs a comment"));
        assert!(parse(&entry(":home/x", "deny", "c")).contains("is deny"));
        assert!(parse(&entry(":cargo_home/bin/x", "write", "c")).contains("never allowed"));
        assert!(parse(&entry(":cargo_home/bin/../x", "write", "c")).contains("'..'"));
        assert!(
            parse("description = \"d\"\nnever = []\nentry = []\nextra = 1\n").contains("extra")
        );
        let unknown = Allowance::builtin("everything").unwrap_err().to_string();
        assert!(unknown.contains("toolchain-caches"), "{unknown}");
    }
}
