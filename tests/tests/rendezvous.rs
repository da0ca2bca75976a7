//! The reference rendezvous's HTTP endpoints as a client sees them, against the real
//! `exec-rendezvous` binary: bearer-token auth, registration, lookup, the websocket endpoints'
//! refusals, and malformed input. Raw HTTP/1.1, so every status and body is checked as sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tests::DEADLINE;
use tests::relay::{TOKEN, start_rendezvous};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A response: status code and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Send one request (`token` as `Authorization: Bearer`, `extra` headers verbatim) and read the
/// whole response (the rendezvous closes after each), or only the head of a `101` upgrade.
async fn http(
    registry: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[&str],
    body: &str,
) -> Answer {
    let address = registry.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    for header in extra {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let read = async {
        let mut response = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap();
            response.extend_from_slice(&chunk[..n]);
            let upgraded = response.starts_with(b"HTTP/1.1 101 ")
                && response.windows(4).any(|w| w == b"\r\n\r\n");
            if n == 0 || upgraded {
                return response;
            }
        }
    };
    let response = tokio::time::timeout(DEADLINE, read)
        .await
        .expect("response deadline");
    let text = String::from_utf8(response).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Answer {
        status,
        body: body.to_owned(),
    }
}

fn public_key(fill: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([fill; 32])
}

const UPGRADE: [&str; 4] = [
    "Connection: Upgrade",
    "Upgrade: websocket",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
];

#[tokio::test]
async fn a_missing_or_wrong_bearer_token_is_refused_with_401_on_every_endpoint() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let register = json!({"name": "n", "publicKey": public_key(1)}).to_string();
    for token in [
        None,
        Some("wrong"),
        Some(""),
        Some("relay-test-token-but-longer"),
    ] {
        for (method, path, extra, body) in [
            ("POST", "/v1/environments/env-a", &[][..], register.as_str()),
            ("POST", "/v1/environments/env-a/connect", &[][..], ""),
            ("GET", "/v1/environments/env-a/executor", &UPGRADE[..], ""),
            ("GET", "/v1/environments/env-a/harness", &UPGRADE[..], ""),
            ("GET", "/no/such/endpoint", &[][..], ""),
        ] {
            let answer = http(registry, method, path, token, extra, body).await;
            assert_eq!(
                (answer.status, answer.body.as_str()),
                (401, "missing or wrong bearer token\n"),
                "{method} {path} with token {token:?}"
            );
        }
    }
    // Nothing was registered by the refused calls.
    let lookup = http(
        registry,
        "POST",
        "/v1/environments/env-a/connect",
        Some(TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(lookup.status, 404);
}

#[tokio::test]
async fn readyz_answers_without_a_token() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let answer = http(&rendezvous.first_line, "GET", "/readyz", None, &[], "").await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "ready\n"));
}

#[tokio::test]
async fn an_unknown_environment_is_404_for_lookups_and_sockets() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let lookup = http(
        registry,
        "POST",
        "/v1/environments/nobody/connect",
        Some(TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(
        (lookup.status, lookup.body.as_str()),
        (404, "environment not registered\n")
    );
    for socket in ["executor", "harness"] {
        let answer = http(
            registry,
            "GET",
            &format!("/v1/environments/nobody/{socket}"),
            Some(TOKEN),
            &UPGRADE,
            "",
        )
        .await;
        assert_eq!(answer.status, 404, "{socket}: {answer:?}");
    }
    let unknown = http(registry, "GET", "/v2/anything", Some(TOKEN), &[], "").await;
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (404, "no such endpoint\n")
    );
}

#[tokio::test]
async fn register_then_connect_hands_out_the_socket_urls_and_the_latest_key() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let ws_base = registry.replacen("http://", "ws://", 1);
    let registered = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(TOKEN),
        &[],
        &json!({"name": "my laptop", "publicKey": public_key(1)}).to_string(),
    )
    .await;
    assert_eq!(registered.status, 200, "{registered:?}");
    assert_eq!(
        registered.json(),
        json!({"rendezvousUrl": format!("{ws_base}/v1/environments/env.http_1/executor")})
    );
    let looked_up = http(
        registry,
        "POST",
        "/v1/environments/env.http_1/connect",
        Some(TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(looked_up.status, 200, "{looked_up:?}");
    assert_eq!(
        looked_up.json(),
        json!({
            "rendezvousUrl": format!("{ws_base}/v1/environments/env.http_1/harness"),
            "publicKey": public_key(1),
            "name": "my laptop",
        })
    );
    // A re-registration (an executor restarted with a new key) wins.
    let again = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(TOKEN),
        &[],
        &json!({"name": "renamed", "publicKey": public_key(2)}).to_string(),
    )
    .await;
    assert_eq!(again.status, 200);
    // The library's registry client reads the same answer.
    let info = supervisor::relay::registry::connect(registry, "env.http_1", TOKEN)
        .await
        .unwrap();
    assert_eq!(
        (info.name.as_str(), info.public_key_bytes().unwrap()),
        ("renamed", vec![2u8; 32])
    );
    // A registered environment's harness endpoint upgrades.
    let upgraded = http(
        registry,
        "GET",
        "/v1/environments/env.http_1/harness",
        Some(TOKEN),
        &UPGRADE,
        "",
    )
    .await;
    assert_eq!(upgraded.status, 101, "{upgraded:?}");
}

#[tokio::test]
async fn malformed_registrations_and_ids_are_400_and_register_nothing() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let short_key = base64::engine::general_purpose::STANDARD.encode([1u8; 31]);
    let long_name = "n".repeat(257);
    for (body, expect) in [
        ("not json".to_owned(), "body must be"),
        (json!({"name": "n"}).to_string(), "body must be"),
        (
            json!({"name": "n", "publicKey": public_key(1), "extra": 1}).to_string(),
            "unknown field",
        ),
        (
            json!({"name": "n", "publicKey": "%%%"}).to_string(),
            "publicKey must be base64",
        ),
        (
            json!({"name": "n", "publicKey": short_key}).to_string(),
            "publicKey must be 32 bytes (got 31)",
        ),
        (
            json!({"name": long_name, "publicKey": public_key(1)}).to_string(),
            "name must be at most 256 bytes",
        ),
    ] {
        let answer = http(
            registry,
            "POST",
            "/v1/environments/env-bad",
            Some(TOKEN),
            &[],
            &body,
        )
        .await;
        assert_eq!(answer.status, 400, "{body}: {answer:?}");
        assert!(answer.body.contains(expect), "{body}: {answer:?}");
    }
    let lookup = http(
        registry,
        "POST",
        "/v1/environments/env-bad/connect",
        Some(TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(lookup.status, 404, "a refused registration registered");
    let bad_id = http(
        registry,
        "POST",
        "/v1/environments/bad%20id/connect",
        Some(TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(bad_id.status, 400, "{bad_id:?}");
    assert!(bad_id.body.contains("environment id must be"), "{bad_id:?}");
    // Refused on the announced length (the later header wins), before any body is read.
    let oversized = http(
        registry,
        "POST",
        "/v1/environments/env-big",
        Some(TOKEN),
        &["Content-Length: 17408"],
        "",
    )
    .await;
    assert_eq!(oversized.status, 400, "{oversized:?}");
}
