//! The reference suite's error wording: each test sends what a non-local reference test sends
//! and checks what that test reads (the code its client maps to an `io::ErrorKind`, the message
//! text) and what this server adds (`data.kind`, our own wording in `data.detail`).
//!
//! The reference client maps -32004 to `NotFound`, -32600 to `InvalidInput` and any other code to
//! `Other`, and shows the message as the error's text.

use super::*;
use tests::RpcError;

/// The error of a request that must fail, with `data` present.
async fn refused(client: &mut Client, method: &str, params: Value) -> RpcError {
    match client.request(method, params).await {
        Ok(value) => panic!("{method} should fail, got {value}"),
        Err(error) => {
            assert!(error.data.is_some(), "{error:?}");
            error
        }
    }
}

/// Code, message and `data.kind` as the reference test reads them, and our wording in
/// `data.detail` (checked to name `detail_names`).
fn assert_reference(error: &RpcError, code: i64, message: &str, kind: &str, detail_names: &str) {
    assert_eq!(
        (
            error.code,
            error.message.as_str(),
            tests::error_kind(error).as_str()
        ),
        (code, message, kind),
        "{error:?}"
    );
    let detail = error.data.as_ref().and_then(|data| data.detail.as_deref());
    assert!(
        detail.is_some_and(|detail| detail.contains(detail_names)),
        "data.detail should name {detail_names:?}: {error:?}"
    );
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// `file_system_copy_rejects_directory_without_recursive`,
/// `file_system_copy_rejects_copying_directory_into_descendant` and
/// `file_system_copy_rejects_standalone_fifo_source`.
#[tokio::test]
async fn copy_refusals_carry_the_reference_texts() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("nested")).unwrap();

    let destination = dir.path().join("dest");
    let error = refused(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination),
               "recursive": false, "sandbox": null}),
    )
    .await;
    assert_reference(
        &error,
        -32600,
        "fs/copy requires recursive: true when sourcePath is a directory",
        "isADirectory",
        "pass recursive: true",
    );
    assert!(!destination.exists());

    let into_itself = source.join("nested/copy");
    let error = refused(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&into_itself),
               "recursive": true, "sandbox": null}),
    )
    .await;
    assert_reference(
        &error,
        -32600,
        "fs/copy cannot copy a directory to itself or one of its descendants",
        "invalidRequest",
        "lies inside it",
    );
    assert!(!into_itself.exists());

    let fifo = dir.path().join("named-pipe");
    mkfifo(&fifo);
    let copied = dir.path().join("copied");
    let error = refused(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&fifo), "destinationPath": file_uri(&copied),
               "recursive": false, "sandbox": null}),
    )
    .await;
    assert_reference(
        &error,
        -32600,
        "fs/copy only supports regular files, directories, and symlinks",
        "notAFile",
        "FIFO",
    );
    assert!(!copied.exists());
}

/// `stream_rejects_fifo_without_waiting_for_a_writer` (the client's streamed read is `fs/open`),
/// and `fs/readFile` of the same FIFO.
#[tokio::test]
async fn a_fifo_is_not_a_file_without_waiting_for_a_writer() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("named-pipe");
    mkfifo(&fifo);
    let expected = format!("path `{}` is not a file", fifo.display());
    for (method, params) in [
        (
            "fs/open",
            json!({"handleId": "fifo", "path": file_uri(&fifo), "sandbox": null}),
        ),
        ("fs/readFile", json!({"path": file_uri(&fifo)})),
    ] {
        let error =
            tokio::time::timeout(Duration::from_secs(5), refused(&mut client, method, params))
                .await
                .expect("a FIFO is refused without waiting for a writer");
        assert_reference(&error, -32600, &expected, "notAFile", "FIFO");
    }
}

/// `open_enforces_the_per_connection_limit_and_close_releases_capacity`: 128 handles open, the
/// 129th is refused with the reference's text, closing one makes room.
#[tokio::test]
async fn the_handle_limit_carries_the_reference_text() {
    const OPEN_FILE_LIMIT: usize = 128;
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("limited.bin");
    std::fs::write(&file, b"limited").unwrap();
    for index in 0..OPEN_FILE_LIMIT {
        client
            .call(
                "fs/open",
                json!({"handleId": format!("h{index}"), "path": file_uri(&file), "sandbox": null}),
            )
            .await;
    }
    let error = refused(
        &mut client,
        "fs/open",
        json!({"handleId": "one-more", "path": file_uri(&file), "sandbox": null}),
    )
    .await;
    assert_reference(
        &error,
        -32600,
        &format!("at most {OPEN_FILE_LIMIT} file reads may be open per connection"),
        "limitExceeded",
        "MAX_OPEN_HANDLES",
    );
    assert_eq!(
        error.data.as_ref().and_then(|data| data.limit),
        Some(OPEN_FILE_LIMIT as u64)
    );
    client.call("fs/close", json!({"handleId": "h0"})).await;
    let reopened = client
        .call(
            "fs/open",
            json!({"handleId": "one-more", "path": file_uri(&file), "sandbox": null}),
        )
        .await;
    assert_eq!(reopened, json!({"handleId": "one-more"}));
}

/// The reference's `read_only_sandbox(root)`: its `permissions` profile reading `root` only.
fn read_only_sandbox(root: &Path) -> Value {
    json!({"permissions": {"type": "managed", "network": "restricted", "file_system": {
        "type": "restricted",
        "entries": [{"path": {"type": "path", "path": root}, "access": "read"}]}}})
}

/// The reference's `workspace_write_sandbox(root)`: writing `root` only.
fn workspace_write_sandbox(root: &Path) -> Value {
    json!({"permissions": {"type": "managed", "network": "restricted", "file_system": {
        "type": "restricted",
        "entries": [{"path": {"type": "path", "path": root}, "access": "write"}]}}})
}

/// What the reference's `assert_sandbox_denied` accepts for `InvalidInput` (-32600), and ours:
/// `sandboxDenied` naming the operation, with the OS error in `data.detail`.
fn assert_sandbox_denied(error: &RpcError, operation: &str) {
    assert_eq!(error.code, -32600, "{error:?}");
    assert!(
        error.message.contains("is not permitted"),
        "the reference reads `is not permitted`: {error:?}"
    );
    assert_eq!(tests::error_kind(error), "sandboxDenied", "{error:?}");
    let data = error.data.as_ref().unwrap();
    assert_eq!(data.operation.as_deref(), Some(operation), "{error:?}");
    assert!(
        data.detail
            .as_deref()
            .is_some_and(|detail| detail.contains("os error")),
        "data.detail keeps the OS error: {error:?}"
    );
}

/// `file_system_sandboxed_write_rejects_unwritable_path`, `..._read_rejects_symlink_escape`,
/// `..._write_rejects_symlink_escape`, `file_system_create_directory_rejects_symlink_escape`,
/// `file_system_read_directory_rejects_symlink_escape`,
/// `file_system_copy_rejects_symlink_escape_destination` / `_source` and
/// `file_system_remove_rejects_symlink_escape`, with an unsandboxed control for each write.
#[tokio::test]
async fn sandbox_denials_read_as_not_permitted() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("allowed");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "outside").unwrap();
    std::fs::write(allowed.join("source.txt"), "hello").unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
    let read_only = read_only_sandbox(&allowed);
    let write = workspace_write_sandbox(&allowed);
    let link = allowed.join("link");

    let blocked = dir.path().join("blocked.txt");
    let error = refused(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&blocked), "dataBase64": b64(b"nope"),
               "sandbox": read_only_sandbox(dir.path())}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/writeFile");
    assert!(!blocked.exists());

    let error = refused(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(link.join("secret.txt")), "sandbox": read_only}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/readFile");

    let error = refused(
        &mut client,
        "fs/readDirectory",
        json!({"path": file_uri(&link), "sandbox": read_only}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/readDirectory");

    let error = refused(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(link.join("blocked.txt")), "dataBase64": b64(b"nope"),
               "sandbox": write}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/writeFile");
    assert!(!outside.join("blocked.txt").exists());

    let error = refused(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(link.join("created")), "recursive": false, "sandbox": write}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/createDirectory");
    assert!(!outside.join("created").exists());

    let error = refused(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(allowed.join("source.txt")),
               "destinationPath": file_uri(link.join("copied.txt")), "sandbox": write}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/copy");
    assert!(!outside.join("copied.txt").exists());

    let error = refused(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(link.join("secret.txt")),
               "destinationPath": file_uri(allowed.join("copied.txt")), "sandbox": write}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/copy");
    assert!(!allowed.join("copied.txt").exists());

    let error = refused(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(link.join("secret.txt")), "recursive": false, "force": false,
               "sandbox": write}),
    )
    .await;
    assert_sandbox_denied(&error, "fs/remove");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside"
    );

    // Control: the same write through the link without a sandbox lands outside.
    client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(link.join("blocked.txt")), "dataBase64": b64(b"yes")}),
        )
        .await;
    assert_eq!(std::fs::read(outside.join("blocked.txt")).unwrap(), b"yes");
}

/// `file_system_write_file_reports_missing_parent`: -32004 (`NotFound`) and the OS text.
#[tokio::test]
async fn a_missing_parent_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing/note.txt");
    let error = refused(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&path), "dataBase64": b64(b"hello")}),
    )
    .await;
    assert_eq!(
        (error.code, tests::error_kind(&error).as_str()),
        (-32004, "notFound"),
        "{error:?}"
    );
    assert!(
        error.message.contains("No such file or directory"),
        "{error:?}"
    );
    assert!(!path.exists());
}

/// `bounded_read::sandbox_helper_enforces_fs_read_file_max_bytes`: `maxBytes` bounds one
/// `fs/readFile` (-32600 "file is too large to read: limit is N bytes", `limitExceeded` with
/// `data.limit`), through the sandboxed helper and without a sandbox; a file within it is read
/// whole, and a limit above `READ_FILE_MAX_BYTES` is accepted (that cap still applies).
#[tokio::test]
async fn read_file_max_bytes_refuses_a_larger_file_with_the_reference_text() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("bounded.txt");
    std::fs::write(&source, b"four").unwrap();
    for sandbox in [read_only_sandbox(dir.path()), Value::Null] {
        let error = refused(
            &mut client,
            "fs/readFile",
            json!({"path": file_uri(&source), "sandbox": sandbox, "maxBytes": 3}),
        )
        .await;
        assert_reference(
            &error,
            -32600,
            "file is too large to read: limit is 3 bytes",
            "limitExceeded",
            "bounded.txt",
        );
        assert_eq!(error.data.as_ref().unwrap().limit, Some(3), "{error:?}");
        for max_bytes in [4, u64::MAX] {
            let read = client
                .call(
                    "fs/readFile",
                    json!({"path": file_uri(&source), "sandbox": sandbox, "maxBytes": max_bytes}),
                )
                .await;
            assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"four");
        }
    }
}

/// `websocket::exec_server_reports_malformed_websocket_json_and_keeps_running` and
/// `exec_server_accepts_binary_websocket_json`: a frame that is not JSON is answered with id -1,
/// -32600 and a message that starts with the reference's words (ours follow them), before
/// `initialize` as after it; the connection keeps serving, and a request in a binary frame is
/// served like a text one.
#[tokio::test]
async fn a_malformed_frame_is_answered_in_the_reference_words_and_binary_json_is_served() {
    let server = server();
    let mut client = server.connect().await;
    client.send_text("not-json").await;
    let answer = client
        .next_message(DEADLINE)
        .await
        .expect("an answer to not-json");
    assert_eq!(
        (answer["id"].clone(), answer["error"]["code"].clone()),
        (json!(-1), json!(-32600)),
        "{answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message
            .starts_with("failed to parse websocket JSON-RPC message from exec-server websocket")
            && message.contains("not valid JSON"),
        "{answer}"
    );
    assert_eq!(
        answer["error"]["data"]["kind"], "invalidRequest",
        "{answer}"
    );
    client
        .send_binary(
            serde_json::to_vec(
                &json!({"id": 1, "method": "initialize", "params": {"clientName": "binary"}}),
            )
            .unwrap(),
        )
        .await;
    let answer = client
        .next_message(DEADLINE)
        .await
        .expect("an answer to initialize");
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(
        answer["result"]["sessionId"]
            .as_str()
            .is_some_and(|id| id.len() == 36),
        "{answer}"
    );
}
