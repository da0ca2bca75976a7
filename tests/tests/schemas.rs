//! The JSON Schemas of `docs/schema/`, generated from the Rust types (schemars, the crates'
//! `schema` feature), and what they accept.
//!
//! - The checked-in files are what the types generate. Regenerate with
//!   `UPDATE_GOLDEN=1 cargo test -p tests --test schemas` (as the sandbox's golden files).
//! - `protocol.json`: every message of the golden transcript (`golden/example_session.jsonl`)
//!   validates, and each response's `result` validates against its request's result schema;
//!   a mutated copy of each message (a field of the wrong type, a member the envelope does not
//!   take, a missing required field) is refused.
//! - `sandbox.json` is checked against the deserializer itself (`SandboxSpec::try_from`): on a
//!   corpus of every shape and spelling and of mutated copies, the schema accepts exactly what
//!   the deserializer accepts. `profile.json` likewise against `ProfileFile::parse`, on every
//!   profile in `policies/`, the READMEs' examples and mutated copies.
//! - `rendezvous.json`: the credentials file example of docs/remote.md validates; mutated
//!   copies do not.
//! - The real server's answers to every method (results, errors, notifications) validate
//!   against the checked-in `protocol.json`.
//!
//! Validation is Python's `jsonschema` (Draft 2020-12), as the SARIF tests already use it; one
//! `python3` process checks every case (`tests::json_schema_verdicts`). The transcript replay
//! (`transcript.rs`) also validates the real server's messages against the checked-in
//! `protocol.json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12().into_generator()
}

/// Every schema of `docs/schema/`, by file name.
fn generate() -> BTreeMap<&'static str, Value> {
    let mut schemas = BTreeMap::new();

    let mut protocol_generator = generator();
    protocol_generator.subschema_for::<sandbox::policy::SandboxSpec>();
    let mut protocol = proto::schema::protocol(&mut protocol_generator);
    let meta = protocol_generator.settings().meta_schema.clone();
    let definitions = protocol_generator.take_definitions(true);
    protocol.insert("$schema".to_owned(), json!(meta));
    protocol.insert("$defs".to_owned(), Value::Object(definitions));
    schemas.insert("protocol.json", protocol.to_value());

    let sandbox = generator().root_schema_for::<sandbox::policy::SandboxSpec>();
    schemas.insert("sandbox.json", sandbox.to_value());
    let profile = generator().root_schema_for::<sandbox::policy::ProfileFile>();
    schemas.insert("profile.json", profile.to_value());
    let rendezvous = supervisor::rendezvous_credentials_schema(&mut generator());
    schemas.insert("rendezvous.json", rendezvous.to_value());
    schemas
}

fn render(schema: &Value) -> String {
    serde_json::to_string_pretty(schema).unwrap() + "\n"
}

#[test]
fn checked_in_schemas_are_what_the_types_generate() {
    let dir = repo().join("docs/schema");
    let schemas = generate();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, schema) in &schemas {
            std::fs::write(dir.join(name), render(schema)).unwrap();
        }
    }
    let regenerate = "regenerate with UPDATE_GOLDEN=1 cargo test -p tests --test schemas";
    for (name, schema) in &schemas {
        let path = dir.join(name);
        let checked_in = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}; {regenerate}", path.display()));
        assert!(
            checked_in == render(schema),
            "{} differs from the schema the types generate; {regenerate}",
            path.display()
        );
    }
    let mut listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    listed.sort();
    let generated: Vec<String> = schemas.keys().map(|name| (*name).to_owned()).collect();
    assert_eq!(
        listed, generated,
        "docs/schema/ holds a schema nothing generates"
    );
}

/// One instance to validate against one schema.
struct Case {
    label: String,
    schema: String,
    instance: Value,
}

/// Checks each case's verdict against `expected(case index)`; reports every mismatch at once.
fn assert_verdicts(
    schemas: &BTreeMap<String, Value>,
    cases: &[Case],
    expected: &[bool],
) -> Vec<(bool, String)> {
    let pairs: Vec<(String, Value)> = cases
        .iter()
        .map(|case| (case.schema.clone(), case.instance.clone()))
        .collect();
    let verdicts = tests::json_schema_verdicts(schemas, &pairs);
    let wrong: Vec<String> = cases
        .iter()
        .zip(&verdicts)
        .zip(expected)
        .filter(|((_, (valid, _)), expected)| valid != *expected)
        .map(|((case, (valid, error)), _)| {
            format!(
                "{}: schema says {} (expected {}) {error}\n  {}",
                case.label,
                if *valid { "valid" } else { "invalid" },
                if *valid { "invalid" } else { "valid" },
                case.instance
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    verdicts
}

/// The golden transcript's messages, placeholders replaced by values of their kind.
fn golden_messages() -> Vec<Value> {
    fn fill(value: &mut Value, seq: &mut u64) {
        match value {
            Value::String(text) if text == "<uuid>" => {
                *value = json!("3f1c2a8e-5b7d-4c9e-8a6f-0d2b4e6c8a1f");
            }
            Value::String(text) if text == "<seq>" => {
                *seq += 1;
                *value = json!(*seq);
            }
            Value::String(text) if text == "<int>" => *value = json!(15),
            Value::String(text) if text == "<usage>" => {
                *value = json!({"cpuMillis": 3, "wallMillis": 40, "peakMemoryBytes": 1048576});
            }
            Value::Array(items) => items.iter_mut().for_each(|item| fill(item, seq)),
            Value::Object(members) => members.values_mut().for_each(|item| fill(item, seq)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(repo().join("tests/golden/example_session.jsonl")).unwrap();
    let mut seq = 0;
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let mut line: Value = serde_json::from_str(line).unwrap();
            let key = if line.get("send").is_some() {
                "send"
            } else {
                "expect"
            };
            let mut message = line[key].take();
            fill(&mut message, &mut seq);
            message
        })
        .collect()
}

/// A value of another JSON type than `value`, one no field of that type also takes.
fn wrong_type(value: &Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::String(_) => Some(json!([])),
        _ => Some(json!("not the right type")),
    }
}

#[test]
fn the_golden_transcript_validates_and_mutated_messages_do_not() {
    let generated = generate();
    let protocol = generated["protocol.json"].clone();
    let mut schemas = BTreeMap::from([("protocol".to_owned(), protocol.clone())]);
    let mut cases = Vec::new();
    let mut expected = Vec::new();
    let mut case = |label: String, schema: &str, instance: Value, valid: bool| {
        cases.push(Case {
            label,
            schema: schema.to_owned(),
            instance,
        });
        expected.push(valid);
    };

    let messages = golden_messages();
    let mut methods_by_id: BTreeMap<String, String> = BTreeMap::new();
    let mut results_checked = 0;
    for (line, message) in messages.iter().enumerate() {
        let line = line + 1;
        case(
            format!("golden line {line}"),
            "protocol",
            message.clone(),
            true,
        );
        // The envelope takes no other member.
        let mut extra = message.clone();
        extra["unexpected"] = json!(1);
        case(format!("line {line} + a member"), "protocol", extra, false);
        if let (Some(id), Some(method)) = (message.get("id"), message.get("method")) {
            methods_by_id.insert(id.to_string(), method.as_str().unwrap().to_owned());
        }
        // Each params field of the wrong type; a request or notification without its method.
        if let Some(params) = message.get("params").and_then(Value::as_object) {
            for (field, value) in params {
                if let Some(wrong) = wrong_type(value) {
                    let mut mutated = message.clone();
                    mutated["params"][field] = wrong;
                    case(
                        format!("line {line} params.{field} of the wrong type"),
                        "protocol",
                        mutated,
                        false,
                    );
                }
            }
            for required in ["processId", "clientName", "argv", "cwd", "chunk", "seq"] {
                if params.contains_key(required) {
                    let mut mutated = message.clone();
                    mutated["params"].as_object_mut().unwrap().remove(required);
                    case(
                        format!("line {line} without params.{required}"),
                        "protocol",
                        mutated,
                        false,
                    );
                }
            }
            // Params fields a method does not know are ignored by the server: so by the schema.
            let mut newer = message.clone();
            newer["params"]["fromANewerClient"] = json!({"x": 1});
            case(
                format!("line {line} + an unknown params field"),
                "protocol",
                newer,
                true,
            );
            let mut anonymous = message.clone();
            anonymous.as_object_mut().unwrap().remove("method");
            case(
                format!("line {line} without method"),
                "protocol",
                anonymous,
                false,
            );
        }
        // A response's result against the result schema of the method it answers.
        if let (Some(id), Some(result)) = (message.get("id"), message.get("result")) {
            let method = &methods_by_id[&id.to_string()];
            let name = format!("result of {method}");
            schemas.insert(name.clone(), tests::result_schema(&protocol, method));
            case(format!("line {line} {name}"), &name, result.clone(), true);
            results_checked += 1;
            for (field, value) in result.as_object().unwrap() {
                let mut mutated = result.clone();
                mutated[field] = wrong_type(value).unwrap();
                case(
                    format!("line {line} {name}.{field} of the wrong type"),
                    &name,
                    mutated,
                    false,
                );
                let mut missing = result.clone();
                missing.as_object_mut().unwrap().remove(field);
                case(
                    format!("line {line} {name} without {field}"),
                    &name,
                    missing,
                    false,
                );
            }
        }
    }
    assert_eq!(results_checked, 4, "the transcript has four responses");

    // Beyond the transcript: a sandbox object resolves inside protocol.json (and a wrong one
    // is refused there), limits deny unknown fields, and errors carry a known data.kind.
    let start = json!({"id": 9, "method": "process/start", "params": {
        "processId": "p", "argv": ["true"], "cwd": "/tmp",
        "sandbox": {"profile": "workspace-write", "cwd": "file:///tmp"},
        "limits": {"memoryBytes": 1048576}}});
    case(
        "start with sandbox and limits".into(),
        "protocol",
        start.clone(),
        true,
    );
    let mut bad_sandbox = start.clone();
    bad_sandbox["params"]["sandbox"] = json!({"profile": "workspace-write", "bogus": 1});
    case(
        "start with an unknown sandbox key".into(),
        "protocol",
        bad_sandbox,
        false,
    );
    let mut bad_limits = start.clone();
    bad_limits["params"]["limits"] = json!({"memoryBytes": 1048576, "bogus": 1});
    case(
        "start with an unknown limit".into(),
        "protocol",
        bad_limits,
        false,
    );
    let mut relative = start;
    relative["params"]["cwd"] = json!("tmp");
    case(
        "start with a relative cwd".into(),
        "protocol",
        relative,
        false,
    );
    let error = json!({"id": 3, "error": {"code": -32600, "message": "denied",
        "data": {"kind": "sandboxDenied", "path": "file:///etc/x", "operation": "fs/writeFile"}}});
    case("an error response".into(), "protocol", error.clone(), true);
    let mut unknown_kind = error;
    unknown_kind["error"]["data"]["kind"] = json!("noSuchKind");
    case(
        "an error of an unknown kind".into(),
        "protocol",
        unknown_kind,
        false,
    );
    // Absent or null params read as {}: allowed where the params type requires no field, as
    // parse_params decides.
    use proto::methods::{Empty, parse_params, process::TerminateParams};
    for params in [None, Some(Value::Null)] {
        let mut info = json!({"id": 5, "method": "environment/info"});
        let mut terminate = json!({"id": 6, "method": "process/terminate"});
        let mut initialized = json!({"method": "initialized"});
        if let Some(params) = &params {
            for message in [&mut info, &mut terminate, &mut initialized] {
                message["params"] = params.clone();
            }
        }
        let info_ok = parse_params::<Empty>("environment/info", params.clone()).is_ok();
        let terminate_ok =
            parse_params::<TerminateParams>("process/terminate", params.clone()).is_ok();
        assert!(info_ok && !terminate_ok);
        case(
            format!("environment/info, params {params:?}"),
            "protocol",
            info,
            info_ok,
        );
        case(
            format!("initialized, params {params:?}"),
            "protocol",
            initialized,
            info_ok,
        );
        case(
            format!("process/terminate, params {params:?}"),
            "protocol",
            terminate,
            terminate_ok,
        );
    }
    case(
        "an unknown method".into(),
        "protocol",
        json!({"id": 1, "method": "process/teleport", "params": {}}),
        false,
    );

    assert_verdicts(&schemas, &cases, &expected);
}

/// Wire `sandbox` objects: every source, spelling and common key, and mutated copies.
fn sandbox_corpus() -> Vec<Value> {
    let entries = json!([
        {"path": {"type": "path", "path": "/ws"}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
        {"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "none"},
        {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "src"}}, "access": "write"},
        {"path": {"type": "special", "value": {"kind": "a_newer_special"}}, "access": "read"},
        {"path": {"type": "special", "value": {"kind": "tmpdir"}}, "access": "deny"}
    ]);
    vec![
        // Named profiles, both spellings of the knobs, every common key.
        json!({"profile": "workspace-write", "cwd": "file:///ws"}),
        json!({"profile": "read-only", "writable_roots": ["/x"], "network_access": true,
               "exclude_slash_tmp": true, "exclude_tmpdir_env_var": false}),
        json!({"profile": "workspace-write", "writableRoots": ["/x"], "networkAccess": false,
               "excludeSlashTmp": true, "excludeTmpdirEnvVar": true, "cwd": "/ws",
               "workspaceRoots": ["file:///ws", "/ws2"],
               "network": {"allow": ["pypi.org", {"pattern": "github.com", "tunnel": "any"}], "deny": []},
               "readableCredentialStores": ["~/.aws"], "allowances": ["toolchain-caches"],
               "denyPaths": ["/ws/secrets"], "allowUnixSockets": ["/run/agent.sock"]}),
        json!({"profile": "read-only", "network": "on", "cwd": null, "workspaceRoots": null,
               "windowsSandboxLevel": "elevated", "useLegacyLandlock": true}),
        json!({"profile": "read-only", "network": true}),
        json!({"profile": "read-only", "network": "restricted"}),
        // The legacy policy, flattened, both spellings of types and fields.
        json!({"type": "read-only"}),
        json!({"type": "readOnly", "networkAccess": true, "cwd": "/ws"}),
        json!({"type": "workspace-write", "writable_roots": ["/x"], "network_access": true,
               "exclude_slash_tmp": true, "cwd": "file:///ws", "denyPaths": ["/ws/.env"]}),
        json!({"type": "workspaceWrite", "writableRoots": ["/x"], "excludeTmpdirEnvVar": true}),
        json!({"type": "danger-full-access"}),
        json!({"type": "dangerFullAccess"}),
        json!({"type": "external-sandbox", "network_access": "enabled"}),
        json!({"type": "externalSandbox"}),
        // Nested, as older reference clients send it.
        json!({"sandboxPolicy": {"type": "workspace-write"}, "sandboxPolicyCwd": "file:///ws"}),
        json!({"sandboxPolicy": {"type": "readOnly"}, "cwd": "/ws"}),
        // The permission profile, tagged and untagged.
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": entries, "glob_scan_max_depth": 3}, "network": "enabled"},
               "cwd": "file:///ws", "writableRoots": ["/tmp/x"]}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "unrestricted"}}}),
        json!({"permissions": {"type": "disabled"}}),
        json!({"permissions": {"type": "external", "network": "restricted"}}),
        json!({"permissions": {"network": {"enabled": true}, "file_system": {"entries": [
               {"path": {"type": "path", "path": "/ws"}, "access": "read"}]}}, "cwd": "/ws"}),
        json!({"permissions": {}}),
        // A profile file's text.
        json!({"profileToml": "network = \"on\"\n[filesystem]\n\":root\" = \"read\"\n",
               "cwd": "/ws", "writableRoots": ["/x"]}),
        // Refused: wrong types.
        json!("workspace-write"),
        json!({"profile": 3}),
        json!({"profile": "read-only", "cwd": 3}),
        json!({"profile": "read-only", "cwd": "relative/dir"}),
        json!({"type": "read-only", "networkAccess": "yes"}),
        json!({"profile": "read-only", "workspaceRoots": "file:///ws"}),
        json!({"profile": "read-only", "denyPaths": [3]}),
        json!({"profile": "read-only", "network": "sometimes"}),
        json!({"profile": "read-only", "network": {"allow": "pypi.org"}}),
        json!({"profileToml": 3}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws"}, "access": "execute"}]}}}),
        json!({"permissions": {"network": {"enabled": "yes"}}}),
        // Refused: unknown keys where the deserializer denies them.
        json!({"profile": "read-only", "bogus": 1}),
        json!({"type": "read-only", "writableRoots": ["/x"]}),
        json!({"type": "no-such-type"}),
        json!({"permissions": {"type": "disabled"}, "profile": "read-only"}),
        json!({"sandboxPolicy": {"type": "read-only"}, "writableRoots": ["/x"]}),
        json!({"sandboxPolicy": {"type": "read-only", "bogus": true}}),
        json!({"permissions": {"network": {"enabled": true}, "bogus": 1}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws", "extra": 1}, "access": "read"}]}}}),
        json!({"profileToml": "", "type": "read-only"}),
        json!({"profile": "read-only", "network": {"allow": [], "bogus": []}}),
        // Refused: both spellings of one field.
        json!({"profile": "read-only", "writableRoots": [], "writable_roots": []}),
        json!({"type": "read-only", "networkAccess": true, "network_access": true}),
        // Refused: missing required fields.
        json!({}),
        json!({"cwd": "/ws"}),
        json!({"permissions": {"type": "managed"}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted"}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "path", "path": "/ws"}}]}}}),
        json!({"permissions": {"type": "managed", "file_system": {"type": "restricted",
               "entries": [{"path": {"type": "special", "value": {}}, "access": "read"}]}}}),
        json!({"profile": "read-only", "network": {"allow": [{"tunnel": "any"}]}}),
    ]
}

#[test]
fn the_sandbox_schema_accepts_exactly_what_the_deserializer_accepts() {
    let generated = generate();
    let schemas = BTreeMap::from([("sandbox".to_owned(), generated["sandbox.json"].clone())]);
    let corpus = sandbox_corpus();
    let expected: Vec<bool> = corpus
        .iter()
        .map(|value| sandbox::policy::SandboxSpec::try_from(value.clone()).is_ok())
        .collect();
    let accepted = expected.iter().filter(|ok| **ok).count();
    assert!(
        accepted >= 20 && corpus.len() - accepted >= 30,
        "the corpus must hold accepted and refused objects ({accepted} of {} accepted)",
        corpus.len()
    );
    let cases: Vec<Case> = corpus
        .into_iter()
        .enumerate()
        .map(|(i, instance)| Case {
            label: format!(
                "sandbox #{i} (deserializer: {})",
                if expected[i] { "accepts" } else { "refuses" }
            ),
            schema: "sandbox".into(),
            instance,
        })
        .collect();
    assert_verdicts(&schemas, &cases, &expected);
}

fn toml_to_json(text: &str) -> Value {
    toml::from_str(text).unwrap_or_else(|e| panic!("not TOML: {e}\n{text}"))
}

#[test]
fn every_profile_in_policies_validates_and_mutated_ones_are_refused() {
    let generated = generate();
    let schemas = BTreeMap::from([("profile".to_owned(), generated["profile.json"].clone())]);
    let mut texts: Vec<(String, String)> = Vec::new();
    let dir = repo().join("policies");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The deny set of credential stores is a data file of another format (`[[store]]`),
        // read by sandbox::policy::credentials; every other top-level .toml is a profile.
        if !name.ends_with(".toml") || name == "credential-stores.toml" {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).unwrap();
        texts.push((name.clone(), text.clone()));
        for (what, line) in [
            ("wrong type", "description = 1"),
            ("wrong type", "network = 3"),
            ("wrong type", "protected_subpaths = \".git\""),
            ("unknown field", "bogus = true"),
            ("unknown mode", "network = \"sometimes\""),
            (
                "both spellings",
                "allow_unix_sockets = []\nallowUnixSockets = []",
            ),
            (
                "missing pattern",
                "network = { allow = [{ tunnel = \"any\" }] }",
            ),
            ("unknown allow key", "network = { allow = [], bogus = [] }"),
            ("alias", "allowUnixSockets = [\"/run/agent.sock\"]"),
            (
                "allowlist",
                "network = { allow = [\"pypi.org\", { pattern = \"github.com\", tunnel = \"any\" }] }",
            ),
            ("mode", "network = \"enabled\""),
        ] {
            // Top-level keys go before the first table; drop a key the line sets again.
            let key = line.split([' ', '=']).next().unwrap();
            let kept: String = text
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} ")))
                .map(|l| format!("{l}\n"))
                .collect();
            texts.push((
                format!("{name} with {what}: {line}"),
                format!("{line}\n{kept}"),
            ));
        }
        if text.contains("[filesystem]") {
            texts.push((
                format!("{name} with an access of the wrong kind"),
                text.replace("\"read\"", "\"rwx\""),
            ));
            texts.push((
                format!("{name} with full access and entries"),
                format!("full_filesystem_access = true\n{text}"),
            ));
            // [filesystem] is the last table: entries appended land in it.
            for key in [
                ":rooot",
                "relative/dir",
                ":cwd/sub",
                "",
                "**/*.pem",
                "[ab]*.key",
                ":project_roots/build",
                ":workspace_roots",
                ":current_working_directory",
                "/var/cache/ccache",
            ] {
                texts.push((
                    format!("{name} with entry {key:?}"),
                    format!("{text}\n\"{key}\" = \"write\"\n"),
                ));
            }
        }
    }
    assert!(files >= 3, "policies/ holds the built-in profiles");
    // The profile examples of the READMEs (every ```toml block with a [filesystem] table).
    for doc in ["README.md", "policies/README.md"] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let examples: Vec<&str> = text
            .split("```toml\n")
            .skip(1)
            .map(|block| block.split("```").next().unwrap())
            .filter(|block| block.contains("[filesystem]"))
            .collect();
        assert!(!examples.is_empty(), "{doc} shows a profile");
        texts.extend(
            examples
                .into_iter()
                .map(|example| (format!("the example of {doc}"), example.to_owned())),
        );
    }
    let expected: Vec<bool> = texts
        .iter()
        .map(|(_, text)| sandbox::policy::ProfileFile::parse(text, "test").is_ok())
        .collect();
    let accepted = expected.iter().filter(|ok| **ok).count();
    assert!(accepted >= files * 4 && texts.len() - accepted >= files * 8);
    let cases: Vec<Case> = texts
        .iter()
        .map(|(label, text)| Case {
            label: label.clone(),
            schema: "profile".into(),
            instance: toml_to_json(text),
        })
        .collect();
    let verdicts = assert_verdicts(&schemas, &cases, &expected);
    // Every profile file as shipped, and every example, validates (not only agrees with the
    // parser).
    for ((label, _), (valid, error)) in texts.iter().zip(&verdicts) {
        if !label.contains(" with ") {
            assert!(valid, "{label}: {error}");
        }
    }
}

#[test]
fn the_documented_rendezvous_toml_validates_and_mutated_copies_do_not() {
    let generated = generate();
    let schemas = BTreeMap::from([(
        "rendezvous".to_owned(),
        generated["rendezvous.json"].clone(),
    )]);
    let doc = std::fs::read_to_string(repo().join("docs/remote.md")).unwrap();
    let example = doc
        .split("```toml\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap())
        .find(|block| block.contains("[[executor]]"))
        .expect("docs/remote.md shows a rendezvous.toml in a ```toml block");
    assert!(
        ["[[harness]]", "[[admin]]", "[[environment]]"]
            .iter()
            .all(|table| example.contains(table)),
        "the example shows every table"
    );
    let mut cases = vec![("docs/remote.md".to_owned(), toml_to_json(example), true)];
    for (what, from, to) in [
        ("token of the wrong type", "token = \"", "token = 7 # \""),
        (
            "environments of the wrong type",
            "environments = [",
            "environments = 1 # [",
        ),
        ("unknown table", "[[admin]]", "[[auditor]]"),
        ("unknown key", "[[admin]]\n", "[[admin]]\nrole = \"all\"\n"),
        (
            "executor without environments",
            "environments = [",
            "# environments = [",
        ),
        ("pin without public_key", "public_key =", "# public_key ="),
    ] {
        assert!(example.contains(from), "the example has {from:?}");
        cases.push((
            format!("docs/remote.md with {what}"),
            toml_to_json(&example.replacen(from, to, 1)),
            false,
        ));
    }
    let expected: Vec<bool> = cases.iter().map(|(_, _, ok)| *ok).collect();
    let cases: Vec<Case> = cases
        .into_iter()
        .map(|(label, instance, _)| Case {
            label,
            schema: "rendezvous".into(),
            instance,
        })
        .collect();
    assert_verdicts(&schemas, &cases, &expected);
}

/// Sends `method` with `params` (recorded in `sent`) and waits for its response.
async fn exchange(
    client: &mut tests::Client,
    sent: &mut Vec<Value>,
    id: &mut i64,
    method: &str,
    params: Value,
) -> Value {
    *id += 1;
    let message = json!({"id": *id, "method": method, "params": params});
    client.send_json(&message).await;
    sent.push(message);
    client
        .raw_response_within(&json!(*id), tests::DEADLINE, method)
        .await
}

#[tokio::test]
async fn the_real_server_s_answers_to_every_method_match_protocol_json() {
    use tests::{b64, file_uri};
    let server = tests::ExecServer::start(&["--listen", "ws://127.0.0.1:0"]);
    let mut client = tests::Client::connect(server.url()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (file, copy, sub) = (
        file_uri(dir.path().join("a.txt")),
        file_uri(dir.path().join("b.txt")),
        file_uri(dir.path().join("sub")),
    );
    let root = file_uri(dir.path());
    let (mut sent, mut id) = (Vec::new(), 0);
    let mut answers = BTreeMap::new();
    let initialize = json!({"clientName": "schemas"});
    let answer = exchange(&mut client, &mut sent, &mut id, "initialize", initialize).await;
    answers.insert(id, answer);
    let initialized = json!({"method": "initialized", "params": {}});
    client.send_json(&initialized).await;
    sent.push(initialized);
    let calls = [
        ("environment/info", json!(null)),
        (
            "fs/writeFile",
            json!({"path": file, "dataBase64": b64("hello\n")}),
        ),
        ("fs/readFile", json!({"path": file})),
        ("fs/getMetadata", json!({"path": file})),
        ("fs/canonicalize", json!({"path": file})),
        ("fs/createDirectory", json!({"path": sub})),
        ("fs/readDirectory", json!({"path": root})),
        ("fs/walk", json!({"path": root, "maxDepth": 2})),
        (
            "fs/copy",
            json!({"sourcePath": file, "destinationPath": copy}),
        ),
        ("fs/open", json!({"handleId": "h", "path": file})),
        (
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 3}),
        ),
        ("fs/close", json!({"handleId": "h"})),
        ("fs/remove", json!({"path": copy})),
        ("fs/readFile", json!({"path": copy})),
        (
            "fs/writeFile",
            json!({"path": copy, "dataBase64": "", "sandbox": {"profile": "read-only"}}),
        ),
        (
            "process/start",
            json!({"processId": "p", "argv": ["sh", "-c", "echo out; echo err >&2; exit 3"],
                   "cwd": root, "limits": {"processes": 16}}),
        ),
    ];
    for (method, params) in calls {
        let answer = exchange(&mut client, &mut sent, &mut id, method, params).await;
        answers.insert(id, answer);
    }
    client
        .wait_for_notification("process/closed", tests::DEADLINE, |n| {
            n["method"] == "process/closed" && n["params"]["processId"] == "p"
        })
        .await;
    for (method, params) in [
        ("process/read", json!({"processId": "p"})),
        ("process/list", json!({})),
        ("process/write", json!({"processId": "gone", "chunk": ""})),
        ("process/terminate", json!({"processId": "p"})),
        (
            "process/signal",
            json!({"processId": "p", "signal": "kill"}),
        ),
        (
            "process/resize",
            json!({"processId": "p", "cols": 80, "rows": 24}),
        ),
        ("process/teleport", json!({})),
    ] {
        let answer = exchange(&mut client, &mut sent, &mut id, method, params).await;
        answers.insert(id, answer);
    }
    // The exchange covered results and errors alike: a missing file, a sandbox denial and an
    // unknown method answer with errors, the rest with results.
    let errors: Vec<i64> = answers
        .iter()
        .filter(|(_, answer)| answer.get("error").is_some())
        .map(|(id, _)| *id)
        .collect();
    assert!(
        errors.contains(&15) && errors.contains(&16) && errors.contains(&id),
        "{answers:?}"
    );
    assert!(answers.len() - errors.len() >= 18, "{answers:?}");
    // The unknown method's request is no protocol message (its error answer is).
    assert_eq!(sent.pop().unwrap()["method"], "process/teleport");
    let received = client.log.clone();
    assert!(
        received.iter().any(|m| m["method"] == "process/output")
            && received.iter().any(|m| m["method"] == "process/exited"),
        "{received:?}"
    );
    let mut messages = sent;
    messages.extend(received);
    tests::assert_messages_match_protocol(&tests::protocol_schema(), &messages);
}
