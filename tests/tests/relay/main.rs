//! Remote mode end to end on loopback: harness -> exec-rendezvous -> exec-server --remote.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tests::relay::{Faults, Proxy, RemoteClient, start_executor, start_rendezvous};

mod exec_remote;
mod library;
mod streams;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

fn uri(path: &std::path::Path) -> String {
    format!("file://{}", path.display())
}

fn output_of(client: &RemoteClient, process_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for n in &client.notifications {
        if n["method"] == "process/output" && n["params"]["processId"] == process_id {
            out.extend(unb64(n["params"]["chunk"].as_str().unwrap_or_default()));
        }
    }
    out
}

async fn run_pty_and_fs(client: &mut RemoteClient, dir: &std::path::Path) {
    let started = client
        .call(
            "process/start",
            json!({"processId": "p1", "argv": ["/bin/sh", "-c", "printf 'relay %s\\n' \"$((6*7))\"; tty"], "tty": true, "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
    client
        .wait_notification(|n| n["method"] == "process/closed" && n["params"]["processId"] == "p1")
        .await;
    let text = String::from_utf8_lossy(&output_of(client, "p1")).into_owned();
    assert!(text.contains("relay 42"), "{text:?}");
    assert!(text.contains("/dev/pts/"), "not a PTY: {text:?}");

    let file = dir.join("remote.txt");
    let content = b"written through the relay\n";
    let written = client
        .call(
            "fs/writeFile",
            json!({"path": uri(&file), "dataBase64": b64(content)}),
        )
        .await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(std::fs::read(&file).unwrap(), content);
    let read = client
        .call("fs/readFile", json!({"path": uri(&file)}))
        .await
        .unwrap();
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), content);
}
