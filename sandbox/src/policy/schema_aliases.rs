//! What `#[derive(JsonSchema)]` does not see of the policy types' serde attributes (feature
//! `schema`): their `alias` spellings, and the checks `ProfileFile::parse` adds. The types name
//! these functions in `#[schemars(transform = ...)]`; each mirrors the serde attributes of one
//! type, and `tests/tests/schemas.rs` checks the result against the deserializers. A leaf
//! module: it imports none of the policy modules (`schema` does, for the hand-written impls).

use proto::schema::{add_field_aliases, add_tag_aliases, add_value_aliases};
use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::json;

/// `Access`: `deny` is also spelled `none` (the reference's word).
pub(super) fn access_aliases(schema: &mut Schema) {
    add_value_aliases(schema, &[("deny", "none")]);
}

/// `LegacyPolicy`: the reference's camelCase spellings of the type and of every field.
pub(super) fn legacy_policy_aliases(schema: &mut Schema) {
    add_tag_aliases(
        schema,
        "type",
        &[
            ("danger-full-access", "dangerFullAccess"),
            ("read-only", "readOnly"),
            ("workspace-write", "workspaceWrite"),
            ("external-sandbox", "externalSandbox"),
        ],
    );
    add_field_aliases(
        schema,
        &[
            ("network_access", "networkAccess"),
            ("writable_roots", "writableRoots"),
            ("exclude_tmpdir_env_var", "excludeTmpdirEnvVar"),
            ("exclude_slash_tmp", "excludeSlashTmp"),
            ("read_only_access", "readOnlyAccess"),
        ],
    );
}

/// `NamedPolicy`: snake_case spellings of its knobs.
pub(super) fn named_policy_aliases(schema: &mut Schema) {
    add_field_aliases(
        schema,
        &[
            ("writableRoots", "writable_roots"),
            ("networkAccess", "network_access"),
            ("excludeTmpdirEnvVar", "exclude_tmpdir_env_var"),
            ("excludeSlashTmp", "exclude_slash_tmp"),
        ],
    );
}

/// `ProfileFile`: `allow_unix_sockets` is also spelled `allowUnixSockets`; what
/// `ProfileFile::parse` checks beyond serde: `full_filesystem_access = true` takes no
/// `[filesystem]` entries, and each entry's key is a path, a glob or a known special.
pub(super) fn profile_file_rules(schema: &mut Schema) {
    add_field_aliases(schema, &[("allow_unix_sockets", "allowUnixSockets")]);
    schema.insert(
        "if".to_owned(),
        json!({"properties": {"full_filesystem_access": {"const": true}}, "required": ["full_filesystem_access"]}),
    );
    schema.insert(
        "then".to_owned(),
        json!({"properties": {"filesystem": {"maxProperties": 0}}}),
    );
    // `parse_entry_key`: `:special` (one of these), else a glob (`*`, `?`, `[`) or an absolute
    // path.
    if let Some(filesystem) = schema
        .get_mut("properties")
        .and_then(|properties| properties.get_mut("filesystem"))
        .and_then(serde_json::Value::as_object_mut)
    {
        filesystem.insert(
            "propertyNames".to_owned(),
            json!({
                "description": "An absolute path, a glob pattern, or :root, :minimal, :project_roots[/SUB] (also :workspace_roots), :cwd (also :current_working_directory), :tmpdir, :slash_tmp.",
                "anyOf": [
                    {"pattern": "^:(root|minimal|cwd|current_working_directory|tmpdir|slash_tmp)$"},
                    {"pattern": "^:(project_roots|workspace_roots)(/.*)?$"},
                    {"not": {"pattern": "^:"}, "anyOf": [{"pattern": "^/"}, {"pattern": "[*?\\[]"}]}
                ]
            }),
        );
    }
}

/// The string form of `network`.
pub(super) fn network_mode(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": ["off", "on", "restricted", "enabled"],
        "description": "\"off\" or \"on\" (the reference's \"restricted\" and \"enabled\" too)."
    })
}
