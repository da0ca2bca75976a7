//! stdin (`process/write`, write ids), terminals (`tty`, size, resize), a restricting sandbox,
//! and requests naming unknown or over-long process ids.

use super::*;

#[tokio::test]
async fn pipe_stdin_write_and_close_reach_cat() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    let result = client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("hello\n")}),
        )
        .await;
    assert_eq!(result, json!({"status": "accepted"}));
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(out.stdout_text(), "hello\n");
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn stdin_is_dev_null_without_pipe_stdin() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("cat", &["/bin/cat"], json!({})).await;
    assert_eq!((out.stdout_text(), out.exit_code), (String::new(), Some(0)));
}

#[tokio::test]
async fn write_without_pipe_stdin_answers_stdin_closed() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("s", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "s", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "s"}))
        .await;
}

#[tokio::test]
async fn write_after_stdin_closed_or_exit_answers_stdin_closed() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "c",
            &sh("exec /bin/sleep 1000 <&0"),
            json!({"pipeStdin": true}),
        )
        .await
        .unwrap();
    client
        .call(
            "process/write",
            json!({"processId": "c", "chunk": "", "close": true}),
        )
        .await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "c", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "c"}))
        .await;

    client
        .run("exited", &["/bin/true"], json!({"pipeStdin": true}))
        .await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "exited", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
}

#[tokio::test]
async fn write_to_unknown_process_answers_unknown_process() {
    let server = server();
    let mut client = server.client().await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "ghost", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "unknownProcess"})
    );
}

#[tokio::test]
async fn write_with_invalid_base64_is_invalid_base64() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    assert_rpc_error(
        client
            .request(
                "process/write",
                json!({"processId": "cat", "chunk": "not base64!"}),
            )
            .await,
        -32602,
        "invalidBase64",
    );
    client
        .call("process/terminate", json!({"processId": "cat"}))
        .await;
}

#[tokio::test]
async fn write_id_makes_a_retried_write_happen_once() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    for (chunk, write_id) in [("a\n", "w1"), ("a\n", "w1"), ("b\n", "w2"), ("b\n", "w2")] {
        let result = client
            .call(
                "process/write",
                json!({"processId": "cat", "chunk": b64(chunk), "writeId": write_id}),
            )
            .await;
        assert_eq!(result, json!({"status": "accepted"}));
    }
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("c\n"), "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(out.stdout_text(), "a\nb\nc\n");
}

#[tokio::test]
async fn tty_process_streams_pty_and_sees_a_terminal_of_the_default_size() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run("tty", &sh("tty; stty size"), json!({"tty": true}))
        .await;
    assert!(
        !out.pty.is_empty(),
        "no pty output; events: {:?}",
        out.events
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "{:?}",
        out.events
    );
    let text = out.pty_text();
    assert!(
        text.contains("/dev/"),
        "tty did not report a terminal: {text:?}"
    );
    assert!(!text.contains("not a tty"), "{text:?}");
    assert!(
        text.contains("24 80"),
        "default size should be 24x80: {text:?}"
    );
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn tty_size_comes_from_cols_and_rows() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run(
            "tty",
            &["/usr/bin/stty", "size"],
            json!({"tty": true, "cols": 100, "rows": 30}),
        )
        .await;
    assert!(out.pty_text().contains("30 100"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn resize_changes_the_terminal_size() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "resize",
            &sh("stty size; read line; stty size"),
            json!({"tty": true}),
        )
        .await
        .unwrap();
    client.wait_for_output("resize", "24 80").await;
    let result = client
        .call(
            "process/resize",
            json!({"processId": "resize", "cols": 120, "rows": 40}),
        )
        .await;
    assert_eq!(result, json!({}));
    client
        .call(
            "process/write",
            json!({"processId": "resize", "chunk": b64("\n")}),
        )
        .await;
    let out = client.collect("resize").await;
    assert!(out.pty_text().contains("40 120"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn resize_of_non_pty_is_unsupported_and_unknown_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("plain", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    assert_rpc_error(
        client
            .request(
                "process/resize",
                json!({"processId": "plain", "cols": 10, "rows": 10}),
            )
            .await,
        -32600,
        "unsupported",
    );
    assert_rpc_error(
        client
            .request(
                "process/resize",
                json!({"processId": "ghost", "cols": 10, "rows": 10}),
            )
            .await,
        -32004,
        "notFound",
    );
    client
        .call("process/terminate", json!({"processId": "plain"}))
        .await;
}

#[tokio::test]
async fn tty_write_reaches_the_program() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "echo",
            &sh("read line; echo got:$line"),
            json!({"tty": true}),
        )
        .await
        .unwrap();
    client
        .call(
            "process/write",
            json!({"processId": "echo", "chunk": b64("hi\n")}),
        )
        .await;
    let out = client.collect("echo").await;
    assert!(out.pty_text().contains("got:hi"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn restricting_sandbox_is_enforced_never_ignored() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("written");
    let script = format!("echo x > '{}'", target.display());
    let out = client
        .run(
            "sandboxed",
            &sh(&script),
            json!({"sandbox": {"profile": "read-only"}, "cwd": file_uri(dir.path())}),
        )
        .await;
    assert_ne!(
        out.exit_code,
        Some(0),
        "write under read-only sandbox succeeded"
    );
    let stderr = out.stderr_text();
    assert!(
        stderr.contains("Read-only file system") || stderr.contains("Permission denied"),
        "the shell reports the kernel's refusal: {stderr}"
    );
    assert!(
        !target.exists(),
        "a read-only sandbox must not allow the write"
    );
    // The same command without a sandbox writes: the refusal above is the policy's.
    let control = client
        .run(
            "control",
            &sh(&script),
            json!({"cwd": file_uri(dir.path())}),
        )
        .await;
    assert_eq!(control.exit_code, Some(0));
    assert_eq!(std::fs::read(&target).unwrap(), b"x\n");
}

#[tokio::test]
async fn process_read_of_unknown_process_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client
            .request("process/read", json!({"processId": "ghost"}))
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn process_id_longer_than_the_limit_is_refused() {
    let server = server();
    let mut client = server.client().await;
    let long = "x".repeat(129);
    let error = client
        .start(&long, &["/bin/true"], json!({}))
        .await
        .expect_err("a 129-byte processId must be refused");
    assert!(
        [-32600, -32602].contains(&error.code),
        "unexpected code {error:?}"
    );
    client
        .start(&"y".repeat(128), &["/bin/true"], json!({}))
        .await
        .unwrap();
}
