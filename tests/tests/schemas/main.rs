//! The JSON Schemas of `docs/schema/`, generated from the Rust types (schemars, the crates'
//! `schema` feature), and what they accept.
//!
//! - The checked-in files are what the types generate. Regenerate with
//!   `UPDATE_GOLDEN=1 cargo test -p execward-tests --test schemas` (as the sandbox's golden files).
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

mod messages;
mod policies;
mod server;

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
    let regenerate = "regenerate with UPDATE_GOLDEN=1 cargo test -p execward-tests --test schemas";
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
