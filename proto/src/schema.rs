//! JSON Schema support (feature `schema`): the pieces `#[derive(JsonSchema)]` cannot express for
//! the wire types, and the helpers the sandbox crate uses for serde's `alias` spellings (which
//! schemars does not see). `tests/tests/schemas.rs` writes `docs/schema/` from these.
//!
//! The derives only describe what serde already does: no serde attribute changes with this
//! feature, so the wire stays exactly the same whether it is on or off.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

use crate::uri::FileUri;

/// Name of the wire `sandbox` object's definition. `sandbox::SandboxSpec` implements it; whoever
/// generates a schema of params that carry `sandbox` registers that type in the same generator
/// (`generator.subschema_for::<sandbox::SandboxSpec>()`), so the reference below resolves.
pub const SANDBOX_DEFINITION: &str = "SandboxSpec";

/// The pattern every `file:` URI string matches (`FileUri::parse` takes the scheme in any case).
pub const FILE_URI_PATTERN: &str = "^[fF][iI][lL][eE]:";

/// An absolute native path or a `file:` URI (`process/start` `cwd`, the sandbox's paths).
pub const NATIVE_PATH_OR_FILE_URI_PATTERN: &str = "^(/|[fF][iI][lL][eE]:)";

impl JsonSchema for FileUri {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FileUri".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": FILE_URI_PATTERN,
            "description": "An absolute `file:` URI, percent-encoded (`file:///tmp/a%20b`).",
            "examples": ["file:///tmp/work"]
        })
    }
}

/// `process/start` `cwd`: a `file:` URI or an absolute native path.
pub fn native_path_or_file_uri(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": NATIVE_PATH_OR_FILE_URI_PATTERN,
        "description": "An absolute `file:` URI, or an absolute native path as the reference server accepts.",
        "examples": ["file:///tmp/work", "/tmp/work"]
    })
}

/// The optional `sandbox` member of `fs/*` and `process/start` params: absent, `null`, or the
/// sandbox object.
pub fn sandbox_field(generator: &mut SchemaGenerator) -> Schema {
    let reference = format!(
        "#{}/{SANDBOX_DEFINITION}",
        generator.settings().definitions_path
    );
    json_schema!({
        "anyOf": [{"$ref": reference}, {"type": "null"}]
    })
}

/// Every object schema in `schema`: itself, or the variants of its `oneOf`/`anyOf`.
fn objects(object: &mut Map<String, Value>) -> Vec<&mut Map<String, Value>> {
    if object.contains_key("oneOf") || object.contains_key("anyOf") {
        let mut found = Vec::new();
        for (key, variants) in object.iter_mut() {
            if (key == "oneOf" || key == "anyOf")
                && let Some(variants) = variants.as_array_mut()
            {
                found.extend(
                    variants
                        .iter_mut()
                        .filter_map(Value::as_object_mut)
                        .flat_map(objects),
                );
            }
        }
        found
    } else {
        vec![object]
    }
}

fn objects_of(schema: &mut Schema) -> Vec<&mut Map<String, Value>> {
    schema.as_object_mut().map(objects).unwrap_or_default()
}

/// Adds serde's field aliases, `(name, alias)`, to an object schema (or to each variant of an
/// enum's): the alias gets the field's schema, and giving both is refused, as serde refuses a
/// duplicate field.
pub fn add_field_aliases(schema: &mut Schema, aliases: &[(&str, &str)]) {
    for object in objects_of(schema) {
        for (name, alias) in aliases {
            let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut)
            else {
                continue;
            };
            let Some(property) = properties.get(*name).cloned() else {
                continue;
            };
            properties.insert((*alias).to_owned(), property);
            let both = serde_json::json!({"not": {"required": [name, alias]}});
            match object.get_mut("allOf").and_then(Value::as_array_mut) {
                Some(all) => all.push(both),
                None => {
                    object.insert("allOf".to_owned(), Value::Array(vec![both]));
                }
            }
        }
    }
}

/// Adds serde's variant aliases, `(name, alias)`, to an internally tagged enum's schema: the
/// variant whose `tag` is `name` also takes `alias`.
pub fn add_tag_aliases(schema: &mut Schema, tag: &str, aliases: &[(&str, &str)]) {
    for object in objects_of(schema) {
        let Some(tag_schema) = object
            .get_mut("properties")
            .and_then(|properties| properties.get_mut(tag))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        let Some(value) = tag_schema.get("const").and_then(Value::as_str) else {
            continue;
        };
        if let Some((name, alias)) = aliases.iter().find(|(name, _)| *name == value) {
            tag_schema.remove("const");
            tag_schema.insert("enum".to_owned(), serde_json::json!([name, alias]));
        }
    }
}

/// Adds serde's aliases of unit variants, `(name, alias)`, to a string enum's schema (an `enum`
/// list, or a `oneOf` of documented `const`s).
pub fn add_value_aliases(schema: &mut Schema, aliases: &[(&str, &str)]) {
    let Some(value) = schema.as_object_mut() else {
        return;
    };
    if let Some(values) = value.get_mut("enum").and_then(Value::as_array_mut) {
        for (name, alias) in aliases {
            if values.iter().any(|v| v == name) {
                values.push(Value::String((*alias).to_owned()));
            }
        }
        return;
    }
    if let Some(variants) = value.get_mut("oneOf").and_then(Value::as_array_mut) {
        let mut added = Vec::new();
        for variant in variants.iter() {
            for (name, alias) in aliases {
                if variant.get("const").and_then(Value::as_str) == Some(name) {
                    let mut copy = variant.clone();
                    copy["const"] = Value::String((*alias).to_owned());
                    added.push(copy);
                }
            }
        }
        variants.extend(added);
    }
}

/// Who sends a method and whether it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodKind {
    /// A client request: answered by a response whose `result` has the method's result schema.
    Request,
    /// A notification the client sends.
    ClientNotification,
    /// A notification the server sends.
    ServerNotification,
    /// A request the server sends (to a client that declared it answers it): answered by the
    /// client with a response whose `result` has the method's result schema.
    ServerRequest,
}

/// One method of the protocol: its name, who sends it, and the schemas of its params and (for a
/// request) its result.
pub struct MethodSchema {
    /// The method name, e.g. `process/start`.
    pub method: &'static str,
    /// Request or notification, and from whom.
    pub kind: MethodKind,
    /// The params' schema (usually a `$ref` into the generator's definitions).
    pub params: Schema,
    /// The result's schema, for requests.
    pub result: Option<Schema>,
}

fn request<P: JsonSchema, R: JsonSchema>(
    generator: &mut SchemaGenerator,
    method: &'static str,
) -> MethodSchema {
    MethodSchema {
        method,
        kind: MethodKind::Request,
        params: generator.subschema_for::<P>(),
        result: Some(generator.subschema_for::<R>()),
    }
}

fn notification<P: JsonSchema>(
    generator: &mut SchemaGenerator,
    method: &'static str,
    kind: MethodKind,
) -> MethodSchema {
    MethodSchema {
        method,
        kind,
        params: generator.subschema_for::<P>(),
        result: None,
    }
}

/// Every method this server serves or sends, with the types its handlers parse and answer.
pub fn methods(generator: &mut SchemaGenerator) -> Vec<MethodSchema> {
    use crate::methods::{self as m, Empty, egress, environment, fs, http, initialize, process};
    use MethodKind::{ClientNotification, ServerNotification};
    vec![
        request::<initialize::InitializeParams, initialize::InitializeResult>(
            generator,
            m::INITIALIZE,
        ),
        notification::<Empty>(generator, m::INITIALIZED, ClientNotification),
        request::<process::StartParams, process::StartResult>(generator, m::PROCESS_START),
        request::<process::ReadParams, process::ReadResult>(generator, m::PROCESS_READ),
        request::<process::WriteParams, process::WriteResult>(generator, m::PROCESS_WRITE),
        request::<process::SignalParams, process::RunningResult>(generator, m::PROCESS_SIGNAL),
        request::<process::ResizeParams, Empty>(generator, m::PROCESS_RESIZE),
        request::<process::TerminateParams, process::RunningResult>(
            generator,
            m::PROCESS_TERMINATE,
        ),
        request::<process::ListParams, process::ListResult>(generator, m::PROCESS_LIST),
        notification::<process::OutputNotification>(
            generator,
            m::PROCESS_OUTPUT,
            ServerNotification,
        ),
        notification::<process::ExitedNotification>(
            generator,
            m::PROCESS_EXITED,
            ServerNotification,
        ),
        notification::<process::DeniedNotification>(
            generator,
            m::PROCESS_DENIED,
            ServerNotification,
        ),
        notification::<process::ClosedNotification>(
            generator,
            m::PROCESS_CLOSED,
            ServerNotification,
        ),
        request::<fs::ReadFileParams, fs::ReadFileResult>(generator, m::FS_READ_FILE),
        request::<fs::WriteFileParams, Empty>(generator, m::FS_WRITE_FILE),
        request::<fs::CreateDirectoryParams, Empty>(generator, m::FS_CREATE_DIRECTORY),
        request::<fs::PathParams, fs::GetMetadataResult>(generator, m::FS_GET_METADATA),
        request::<fs::PathParams, fs::CanonicalizeResult>(generator, m::FS_CANONICALIZE),
        request::<fs::PathParams, fs::ReadDirectoryResult>(generator, m::FS_READ_DIRECTORY),
        request::<fs::RemoveParams, Empty>(generator, m::FS_REMOVE),
        request::<fs::CopyParams, Empty>(generator, m::FS_COPY),
        request::<fs::WalkParams, fs::WalkResult>(generator, m::FS_WALK),
        request::<fs::OpenParams, fs::OpenResult>(generator, m::FS_OPEN),
        request::<fs::ReadBlockParams, fs::ReadBlockResult>(generator, m::FS_READ_BLOCK),
        request::<fs::CloseParams, Empty>(generator, m::FS_CLOSE),
        request::<Empty, environment::EnvironmentInfo>(generator, m::ENVIRONMENT_INFO),
        request::<http::HttpRequestParams, http::HttpResponse>(generator, m::HTTP_REQUEST),
        notification::<http::HttpBodyDelta>(
            generator,
            m::HTTP_REQUEST_BODY_DELTA,
            ServerNotification,
        ),
        MethodSchema {
            kind: MethodKind::ServerRequest,
            ..request::<egress::ApproveParams, egress::ApproveResult>(generator, m::EGRESS_APPROVE)
        },
    ]
}

/// The schema of every JSON-RPC message (one websocket frame): a request, a notification, a
/// response or an error response, with each method's params. A response's `result` depends on
/// the request it answers: `x-results` maps each request method to its result's schema.
///
/// The `sandbox` object's definition is not added here (it lives in the sandbox crate): register
/// it in `generator` before taking its definitions.
pub fn protocol(generator: &mut SchemaGenerator) -> Schema {
    let methods = methods(generator);
    let id = generator.subschema_for::<crate::jsonrpc::RequestId>();
    let error = generator.subschema_for::<crate::error::RpcError>();
    let jsonrpc = serde_json::json!({
        "const": "2.0",
        "description": "Optional; accepted when it says \"2.0\", never sent."
    });
    // Absent or null params are read as `{}` (`parse_params`): allowed exactly when the params
    // type has no required field.
    let definitions = generator.definitions().clone();
    let prefix = format!("#{}/", generator.settings().definitions_path);
    let needs_fields = |params: &Schema| {
        let definition = params
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|reference| reference.strip_prefix(prefix.as_str()))
            .and_then(|name| definitions.get(name));
        definition
            .unwrap_or(params.as_value())
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|required| !required.is_empty())
    };
    let message = |method: &MethodSchema, with_id: bool| {
        let needs_params = needs_fields(&method.params);
        let params = if needs_params {
            method.params.clone().to_value()
        } else {
            serde_json::json!({"anyOf": [method.params, {"type": "null"}]})
        };
        let mut properties = serde_json::json!({
            "jsonrpc": jsonrpc,
            "method": {"const": method.method},
            "params": params,
        });
        let mut required = vec!["method"];
        if needs_params {
            required.push("params");
        }
        if with_id {
            properties["id"] = id.clone().to_value();
            required.insert(0, "id");
        }
        serde_json::json!({
            "title": method.method,
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false
        })
    };
    let answered =
        |m: &&MethodSchema| matches!(m.kind, MethodKind::Request | MethodKind::ServerRequest);
    let requests: Vec<Value> = methods
        .iter()
        .filter(answered)
        .map(|m| message(m, true))
        .collect();
    let notifications: Vec<Value> = methods
        .iter()
        .filter(|m| !answered(m))
        .map(|m| message(m, false))
        .collect();
    let results: Map<String, Value> = methods
        .iter()
        .filter_map(|m| Some((m.method.to_owned(), m.result.clone()?.to_value())))
        .collect();
    json_schema!({
        "title": "execward JSON-RPC message",
        "description": "One message (one websocket frame) of the execward protocol: see docs/protocol.md. Params absent or null are read as {} (so they may be left out only where no field is required); params fields a method does not know are ignored (the sandbox object is strict).",
        "oneOf": [
            {"title": "request", "oneOf": requests},
            {"title": "notification", "oneOf": notifications},
            {
                "title": "response",
                "type": "object",
                "properties": {"jsonrpc": jsonrpc, "id": id, "result": true},
                "required": ["id", "result"],
                "additionalProperties": false
            },
            {
                "title": "error response",
                "type": "object",
                "properties": {"jsonrpc": jsonrpc, "id": id, "error": error},
                "required": ["id", "error"],
                "additionalProperties": false
            }
        ],
        "x-results": results
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::call::Call;

    /// The schema's table of client requests is the server's: every method `Call::parse`
    /// accepts has a request schema, and every request schema but `initialize` (answered before
    /// a session exists) is a `Call`. A method added to one and not the other fails here.
    #[test]
    fn the_request_schemas_are_exactly_the_calls_and_initialize() {
        let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        let mut requests: Vec<&str> = methods(&mut generator)
            .iter()
            .filter(|method| method.kind == MethodKind::Request)
            .map(|method| method.method)
            .collect();
        let mut expected: Vec<&str> = Call::METHODS.to_vec();
        expected.push(crate::methods::INITIALIZE);
        requests.sort_unstable();
        expected.sort_unstable();
        assert_eq!(requests, expected);
    }
}
