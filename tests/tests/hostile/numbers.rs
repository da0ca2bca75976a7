//! Absurd numbers: read, long-poll, block, terminal and signal parameters.

use super::*;

#[tokio::test]
async fn absurd_read_parameters_are_capped_or_refused_promptly() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    start_echo(&mut client, "cat").await;
    assert_echoes(&mut client, "cat", "line\n").await;
    let quick = Duration::from_secs(3);
    // Capped: u64::MAX bytes is MAX_READ_BYTES; the answer is immediate because output exists.
    let started = Instant::now();
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "cat", "maxBytes": u64::MAX, "waitMs": u64::MAX}),
            quick,
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"].as_array().unwrap().len(), 1, "{read}");
    assert!(started.elapsed() < quick);
    // A cursor past everything that will ever exist: an empty answer, not a crash.
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "cat", "afterSeq": u64::MAX}),
            quick,
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"], json!([]), "{read}");
    // A long-poll with an absurd waitMs returns as soon as output appears.
    let poll = client
        .send_request(
            "process/read",
            json!({"processId": "cat", "afterSeq": 1, "waitMs": u64::MAX}),
        )
        .await;
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("more\n")}),
        )
        .await;
    let read = client
        .response_within(&poll, quick, "long-poll woken by output")
        .await
        .unwrap();
    assert_eq!(read["chunks"][0]["seq"], 2, "{read}");
    // Out of the domain of the field: refused by name, never silently clamped.
    for (what, params) in [
        (
            "negative maxBytes",
            json!({"processId": "cat", "maxBytes": -1}),
        ),
        (
            "fractional waitMs",
            json!({"processId": "cat", "waitMs": 1.5}),
        ),
        (
            "waitMs past u64",
            json!({"processId": "cat", "waitMs": 1e30}),
        ),
        (
            "string afterSeq",
            json!({"processId": "cat", "afterSeq": "1"}),
        ),
    ] {
        let r = client.request_within("process/read", params, quick).await;
        assert_rpc_error(r, -32602, "invalidParams");
        let _ = what;
    }
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn long_poll_on_a_closed_process_returns_at_once_whatever_wait_ms_says() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    let out = client.run("done", &sh("echo bye"), json!({})).await;
    let last = *tests::seqs(&out.events).last().unwrap();
    // Nothing can follow `closed`: waiting would only hold a request slot for MAX_WAIT_MS.
    let started = Instant::now();
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "done", "afterSeq": last, "waitMs": u64::MAX}),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"], json!([]), "{read}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn absurd_block_terminal_and_signal_parameters_get_clear_errors() {
    let _turn = tests::siege::beside_sieges().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"0123456789").unwrap();
    let server = server();
    let mut client = server.client().await;
    client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&file)}))
        .await;
    for len in [u64::MAX, READ_BLOCK_MAX_BYTES + 1] {
        let r = client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": 0, "len": len}),
            )
            .await;
        let error = assert_rpc_error(r, -32602, "invalidParams");
        assert!(error.message.contains("READ_BLOCK_MAX_BYTES"), "{error:?}");
    }
    // An offset far past the end is an empty block at EOF, or an out-of-range error: never a
    // hang or a crash.
    for offset in [u64::MAX, i64::MAX as u64, 1 << 40] {
        match client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": offset, "len": 10}),
            )
            .await
        {
            Ok(block) => assert_eq!(block, json!({"chunk": "", "eof": true}), "offset {offset}"),
            Err(error) => assert_eq!(error.code, -32602, "offset {offset}: {error:?}"),
        }
    }
    // Terminal sizes: u16 is the domain; 0 is refused by name, 65535 is a (huge) terminal.
    let r = client
        .start(
            "big",
            &["/bin/true"],
            json!({"tty": true, "cols": 70000, "rows": 1}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let out = client
        .run(
            "huge",
            &sh("stty size"),
            json!({"tty": true, "cols": 65535, "rows": 65535}),
        )
        .await;
    assert_eq!(out.pty_text().trim(), "65535 65535");
    client
        .start("tty", &["/bin/cat"], json!({"tty": true}))
        .await
        .unwrap();
    let r = client
        .request(
            "process/resize",
            json!({"processId": "tty", "cols": 0, "rows": 0}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let r = client
        .request(
            "process/signal",
            json!({"processId": "tty", "signal": "SIGKILL; rm -rf /"}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let r = client
        .request("process/signal", json!({"processId": "tty", "signal": 9}))
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    client
        .call("process/terminate", json!({"processId": "tty"}))
        .await;
    assert_serving(&mut client).await;
}
