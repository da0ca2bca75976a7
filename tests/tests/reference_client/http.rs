//! `http/request`, buffered and streamed, against the local upstream of the parent module.

use super::*;

#[tokio::test]
async fn buffered_http_request_keeps_method_body_header_order_and_repeats() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let result = client
        .call(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/echo"),
                   "headers": [{"name": "X-A", "value": "1"}, {"name": "x-b", "value": "2"},
                               {"name": "x-a", "value": "3"}],
                   "bodyBase64": b64("payload"), "timeoutMs": null, "requestId": "buffered",
                   "streamResponse": false}),
        )
        .await;
    assert_eq!(result["status"], json!(200));
    let multi: Vec<&Value> = result["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "x-multi")
        .map(|h| &h["value"])
        .collect();
    assert_eq!(multi, [&json!("one"), &json!("two")]);
    let echoed: Value =
        serde_json::from_slice(&unb64(result["bodyBase64"].as_str().unwrap())).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(unb64(echoed["bodyBase64"].as_str().unwrap()), b"payload");
    let sent_a: Vec<&Value> = echoed["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "x-a")
        .map(|h| &h[1])
        .collect();
    assert_eq!(sent_a, [&json!("1"), &json!("3")]);
    assert!(
        echoed["headers"]
            .as_array()
            .unwrap()
            .contains(&json!(["x-b", "2"])),
        "{echoed}"
    );

    // Redirects are followed (and checked hop by hop).
    let redirected = client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/redirect"), "requestId": "r"}),
        )
        .await;
    assert_eq!(redirected["status"], json!(200));
    let echoed: Value =
        serde_json::from_slice(&unb64(redirected["bodyBase64"].as_str().unwrap())).unwrap();
    assert_eq!(echoed["method"], "GET");
    // ... unless redirectPolicy says stop: the redirect itself is the answer.
    let stopped = client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/redirect"), "requestId": "r",
                   "redirectPolicy": "stop"}),
        )
        .await;
    assert_eq!(stopped["status"], json!(302));
    assert!(
        stopped["headers"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "location", "value": "/echo"})),
        "{stopped}"
    );

    let big = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/big"), "requestId": "big"}),
        )
        .await;
    let error = assert_rpc_error(big, -32600, "limitExceeded");
    assert!(error.message.contains("streamResponse"), "{error:?}");
}

#[tokio::test]
async fn streamed_http_request_answers_first_then_sends_ordered_deltas_until_done() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "s1",
                   "streamResponse": true}),
        )
        .await;
    // The answer and the first part arrive while the upstream body is still open.
    let first = client.next_message(DEADLINE).await.expect("the answer");
    assert_eq!(
        first["id"], id,
        "the answer comes before any delta: {first}"
    );
    assert_eq!(first["result"]["status"], json!(200));
    assert_eq!(first["result"]["bodyBase64"], json!(""));
    assert!(
        first["result"]["headers"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "content-type", "value": "text/event-stream"})),
        "{first}"
    );
    let delta = client
        .wait_for_notification("the first delta", DEADLINE, |n| {
            n["method"] == "http/request/bodyDelta"
        })
        .await;
    assert_eq!(delta["params"]["seq"], json!(1));
    assert_eq!(delta["params"]["done"], json!(false));
    assert_eq!(delta["params"]["error"], Value::Null);
    assert_eq!(
        unb64(delta["params"]["deltaBase64"].as_str().unwrap()),
        b"part-1\n"
    );

    upstream.open_gate();
    let rest = response_and_deltas(&mut client, &id, "s1").await;
    let mut body = b"part-1\n".to_vec();
    for (index, delta) in rest.iter().enumerate() {
        assert_eq!(delta["method"], "http/request/bodyDelta", "{delta}");
        assert_eq!(delta["params"]["seq"], json!(index + 2), "{rest:?}");
        assert_eq!(delta["params"]["error"], Value::Null, "{delta}");
        body.extend(unb64(delta["params"]["deltaBase64"].as_str().unwrap()));
    }
    let last = rest.last().unwrap();
    assert_eq!(last["params"]["done"], json!(true));
    assert!(
        rest[..rest.len() - 1]
            .iter()
            .all(|delta| delta["params"]["done"] == json!(false))
    );
    assert_eq!(body, b"part-1\npart-2\npart-3\npart-4\npart-5\n");
}

#[tokio::test]
async fn a_second_active_stream_with_the_same_request_id_is_invalid_params() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let stream = json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "dup",
                        "streamResponse": true});
    let id = client.send_request("http/request", stream.clone()).await;
    client.response(&id).await.unwrap();
    let second = client.request("http/request", stream.clone()).await;
    let error = assert_rpc_error(second, -32602, "invalidParams");
    // The reference's words exactly (its tests compare the message).
    assert_eq!(
        error.message,
        "http/request streamResponse requestId `dup` is already active"
    );
    // Buffered requests do not reserve their id.
    client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "dup"}),
        )
        .await;
    upstream.open_gate();
    response_and_deltas(&mut client, &id, "dup").await;
    // Once the first stream is done the id is free again.
    let again = client.send_request("http/request", stream).await;
    response_and_deltas(&mut client, &again, "dup").await;
}

#[tokio::test]
async fn timeout_ms_ends_a_hanging_request_and_a_hanging_body() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let hung = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/hang"), "requestId": "h",
                   "timeoutMs": 300}),
        )
        .await;
    let error = assert_rpc_error(hung, -32603, "timedOut");
    // The reference's tests check this prefix.
    assert!(
        error.message.starts_with("http/request failed: ") && error.message.contains("300"),
        "{error:?}"
    );

    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/hang-body"), "requestId": "hb",
                   "timeoutMs": 300, "streamResponse": true}),
        )
        .await;
    let seen = response_and_deltas(&mut client, &id, "hb").await;
    assert_eq!(seen[0]["result"]["status"], json!(200), "{seen:?}");
    let last = seen.last().unwrap();
    assert_eq!(last["params"]["done"], json!(true));
    assert!(
        last["params"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out")),
        "{last}"
    );
    let bytes: Vec<u8> = seen[1..]
        .iter()
        .flat_map(|delta| unb64(delta["params"]["deltaBase64"].as_str().unwrap()))
        .collect();
    assert_eq!(bytes, b"first");
    upstream.wait_dropped(1).await;
}

#[tokio::test]
async fn a_stream_ends_when_its_connection_ends() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "c",
                   "streamResponse": true}),
        )
        .await;
    client.response(&id).await.unwrap();
    client.close().await;
    // The server drops the upstream response: the upstream sees its body abandoned.
    upstream.wait_dropped(1).await;
    // And the request slot is free: a new connection can stream under the same id.
    let mut client = server.client().await;
    upstream.open_gate();
    let again = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "c",
                   "streamResponse": true}),
        )
        .await;
    response_and_deltas(&mut client, &again, "c").await;
}

/// `MAX_HTTP_REQUESTS_PER_CONNECTION` from docs/protocol.md.
const MAX_HTTP_REQUESTS_PER_CONNECTION: usize = 32;

#[tokio::test]
async fn requests_in_flight_are_bounded_per_connection_and_connections_are_pooled() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let mut streams = Vec::new();
    for n in 0..MAX_HTTP_REQUESTS_PER_CONNECTION {
        let request_id = format!("s{n}");
        let id = client
            .send_request(
                "http/request",
                json!({"method": "GET", "url": upstream.url("/gated"), "requestId": request_id,
                       "streamResponse": true}),
            )
            .await;
        client.response(&id).await.unwrap();
        streams.push(request_id);
    }
    let over = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "over"}),
        )
        .await;
    let error = assert_rpc_error(over, -32600, "limitExceeded");
    assert!(
        error.message.contains("MAX_HTTP_REQUESTS_PER_CONNECTION"),
        "{error:?}"
    );
    // Another connection has its own slots.
    let mut other = server.client().await;
    other
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "other"}),
        )
        .await;
    upstream.open_gate();
    let mut done = std::collections::HashSet::new();
    let until = tokio::time::Instant::now() + DEADLINE;
    while done.len() < streams.len() {
        let remaining = until.saturating_duration_since(tokio::time::Instant::now());
        let message = client.next_message(remaining).await.unwrap_or_else(|| {
            panic!(
                "only {} of {} streams done within {DEADLINE:?}",
                done.len(),
                streams.len()
            )
        });
        if message["method"] == "http/request/bodyDelta" && message["params"]["done"] == true {
            assert_eq!(message["params"]["error"], Value::Null, "{message}");
            done.insert(message["params"]["requestId"].as_str().unwrap().to_owned());
        }
    }
    // Slots are back; sequential requests to one host share a pooled connection.
    let mut peers = Vec::new();
    for n in 0..3 {
        let answer = client
            .call(
                "http/request",
                json!({"method": "GET", "url": upstream.url("/echo"), "requestId": n.to_string()}),
            )
            .await;
        let echoed: Value =
            serde_json::from_slice(&unb64(answer["bodyBase64"].as_str().unwrap())).unwrap();
        peers.push(echoed["peer"].as_str().unwrap().to_owned());
    }
    assert!(peers.windows(2).all(|pair| pair[0] == pair[1]), "{peers:?}");
}

#[tokio::test]
async fn http_request_validation_errors_are_invalid_params() {
    let server = server();
    let mut client = server.client().await;
    for (params, needle) in [
        (
            json!({"method": "GET", "url": "ftp://127.0.0.1/", "requestId": "a"}),
            "ftp",
        ),
        (
            json!({"method": "GET", "url": "not a url", "requestId": "a"}),
            "url",
        ),
        (
            json!({"method": "G E T", "url": "http://127.0.0.1/", "requestId": "a"}),
            "method",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/"}),
            "requestId",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": ""}),
            "requestId",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": "a",
                   "headers": [{"name": "bad name", "value": "x"}]}),
            "bad name",
        ),
    ] {
        let error = assert_rpc_error(
            client.request("http/request", params.clone()).await,
            -32602,
            "invalidParams",
        );
        assert!(error.message.contains(needle), "{params}: {error:?}");
    }
    let base64 = client
        .request(
            "http/request",
            json!({"method": "POST", "url": "http://127.0.0.1/", "requestId": "a",
                   "bodyBase64": "!!"}),
        )
        .await;
    assert_rpc_error(base64, -32602, "invalidBase64");
    let env_header = client
        .request(
            "http/request",
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": "a",
                   "headers": [{"name": "authorization", "value": "Bearer ",
                                "valueEnvVar": "HOME"}]}),
        )
        .await;
    let error = assert_rpc_error(env_header, -32600, "unsupported");
    assert!(error.message.contains("valueEnvVar"), "{error:?}");
}

#[tokio::test]
async fn the_servers_own_listener_and_link_local_addresses_are_refused_unless_allowed() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let own_port = server.addr().rsplit_once(':').unwrap().1.to_owned();
    for url in [
        format!("http://{}/readyz", server.addr()),
        format!("http://localhost:{own_port}/readyz"),
        format!("http://0.0.0.0:{own_port}/readyz"),
        format!("http://[::ffff:127.0.0.1]:{own_port}/readyz"),
    ] {
        let error = assert_rpc_error(
            client
                .request(
                    "http/request",
                    json!({"method": "GET", "url": url, "requestId": "own"}),
                )
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(error.message.contains("own listener"), "{url}: {error:?}");
    }
    let allowed = client
        .call(
            "http/request",
            json!({"method": "GET", "url": format!("http://{}/readyz", server.addr()),
                   "requestId": "own", "allowOwnListeners": true}),
        )
        .await;
    assert_eq!(allowed["status"], json!(200));
    assert_eq!(unb64(allowed["bodyBase64"].as_str().unwrap()), b"ok");

    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
    ] {
        let error = assert_rpc_error(
            client
                .request(
                    "http/request",
                    json!({"method": "GET", "url": url, "requestId": "meta", "timeoutMs": 2000}),
                )
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(error.message.contains("link-local"), "{url}: {error:?}");
    }

    // Loopback stays reachable for ordinary local services, also by name.
    let by_name = client
        .call(
            "http/request",
            json!({"method": "GET", "requestId": "local",
                   "url": format!("http://localhost:{}/echo", upstream.addr.port())}),
        )
        .await;
    assert_eq!(by_name["status"], json!(200));
}

#[tokio::test]
async fn a_sandbox_with_the_network_off_refuses_http_request() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let request = |sandbox: Value| {
        json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "s",
               "sandbox": sandbox})
    };
    for sandbox in [
        json!({"profile": "read-only"}),
        json!({"type": "read-only", "network_access": false}),
    ] {
        let error = assert_rpc_error(
            client
                .request("http/request", request(sandbox.clone()))
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(
            error.message.contains("network off"),
            "{sandbox}: {error:?}"
        );
    }
    let on = client
        .call(
            "http/request",
            request(json!({"profile": "read-only", "networkAccess": true})),
        )
        .await;
    assert_eq!(on["status"], json!(200));
    let unknown = client
        .request(
            "http/request",
            request(json!({"profile": "read-only", "bogus": 1})),
        )
        .await;
    assert_rpc_error(unknown, -32602, "invalidParams");
}

/// An HTTPS server on 127.0.0.1:0 for `localhost`, with a certificate from a fresh test CA
/// written to `dir/ca.pem`. Answers every request with `hello over tls`.
async fn tls_upstream(dir: &Path) -> SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &*ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key.into())
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tls.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = b"hello over tls";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.write_all(body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_requests_verify_the_server_against_the_trust_roots() {
    let dir = tempfile::tempdir().unwrap();
    let addr = tls_upstream(dir.path()).await;
    let url = format!("https://localhost:{}/", addr.port());
    let request = json!({"method": "GET", "url": url, "requestId": "tls"});

    let trusting = ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env("SSL_CERT_FILE", dir.path().join("ca.pem"));
    });
    let mut client = trusting.client().await;
    let answer = client.call("http/request", request.clone()).await;
    assert_eq!(answer["status"], json!(200));
    assert_eq!(
        unb64(answer["bodyBase64"].as_str().unwrap()),
        b"hello over tls"
    );

    // A server that does not trust the test CA refuses the certificate.
    let other = tempfile::tempdir().unwrap();
    let elsewhere = tls_upstream(other.path()).await;
    let untrusted = client
        .request(
            "http/request",
            json!({"method": "GET", "requestId": "tls",
                   "url": format!("https://localhost:{}/", elsewhere.port())}),
        )
        .await;
    let error = assert_rpc_error(untrusted, -32603, "io");
    assert!(error.message.contains("certificate"), "{error:?}");
}
