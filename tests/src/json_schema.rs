//! JSON Schema validation for the tests, with Python's `jsonschema` (Draft 2020-12), which the
//! SARIF tests already need: one `python3` process checks every schema against the metaschema
//! and validates every instance.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Validates each `(schema name, instance)` against `schemas[name]`; returns each verdict with
/// the best-matching error's message (empty when valid). A schema may refer to another by
/// `urn:execward:NAME` (as [`result_schema`] does). Panics when python3 or its jsonschema
/// module is missing, or a schema is not a valid Draft 2020-12 schema.
pub fn json_schema_verdicts(
    schemas: &BTreeMap<String, Value>,
    cases: &[(String, Value)],
) -> Vec<(bool, String)> {
    let script = "import json, sys, jsonschema\n\
        from referencing import Registry\n\
        from referencing.jsonschema import DRAFT202012\n\
        job = json.load(sys.stdin)\n\
        registry = Registry().with_resources(\n\
        \x20   ('urn:execward:' + name, DRAFT202012.create_resource(schema))\n\
        \x20   for name, schema in job['schemas'].items())\n\
        validators = {}\n\
        for name, schema in job['schemas'].items():\n\
        \x20   jsonschema.Draft202012Validator.check_schema(schema)\n\
        \x20   validators[name] = jsonschema.Draft202012Validator(schema, registry=registry)\n\
        out = []\n\
        for name, instance in job['cases']:\n\
        \x20   error = jsonschema.exceptions.best_match(validators[name].iter_errors(instance))\n\
        \x20   out.append([error is None, '' if error is None else error.message[:300]])\n\
        json.dump(out, sys.stdout)\n";
    let job = json!({"schemas": schemas, "cases": cases});
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is needed to validate against JSON Schemas (pip install jsonschema)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "python3 jsonschema failed (pip install jsonschema):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdicts: Vec<(bool, String)> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(verdicts.len(), cases.len());
    verdicts
}

/// `docs/schema/protocol.json` as checked in.
pub fn protocol_schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema/protocol.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The schema of `method`'s result: a reference to `protocol`'s `x-results` entry, for a
/// [`json_schema_verdicts`] run that holds `protocol` under the name `"protocol"`.
pub fn result_schema(protocol: &Value, method: &str) -> Value {
    assert!(
        protocol["x-results"][method].is_object(),
        "protocol.json has no x-results entry for {method}"
    );
    let pointer = method.replace('~', "~0").replace('/', "~1");
    json!({"$ref": format!("urn:execward:protocol#/x-results/{pointer}")})
}

/// Asserts every message validates against `protocol` (`docs/schema/protocol.json`), and every
/// response's result against the result schema of the request with its id among `messages`.
#[track_caller]
pub fn assert_messages_match_protocol(protocol: &Value, messages: &[Value]) {
    let mut schemas = BTreeMap::from([("protocol".to_owned(), protocol.clone())]);
    let mut methods_by_id = BTreeMap::new();
    let mut cases = Vec::new();
    for message in messages {
        cases.push(("protocol".to_owned(), message.clone()));
        if let (Some(id), Some(method)) = (message.get("id"), message["method"].as_str()) {
            methods_by_id.insert(id.to_string(), method.to_owned());
        }
    }
    for message in messages {
        if let (Some(id), Some(result)) = (message.get("id"), message.get("result")) {
            let method = methods_by_id
                .get(&id.to_string())
                .unwrap_or_else(|| panic!("no request with the id of {message}"));
            let name = format!("result of {method}");
            schemas.insert(name.clone(), result_schema(protocol, method));
            cases.push((name, result.clone()));
        }
    }
    let verdicts = json_schema_verdicts(&schemas, &cases);
    let invalid: Vec<String> = cases
        .iter()
        .zip(&verdicts)
        .filter(|(_, (valid, _))| !valid)
        .map(|((schema, instance), (_, error))| format!("{schema}: {error}\n  {instance}"))
        .collect();
    assert!(
        invalid.is_empty(),
        "{} of {} messages do not match docs/schema/protocol.json:\n{}",
        invalid.len(),
        cases.len(),
        invalid.join("\n")
    );
}
