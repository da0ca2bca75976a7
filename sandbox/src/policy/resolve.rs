//! Resolution: every input shape becomes one [`Draft`] (typed entries + switches), and a draft
//! becomes a [`ResolvedPolicy`] against `cwd`, the workspace roots and `$TMPDIR`.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::glob::{self, DEFAULT_GLOB_SCAN_MAX_DEPTH};
use super::network::NetworkPolicy;
use super::profile::{DEFAULT_PROTECTED_SUBPATHS, ProfileFile, builtin_profile};
use super::wire::{
    EntryPath, LegacyPolicy, ManagedFileSystem, NamedPolicy, NetworkMode, PermissionProfile,
    PolicySource, SandboxSpec, SpecialPath, parse_abs,
};
use super::{Access, FilesystemPolicy, PathRule, PolicyError, ResolvedPolicy};

mod normalize;
mod planted;
pub(crate) mod reads;

pub(crate) use normalize::{normalize_existing, normalize_rules, protect_subpaths};
pub use planted::{MAX_PLANTABLE_ROOTS, PlantableDirs};

/// What `:minimal` expands to on Linux: enough to exec dynamically linked programs.
pub const MINIMAL_READ_PATHS: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/nix/store",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Most path rules one policy may resolve to, counted as entries expand (`:project_roots` over
/// every workspace root, `:minimal`, globs) and before normalisation. Normalising and protecting
/// subpaths are quadratic in the rule count and the policy comes from any client: unbounded, a
/// 10 KB spec (100 `:project_roots` subpaths times 100 workspace roots) kept a release build of
/// `sandbox-run --explain` busy for 47 s. More rules than this is an error (never a truncated,
/// wider policy).
pub const MAX_RESOLVED_RULES: usize = 1024;

/// Inputs from the resolving process's environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolveContext {
    /// `$TMPDIR`, when set and absolute.
    pub tmpdir: Option<PathBuf>,
    /// Host directories earlier sandboxes (of this server) could write: a symlink in one of
    /// them on the way to a named path is refused as surely as one in a directory the policy
    /// being resolved makes writable.
    pub earlier_writable: std::sync::Arc<PlantableDirs>,
    /// The home directories whose credential stores the built-in profiles deny
    /// ([`super::credentials`]); empty: none.
    pub homes: Vec<PathBuf>,
}

impl ResolveContext {
    /// Reads `$TMPDIR` and the home directory (`$HOME`, else the uid's passwd home) from the
    /// current process.
    pub fn from_env() -> Self {
        let tmpdir = std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        Self {
            tmpdir,
            earlier_writable: std::sync::Arc::default(),
            homes: super::credentials::homes_of_current_process(),
        }
    }
}

/// A policy before paths are resolved.
struct Draft {
    entries: Vec<(EntryPath, Access)>,
    network: NetworkPolicy,
    full_filesystem: bool,
    protected: Vec<String>,
    glob_depth: usize,
    /// Deny the credential stores but these (`None`: no deny set).
    credential_stores: Option<Vec<String>>,
    /// Pathname unix sockets the policy names (absolute, as written).
    unix_sockets: Vec<PathBuf>,
}

impl Draft {
    fn from_profile(profile: &ProfileFile) -> Self {
        Self {
            entries: profile.entries(),
            network: profile.network.clone(),
            full_filesystem: profile.full_filesystem_access,
            protected: profile.protected(),
            glob_depth: profile
                .glob_scan_max_depth
                .unwrap_or(DEFAULT_GLOB_SCAN_MAX_DEPTH),
            credential_stores: profile
                .deny_credential_stores
                .then(|| profile.readable_credential_stores.clone()),
            // Checked absolute when the profile was parsed.
            unix_sockets: profile
                .allow_unix_sockets
                .iter()
                .map(PathBuf::from)
                .collect(),
        }
    }

    fn full(network: impl Into<NetworkPolicy>) -> Self {
        Self {
            entries: Vec::new(),
            network: network.into(),
            full_filesystem: true,
            protected: Vec::new(),
            glob_depth: DEFAULT_GLOB_SCAN_MAX_DEPTH,
            credential_stores: None,
            unix_sockets: Vec::new(),
        }
    }

    fn from_named(named: &NamedPolicy) -> Result<Self, PolicyError> {
        let mut draft = Self::from_profile(&builtin_profile(&named.profile)?);
        for root in &named.writable_roots {
            draft.entries.push((
                EntryPath::Path {
                    path: parse_abs("writableRoots[]", root)?.display().to_string(),
                },
                Access::Write,
            ));
        }
        if let Some(network) = named.network_access {
            draft.network = network.into();
        }
        draft.entries.retain(|(path, access)| {
            let excluded = match path {
                EntryPath::Special {
                    value: SpecialPath::Tmpdir,
                } => named.exclude_tmpdir_env_var,
                EntryPath::Special {
                    value: SpecialPath::SlashTmp,
                } => named.exclude_slash_tmp,
                _ => false,
            };
            !(excluded && *access == Access::Write)
        });
        Ok(draft)
    }

    fn from_legacy(legacy: &LegacyPolicy) -> Result<Self, PolicyError> {
        match legacy {
            LegacyPolicy::DangerFullAccess => Ok(Self::full(true)),
            LegacyPolicy::ReadOnly {
                network_access,
                access,
            } => {
                require_full_read(access.as_ref(), "access")?;
                let mut named = NamedPolicy::new("read-only");
                named.network_access = Some(*network_access);
                Self::from_named(&named)
            }
            LegacyPolicy::WorkspaceWrite {
                writable_roots,
                network_access,
                exclude_tmpdir_env_var,
                exclude_slash_tmp,
                read_only_access,
            } => {
                require_full_read(read_only_access.as_ref(), "read_only_access")?;
                Self::from_named(&NamedPolicy {
                    profile: "workspace-write".to_owned(),
                    writable_roots: writable_roots.clone(),
                    network_access: Some(*network_access),
                    exclude_tmpdir_env_var: *exclude_tmpdir_env_var,
                    exclude_slash_tmp: *exclude_slash_tmp,
                })
            }
            LegacyPolicy::ExternalSandbox { network_access } => {
                let enabled = matches!(network_access, Some(Value::Bool(true)))
                    || matches!(network_access, Some(Value::String(s)) if s == "enabled");
                Ok(Self::full(enabled))
            }
        }
    }

    fn from_permissions(profile: &PermissionProfile) -> Self {
        match profile {
            PermissionProfile::Disabled => Self::full(true),
            PermissionProfile::External { network } => Self::full(*network == NetworkMode::Enabled),
            PermissionProfile::Managed {
                file_system,
                network,
            } => {
                let network = *network == NetworkMode::Enabled;
                match file_system {
                    ManagedFileSystem::Unrestricted => Self::full(network),
                    ManagedFileSystem::Restricted {
                        entries,
                        glob_scan_max_depth,
                    } => Self {
                        entries: entries.iter().map(|e| (e.path.clone(), e.access)).collect(),
                        network: network.into(),
                        full_filesystem: false,
                        protected: DEFAULT_PROTECTED_SUBPATHS
                            .iter()
                            .map(|s| (*s).to_owned())
                            .collect(),
                        glob_depth: glob_scan_max_depth.unwrap_or(DEFAULT_GLOB_SCAN_MAX_DEPTH),
                        credential_stores: None,
                        unix_sockets: Vec::new(),
                    },
                }
            }
        }
    }
}

/// Legacy `access`/`read_only_access` may only say "full access".
fn require_full_read(value: Option<&Value>, field: &str) -> Result<(), PolicyError> {
    let kind = value.and_then(|v| v.get("type")).and_then(Value::as_str);
    match (value, kind) {
        (None | Some(Value::Null), _) | (_, Some("full-access" | "fullAccess")) => Ok(()),
        _ => Err(PolicyError::Shape {
            message: format!(
                "{field}: only {{\"type\": \"full-access\"}} is supported; express restricted reads with a \"permissions\" profile"
            ),
        }),
    }
}

impl SandboxSpec {
    /// Resolves the spec against its cwd, workspace roots and this process's `$TMPDIR`.
    ///
    /// # Errors
    /// [`PolicyError`] naming the problem: unknown profile, a cwd-dependent entry without
    /// `cwd`, a bad subpath or glob.
    pub fn resolve(&self) -> Result<ResolvedPolicy, PolicyError> {
        self.resolve_with(&ResolveContext::from_env())
    }

    /// [`Self::resolve`] with an explicit environment.
    ///
    /// # Errors
    /// As [`Self::resolve`].
    pub fn resolve_with(&self, ctx: &ResolveContext) -> Result<ResolvedPolicy, PolicyError> {
        self.resolve_scanning(ctx, true)
    }

    /// [`Self::resolve_with`]; without `scan`, the writable roots are not searched for
    /// protected names (`.git`, ...), whose rules only narrow writes: for a policy that
    /// [`reads::ReadsOnly`] turns read-only before anything runs under it.
    fn resolve_scanning(
        &self,
        ctx: &ResolveContext,
        scan: bool,
    ) -> Result<ResolvedPolicy, PolicyError> {
        let mut draft = match &self.source {
            PolicySource::Named(named) => Draft::from_named(named)?,
            PolicySource::Permissions(profile) => Draft::from_permissions(profile),
            PolicySource::Legacy(legacy) => Draft::from_legacy(legacy)?,
            PolicySource::Toml(text) => {
                Draft::from_profile(&ProfileFile::parse(text, "profileToml")?)
            }
        };
        // Beside the source, as `sandbox-run --writable-root` and `--deny`: entries of the
        // draft, so they are resolved (and refused when planted) like the source's own.
        let entry = |path: &PathBuf| EntryPath::Path {
            path: path.display().to_string(),
        };
        for root in &self.writable_roots {
            draft.entries.push((entry(root), Access::Write));
        }
        for path in &self.denied_paths {
            draft.entries.push((entry(path), Access::Deny));
        }
        if let Some(network) = &self.network {
            draft.network = network.clone();
        }
        if let Some(lifted) = &mut draft.credential_stores {
            lifted.extend(self.readable_credential_stores.iter().cloned());
        } else if let Some(name) = self.readable_credential_stores.first() {
            // Lifting a store the policy does not deny is a mistake worth naming, not a no-op.
            super::credentials::canonical_store(name)?;
        }
        draft
            .unix_sockets
            .extend(self.allow_unix_sockets.iter().cloned());
        if !scan {
            draft.protected.clear();
        }
        let mut policy = resolve_draft(&draft, self.cwd.as_deref(), &self.workspace_roots, ctx)?;
        if !self.allowances.is_empty() {
            // From the context's home, as the credential stores are: the processes that
            // resolve one spec (the server recording what sandboxes write, a launcher or a
            // one-shot sandbox-run, each with its own cleared environment) then agree on it.
            let home = ctx.homes.first().cloned();
            let bases = super::AllowanceBases::from_vars(|name| match name {
                "HOME" => home.clone(),
                _ => None,
            });
            for name in &self.allowances {
                policy = super::Allowance::builtin(name)
                    .and_then(|allowance| allowance.apply(policy, &bases))
                    .map_err(|err| PolicyError::Allowance(Box::new(err)))?;
            }
        }
        Ok(policy)
    }
}

impl ProfileFile {
    /// Resolves a profile file (a user's own or a built-in one).
    ///
    /// # Errors
    /// As [`SandboxSpec::resolve`].
    pub fn resolve(
        &self,
        cwd: Option<&Path>,
        workspace_roots: &[PathBuf],
        ctx: &ResolveContext,
    ) -> Result<ResolvedPolicy, PolicyError> {
        resolve_draft(&Draft::from_profile(self), cwd, workspace_roots, ctx)
    }
}

impl ResolvedPolicy {
    /// Adds a writable root (with the default protected subpaths kept read-only). Does nothing
    /// when the filesystem is unrestricted.
    pub fn with_writable_root(mut self, root: &Path) -> Self {
        let layers = self.private_layers();
        if let FilesystemPolicy::Restricted { rules } = &mut self.filesystem {
            let mut all = std::mem::take(rules);
            all.push(PathRule {
                path: normalize_existing(root),
                access: Access::Write,
            });
            let protected: Vec<String> = DEFAULT_PROTECTED_SUBPATHS
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            *rules = protect_subpaths(all, &protected, &layers);
        }
        self
    }

    /// Lets the sandboxed process connect to the pathname unix socket `path` (absolute) outside
    /// its writable roots. Does nothing when the filesystem is unrestricted (every socket is
    /// reachable then).
    ///
    /// # Errors
    /// [`PolicyError::PlantedSymlink`] when the way to it passes a symlink a sandbox under this
    /// policy could have planted.
    pub fn with_allowed_unix_socket(mut self, path: &Path) -> Result<Self, PolicyError> {
        if !self.restricts_filesystem() {
            return Ok(self);
        }
        self.refuse_planted_symlink(path)?;
        let path = normalize_existing(path);
        if !self.unix_sockets.contains(&path) {
            self.unix_sockets.push(path);
            self.unix_sockets.sort();
        }
        Ok(self)
    }

    /// The policy a command starting in `cwd` (canonical) runs under. A working directory
    /// inside a private layer ([`Self::private_layers`]) is carried into the command's fresh
    /// tmpfs with the access the policy gives it; when that is write, the command writes that
    /// host directory (and can plant symlinks in it) as in any writable root, so it becomes
    /// one: carried in, its protected names kept read-only, recorded and checked as a
    /// directory sandboxes write ([`PlantableDirs`]). Any other `cwd` changes nothing.
    pub fn with_working_directory(self, cwd: &Path) -> Self {
        let carried = self
            .private_layers()
            .iter()
            .any(|layer| cwd.starts_with(layer) && cwd != layer.as_path());
        if carried && self.can_write(cwd) {
            self.with_writable_root(cwd)
        } else {
            self
        }
    }

    /// Turns the network on or off.
    pub fn with_network(mut self, allowed: bool) -> Self {
        self.network = allowed.into();
        self
    }

    /// Sets the network policy (off, on, or an allowlist).
    pub fn with_network_policy(mut self, network: super::NetworkPolicy) -> Self {
        self.network = network;
        self
    }
}

fn resolve_draft(
    draft: &Draft,
    cwd: Option<&Path>,
    workspace_roots: &[PathBuf],
    ctx: &ResolveContext,
) -> Result<ResolvedPolicy, PolicyError> {
    if draft.full_filesystem {
        // Every path is writable: every socket is reachable, a named one needs no entry.
        return Ok(ResolvedPolicy::new(
            FilesystemPolicy::Unrestricted,
            draft.network.clone(),
        ));
    }
    let mut rules = Vec::new();
    let mut named: Vec<PathBuf> = cwd.iter().map(|c| c.to_path_buf()).collect();
    // All the globs of one policy share one budget; an entry given twice is resolved once.
    let mut globs = glob::GlobBudget::new();
    let mut seen = std::collections::HashSet::new();
    for (path, access) in &draft.entries {
        if !seen.insert((path, *access)) {
            continue;
        }
        let resolved = resolve_entry(
            path,
            *access,
            cwd,
            workspace_roots,
            ctx,
            draft.glob_depth,
            &mut globs,
        )?;
        if rules.len() + resolved.len() > MAX_RESOLVED_RULES {
            return Err(PolicyError::TooManyRules {
                limit: MAX_RESOLVED_RULES,
            });
        }
        for resolved in resolved {
            named.push(resolved.clone());
            rules.push(PathRule {
                path: normalize_existing(&resolved),
                access: *access,
            });
        }
    }
    if let Some(lifted) = &draft.credential_stores {
        for path in super::credentials::denied_paths(&ctx.homes, lifted)? {
            rules.push(PathRule {
                path: normalize_existing(&path),
                access: Access::Deny,
            });
        }
        if rules.len() > MAX_RESOLVED_RULES {
            return Err(PolicyError::TooManyRules {
                limit: MAX_RESOLVED_RULES,
            });
        }
    }
    if !rules.iter().any(|r| r.path == Path::new("/dev/null")) {
        // Shells redirect to /dev/null everywhere; it is always writable.
        rules.push(PathRule {
            path: PathBuf::from("/dev/null"),
            access: Access::Write,
        });
    }
    let tmpdir_writable = draft.entries.iter().any(|(path, access)| {
        *access == Access::Write
            && matches!(
                path,
                EntryPath::Special {
                    value: SpecialPath::Tmpdir
                }
            )
    });
    let mut policy = ResolvedPolicy::new(
        FilesystemPolicy::Restricted { rules: Vec::new() },
        draft.network.clone(),
    );
    if tmpdir_writable {
        policy.tmpdir = ctx.tmpdir.as_deref().map(normalize_existing);
    }
    // The fresh layers' host contents are never scanned; writable roots inside them stay
    // rules of their own (host directories carried in).
    let fresh = policy.private_layers();
    policy.filesystem = FilesystemPolicy::Restricted {
        rules: protect_subpaths(rules, &draft.protected, &fresh),
    };
    for path in &named {
        policy.refuse_planted_symlink_after(path, &ctx.earlier_writable)?;
    }
    for socket in &draft.unix_sockets {
        // A symlink a sandbox could have planted on the way would redirect the name to any
        // socket (docker.sock): refused, as for every path a start names.
        policy.refuse_planted_symlink_after(socket, &ctx.earlier_writable)?;
        policy.unix_sockets.push(normalize_existing(socket));
    }
    policy.unix_sockets.sort();
    policy.unix_sockets.dedup();
    Ok(policy)
}

fn resolve_entry(
    path: &EntryPath,
    access: Access,
    cwd: Option<&Path>,
    workspace_roots: &[PathBuf],
    ctx: &ResolveContext,
    glob_depth: usize,
    globs: &mut glob::GlobBudget,
) -> Result<Vec<PathBuf>, PolicyError> {
    let need_cwd = |entry: &str| {
        cwd.map(Path::to_owned)
            .ok_or_else(|| PolicyError::MissingCwd {
                entry: entry.to_owned(),
            })
    };
    Ok(match path {
        EntryPath::Path { path } => vec![parse_abs("permissions entry path", path)?],
        EntryPath::GlobPattern { pattern } => {
            let absolute = if pattern.starts_with('/') {
                PathBuf::from(pattern)
            } else {
                need_cwd(&format!("glob {pattern:?}"))?.join(pattern)
            };
            glob::expand_within(&absolute, glob_depth, globs, access == Access::Deny)?
        }
        EntryPath::Special { value } => match value {
            SpecialPath::Root => vec![PathBuf::from("/")],
            SpecialPath::Minimal => MINIMAL_READ_PATHS
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect(),
            SpecialPath::ProjectRoots { subpath } => {
                let roots = if workspace_roots.is_empty() {
                    vec![need_cwd(":project_roots")?]
                } else {
                    workspace_roots.to_vec()
                };
                match subpath {
                    None => roots,
                    Some(sub) => {
                        check_subpath(sub)?;
                        roots.iter().map(|root| root.join(sub)).collect()
                    }
                }
            }
            SpecialPath::CurrentWorkingDirectory => vec![need_cwd(":cwd")?],
            SpecialPath::Tmpdir => ctx.tmpdir.iter().cloned().collect(),
            SpecialPath::SlashTmp => vec![PathBuf::from("/tmp")],
            SpecialPath::Unknown if access == Access::Deny => {
                return Err(PolicyError::UnknownSpecial {
                    name: "unknown".to_owned(),
                });
            }
            SpecialPath::Unknown => Vec::new(),
        },
    })
}

fn check_subpath(sub: &Path) -> Result<(), PolicyError> {
    let escapes = sub.is_absolute()
        || sub
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if escapes {
        return Err(PolicyError::BadSubpath {
            subpath: sub.display().to_string(),
        });
    }
    Ok(())
}
