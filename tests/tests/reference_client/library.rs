//! The library client: `environment_info()`, `http_request()`, `http_request_stream()` and
//! `write()`, and the request and delta size limits.

use super::*;

#[tokio::test]
async fn library_client_environment_info_matches_the_wire_answer() {
    let server = server();
    let client = library_client(server.url()).await;
    let info = client.environment_info().await.unwrap();
    let mut raw = server.client().await;
    let wire: proto::methods::environment::EnvironmentInfo =
        serde_json::from_value(raw.call("environment/info", Value::Null).await).unwrap();
    assert_eq!(info, wire);
    assert!(info.sandbox.is_some_and(|sandbox| sandbox.available));
}

#[tokio::test]
async fn library_client_http_request_buffered_and_streamed() {
    let upstream = Upstream::start().await;
    let server = server();
    let client = library_client(server.url()).await;
    let response = client
        .http_request(
            supervisor::HttpRequest::new("PUT", upstream.url("/echo"))
                .header("x-a", "1")
                .header("x-a", "2")
                .body(b"bytes".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let echoed: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(echoed["method"], "PUT");
    assert_eq!(unb64(echoed["bodyBase64"].as_str().unwrap()), b"bytes");
    assert!(
        echoed["headers"]
            .as_array()
            .unwrap()
            .contains(&json!(["x-a", "2"]))
    );

    let mut stream = client
        .http_request_stream(supervisor::HttpRequest::new("GET", upstream.url("/gated")))
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let first = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .expect("the first chunk while the upstream still holds the rest")
        .unwrap()
        .unwrap();
    assert_eq!(first, b"part-1\n");
    upstream.open_gate();
    let rest = tokio::time::timeout(DEADLINE, stream.body.read_to_end())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, b"part-2\npart-3\npart-4\npart-5\n");

    let refused = client
        .http_request(supervisor::HttpRequest::new(
            "GET",
            "http://169.254.169.254/",
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.rpc_code(), Some(-32600));
    assert_eq!(
        refused.rpc_kind(),
        Some(proto::error::ErrorKind::SandboxDenied)
    );

    let timed_out = client
        .http_request(
            supervisor::HttpRequest::new("GET", upstream.url("/hang"))
                .timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        timed_out.rpc_kind(),
        Some(proto::error::ErrorKind::TimedOut)
    );
}

#[tokio::test]
async fn library_client_body_stream_fails_when_its_connection_is_lost() {
    let upstream = Upstream::start().await;
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let mut stream = client
        .http_request_stream(supervisor::HttpRequest::new("GET", upstream.url("/gated")))
        .await
        .unwrap();
    let first = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, b"part-1\n");
    proxy.cut();
    let end = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .expect("the body ends when its connection is lost")
        .expect("an error, not a clean end");
    assert!(
        matches!(
            end,
            Err(supervisor::ExecServerError::StreamInterrupted { .. })
        ),
        "{end:?}"
    );
    assert!(stream.body.next().await.is_none());
    // The client recovered; the next request works on the new connection.
    upstream.open_gate();
    let again = client
        .http_request(supervisor::HttpRequest::new("GET", upstream.url("/echo")))
        .await
        .unwrap();
    assert_eq!(again.status, 200);
}

#[tokio::test]
async fn library_client_write_reports_a_closed_stdin() {
    let server = server();
    let client = library_client(server.url()).await;
    let handle = client
        .start_process(tests::start_params("sleeper", &["/bin/sleep", "30"]))
        .await
        .unwrap();
    let error = handle.process().write(b"x").await.unwrap_err();
    assert_eq!(
        error,
        supervisor::ExecServerError::WriteNotAccepted {
            process_id: "sleeper".into(),
            status: proto::methods::process::WriteStatus::StdinClosed,
        }
    );
    handle.process().terminate().await.unwrap();
}

#[tokio::test]
async fn a_request_body_of_max_http_request_body_bytes_is_sent_and_one_more_byte_is_refused() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let at_limit = client
        .call(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/length"), "requestId": "at",
                   "bodyBase64": b64(vec![b'b'; MAX_HTTP_REQUEST_BODY_BYTES])}),
        )
        .await;
    assert_eq!(at_limit["status"], json!(200), "{at_limit}");
    assert_eq!(
        unb64(at_limit["bodyBase64"].as_str().unwrap()),
        MAX_HTTP_REQUEST_BODY_BYTES.to_string().as_bytes()
    );
    let over = client
        .request(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/length"), "requestId": "over",
                   "bodyBase64": b64(vec![b'b'; MAX_HTTP_REQUEST_BODY_BYTES + 1])}),
        )
        .await;
    let error = assert_rpc_error(over, -32600, "limitExceeded");
    assert!(
        error.message.contains("request body")
            && error.message.contains("MAX_HTTP_REQUEST_BODY_BYTES"),
        "{error:?}"
    );
    // The connection keeps serving.
    client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "after"}),
        )
        .await;
}

#[tokio::test]
async fn streamed_deltas_carry_at_most_http_body_delta_bytes_each() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/megabyte"), "requestId": "mb",
                   "streamResponse": true}),
        )
        .await;
    let messages = response_and_deltas(&mut client, &id, "mb").await;
    let mut body = Vec::new();
    let mut largest = 0;
    for delta in messages
        .iter()
        .filter(|m| m["method"] == "http/request/bodyDelta")
    {
        let bytes = unb64(delta["params"]["deltaBase64"].as_str().unwrap());
        assert!(
            bytes.len() <= HTTP_BODY_DELTA_BYTES,
            "a delta of {} bytes (seq {})",
            bytes.len(),
            delta["params"]["seq"]
        );
        largest = largest.max(bytes.len());
        body.extend(bytes);
    }
    assert_eq!(body, megabyte().await, "the deltas reassemble the body");
    assert!(largest > 0, "no delta carried any body");
}
