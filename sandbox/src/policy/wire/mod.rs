//! The wire `sandbox` object ([`SandboxSpec`]) and the reference's shapes it accepts.
//!
//! One object, one of four policy sources chosen by its keys:
//! `profile` (a named profile), `permissions` (the reference's permission profile),
//! `type` (the legacy policy, flattened), or `sandboxPolicy` (the legacy policy, nested, as
//! older reference clients send it). `cwd` and `workspaceRoots` sit beside it. The exact JSON
//! is documented in `policies/README.md`.

mod fields;
mod reference;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::PolicyError;
use fields::{network_value, object, reject_extra, shape, take_path, take_strings};

pub(crate) use fields::parse_abs;
#[cfg(feature = "schema")]
pub(super) use reference::UntaggedPermissionProfile;
pub use reference::{
    EntryPath, FsEntry, LegacyPolicy, ManagedFileSystem, NetworkMode, PermissionProfile,
    SpecialPath,
};

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
