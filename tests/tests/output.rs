//! Process output: notifications, seq numbering, `process/read`, retention and long polls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{ExecServer, b64, seqs, sh, unb64};

/// `OUTPUT_RETENTION_BYTES` from docs/protocol.md.
const OUTPUT_RETENTION_BYTES: usize = 1024 * 1024;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

fn decoded_len(chunks: &[Value]) -> usize {
    chunks
        .iter()
        .map(|c| unb64(c["chunk"].as_str().unwrap()).len())
        .sum()
}

#[tokio::test]
async fn seq_is_one_counter_shared_by_output_exited_and_closed() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run(
            "p",
            &sh("echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3"),
            json!({}),
        )
        .await;
    let seqs = seqs(&out.events);
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "events: {:?}", out.events);
    let methods: Vec<&str> = out
        .events
        .iter()
        .map(|e| e["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods.last(), Some(&"process/closed"), "{methods:?}");
    // All output the child wrote comes before `exited`, which comes right before `closed`.
    let exited = methods
        .iter()
        .position(|m| *m == "process/exited")
        .expect("exited");
    assert_eq!(exited, methods.len() - 2, "{methods:?}");
    assert_eq!(
        methods.iter().filter(|m| **m == "process/exited").count(),
        1
    );
    assert_eq!(out.stdout_text(), "out1\nout2\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err1\nerr2\n");
    assert_eq!(out.exit_code, Some(3));
    for e in &out.events {
        assert_eq!(e["params"]["processId"], "p", "{e}");
    }
}

#[tokio::test]
async fn closed_waits_for_output_streams_to_reach_eof_after_exit() {
    let server = server();
    let mut client = server.client().await;
    // The shell exits at once; a grandchild keeps stdout open and writes later.
    let out = client
        .run(
            "p",
            &sh("echo first; (/bin/sleep 0.3; echo late) & exit 0"),
            json!({}),
        )
        .await;
    let methods: Vec<&str> = out
        .events
        .iter()
        .map(|e| e["method"].as_str().unwrap())
        .collect();
    let late = out
        .events
        .iter()
        .position(|e| {
            e["method"] == "process/output"
                && String::from_utf8_lossy(&unb64(e["params"]["chunk"].as_str().unwrap()))
                    .contains("late")
        })
        .unwrap_or_else(|| panic!("late output missing: {:?}", out.events));
    let exited = methods.iter().position(|m| *m == "process/exited").unwrap();
    let closed = methods.iter().position(|m| *m == "process/closed").unwrap();
    assert!(closed > late && closed > exited, "{methods:?}");
    assert_eq!(closed, methods.len() - 1);
    assert_eq!(out.stdout_text(), "first\nlate\n");
}

#[tokio::test]
async fn read_after_close_returns_everything_with_exit_and_close_seqs() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("p", &sh("echo hi; exit 4"), json!({})).await;
    let last = *seqs(&out.events).last().unwrap();
    let seq_of = |method: &str| {
        out.events
            .iter()
            .find(|e| e["method"] == method)
            .map(|e| e["params"]["seq"].clone())
            .unwrap()
    };
    let result = client
        .call("process/read", json!({"processId": "p", "afterSeq": 0}))
        .await;
    let chunks = result["chunks"].as_array().unwrap();
    let text: Vec<u8> = chunks
        .iter()
        .flat_map(|c| unb64(c["chunk"].as_str().unwrap()))
        .collect();
    assert_eq!(text, b"hi\n");
    assert_eq!(chunks[0]["seq"], seq_of("process/output"));
    assert_eq!(chunks[0]["stream"], "stdout");
    assert_eq!(result["exited"], true, "{result}");
    assert_eq!(result["exitCode"], 4, "{result}");
    assert_eq!(result["closed"], true, "{result}");
    assert_eq!(result["closedSeq"], last, "{result}");
    assert_eq!(result["exitSeq"], seq_of("process/exited"), "{result}");
    assert_eq!(result["nextSeq"], last + 1, "{result}");
    assert_eq!(result["outputDropped"], false, "{result}");

    // Without afterSeq: from the oldest retained, the same answer.
    let from_oldest = client.call("process/read", json!({"processId": "p"})).await;
    assert_eq!(from_oldest, result);
}

#[tokio::test]
async fn read_continues_from_the_cursor_and_reports_exit_only_when_covered() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run("p", &sh("echo a; echo b >&2; echo c"), json!({}))
        .await;
    let all = seqs(&out.events);
    let closed_seq = *all.last().unwrap();
    let exit_seq = out
        .events
        .iter()
        .find(|e| e["method"] == "process/exited")
        .map(|e| e["params"]["seq"].as_u64().unwrap())
        .unwrap();
    // A cursor right before the exit: exit and close covered, only later output returned.
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": exit_seq - 1}),
        )
        .await;
    assert!(
        result["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["seq"].as_u64() > Some(exit_seq)),
        "{result}"
    );
    assert_eq!(
        (&result["exited"], &result["exitSeq"]),
        (&json!(true), &json!(exit_seq))
    );
    assert_eq!(
        (&result["closed"], &result["closedSeq"]),
        (&json!(true), &json!(closed_seq))
    );
    // A cursor right before the close: nothing but the close.
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": closed_seq - 1}),
        )
        .await;
    assert_eq!(result["chunks"], json!([]), "{result}");
    assert_eq!(result["closed"], true, "{result}");
    // From seq 1: chunk 2.. onwards.
    let result = client
        .call("process/read", json!({"processId": "p", "afterSeq": 1}))
        .await;
    let chunk_seqs: Vec<u64> = result["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = out
        .events
        .iter()
        .filter(|e| e["method"] == "process/output" && e["params"]["seq"].as_u64() > Some(1))
        .map(|e| e["params"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(chunk_seqs, expected, "{result}");
    // Past the end: nothing, nextSeq stays.
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": all.last().unwrap()}),
        )
        .await;
    assert_eq!(result["chunks"], json!([]));
    assert_eq!(result["nextSeq"], all.last().unwrap() + 1, "{result}");
}

#[tokio::test]
async fn read_max_bytes_returns_at_least_one_chunk_and_bounds_the_rest() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run(
            "p",
            &sh("for i in 1 2 3 4 5 6 7 8; do echo line$i; /bin/sleep 0.01; done"),
            json!({}),
        )
        .await;
    let chunk_count = out
        .events
        .iter()
        .filter(|e| e["method"] == "process/output")
        .count();
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "maxBytes": 1}),
        )
        .await;
    let chunks = result["chunks"].as_array().unwrap();
    assert_eq!(
        chunks.len(),
        1,
        "maxBytes 1 still returns exactly one chunk: {result}"
    );
    assert_eq!(result["nextSeq"], 2, "{result}");
    if chunk_count > 1 {
        assert_eq!(result["exited"], false, "exit is not covered yet: {result}");
    }
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "maxBytes": 12}),
        )
        .await;
    let chunks = result["chunks"].as_array().unwrap();
    assert!(
        chunks.len() == 1 || decoded_len(chunks) <= 12,
        "more than maxBytes in several chunks: {result}"
    );
}

#[tokio::test]
async fn read_of_one_large_chunk_with_small_max_bytes_returns_it_whole() {
    let server = server();
    let mut client = server.client().await;
    client
        .run(
            "p",
            &["/usr/bin/head", "-c", "65536", "/dev/zero"],
            json!({}),
        )
        .await;
    let result = client
        .call(
            "process/read",
            json!({"processId": "p", "afterSeq": 0, "maxBytes": 10}),
        )
        .await;
    let chunks = result["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 1, "{}", chunks.len());
    assert!(decoded_len(chunks) > 10);
}

#[tokio::test]
async fn long_poll_returns_as_soon_as_output_appears() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    let started = Instant::now();
    let read = client
        .send_request(
            "process/read",
            json!({"processId": "cat", "afterSeq": 0, "waitMs": 10000}),
        )
        .await;
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("ping\n")}),
        )
        .await;
    let result = client
        .response_within(&read, Duration::from_secs(5), "long poll after output")
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let chunks = result["chunks"].as_array().unwrap();
    assert!(!chunks.is_empty(), "{result}");
    assert_eq!(unb64(chunks[0]["chunk"].as_str().unwrap()), b"ping\n");
    client
        .call("process/terminate", json!({"processId": "cat"}))
        .await;
}

#[tokio::test]
async fn long_poll_without_new_events_returns_empty_after_wait_ms() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("s", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    let started = Instant::now();
    let result = client
        .call(
            "process/read",
            json!({"processId": "s", "afterSeq": 0, "waitMs": 300}),
        )
        .await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(result["chunks"], json!([]), "{result}");
    assert_eq!(result["exited"], false, "{result}");
    assert_eq!(result["nextSeq"], 1, "{result}");
    client
        .call("process/terminate", json!({"processId": "s"}))
        .await;
}

#[tokio::test]
async fn retention_keeps_the_newest_mebibyte_and_reports_dropped_output() {
    let server = server();
    let mut client = server.client().await;
    let total = 3 * OUTPUT_RETENTION_BYTES;
    let count = total.to_string();
    client
        .start(
            "big",
            &["/usr/bin/head", "-c", &count, "/dev/zero"],
            json!({}),
        )
        .await
        .unwrap();
    let out = client.collect_within("big", Duration::from_secs(30)).await;
    assert_eq!(out.stdout.len(), total, "notifications carry every byte");
    let result = client
        .call("process/read", json!({"processId": "big", "afterSeq": 0}))
        .await;
    assert_eq!(result["outputDropped"], true, "{}", summary(&result));
    let first_retained = result["firstRetainedSeq"]
        .as_u64()
        .unwrap_or_else(|| panic!("firstRetainedSeq missing: {}", summary(&result)));
    assert!(first_retained > 1);
    let chunks = result["chunks"].as_array().unwrap();
    assert_eq!(chunks[0]["seq"], first_retained, "{}", summary(&result));
    let retained = decoded_len(chunks);
    let largest = chunks
        .iter()
        .map(|c| unb64(c["chunk"].as_str().unwrap()).len())
        .max()
        .unwrap();
    assert!(
        retained + largest >= OUTPUT_RETENTION_BYTES
            && retained <= OUTPUT_RETENTION_BYTES + largest,
        "retained {retained} bytes (largest chunk {largest}), expected about {OUTPUT_RETENTION_BYTES}"
    );
    assert_eq!(result["closed"], true);

    // A cursor inside the retained window is not "dropped".
    let inside = client
        .call(
            "process/read",
            json!({"processId": "big", "afterSeq": first_retained}),
        )
        .await;
    assert_eq!(inside["outputDropped"], false, "{}", summary(&inside));
}

fn summary(result: &Value) -> String {
    let mut r = result.clone();
    let n = r["chunks"].as_array().map(Vec::len);
    r["chunks"] = json!(format!("<{n:?} chunks>"));
    r.to_string()
}

/// The README's promise: `exited` comes after all output the child wrote before exiting. A
/// race between the exit and the output pipes shows up only sometimes, so it runs many
/// processes of different output sizes, in pipe and PTY mode, sandboxed and not.
#[tokio::test]
async fn exited_follows_all_output_written_before_the_exit() {
    let server = server();
    let mut client = server.client().await;
    let workspace = tempfile::tempdir().unwrap();
    let sandbox = json!({"profile": "workspace-write", "cwd": tests::file_uri(workspace.path())});
    let mut checked = 0;
    for (n, bytes) in [1usize, 100, 4096, 65_536, 200_000]
        .iter()
        .cycle()
        .take(40)
        .enumerate()
    {
        let tty = n % 2 == 1;
        let mut extra = json!({"tty": tty});
        if n % 4 >= 2 {
            extra["sandbox"] = sandbox.clone();
            extra["cwd"] = json!(tests::file_uri(workspace.path()));
        }
        // head writes exactly `bytes` bytes and the shell exits at once after it.
        let script = format!("head -c {bytes} /dev/zero | tr '\\0' x");
        let id = format!("p{n}");
        let out = client.run(&id, &sh(&script), extra.clone()).await;
        let written: usize = if tty { out.pty.len() } else { out.stdout.len() };
        assert_eq!(written, *bytes, "{id} {extra}: all output arrives");
        let exited = out
            .events
            .iter()
            .position(|e| e["method"] == "process/exited")
            .unwrap();
        let last_output = out
            .events
            .iter()
            .rposition(|e| e["method"] == "process/output")
            .unwrap();
        assert!(
            last_output < exited,
            "{id} {extra}: output after exited (event {last_output} vs {exited})"
        );
        checked += 1;
    }
    assert_eq!(checked, 40);
}

/// `initialize` with `params`, retried while the session is still attached to a connection
/// that is closing (`sessionAttached`); the result.
async fn initialize_with(client: &mut tests::Client, params: Value) -> Value {
    let started = Instant::now();
    loop {
        match client.request("initialize", params.clone()).await {
            Ok(result) => return result,
            Err(error) if tests::error_kind(&error) == "sessionAttached" => {
                assert!(started.elapsed() < tests::DEADLINE, "{error:?}");
                tokio::time::sleep(Duration::from_millis(20)).await; // retry interval
            }
            Err(error) => panic!("initialize {params}: {error:?}"),
        }
    }
}

/// `initialize` asking for binary output frames; the session id.
async fn initialize_binary(client: &mut tests::Client, resume: Option<&str>) -> String {
    let mut params = json!({"clientName": "tests", "binaryOutput": true});
    if let Some(session) = resume {
        params["resumeSessionId"] = json!(session);
    }
    let result = initialize_with(client, params).await;
    assert_eq!(result["binaryOutput"], true, "{result}");
    result["sessionId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn binary_output_frames_carry_the_bytes_and_seqs_process_read_returns() {
    let server = server();
    let mut client = server.connect().await;
    initialize_binary(&mut client, None).await;
    // Bytes that are not UTF-8 on both streams, PTY output too.
    let script = r"printf 'a\377\000b'; printf 'e\376' >&2; printf 'c\n'";
    let out = client.run("p", &sh(script), json!({})).await;
    let tty = client
        .run("t", &sh("printf 'tty\\377'"), json!({"tty": true}))
        .await;
    for events in [&out.events, &tty.events] {
        let outputs: Vec<&Value> = events
            .iter()
            .filter(|e| e["method"] == "process/output")
            .collect();
        assert!(!outputs.is_empty());
        for output in &outputs {
            assert_eq!(
                output["frame"], "binary",
                "JSON output to a binary client: {output}"
            );
        }
        // One seq counter for the frames and the JSON exited/closed, as before.
        let seqs = seqs(events);
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{events:?}"
        );
    }
    assert_eq!(out.stdout, b"a\xff\x00bc\n");
    assert_eq!(out.stderr, b"e\xfe");
    assert!(tty.pty.ends_with(b"tty\xff"), "{:?}", tty.pty);
    // `process/read` (JSON) returns the same chunks under the same seqs.
    let read = client
        .call("process/read", json!({"processId": "p", "afterSeq": 0}))
        .await;
    let from_read: Vec<(u64, String, Vec<u8>)> = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let bytes = unb64(c["chunk"].as_str().unwrap());
            (
                c["seq"].as_u64().unwrap(),
                c["stream"].as_str().unwrap().to_owned(),
                bytes,
            )
        })
        .collect();
    let from_frames: Vec<(u64, String, Vec<u8>)> = out
        .events
        .iter()
        .filter(|e| e["method"] == "process/output")
        .map(|e| {
            let p = &e["params"];
            let bytes = unb64(p["chunk"].as_str().unwrap());
            (
                p["seq"].as_u64().unwrap(),
                p["stream"].as_str().unwrap().to_owned(),
                bytes,
            )
        })
        .collect();
    assert_eq!(from_frames, from_read);
}

#[tokio::test]
async fn a_resumed_session_gets_output_in_the_form_its_new_connection_asked_for() {
    let server = server();
    let mut binary = server.connect().await;
    let session = initialize_binary(&mut binary, None).await;
    binary
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    let write = |text: &str| json!({"processId": "cat", "chunk": b64(text)});
    binary.call("process/write", write("one\n")).await;
    let first = binary.next_notification(tests::DEADLINE).await;
    assert_eq!(first["frame"], "binary", "{first}");
    binary.close().await;
    // A client that does not ask gets JSON, exactly as before.
    let mut json_client = server.connect().await;
    let result = initialize_with(
        &mut json_client,
        json!({"clientName": "tests", "resumeSessionId": session}),
    )
    .await;
    assert!(result.get("binaryOutput").is_none(), "{result}");
    json_client.call("process/write", write("two\n")).await;
    let second = json_client
        .wait_for_notification("output", tests::DEADLINE, |n| {
            n["method"] == "process/output"
        })
        .await;
    assert!(second.get("frame").is_none(), "{second}");
    assert_eq!(unb64(second["params"]["chunk"].as_str().unwrap()), b"two\n");
    assert!(second["params"]["seq"].as_u64().unwrap() > first["params"]["seq"].as_u64().unwrap());
    json_client.close().await;
    // And binary again on the next resume.
    let mut again = server.connect().await;
    initialize_binary(&mut again, Some(&session)).await;
    again.call("process/write", write("three\n")).await;
    let third = again
        .wait_for_notification("output", tests::DEADLINE, |n| {
            n["method"] == "process/output"
        })
        .await;
    assert_eq!(third["frame"], "binary", "{third}");
    assert_eq!(
        unb64(third["params"]["chunk"].as_str().unwrap()),
        b"three\n"
    );
    again
        .call("process/terminate", json!({"processId": "cat"}))
        .await;
}
