//! The policy model: what a sandboxed process may read, write and reach.
//!
//! Three input shapes arrive from outside ([`SandboxSpec`]: a named profile, the reference's
//! `permissions` profile, the legacy `{"type": ...}` policy). All of them are validated and
//! resolved into one internal model, [`ResolvedPolicy`]: a flat list of absolute path rules
//! plus a network switch. Nothing downstream (Landlock, namespaces, seccomp, Seatbelt) ever
//! sees unvalidated input.
//!
//! Precedence: the most specific path (most components) wins; at equal specificity
//! `deny` > `write` > `read`. A path no rule covers is denied.

mod allowance;
pub mod credentials;
mod glob;
pub mod network;
mod profile;
mod resolve;
#[cfg(feature = "schema")]
mod schema;
#[cfg(feature = "schema")]
mod schema_aliases;
mod wire;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use allowance::{
    Allowance, AllowanceBases, AllowanceError, AllowanceFormatError, BUILTIN_ALLOWANCES,
};
pub use network::{EgressRules, HostPattern, NetworkPolicy};
pub use profile::{BUILTIN_PROFILES, DEFAULT_PROTECTED_SUBPATHS, ProfileFile, builtin_profile};
pub use resolve::reads::ReadsOnly;
pub use resolve::{MAX_PLANTABLE_ROOTS, MAX_RESOLVED_RULES, PlantableDirs, ResolveContext};
pub use wire::{
    EntryPath, FsEntry, LegacyPolicy, ManagedFileSystem, NamedPolicy, NetworkMode,
    PermissionProfile, PolicySource, SandboxSpec, SpecialPath,
};

/// Access granted to a path and everything beneath it.
///
/// The order of the variants is the conflict precedence at equal specificity:
/// `Deny` beats `Write`, `Write` beats `Read`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = schema_aliases::access_aliases)
)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Read files, list directories, execute.
    Read,
    /// Everything `Read` allows, plus create, modify, rename and remove.
    Write,
    /// Neither read nor write. The reference spells this `none`.
    #[serde(alias = "none")]
    Deny,
}

impl Access {
    /// True for `Read` and `Write`.
    pub fn can_read(self) -> bool {
        !matches!(self, Access::Deny)
    }

    /// True for `Write` only.
    pub fn can_write(self) -> bool {
        matches!(self, Access::Write)
    }

    /// How much this access allows, for "is this rule narrower than its parent" checks.
    fn breadth(self) -> u8 {
        match self {
            Access::Deny => 0,
            Access::Read => 1,
            Access::Write => 2,
        }
    }
}

/// One resolved rule: `access` applies to `path` and everything beneath it, unless a more
/// specific rule says otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PathRule {
    /// Absolute, normalised path (canonical when it existed at resolution time).
    pub path: PathBuf,
    /// What the rule grants.
    pub access: Access,
}

/// Filesystem part of a resolved policy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FilesystemPolicy {
    /// No filesystem restriction at all.
    Unrestricted,
    /// Only what the rules grant.
    Restricted {
        /// Rules sorted by path; redundant rules (same access as the nearest ancestor rule)
        /// are removed.
        rules: Vec<PathRule>,
    },
}

/// A writable root with the read-only (or denied) subpaths carved out of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WritableRoot {
    /// The writable directory (or file).
    pub root: PathBuf,
    /// More specific rules beneath `root` that do not allow writing.
    pub read_only_subpaths: Vec<PathBuf>,
}

/// The validated, absolute policy that enforcement consumes.
///
/// It is plain data: `Clone + Eq + Hash` so the supervisor can use it as a helper-pool key, and
/// serde so it can be handed to a helper as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedPolicy {
    /// Filesystem rules.
    pub filesystem: FilesystemPolicy,
    /// The network: off, on, or an allowlist enforced by the egress proxy.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Paths hidden from the sandboxed process whatever the filesystem rules say: the
    /// supervisor's own sockets, token and key files ([`Self::with_hidden_path`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<PathBuf>,
    /// Paths kept read-only whatever the filesystem rules say: the supervisor's own binaries
    /// ([`Self::with_read_only_path`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// TCP ports the sandboxed process may not connect to when the network is on: the
    /// supervisor's own listeners ([`Self::with_denied_tcp_port`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_tcp_ports: Vec<u16>,
    /// `$TMPDIR` of the resolving process when the policy makes it writable (`:tmpdir`): a
    /// command gets a private tmpfs there, as on `/tmp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmpdir: Option<PathBuf>,
    /// Pathname unix sockets the sandboxed process may connect to outside its writable roots
    /// (`allowUnixSockets`), canonical; pinned by inode when a sandbox starts
    /// ([`crate::linux::unix_sockets`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unix_sockets: Vec<PathBuf>,
}

impl ResolvedPolicy {
    /// A policy of `filesystem` and `network` (a switch or a [`NetworkPolicy`]) with no
    /// supervisor protections.
    pub fn new(filesystem: FilesystemPolicy, network: impl Into<NetworkPolicy>) -> Self {
        Self {
            filesystem,
            network: network.into(),
            hidden: Vec::new(),
            read_only: Vec::new(),
            denied_tcp_ports: Vec::new(),
            tmpdir: None,
            unix_sockets: Vec::new(),
        }
    }

    /// No sandbox at all (`danger-full-access`).
    pub fn unrestricted() -> Self {
        Self::new(FilesystemPolicy::Unrestricted, true)
    }

    /// Paths hidden whatever the filesystem rules say.
    pub fn hidden_paths(&self) -> &[PathBuf] {
        &self.hidden
    }

    /// Paths kept read-only whatever the filesystem rules say.
    pub fn read_only_paths(&self) -> &[PathBuf] {
        &self.read_only
    }

    /// Hides `path` from the sandboxed process (a supervisor socket, token or key file): a deny
    /// rule when the filesystem is restricted, and a mask in every case. Does nothing for a
    /// policy that sandboxes nothing at all.
    pub fn with_hidden_path(self, path: &Path) -> Self {
        self.with_hidden_paths([path])
    }

    /// [`Self::with_hidden_path`] for each of `paths`, each resolved once and the rules
    /// normalised once for all of them (a policy gets every registered server's secrets).
    pub fn with_hidden_paths<'a>(mut self, paths: impl IntoIterator<Item = &'a Path>) -> Self {
        if self.is_unrestricted() {
            return self;
        }
        let paths: Vec<PathBuf> = paths.into_iter().map(resolve::normalize_existing).collect();
        if paths.is_empty() {
            return self;
        }
        self.hidden.extend(paths.iter().cloned());
        self.hidden.sort();
        self.hidden.dedup();
        self.with_denied_normalized(paths)
    }

    /// Keeps `path` read-only for the sandboxed process (the supervisor's binaries, wherever
    /// they live). Does nothing for a policy that sandboxes nothing at all.
    pub fn with_read_only_path(self, path: &Path) -> Self {
        self.with_read_only_paths([path])
    }

    /// [`Self::with_read_only_path`] for each of `paths`.
    pub fn with_read_only_paths<'a>(mut self, paths: impl IntoIterator<Item = &'a Path>) -> Self {
        if self.is_unrestricted() {
            return self;
        }
        self.read_only
            .extend(paths.into_iter().map(resolve::normalize_existing));
        self.read_only.sort();
        self.read_only.dedup();
        self
    }

    /// Refuses TCP connections to `port` when the network is on (the supervisor's listener).
    /// Does nothing for a policy that sandboxes nothing at all.
    pub fn with_denied_tcp_port(mut self, port: u16) -> Self {
        if self.is_unrestricted() {
            return self;
        }
        if !self.denied_tcp_ports.contains(&port) {
            self.denied_tcp_ports.push(port);
            self.denied_tcp_ports.sort_unstable();
        }
        self
    }

    /// False only when the filesystem is unrestricted.
    pub fn restricts_filesystem(&self) -> bool {
        matches!(self.filesystem, FilesystemPolicy::Restricted { .. })
    }

    /// Whether `AF_INET`/`AF_INET6` sockets may be created: the network is on, or an allowlist
    /// (whose command reaches only the egress proxy's port, in a network namespace of its own).
    pub fn network_allowed(&self) -> bool {
        !matches!(self.network, NetworkPolicy::Off)
    }

    /// Whether the network is fully on (the command shares the host's network namespace).
    pub fn network_fully_on(&self) -> bool {
        matches!(self.network, NetworkPolicy::On)
    }

    /// The allowlist, when the network is limited to one.
    pub fn egress(&self) -> Option<&EgressRules> {
        match &self.network {
            NetworkPolicy::Allowlist(rules) => Some(rules),
            _ => None,
        }
    }

    /// Whether a command under this policy gets a network namespace of its own (network off,
    /// or an allowlist).
    pub fn needs_network_namespace(&self) -> bool {
        !self.network_fully_on()
    }

    /// True when nothing at all is restricted: no helper needs to confine itself.
    pub fn is_unrestricted(&self) -> bool {
        !self.restricts_filesystem() && self.network_fully_on()
    }

    /// The path rules (empty when the filesystem is unrestricted).
    pub fn rules(&self) -> &[PathRule] {
        match &self.filesystem {
            FilesystemPolicy::Unrestricted => &[],
            FilesystemPolicy::Restricted { rules } => rules,
        }
    }

    /// The effective access for `path` (absolute; not canonicalised here).
    pub fn access_for(&self, path: &Path) -> Access {
        match &self.filesystem {
            FilesystemPolicy::Unrestricted => Access::Write,
            FilesystemPolicy::Restricted { rules } => effective_access(rules, path),
        }
    }

    /// Whether `path` may be read under this policy.
    pub fn can_read(&self, path: &Path) -> bool {
        self.access_for(path).can_read()
    }

    /// Whether `path` may be written under this policy.
    pub fn can_write(&self, path: &Path) -> bool {
        self.access_for(path).can_write()
    }

    /// Writable roots with their carve-outs. Empty when the filesystem is unrestricted.
    pub fn writable_roots(&self) -> Vec<WritableRoot> {
        let rules = self.rules();
        rules
            .iter()
            .filter(|rule| rule.access == Access::Write)
            .map(|rule| WritableRoot {
                root: rule.path.clone(),
                read_only_subpaths: rules
                    .iter()
                    .filter(|inner| {
                        inner.path != rule.path
                            && inner.path.starts_with(&rule.path)
                            && !inner.access.can_write()
                    })
                    .map(|inner| inner.path.clone())
                    .collect(),
            })
            .collect()
    }

    /// Rules that are narrower than the rule above them (a read-only `.git` inside a writable
    /// root, a denied path inside a readable one). Landlock only adds rights, so these are the
    /// rules only the mount-namespace layer can enforce.
    pub fn narrowing_rules(&self) -> Vec<&PathRule> {
        let rules = self.rules();
        rules
            .iter()
            .filter(|rule| {
                let parent = parent_access(rules, &rule.path);
                rule.access.breadth() < parent.breadth() && parent != Access::Deny
            })
            .collect()
    }

    /// Adds a deny rule (for example the supervisor's own unix socket), keeping the rule list
    /// normalised. Does nothing when the filesystem is unrestricted.
    pub fn with_denied_path(self, path: &Path) -> Self {
        self.with_denied_normalized(vec![resolve::normalize_existing(path)])
    }

    /// Deny rules for `paths` (already resolved), the rule list normalised once. All of them
    /// deny, so adding them at once narrows exactly as adding them one by one would.
    fn with_denied_normalized(mut self, paths: Vec<PathBuf>) -> Self {
        let layers = self.private_layers();
        if let FilesystemPolicy::Restricted { rules } = &mut self.filesystem {
            let mut all = std::mem::take(rules);
            all.extend(paths.into_iter().map(|path| PathRule {
                path,
                access: Access::Deny,
            }));
            *rules = resolve::normalize_rules(all, &layers);
        }
        self
    }

    /// The directories a command under this policy gets a fresh tmpfs on (`/tmp`, and
    /// `$TMPDIR` when the policy makes it writable); empty when the filesystem is unrestricted.
    /// Host paths inside them are visible to the command only when carried in: its writable
    /// roots there and its working directory.
    pub fn private_layers(&self) -> Vec<PathBuf> {
        if !self.restricts_filesystem() {
            return Vec::new();
        }
        let mut layers = vec![PathBuf::from("/tmp")];
        layers.extend(self.tmpdir.iter().cloned());
        layers
    }
}

/// Access from the most specific rule covering `path`; denied when none does.
fn effective_access(rules: &[PathRule], path: &Path) -> Access {
    rules
        .iter()
        .filter(|rule| path.starts_with(&rule.path))
        .max_by_key(|rule| (rule.path.components().count(), rule.access))
        .map_or(Access::Deny, |rule| rule.access)
}

/// Access that applies to `path` from strictly shallower rules.
fn parent_access(rules: &[PathRule], path: &Path) -> Access {
    rules
        .iter()
        .filter(|rule| rule.path != path && path.starts_with(&rule.path))
        .max_by_key(|rule| (rule.path.components().count(), rule.access))
        .map_or(Access::Deny, |rule| rule.access)
}

/// Why a sandbox specification could not be turned into a policy. Each message names the
/// problem and the expected form.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The JSON/TOML did not have the expected shape.
    #[error("invalid sandbox specification: {message}")]
    Shape {
        /// What was wrong and what is expected.
        message: String,
    },
    /// A lift named no store of the credential deny set.
    #[error(
        "{name:?} is not a credential store of the built-in deny set (expected one of: {known}; \
         see policies/credential-stores.toml)"
    )]
    UnknownCredentialStore {
        /// The name given.
        name: String,
        /// The stores there are.
        known: String,
    },
    /// `profile` named no built-in profile.
    #[error(
        "unknown sandbox profile {name:?}{} (expected one of: read-only, workspace-write, danger-full-access)",
        profile::did_you_mean(.name)
    )]
    UnknownProfile {
        /// The name given.
        name: String,
    },
    /// A profile file could not be parsed.
    #[error("invalid profile {origin}: {message}")]
    ProfileFile {
        /// Where the profile came from (built-in name or file path).
        origin: String,
        /// The parser's message.
        message: String,
    },
    /// A path was neither absolute nor a `file:` URI.
    #[error("{field} must be an absolute path or a file: URI (got {value:?})")]
    NotAbsolute {
        /// Which field.
        field: String,
        /// The value given.
        value: String,
    },
    /// A cwd-dependent entry without `cwd`.
    #[error(
        "policy entry {entry} depends on the working directory, but the sandbox has no cwd \
         (add \"cwd\": \"file:///path/to/workspace\")"
    )]
    MissingCwd {
        /// The entry, as written in the policy.
        entry: String,
    },
    /// A special path the model does not know, with deny access (ignoring it would widen).
    #[error(
        "unknown special path {name:?} with access deny (expected :root, :minimal, :project_roots[/SUB], :cwd, :tmpdir, :slash_tmp)"
    )]
    UnknownSpecial {
        /// The special's name.
        name: String,
    },
    /// A subpath tried to leave its root.
    #[error("subpath {subpath:?} must be relative and stay inside its root (no `..`)")]
    BadSubpath {
        /// The subpath given.
        subpath: String,
    },
    /// A named path passes a symlink a sandbox could have planted.
    #[error(
        "{path} resolves through the symlink {link}, which lies in a directory sandboxed commands \
         can write (an earlier command could have planted it to redirect this path); name the \
         real path instead"
    )]
    PlantedSymlink {
        /// The path as named.
        path: PathBuf,
        /// The symlink on the way.
        link: PathBuf,
    },
    /// A glob pattern was malformed or matched too much.
    #[error("glob pattern {pattern:?}: {message}")]
    Glob {
        /// The pattern.
        pattern: String,
        /// What went wrong.
        message: String,
    },
    /// The entries expand to more than [`MAX_RESOLVED_RULES`] path rules.
    #[error(
        "sandbox policy expands to more than {limit} path rules (MAX_RESOLVED_RULES); use fewer \
         entries or workspace roots, or narrower globs"
    )]
    TooManyRules {
        /// The limit.
        limit: usize,
    },
    /// The `network` value or an egress pattern is malformed.
    #[error("invalid network policy: {0}")]
    Network(#[from] network::NetworkError),
    /// Reading a profile file failed.
    #[error("cannot read profile file {path}: {source}")]
    ReadProfile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A named allowance of the spec (`allowances`) is unknown or cannot be applied.
    #[error("allowances: {0}")]
    Allowance(#[source] Box<allowance::AllowanceError>),
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wire_tests;
