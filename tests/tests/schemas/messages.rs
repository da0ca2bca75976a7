//! The golden transcript's messages validate against the schemas and mutated ones do not.

use super::*;

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
