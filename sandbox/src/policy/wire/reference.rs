//! The reference's shapes: permission profiles (tagged and the older untagged one), their
//! entries and special paths, and the legacy sandbox policy.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::shape;

use crate::policy::{Access, PolicyError};

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
pub(in crate::policy) struct UntaggedPermissionProfile {
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
    pub(super) fn from_value(value: Value) -> Result<Self, PolicyError> {
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
    schemars(transform = crate::policy::schema_aliases::legacy_policy_aliases)
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
