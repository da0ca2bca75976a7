//! Connection lifecycle and the JSON-RPC envelope: `initialize`, ids, malformed input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{Client, DEADLINE, ExecServer, assert_rpc_error};

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Wait for the error response with id -1 (garbage input is never tied to a request).
async fn error_with_id_minus_one(client: &mut Client) -> Value {
    let raw = client
        .raw_response_within(&json!(-1), DEADLINE, "error for unattributable input")
        .await;
    assert!(raw.get("result").is_none(), "expected an error, got {raw}");
    raw["error"].clone()
}

fn assert_error_value(error: &Value, code: i64, kind: &str) {
    assert_eq!(error["code"], code, "error: {error}");
    assert_eq!(error["data"]["kind"], kind, "error: {error}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error without message: {error}"
    );
}

/// The connection still serves requests (after an error).
async fn assert_still_serving(client: &mut Client) {
    let metadata = client
        .request("fs/getMetadata", json!({"path": "file:///"}))
        .await
        .expect("connection keeps serving");
    assert_eq!(metadata["isDirectory"], true);
}

fn is_uuid_v4(text: &str) -> bool {
    let bytes = text.as_bytes();
    text.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-')
        && text
            .chars()
            .enumerate()
            .all(|(i, c)| [8, 13, 18, 23].contains(&i) || c.is_ascii_hexdigit())
        && bytes[14] == b'4'
        && matches!(bytes[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

#[tokio::test]
async fn initialize_returns_a_uuid_v4_session_id() {
    let server = server();
    let mut client = server.connect().await;
    let result = client
        .request("initialize", json!({"clientName": "lifecycle"}))
        .await
        .unwrap();
    let session = result["sessionId"].as_str().expect("sessionId string");
    assert!(is_uuid_v4(session), "not a UUIDv4: {session}");

    let mut other = server.connect().await;
    let second = other.initialize().await;
    assert_ne!(session, second, "each connection gets a new session");
}

#[tokio::test]
async fn request_before_initialize_is_not_initialized_and_initialize_still_works() {
    let server = server();
    let mut client = server.connect().await;
    let error = assert_rpc_error(
        client
            .request("fs/getMetadata", json!({"path": "file:///"}))
            .await,
        -32600,
        "notInitialized",
    );
    assert!(
        error.message.contains("initialize"),
        "message should say to initialize first: {}",
        error.message
    );
    client.initialize().await;
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn second_initialize_is_already_initialized() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client
            .request("initialize", json!({"clientName": "again"}))
            .await,
        -32600,
        "alreadyInitialized",
    );
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn initialized_notification_is_accepted_silently() {
    let server = server();
    let mut client = server.connect().await;
    client
        .request("initialize", json!({"clientName": "c"}))
        .await
        .unwrap();
    client.notify("initialized", json!({})).await;
    let id = client
        .send_request("fs/getMetadata", json!({"path": "file:///"}))
        .await;
    // The very next message must be that response: no error for `initialized`.
    let next = client.next_message(DEADLINE).await.expect("a response");
    assert_eq!(
        next["id"], id,
        "unexpected message after `initialized`: {next}"
    );
    assert!(next.get("result").is_some(), "{next}");
}

#[tokio::test]
async fn unexpected_notification_gets_error_with_id_minus_one() {
    let server = server();
    let mut client = server.client().await;
    client.notify("process/kill-everything", json!({})).await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_error_value(&error, -32600, "unexpectedNotification");
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn unparseable_json_gets_invalid_request_with_id_minus_one_and_connection_keeps_serving() {
    let server = server();
    let mut client = server.client().await;
    client.send_text("{not json").await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_error_value(&error, -32600, "invalidRequest");
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn garbage_before_initialize_gets_id_minus_one_too() {
    let server = server();
    let mut client = server.connect().await;
    client.send_text("garbage").await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_eq!(error["code"], -32600, "{error}");
    client.initialize().await;
}

#[tokio::test]
async fn non_object_messages_get_invalid_request_with_id_minus_one() {
    let server = server();
    let mut client = server.client().await;
    for input in ["[1,2]", "42", "\"text\"", "null", "[]"] {
        client.send_text(input).await;
        let error = error_with_id_minus_one(&mut client).await;
        assert_error_value(&error, -32600, "invalidRequest");
    }
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn invalid_utf8_binary_frame_gets_invalid_request_with_id_minus_one() {
    let server = server();
    let mut client = server.client().await;
    client.send_binary(vec![0xff, 0xfe, b'{', b'}']).await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_error_value(&error, -32600, "invalidRequest");
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn message_of_no_known_shape_gets_id_minus_one() {
    let server = server();
    let mut client = server.client().await;
    client.send_text(r#"{"params":{}}"#).await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_error_value(&error, -32600, "invalidRequest");
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn client_response_gets_error_with_id_minus_one() {
    let server = server();
    let mut client = server.client().await;
    client.send_text(r#"{"id":77,"result":{}}"#).await;
    let error = error_with_id_minus_one(&mut client).await;
    assert_eq!(error["code"], -32600, "{error}");
    assert_still_serving(&mut client).await;
}

#[tokio::test]
async fn binary_frame_carrying_a_request_is_served() {
    let server = server();
    let mut client = server.client().await;
    client
        .send_binary(
            br#"{"id":"bin","method":"fs/getMetadata","params":{"path":"file:///"}}"#.to_vec(),
        )
        .await;
    let result = client
        .response_within(&json!("bin"), DEADLINE, "binary-frame request")
        .await
        .unwrap();
    assert_eq!(result["isDirectory"], true);
}

#[tokio::test]
async fn string_ids_are_echoed_and_jsonrpc_member_is_accepted() {
    let server = server();
    let mut client = server.connect().await;
    client
        .send_text(
            r#"{"jsonrpc":"2.0","id":"init-1","method":"initialize","params":{"clientName":"c"}}"#,
        )
        .await;
    let raw = client
        .raw_response_within(&json!("init-1"), DEADLINE, "initialize with string id")
        .await;
    // The harness already asserts the server never sends "jsonrpc".
    assert_eq!(raw["id"], "init-1");
    assert!(raw["result"]["sessionId"].is_string(), "{raw}");
}

#[tokio::test]
async fn unknown_method_is_method_not_found() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client.request("process/teleport", json!({})).await,
        -32601,
        "methodNotFound",
    );
}

/// Clients of the reference protocol add fields over time: unknown top-level params fields are
/// ignored (logged at debug), never an error. (Unknown keys inside `sandbox` still are:
/// `sandboxed.rs`.)
#[tokio::test]
async fn unknown_param_fields_are_tolerated() {
    let server = server();
    let mut client = server.client().await;
    let metadata = client
        .call(
            "fs/getMetadata",
            json!({"path": "file:///", "recursiv": true}),
        )
        .await;
    assert_eq!(metadata["isDirectory"], json!(true));
    let started = client
        .call(
            "process/start",
            json!({"processId": "p", "argv": ["/bin/true"], "cwd": "file:///",
                   "envPolicy": null, "fromANewerClient": [1, 2]}),
        )
        .await;
    assert_eq!(started, json!({"processId": "p"}));
    let read = client
        .call("process/read", json!({"processId": "p", "extra": "x"}))
        .await;
    assert!(read["nextSeq"].is_u64(), "{read}");
}

#[tokio::test]
async fn missing_params_are_invalid_params() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client.request("fs/getMetadata", json!({})).await,
        -32602,
        "invalidParams",
    );
}

#[tokio::test]
async fn native_path_is_invalid_path_with_a_message_showing_the_uri() {
    let server = server();
    let mut client = server.client().await;
    let error = assert_rpc_error(
        client
            .request("fs/getMetadata", json!({"path": "/tmp"}))
            .await,
        -32602,
        "invalidPath",
    );
    assert!(
        error.message.contains("file:///tmp"),
        "message should show the URI to send: {}",
        error.message
    );
}

#[tokio::test]
async fn relative_hosted_and_malformed_uris_are_invalid_path() {
    let server = server();
    let mut client = server.client().await;
    for path in [
        "tmp/x",
        "file:tmp",
        "file://example.com/tmp",
        "file:///tmp?x=1",
        "file:///tmp#frag",
        "file:///tmp/%zz",
        "file:///tmp/a%00b",
        "http://localhost/tmp",
    ] {
        let result = client
            .request("fs/getMetadata", json!({"path": path}))
            .await;
        assert_rpc_error(result, -32602, "invalidPath");
    }
    // The accepted spellings.
    for path in ["file:///", "file://localhost/", "file:/"] {
        let metadata = client
            .request("fs/getMetadata", json!({"path": path}))
            .await
            .unwrap_or_else(|e| panic!("{path} should be accepted: {e:?}"));
        assert_eq!(metadata["isDirectory"], true);
    }
}

#[tokio::test]
async fn requests_on_one_connection_are_served_concurrently() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("sleeper", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    let read = client
        .send_request(
            "process/read",
            json!({"processId": "sleeper", "afterSeq": 0, "waitMs": 10000}),
        )
        .await;
    let metadata = client
        .send_request("fs/getMetadata", json!({"path": "file:///"}))
        .await;
    // The getMetadata response must arrive while the long poll is still pending.
    let first = loop {
        let message = client
            .next_message(Duration::from_secs(5))
            .await
            .expect("the fs/getMetadata response within 5 s");
        if let Some(id) = message.get("id") {
            break id.clone();
        }
    };
    assert_eq!(
        first, metadata,
        "fs/getMetadata was delayed behind the process/read long poll"
    );
    // Ending the process ends the long poll early.
    client
        .call("process/terminate", json!({"processId": "sleeper"}))
        .await;
    let result = client.response(&read).await.unwrap();
    assert_eq!(
        result["exited"], true,
        "long poll should end with the exit: {result}"
    );
}
