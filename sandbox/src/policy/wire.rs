//! The wire `sandbox` object ([`SandboxSpec`]) and the reference's shapes it accepts.
//!
//! One object, one of four policy sources chosen by its keys:
//! `profile` (a named profile), `permissions` (the reference's permission profile),
//! `type` (the legacy policy, flattened), or `sandboxPolicy` (the legacy policy, nested, as
//! older reference clients send it). `cwd` and `workspaceRoots` sit beside it. The exact JSON
//! is documented in `policies/README.md`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Access, PolicyError};

/// A filesystem entry's path in the reference's shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum EntryPath {
    /// An absolute path or `file:` URI.
    Path {
        /// The path as given.
        path: String,
    },
    /// A glob pattern (`*`, `?`, `[...]`, `**`); relative patterns are resolved against cwd.
    GlobPattern {
        /// The pattern as given.
        pattern: String,
    },
    /// A special, platform- or request-dependent path.
    Special {
        /// Which one.
        value: SpecialPath,
    },
}

/// The reference's special paths.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SpecialPath {
    /// `/`.
    Root,
    /// The platform's minimal runtime set (`/usr`, `/bin`, `/lib*`, `/etc`, a few devices).
    Minimal,
    /// Each workspace root (or cwd when there are none), optionally joined with `subpath`.
    ProjectRoots {
        /// Relative path inside each root.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subpath: Option<PathBuf>,
    },
    /// The request's cwd.
    CurrentWorkingDirectory,
    /// `$TMPDIR` of the process that resolves the policy, when set and absolute.
    Tmpdir,
    /// `/tmp`.
    SlashTmp,
    /// A special this version does not know (kept so newer clients do not fail outright:
    /// ignored for read/write, an error for deny).
    #[serde(other)]
    Unknown,
}

/// One `{path, access}` entry of a permission profile.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct FsEntry {
    /// Which path.
    pub path: EntryPath,
    /// `read`, `write`, `deny` (or the reference's `none`).
    pub access: Access,
}

/// The reference's network policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// No network sockets.
    #[default]
    Restricted,
    /// Network allowed.
    Enabled,
}

/// Managed filesystem permissions of the reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ManagedFileSystem {
    /// Only what the entries grant.
    Restricted {
        /// The entries.
        entries: Vec<FsEntry>,
        /// Depth bound for glob expansion.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        glob_scan_max_depth: Option<usize>,
    },
    /// Everything.
    Unrestricted,
}

/// The reference's `PermissionProfile` (tagged by `type`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PermissionProfile {
    /// The sandbox is built from `file_system` and `network`.
    Managed {
        /// Filesystem permissions.
        file_system: ManagedFileSystem,
        /// Network policy.
        #[serde(default)]
        network: NetworkMode,
    },
    /// No sandbox.
    Disabled,
    /// The caller isolates the filesystem itself; only the network policy applies here.
    External {
        /// Network policy.
        #[serde(default)]
        network: NetworkMode,
    },
}

/// The reference's older, untagged permission profile `{network: {enabled}, file_system: {entries}}`.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub(super) struct UntaggedPermissionProfile {
    #[serde(default)]
    network: Option<UntaggedNetwork>,
    #[serde(default)]
    file_system: Option<UntaggedFileSystem>,
}

#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct UntaggedNetwork {
    #[serde(default)]
    enabled: Option<bool>,
}

#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct UntaggedFileSystem {
    #[serde(default)]
    entries: Vec<FsEntry>,
    #[serde(default)]
    glob_scan_max_depth: Option<usize>,
}

impl PermissionProfile {
    fn from_value(value: Value) -> Result<Self, PolicyError> {
        let tagged = value.get("type").is_some();
        if tagged {
            return serde_json::from_value(value).map_err(|err| shape("permissions", err));
        }
        let old: UntaggedPermissionProfile =
            serde_json::from_value(value).map_err(|err| shape("permissions", err))?;
        let fs = old.file_system.unwrap_or(UntaggedFileSystem {
            entries: Vec::new(),
            glob_scan_max_depth: None,
        });
        let enabled = old.network.and_then(|n| n.enabled).unwrap_or(false);
        Ok(PermissionProfile::Managed {
            file_system: ManagedFileSystem::Restricted {
                entries: fs.entries,
                glob_scan_max_depth: fs.glob_scan_max_depth,
            },
            network: if enabled {
                NetworkMode::Enabled
            } else {
                NetworkMode::Restricted
            },
        })
    }
}

/// The legacy sandbox policy (`{"type": "workspace-write", ...}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = super::schema_aliases::legacy_policy_aliases)
)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LegacyPolicy {
    /// No sandbox.
    #[serde(alias = "dangerFullAccess")]
    DangerFullAccess,
    /// Read everywhere, write nowhere.
    #[serde(alias = "readOnly")]
    ReadOnly {
        /// Allow network.
        #[serde(default, alias = "networkAccess")]
        network_access: bool,
        /// Only `{"type": "full-access"}` is accepted (restricted reads use `permissions`).
        #[serde(default, skip_serializing)]
        access: Option<Value>,
    },
    /// Read everywhere, write the cwd/workspace roots, `/tmp`, `$TMPDIR` and extra roots.
    #[serde(alias = "workspaceWrite")]
    WorkspaceWrite {
        /// Extra writable roots (absolute paths or `file:` URIs).
        #[serde(default, alias = "writableRoots")]
        writable_roots: Vec<String>,
        /// Allow network.
        #[serde(default, alias = "networkAccess")]
        network_access: bool,
        /// Do not make `$TMPDIR` writable.
        #[serde(default, alias = "excludeTmpdirEnvVar")]
        exclude_tmpdir_env_var: bool,
        /// Do not make `/tmp` writable.
        #[serde(default, alias = "excludeSlashTmp")]
        exclude_slash_tmp: bool,
        /// Only `{"type": "full-access"}` is accepted.
        #[serde(default, alias = "readOnlyAccess", skip_serializing)]
        read_only_access: Option<Value>,
    },
    /// The caller sandboxes the filesystem; only the network flag applies.
    #[serde(alias = "externalSandbox")]
    ExternalSandbox {
        /// `"restricted"` or `"enabled"` (or a boolean).
        #[serde(default, alias = "networkAccess")]
        network_access: Option<Value>,
    },
}

/// A named profile plus the knobs a request may turn.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(
    feature = "schema",
    derive(schemars::JsonSchema),
    schemars(transform = super::schema_aliases::named_policy_aliases)
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamedPolicy {
    /// `read-only`, `workspace-write` or `danger-full-access`.
    pub profile: String,
    /// Extra writable roots.
    #[serde(
        default,
        alias = "writable_roots",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub writable_roots: Vec<String>,
    /// Override the profile's network setting.
    #[serde(
        default,
        alias = "network_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub network_access: Option<bool>,
    /// Do not make `$TMPDIR` writable.
    #[serde(
        default,
        alias = "exclude_tmpdir_env_var",
        skip_serializing_if = "is_false"
    )]
    pub exclude_tmpdir_env_var: bool,
    /// Do not make `/tmp` writable.
    #[serde(default, alias = "exclude_slash_tmp", skip_serializing_if = "is_false")]
    pub exclude_slash_tmp: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

impl NamedPolicy {
    /// The named profile with no knobs turned.
    pub fn new(profile: &str) -> Self {
        Self {
            profile: profile.to_owned(),
            writable_roots: Vec::new(),
            network_access: None,
            exclude_tmpdir_env_var: false,
            exclude_slash_tmp: false,
        }
    }
}

/// Where a spec's rules come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PolicySource {
    /// `{"profile": ...}`.
    Named(NamedPolicy),
    /// `{"permissions": ...}`.
    Permissions(PermissionProfile),
    /// `{"type": ...}` or `{"sandboxPolicy": {...}}`.
    Legacy(LegacyPolicy),
    /// `{"profileToml": "..."}`: a profile file's text (the format of `policies/*.toml`),
    /// resolved where the command runs, as `sandbox-run --policy FILE` resolves the file. Kept as
    /// text (checked to parse when the spec is read) so a spec stays comparable and hashable.
    Toml(String),
}

/// The wire `sandbox` object of `fs/*` and `process/start` params.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub struct SandboxSpec {
    /// The policy source.
    pub source: PolicySource,
    /// Directory cwd-dependent entries resolve against.
    pub cwd: Option<PathBuf>,
    /// The workspace roots `:project_roots` expands to (cwd when empty).
    pub workspace_roots: Vec<PathBuf>,
    /// `network` beside the source: `"off"`, `"on"` or `{"allow": [...], "deny": [...]}`;
    /// overrides the source's own network setting.
    pub network: Option<super::NetworkPolicy>,
    /// `readableCredentialStores` beside the source: stores of the built-in deny set the
    /// command may read (`["~/.aws"]`).
    pub readable_credential_stores: Vec<String>,
    /// `writableRoots` beside a source other than `profile` (which carries its own): more
    /// writable roots, as `sandbox-run --writable-root`.
    pub writable_roots: Vec<PathBuf>,
    /// `allowances` beside the source: named allowances (`["toolchain-caches"]`), as
    /// `sandbox-run --allow`.
    pub allowances: Vec<String>,
    /// `denyPaths` beside the source: paths the command may neither read nor write, as
    /// `sandbox-run --deny`.
    pub denied_paths: Vec<PathBuf>,
    /// `allowUnixSockets` beside the source: pathname unix sockets (absolute paths or `file:`
    /// URIs) the command may connect to outside its writable roots.
    pub allow_unix_sockets: Vec<PathBuf>,
}

/// Keys reference clients send that have no meaning on Linux; accepted and ignored.
const IGNORED_KEYS: &[&str] = &[
    "windowsSandboxLevel",
    "windowsSandboxPrivateDesktop",
    "useLegacyLandlock",
];

impl SandboxSpec {
    /// A spec for a named profile.
    pub fn named(profile: &str, cwd: Option<PathBuf>) -> Self {
        Self {
            source: PolicySource::Named(NamedPolicy::new(profile)),
            cwd,
            workspace_roots: Vec::new(),
            network: None,
            readable_credential_stores: Vec::new(),
            writable_roots: Vec::new(),
            allowances: Vec::new(),
            denied_paths: Vec::new(),
            allow_unix_sockets: Vec::new(),
        }
    }

    /// Parses the wire JSON text.
    ///
    /// # Errors
    /// [`PolicyError::Shape`] naming the offending key and the expected form.
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let value: Value = serde_json::from_str(text).map_err(|err| shape("sandbox", err))?;
        Self::try_from(value)
    }
}

impl TryFrom<Value> for SandboxSpec {
    type Error = PolicyError;

    fn try_from(value: Value) -> Result<Self, PolicyError> {
        let Value::Object(mut map) = value else {
            return Err(PolicyError::Shape {
                message: "sandbox must be a JSON object such as {\"profile\": \"workspace-write\", \"cwd\": \"file:///ws\"}".to_owned(),
            });
        };
        for key in IGNORED_KEYS {
            map.remove(*key);
        }
        let mut cwd = take_path(&mut map, "cwd")?;
        let network = match map.remove("network") {
            None | Some(Value::Null) => None,
            Some(value) => Some(network_value(value)?),
        };
        let workspace_roots = match map.remove("workspaceRoots") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => parse_abs("workspaceRoots[]", s),
                    other => Err(PolicyError::Shape {
                        message: format!("workspaceRoots entries must be strings (got {other})"),
                    }),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(PolicyError::Shape {
                    message: format!("workspaceRoots must be an array of file: URIs (got {other})"),
                });
            }
        };
        let readable_credential_stores =
            take_strings(&mut map, "readableCredentialStores", "\"~/.aws\"")?;
        let allowances = take_strings(&mut map, "allowances", "\"toolchain-caches\"")?;
        let denied_paths = take_strings(&mut map, "denyPaths", "\"/srv/ws/secrets\"")?
            .iter()
            .map(|path| parse_abs("denyPaths[]", path))
            .collect::<Result<_, _>>()?;
        // `profile` and the legacy `type` carry their own `writableRoots` (the reference's
        // shapes); beside `permissions` and `profileToml` they are the spec's.
        let writable_roots = if map.contains_key("permissions") || map.contains_key("profileToml") {
            take_strings(&mut map, "writableRoots", "\"/srv/ws\"")?
                .iter()
                .map(|path| parse_abs("writableRoots[]", path))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let allow_unix_sockets = take_strings(
            &mut map,
            "allowUnixSockets",
            "\"/run/user/1000/ssh-agent.sock\"",
        )?
        .iter()
        .map(|path| parse_abs("allowUnixSockets entry", path))
        .collect::<Result<_, _>>()?;
        let source = if let Some(toml) = map.remove("profileToml") {
            reject_extra(&map, "profileToml")?;
            let Value::String(text) = toml else {
                return Err(PolicyError::Shape {
                    message: format!(
                        "profileToml must be a string holding a profile file's TOML (got {toml})"
                    ),
                });
            };
            super::ProfileFile::parse(&text, "profileToml")?;
            PolicySource::Toml(text)
        } else if map.contains_key("profile") {
            PolicySource::Named(
                serde_json::from_value(Value::Object(map)).map_err(|err| shape("profile", err))?,
            )
        } else if let Some(permissions) = map.remove("permissions") {
            reject_extra(&map, "permissions")?;
            PolicySource::Permissions(PermissionProfile::from_value(permissions)?)
        } else if map.contains_key("type") {
            PolicySource::Legacy(
                serde_json::from_value(Value::Object(map)).map_err(|err| shape("type", err))?,
            )
        } else if let Some(policy) = map.remove("sandboxPolicy") {
            let nested_cwd = take_path(&mut map, "sandboxPolicyCwd")?;
            cwd = cwd.or(nested_cwd);
            reject_extra(&map, "sandboxPolicy")?;
            PolicySource::Legacy(
                serde_json::from_value(policy).map_err(|err| shape("sandboxPolicy", err))?,
            )
        } else {
            let keys: Vec<&String> = map.keys().collect();
            return Err(PolicyError::Shape {
                message: format!(
                    "sandbox needs one of \"profile\", \"permissions\", \"type\" or \"sandboxPolicy\" (got keys {keys:?})"
                ),
            });
        };
        Ok(SandboxSpec {
            source,
            cwd,
            workspace_roots,
            network,
            readable_credential_stores,
            writable_roots,
            allowances,
            denied_paths,
            allow_unix_sockets,
        })
    }
}

impl From<SandboxSpec> for Value {
    fn from(spec: SandboxSpec) -> Value {
        let mut map = match spec.source {
            PolicySource::Named(named) => object(serde_json::to_value(named)),
            PolicySource::Legacy(legacy) => object(serde_json::to_value(legacy)),
            PolicySource::Permissions(permissions) => {
                let mut map = Map::new();
                map.insert(
                    "permissions".to_owned(),
                    serde_json::to_value(permissions).unwrap_or(Value::Null),
                );
                map
            }
            PolicySource::Toml(text) => {
                let mut map = Map::new();
                map.insert("profileToml".to_owned(), Value::String(text));
                map
            }
        };
        let paths = |paths: Vec<PathBuf>| {
            Value::Array(
                paths
                    .iter()
                    .map(|path| Value::String(path.display().to_string()))
                    .collect(),
            )
        };
        if !spec.writable_roots.is_empty() {
            map.insert("writableRoots".to_owned(), paths(spec.writable_roots));
        }
        if !spec.denied_paths.is_empty() {
            map.insert("denyPaths".to_owned(), paths(spec.denied_paths));
        }
        if !spec.allowances.is_empty() {
            map.insert(
                "allowances".to_owned(),
                Value::Array(spec.allowances.into_iter().map(Value::String).collect()),
            );
        }
        if let Some(cwd) = spec.cwd {
            map.insert("cwd".to_owned(), Value::String(cwd.display().to_string()));
        }
        if !spec.readable_credential_stores.is_empty() {
            map.insert(
                "readableCredentialStores".to_owned(),
                Value::Array(
                    spec.readable_credential_stores
                        .into_iter()
                        .map(Value::String)
                        .collect(),
                ),
            );
        }
        if !spec.allow_unix_sockets.is_empty() {
            map.insert(
                "allowUnixSockets".to_owned(),
                Value::Array(
                    spec.allow_unix_sockets
                        .iter()
                        .map(|path| Value::String(path.display().to_string()))
                        .collect(),
                ),
            );
        }
        if let Some(network) = spec.network {
            map.insert(
                "network".to_owned(),
                serde_json::to_value(network).unwrap_or(Value::Null),
            );
        }
        if !spec.workspace_roots.is_empty() {
            let roots = spec
                .workspace_roots
                .iter()
                .map(|root| Value::String(root.display().to_string()))
                .collect();
            map.insert("workspaceRoots".to_owned(), Value::Array(roots));
        }
        Value::Object(map)
    }
}

fn object(value: Result<Value, serde_json::Error>) -> Map<String, Value> {
    match value {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// The top-level `network` value, with a message that shows the accepted forms.
fn network_value(value: Value) -> Result<super::NetworkPolicy, PolicyError> {
    let setting: super::network::NetworkSetting = serde_json::from_value(value.clone())
        .map_err(|_| super::network::NetworkError::Malformed { value })?;
    super::NetworkPolicy::from_setting(setting)
}

fn reject_extra(map: &Map<String, Value>, source: &str) -> Result<(), PolicyError> {
    match map.keys().next() {
        None => Ok(()),
        Some(key) => Err(PolicyError::Shape {
            message: format!(
                "unknown key {key:?} beside {source:?} (expected only \"cwd\", \"workspaceRoots\", \
                 \"network\", \"writableRoots\", \"allowances\", \"denyPaths\" and \
                 \"readableCredentialStores\")"
            ),
        }),
    }
}

/// Removes `key`, an array of strings (absent or `null`: empty); `example` shows an entry in the
/// error.
fn take_strings(
    map: &mut Map<String, Value>,
    key: &str,
    example: &str,
) -> Result<Vec<String>, PolicyError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                other => Err(PolicyError::Shape {
                    message: format!(
                        "{key} entries must be strings such as {example} (got {other})"
                    ),
                }),
            })
            .collect(),
        Some(other) => Err(PolicyError::Shape {
            message: format!("{key} must be an array such as [{example}] (got {other})"),
        }),
    }
}

fn take_path(map: &mut Map<String, Value>, key: &str) -> Result<Option<PathBuf>, PolicyError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_abs(key, &s).map(Some),
        Some(other) => Err(PolicyError::Shape {
            message: format!("{key} must be a file: URI string (got {other})"),
        }),
    }
}

fn shape(what: &str, err: serde_json::Error) -> PolicyError {
    PolicyError::Shape {
        message: format!("{what}: {err}"),
    }
}

/// Parses an absolute path or a `file:` URI (`file:///abs/path`, `file://localhost/abs`),
/// percent-decoding the URI form.
///
/// # Errors
/// [`PolicyError::NotAbsolute`] for relative paths, other URI schemes or remote hosts.
pub(crate) fn parse_abs(field: &str, value: &str) -> Result<PathBuf, PolicyError> {
    let not_absolute = || PolicyError::NotAbsolute {
        field: field.to_owned(),
        value: value.to_owned(),
    };
    // One `file:` URI parser for the whole project (exact for non-UTF-8 names).
    let raw = if value
        .get(..5)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("file:"))
    {
        proto::FileUri::parse(value)
            .map_err(|_| not_absolute())?
            .into_path_buf()
    } else {
        PathBuf::from(value)
    };
    if !raw.is_absolute() || raw.as_os_str().is_empty() {
        return Err(not_absolute());
    }
    if raw
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(not_absolute());
    }
    Ok(raw)
}
