//! Hand-written JSON Schemas (feature `schema`) where serde's behaviour is hand-written too: the
//! wire `sandbox` object ([`SandboxSpec`], read key by key in `wire/mod.rs`) and the
//! `#[serde(other)]` special path. (serde's `alias` spellings are added in `schema_aliases`.)
//! `tests/tests/schemas.rs` checks the schemas accept every shape and spelling the deserializer
//! accepts and refuse mutated copies.

use proto::schema::NATIVE_PATH_OR_FILE_URI_PATTERN;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value, json};

use super::profile::BUILTIN_PROFILES;
use super::wire::{
    LegacyPolicy, NamedPolicy, PermissionProfile, SandboxSpec, SpecialPath,
    UntaggedPermissionProfile,
};

/// Names of the special paths this version knows (`SpecialPath` without `Unknown`).
const SPECIAL_PATH_KINDS: &[&str] = &[
    "root",
    "minimal",
    "project_roots",
    "current_working_directory",
    "tmpdir",
    "slash_tmp",
];

impl JsonSchema for SpecialPath {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SpecialPath".into()
    }

    /// Any `kind` is accepted (`#[serde(other)]`: a special a newer client names is ignored
    /// for read and write, refused for deny when resolved); other members are ignored, but
    /// `project_roots` reads `subpath`.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A special path, by kind. Kinds this version does not know are accepted (ignored for read and write, an error for deny).",
            "type": "object",
            "properties": {
                "kind": {"type": "string", "examples": SPECIAL_PATH_KINDS},
                "subpath": true
            },
            "required": ["kind"],
            "if": {"properties": {"kind": {"const": "project_roots"}}},
            "then": {
                "properties": {
                    "subpath": {
                        "type": ["string", "null"],
                        "description": "Relative path inside each workspace root."
                    }
                }
            }
        })
    }
}

/// The keys read beside any policy source, with what each accepts (`null` reads as absent).
fn common_properties(generator: &mut SchemaGenerator) -> Map<String, Value> {
    let path = json!({"type": "string", "pattern": NATIVE_PATH_OR_FILE_URI_PATTERN});
    let paths = |description: &str| json!({"type": ["array", "null"], "items": path, "description": description});
    let names = |description: &str| json!({"type": ["array", "null"], "items": {"type": "string"}, "description": description});
    let network = generator.subschema_for::<super::NetworkPolicy>();
    let ignored =
        json!({"description": "Sent by reference clients, meaningless on Linux: ignored."});
    let mut properties = Map::new();
    properties.insert(
        "cwd".to_owned(),
        json!({"anyOf": [path, {"type": "null"}], "description": "Directory cwd-dependent entries resolve against (a file: URI or an absolute path)."}),
    );
    properties.insert(
        "workspaceRoots".to_owned(),
        paths("The workspace roots :project_roots expands to (cwd when empty)."),
    );
    properties.insert(
        "network".to_owned(),
        json!({"anyOf": [network, {"type": "null"}], "description": "Overrides the source's network setting: \"off\", \"on\" or {\"allow\": [...], \"deny\": [...]}."}),
    );
    properties.insert(
        "readableCredentialStores".to_owned(),
        names("Credential stores of the built-in deny set the command may read (\"~/.aws\")."),
    );
    properties.insert(
        "allowances".to_owned(),
        names("Named allowances (\"toolchain-caches\")."),
    );
    properties.insert(
        "denyPaths".to_owned(),
        paths("Paths the command may neither read nor write."),
    );
    properties.insert(
        "allowUnixSockets".to_owned(),
        paths("Pathname unix sockets the command may connect to outside its writable roots."),
    );
    for key in [
        "windowsSandboxLevel",
        "windowsSandboxPrivateDesktop",
        "useLegacyLandlock",
    ] {
        properties.insert(key.to_owned(), ignored.clone());
    }
    properties
}

/// A closed object: `own` plus the common keys, `required` present.
fn shape(
    title: &str,
    own: Map<String, Value>,
    common: &Map<String, Value>,
    required: &str,
) -> Value {
    let mut properties = common.clone();
    properties.extend(own);
    json!({
        "title": title,
        "type": "object",
        "properties": properties,
        "required": [required],
        "additionalProperties": false
    })
}

/// Adds the common keys to every (closed) object of an inline schema.
fn with_common(mut schema: Schema, title: &str, common: &Map<String, Value>) -> Value {
    fn extend(value: &mut Value, common: &Map<String, Value>) {
        let Some(object) = value.as_object_mut() else {
            return;
        };
        for key in ["oneOf", "anyOf"] {
            if let Some(variants) = object.get_mut(key).and_then(Value::as_array_mut) {
                variants
                    .iter_mut()
                    .for_each(|variant| extend(variant, common));
            }
        }
        if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
            for (key, value) in common {
                properties
                    .entry(key.clone())
                    .or_insert_with(|| value.clone());
            }
        }
    }
    schema.insert("title".to_owned(), json!(title));
    let mut value = schema.to_value();
    extend(&mut value, common);
    value
}

/// `NamedPolicy` inline, the built-in profile names as examples (an unknown name is refused
/// when the policy is resolved, not when it is read).
fn named_policy(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = NamedPolicy::json_schema(generator);
    let names: Vec<&str> = BUILTIN_PROFILES.iter().map(|(name, _)| *name).collect();
    if let Some(profile) = schema
        .get_mut("properties")
        .and_then(|properties| properties.get_mut("profile"))
        .and_then(Value::as_object_mut)
    {
        profile.insert("examples".to_owned(), json!(names));
    }
    schema
}

impl JsonSchema for SandboxSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        proto::schema::SANDBOX_DEFINITION.into()
    }

    /// One of five policy sources, chosen by its key (exactly one may be present), with the
    /// common keys beside it: as `TryFrom<Value> for SandboxSpec` reads it.
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let common = common_properties(generator);
        let paths = json!({
            "type": ["array", "null"],
            "items": {"type": "string", "pattern": NATIVE_PATH_OR_FILE_URI_PATTERN},
            "description": "More writable roots."
        });
        let mut toml = Map::new();
        toml.insert(
            "profileToml".to_owned(),
            json!({"type": "string", "description": "A profile file's text (the format of policies/*.toml, schema profile.json)."}),
        );
        toml.insert("writableRoots".to_owned(), paths.clone());
        let mut permissions = Map::new();
        let tagged = generator.subschema_for::<PermissionProfile>();
        let untagged = generator.subschema_for::<UntaggedPermissionProfile>();
        permissions.insert(
            "permissions".to_owned(),
            json!({"anyOf": [tagged, untagged], "description": "The reference's permission profile (tagged by type, or the older untagged form)."}),
        );
        permissions.insert("writableRoots".to_owned(), paths);
        let mut nested = Map::new();
        nested.insert(
            "sandboxPolicy".to_owned(),
            generator.subschema_for::<LegacyPolicy>().to_value(),
        );
        nested.insert(
            "sandboxPolicyCwd".to_owned(),
            json!({"anyOf": [{"type": "string", "pattern": NATIVE_PATH_OR_FILE_URI_PATTERN}, {"type": "null"}]}),
        );
        json_schema!({
            "description": "The sandbox object of fs/* and process/start params: a named profile, the reference's permission profile, its legacy policy (flattened or nested), or a profile file's text; with cwd, workspaceRoots and the other common keys beside it. See policies/README.md.",
            "oneOf": [
                with_common(named_policy(generator), "named profile", &common),
                shape("permission profile", permissions, &common, "permissions"),
                with_common(LegacyPolicy::json_schema(generator), "legacy policy", &common),
                shape("legacy policy, nested", nested, &common, "sandboxPolicy"),
                shape("profile file text", toml, &common, "profileToml"),
            ]
        })
    }
}
