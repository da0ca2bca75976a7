//! The documented per-process and per-session limits, hit for real through the wire:
//! `MAX_PROCESSES_PER_SESSION`, `CLOSED_PROCESS_RETENTION`, `OUTPUT_READ_CHUNK_BYTES` and
//! `WRITE_ID_MEMORY` (docs/protocol.md states each value; the constants below repeat them so a
//! change of either side fails here).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Client, ExecServer, RpcError, assert_rpc_error, b64, unb64};

/// `MAX_PROCESSES_PER_SESSION` from docs/protocol.md.
const MAX_PROCESSES_PER_SESSION: usize = 2048;
/// `CLOSED_PROCESS_RETENTION` from docs/protocol.md.
const CLOSED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// `OUTPUT_READ_CHUNK_BYTES` from docs/protocol.md.
const OUTPUT_READ_CHUNK_BYTES: usize = 256 * 1024;
/// `WRITE_ID_MEMORY` from docs/protocol.md.
const WRITE_ID_MEMORY: usize = 4096;
/// Requests sent before their answers are awaited (below the server's 128 in flight).
const PIPELINE: usize = 64;
/// Slack for a scheduled removal on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(15);

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Send `requests` in windows of [`PIPELINE`] and return every answer, in order.
async fn pipelined(
    client: &mut Client,
    requests: impl IntoIterator<Item = (&'static str, Value)>,
) -> Vec<Result<Value, RpcError>> {
    let requests: Vec<_> = requests.into_iter().collect();
    let mut answers = Vec::with_capacity(requests.len());
    for window in requests.chunks(PIPELINE) {
        let mut ids = Vec::with_capacity(window.len());
        for (method, params) in window {
            ids.push(client.send_request(method, params.clone()).await);
        }
        for id in &ids {
            answers.push(client.response(id).await);
        }
    }
    answers
}

fn start_params(process_id: &str, argv: &[&str]) -> Value {
    json!({
        "processId": process_id,
        "argv": argv,
        "cwd": "file:///",
        "env": {"PATH": "/usr/bin:/bin"},
    })
}

#[tokio::test]
async fn a_session_holds_at_most_max_processes_and_a_closed_one_is_forgotten_after_retention() {
    let server = server();
    let mut client = server.client().await;
    let first_started = Instant::now();
    let starts = (0..MAX_PROCESSES_PER_SESSION).map(|n| {
        (
            "process/start",
            start_params(&format!("p{n}"), &["/bin/true"]),
        )
    });
    for (n, answer) in pipelined(&mut client, starts).await.into_iter().enumerate() {
        answer.unwrap_or_else(|e| panic!("start p{n} (below the limit) failed: {e:?}"));
    }
    // Every one of them has exited by now, but closed processes stay readable and count.
    let refused = assert_rpc_error(
        client
            .request("process/start", start_params("one-more", &["/bin/true"]))
            .await,
        -32600,
        "limitExceeded",
    );
    assert_eq!(
        refused.data.as_ref().and_then(|d| d.limit),
        Some(MAX_PROCESSES_PER_SESSION as u64),
        "{refused:?}"
    );
    assert!(
        refused.message.contains("MAX_PROCESSES_PER_SESSION"),
        "the message names the limit: {refused:?}"
    );
    assert!(
        first_started.elapsed() < CLOSED_PROCESS_RETENTION,
        "starting {MAX_PROCESSES_PER_SESSION} processes took {:?}, longer than the retention: \
         the refusal above proves nothing about the cap",
        first_started.elapsed()
    );
    // p0 closed after it started; it must stay readable for the whole retention...
    let read = client
        .call("process/read", json!({"processId": "p0", "waitMs": 5000}))
        .await;
    assert_eq!(
        (&read["exited"], &read["exitCode"]),
        (&json!(true), &json!(0)),
        "{read}"
    );
    // ...and be forgotten once it has passed, which frees its slot.
    let deadline = first_started + CLOSED_PROCESS_RETENTION + SLACK;
    loop {
        match client
            .request("process/read", json!({"processId": "p0"}))
            .await
        {
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "p0 is still readable {:?} after it started (retention {CLOSED_PROCESS_RETENTION:?})",
                    first_started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => {
                assert_eq!(error.code, -32004, "{error:?}");
                assert!(
                    first_started.elapsed() >= CLOSED_PROCESS_RETENTION,
                    "p0 was forgotten {:?} after it started, before the retention ran out",
                    first_started.elapsed()
                );
                break;
            }
        }
    }
    client
        .call("process/start", start_params("one-more", &["/bin/true"]))
        .await;
}

#[tokio::test]
async fn output_arrives_in_chunks_of_at_most_output_read_chunk_bytes() {
    let server = server();
    let mut client = server.client().await;
    const TOTAL: usize = 4 * 1024 * 1024;
    let out = client
        .run(
            "big",
            &["/usr/bin/head", "-c", &TOTAL.to_string(), "/dev/zero"],
            json!({}),
        )
        .await;
    let sizes: Vec<usize> = out
        .events
        .iter()
        .filter(|e| e["method"] == "process/output")
        .map(|e| unb64(e["params"]["chunk"].as_str().unwrap()).len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), TOTAL);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    assert!(
        largest <= OUTPUT_READ_CHUNK_BYTES,
        "a chunk of {largest} bytes is over OUTPUT_READ_CHUNK_BYTES"
    );
    // The child's pipe holds more than a chunk (CHILD_PIPE_BYTES is 1 MiB), so the bound is
    // what cut it, not the writer.
    assert!(sizes.len() >= TOTAL / OUTPUT_READ_CHUNK_BYTES, "{sizes:?}");
}

#[tokio::test]
async fn write_ids_beyond_write_id_memory_evict_the_oldest() {
    let server = server();
    let mut client = server.client().await;
    client
        .call(
            "process/start",
            json!({
                "processId": "cat",
                "argv": ["/bin/cat"],
                "cwd": "file:///",
                "env": {},
                "pipeStdin": true,
            }),
        )
        .await;
    let write = |id: String, chunk: &str| {
        (
            "process/write",
            json!({"processId": "cat", "chunk": b64(chunk), "writeId": id}),
        )
    };
    // One more id than the server remembers: w0 is evicted, w1..=w4096 are remembered.
    // Pipelined requests run concurrently, so w0 goes first on its own to be the oldest.
    let (method, params) = write("w0".to_owned(), "a");
    assert_eq!(
        client.call(method, params).await,
        json!({"status": "accepted"})
    );
    let writes = (1..=WRITE_ID_MEMORY).map(|n| write(format!("w{n}"), "a"));
    for answer in pipelined(&mut client, writes).await {
        assert_eq!(answer.unwrap(), json!({"status": "accepted"}));
    }
    // A retry of a remembered id is deduplicated: accepted, not written again (before w0 comes
    // back, which evicts the oldest of the others).
    let retry_newest = write(format!("w{WRITE_ID_MEMORY}"), "N");
    // The evicted id is new again: written.
    let retry_evicted = write("w0".to_owned(), "E");
    for (method, params) in [retry_newest, retry_evicted] {
        assert_eq!(
            client.call(method, params).await,
            json!({"status": "accepted"})
        );
    }
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    let expected = format!("{}E", "a".repeat(WRITE_ID_MEMORY + 1));
    assert_eq!(out.stdout_text().len(), expected.len());
    assert_eq!(out.stdout_text(), expected);
}
