//! Golden transcripts: JSONL files of `{"send": message}` and `{"expect": message}` lines,
//! replayed against the real server.
//!
//! Each `send` starts a step; the `expect` lines after it are what that step must produce.
//! Volatile values are normalised before comparing:
//! - `"<uuid>"` matches a UUIDv4 string, `"<int>"` any integer, `"<seq>"` any integer (seqs are
//!   checked separately: per process they run 1, 2, 3, ... across the whole transcript),
//!   `"<usage>"` a `usage` object (resource use at exit).
//! - Output chunk boundaries are not part of the protocol: within a step, all `process/output`
//!   of one process and stream are merged into one message (the first one's seq) before
//!   comparing, and the step waits until the merged output is as long as expected.
//! - Within a step, responses come first (by id), then merged output, then other
//!   notifications in arrival order: the order between a response and a notification sent by
//!   concurrent tasks is not part of the protocol either.
//!
//! `golden/example_session.jsonl` is the seeds' "Example session" adapted to this server's protocol
//! (docs/protocol.md): `initialize` returns `{sessionId}`, a tty process's stream is `pty` (so `\n`
//! arrives as `\r\n` and the terminal echoes the written line), `closed` carries `seq`, and the
//! exit status of the terminated shell is normalised. `bash -lc` became `bash --noprofile --norc
//! -c` so that the host's login files cannot add output.
//!
//! Every message of the replay, sent and received as on the wire (before normalising), validates
//! against the checked-in `docs/schema/protocol.json`, each response's result against its
//! request's result schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tests::{Client, DEADLINE, ExecServer, b64, unb64};

#[derive(Debug, Default)]
struct Step {
    send: Value,
    expect: Vec<Value>,
}

fn load(name: &str) -> Vec<Step> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut steps: Vec<Step> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), number + 1));
        if let Some(send) = value.get("send") {
            steps.push(Step {
                send: send.clone(),
                expect: Vec::new(),
            });
        } else if let Some(expect) = value.get("expect") {
            steps
                .last_mut()
                .unwrap_or_else(|| panic!("{}: expect before any send", path.display()))
                .expect
                .push(expect.clone());
        } else {
            panic!("{}:{}: neither send nor expect", path.display(), number + 1);
        }
    }
    steps
}

fn is_uuid_v4(text: &str) -> bool {
    let b = text.as_bytes();
    text.len() == 36
        && text.char_indices().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
        && b[14] == b'4'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// Replace values in `actual` by the placeholder in `expected` when they fit it.
fn normalise(actual: &Value, expected: &Value) -> Value {
    match (actual, expected) {
        (Value::String(s), Value::String(p)) if p == "<uuid>" && is_uuid_v4(s) => expected.clone(),
        (Value::Number(n), Value::String(p)) if (p == "<int>" || p == "<seq>") && n.is_i64() => {
            expected.clone()
        }
        // Resource use: its CPU and wall milliseconds, and which memory figures the host can
        // give, vary; its shape is checked by the process tests.
        (Value::Object(usage), Value::String(p))
            if p == "<usage>" && usage.get("cpuMillis").is_some_and(Value::is_u64) =>
        {
            expected.clone()
        }
        (Value::Object(a), Value::Object(e)) => Value::Object(
            a.iter()
                .map(|(k, v)| (k.clone(), e.get(k).map_or(v.clone(), |ev| normalise(v, ev))))
                .collect(),
        ),
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            Value::Array(a.iter().zip(e).map(|(a, e)| normalise(a, e)).collect())
        }
        _ => actual.clone(),
    }
}

/// `(processId, stream)` of an output notification.
type OutputKey = (String, String);

fn output_key(message: &Value) -> Option<OutputKey> {
    (message["method"] == "process/output").then(|| {
        (
            message["params"]["processId"].as_str().unwrap().to_owned(),
            message["params"]["stream"].as_str().unwrap().to_owned(),
        )
    })
}

/// Responses by id, then merged output per (process, stream), then other notifications.
fn canonical(messages: &[Value]) -> Vec<Value> {
    let mut responses: Vec<Value> = messages
        .iter()
        .filter(|m| m.get("id").is_some())
        .cloned()
        .collect();
    responses.sort_by_key(|m| m["id"].to_string());
    // (process, stream) -> first notification and the merged bytes, in first-arrival order.
    let mut outputs: Vec<(OutputKey, Value, Vec<u8>)> = Vec::new();
    let mut others = Vec::new();
    for m in messages.iter().filter(|m| m.get("id").is_none()) {
        match output_key(m) {
            Some(key) => {
                let bytes = unb64(m["params"]["chunk"].as_str().unwrap());
                match outputs.iter_mut().find(|(k, _, _)| *k == key) {
                    Some((_, _, merged)) => merged.extend(bytes),
                    None => outputs.push((key, m.clone(), bytes)),
                }
            }
            None => others.push(m.clone()),
        }
    }
    let merged = outputs.into_iter().map(|(_, mut first, bytes)| {
        first["params"]["chunk"] = json!(b64(bytes));
        first
    });
    responses.into_iter().chain(merged).chain(others).collect()
}

/// Whether `received` covers everything `expected` asks for.
fn step_complete(expected: &[Value], received: &[Value]) -> bool {
    let mut want_output: BTreeMap<OutputKey, usize> = BTreeMap::new();
    let mut have_output: BTreeMap<OutputKey, usize> = BTreeMap::new();
    for e in expected {
        if let Some(key) = output_key(e) {
            *want_output.entry(key).or_default() +=
                unb64(e["params"]["chunk"].as_str().unwrap()).len();
        }
    }
    for r in received {
        if let Some(key) = output_key(r) {
            *have_output.entry(key).or_default() +=
                unb64(r["params"]["chunk"].as_str().unwrap()).len();
        }
    }
    let outputs_done = want_output
        .iter()
        .all(|(k, n)| have_output.get(k).copied().unwrap_or(0) >= *n);
    let others_done = expected
        .iter()
        .filter(|e| output_key(e).is_none())
        .all(|e| {
            received.iter().any(|r| match e.get("id") {
                Some(id) => r.get("id") == Some(id),
                None => {
                    r.get("id").is_none()
                        && r["method"] == e["method"]
                        && r["params"]["processId"] == e["params"]["processId"]
                }
            })
        });
    outputs_done && others_done
}

async fn replay(name: &str) {
    let server = ExecServer::start(&["--listen", "ws://127.0.0.1:0"]);
    let mut client = Client::connect(server.url()).await.unwrap();
    let steps = load(name);
    let mut actual_transcript = Vec::new();
    let mut expected_transcript = Vec::new();
    let mut last_seq: BTreeMap<String, u64> = BTreeMap::new();
    // Every message sent and received, as on the wire, for the schema check.
    let mut wire = Vec::new();
    for step in &steps {
        client.send_json(&step.send).await;
        wire.push(step.send.clone());
        let mut received = Vec::new();
        while !step_complete(&step.expect, &received) {
            let message = client.next_message(DEADLINE).await.unwrap_or_else(|| {
                panic!(
                    "step {} did not complete within {DEADLINE:?}; expected {:?}, received {:?}",
                    step.send, step.expect, received
                )
            });
            if let Some(seq) = message["params"]["seq"].as_u64() {
                let process = message["params"]["processId"].as_str().unwrap().to_owned();
                let last = last_seq.entry(process).or_insert(0);
                assert_eq!(seq, *last + 1, "seq out of order: {message}");
                *last = seq;
            }
            received.push(message);
        }
        wire.extend(received.iter().cloned());
        let canonical_received = canonical(&received);
        let expected = canonical(&step.expect);
        actual_transcript.push(json!({"send": step.send}));
        expected_transcript.push(json!({"send": step.send}));
        for (i, message) in canonical_received.iter().enumerate() {
            let normalised = expected
                .get(i)
                .map_or(message.clone(), |e| normalise(message, e));
            actual_transcript.push(json!({"expect": normalised}));
        }
        expected_transcript.extend(expected.into_iter().map(|e| json!({"expect": e})));
    }
    let render = |lines: &[Value]| {
        lines
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(render(&actual_transcript), render(&expected_transcript));
    tests::assert_messages_match_protocol(&tests::protocol_schema(), &wire);
}

#[tokio::test]
async fn example_session_from_the_seeds_matches_the_golden_transcript() {
    replay("example_session.jsonl").await;
}
