//! The real server's answers to every method match protocol.json.

use super::*;

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
