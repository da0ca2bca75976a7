//! The reference rendezvous's HTTP endpoints as a client sees them, against the real
//! `exec-rendezvous` binary: bearer-token auth, registration, lookup, the websocket endpoints'
//! refusals, and malformed input. Raw HTTP/1.1, so every status and body is checked as sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tests::DEADLINE;
use tests::relay::{ADMIN_TOKEN, EXECUTOR_TOKEN, TOKEN, start_rendezvous, start_rendezvous_with};
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
/// whole response (`Connection: close`), or only the head of a `101` upgrade.
async fn http(
    registry: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[&str],
    body: &str,
) -> Answer {
    http_keep(registry, method, path, token, extra, body)
        .await
        .0
}

/// [`http`], keeping the connection (an upgraded websocket stays open while it is held).
async fn http_keep(
    registry: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[&str],
    body: &str,
) -> (Answer, tokio::net::TcpStream) {
    let address = registry.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !extra.iter().any(|h| h.starts_with("Connection:")) {
        head.push_str("Connection: close\r\n");
    }
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
    // Lossy: after a 101, the executor socket's key challenge (binary) may follow in the same
    // read.
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let answer = Answer {
        status,
        body: body.to_owned(),
    };
    (answer, stream)
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
    for (socket, token) in [("executor", EXECUTOR_TOKEN), ("harness", TOKEN)] {
        let answer = http(
            registry,
            "GET",
            &format!("/v1/environments/nobody/{socket}"),
            Some(token),
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
async fn register_then_connect_hands_out_the_socket_urls_and_the_bound_key() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let ws_base = registry.replacen("http://", "ws://", 1);
    let registered = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(EXECUTOR_TOKEN),
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
    // A re-registration with the same key (an executor reconnecting) may rename it.
    let again = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(EXECUTOR_TOKEN),
        &[],
        &json!({"name": "renamed", "publicKey": public_key(1)}).to_string(),
    )
    .await;
    assert_eq!(again.status, 200, "{again:?}");
    // Another key is refused while the binding stands, and changes nothing.
    let other_key = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(EXECUTOR_TOKEN),
        &[],
        &json!({"name": "impostor", "publicKey": public_key(2)}).to_string(),
    )
    .await;
    assert_eq!(other_key.status, 409, "{other_key:?}");
    assert!(
        other_key.body.contains("bound to another public key"),
        "{other_key:?}"
    );
    // The library's registry client reads the same answer.
    let client = tests::relay::registry_client(registry, None);
    let info = client.connect("env.http_1", TOKEN).await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.public_key_bytes().unwrap()),
        ("renamed", vec![1u8; 32])
    );
    // Only an admin credential releases the binding; then a new key may register.
    for token in [TOKEN, EXECUTOR_TOKEN] {
        let refused = http(
            registry,
            "DELETE",
            "/v1/environments/env.http_1",
            Some(token),
            &[],
            "",
        )
        .await;
        assert_eq!(refused.status, 403, "{refused:?}");
    }
    let released = http(
        registry,
        "DELETE",
        "/v1/environments/env.http_1",
        Some(ADMIN_TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(released.status, 200, "{released:?}");
    let rebound = http(
        registry,
        "POST",
        "/v1/environments/env.http_1",
        Some(EXECUTOR_TOKEN),
        &[],
        &json!({"name": "rotated", "publicKey": public_key(2)}).to_string(),
    )
    .await;
    assert_eq!(rebound.status, 200, "{rebound:?}");
    let info = client.connect("env.http_1", TOKEN).await.unwrap();
    assert_eq!(info.public_key_bytes().unwrap(), vec![2u8; 32]);
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
            Some(EXECUTOR_TOKEN),
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
        Some(EXECUTOR_TOKEN),
        &[],
        &"x".repeat(17 * 1024),
    )
    .await;
    assert_eq!(oversized.status, 413, "{oversized:?}");
}

#[tokio::test]
async fn each_credential_may_do_only_what_its_role_allows() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let register = json!({"name": "n", "publicKey": public_key(1)}).to_string();
    // A harness credential can never register, nor open an executor socket.
    let by_harness = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(by_harness.status, 403, "{by_harness:?}");
    assert!(
        by_harness.body.contains("needs an executor credential"),
        "{by_harness:?}"
    );
    // An executor credential registers; it is not a harness credential.
    let by_executor = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(EXECUTOR_TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(by_executor.status, 200, "{by_executor:?}");
    let socket = http(
        registry,
        "GET",
        "/v1/environments/env-a/executor",
        Some(TOKEN),
        &UPGRADE,
        "",
    )
    .await;
    assert_eq!(socket.status, 403, "{socket:?}");
    let lookup = http(
        registry,
        "POST",
        "/v1/environments/env-a/connect",
        Some(EXECUTOR_TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(lookup.status, 403, "{lookup:?}");
    // A credential granted one environment is refused another.
    let narrow = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(tests::relay::NARROW_EXECUTOR_TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(narrow.status, 403, "{narrow:?}");
    assert!(narrow.body.contains("not granted"), "{narrow:?}");
}

#[tokio::test]
async fn sighup_rereads_the_credentials_file() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let path = rendezvous
        .dir
        .as_ref()
        .unwrap()
        .path()
        .join("credentials.toml");
    let new_token = "relay-test-rotated-harness";
    let lookup = |token: &'static str| {
        let registry = registry.clone();
        async move {
            http(
                &registry,
                "POST",
                "/v1/environments/x/connect",
                Some(token),
                &[],
                "",
            )
            .await
            .status
        }
    };
    assert_eq!(lookup(new_token).await, 401);
    std::fs::write(
        &path,
        tests::relay::credentials_toml().replace(TOKEN, new_token),
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rendezvous.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let until = tokio::time::Instant::now() + DEADLINE;
    while lookup(new_token).await != 404 {
        assert!(
            tokio::time::Instant::now() < until,
            "SIGHUP did not reload:\n{}",
            rendezvous.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(TOKEN).await, 401, "the replaced token still works");
    // A broken file is refused and the credentials in force stay.
    std::fs::write(&path, "not toml [").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rendezvous.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let until = tokio::time::Instant::now() + DEADLINE;
    while !rendezvous.stderr().contains("credentials not reloaded") {
        assert!(
            tokio::time::Instant::now() < until,
            "{}",
            rendezvous.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(new_token).await, 404);
}

/// `MAX_RENDEZVOUS_CONNECTIONS`: sockets the rendezvous holds at once.
const MAX_RENDEZVOUS_CONNECTIONS: usize = 4096;
/// `MAX_PENDING_CONNECTIONS`: connections without a valid token yet (the admission pool).
const MAX_PENDING_CONNECTIONS: usize = 256;

#[tokio::test]
async fn silent_sockets_cannot_lock_out_token_holders() {
    // The number that locked every executor and harness out before: more silent sockets than
    // the rendezvous holds at all.
    const SILENT: usize = 4200;
    const { assert!(SILENT > MAX_RENDEZVOUS_CONNECTIONS) };
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let address = registry.trim_start_matches("http://").to_owned();
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    // While they stay connected, a token holder is answered at once, again and again.
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let lookup = http(
            registry,
            "POST",
            "/v1/environments/nobody/connect",
            Some(TOKEN),
            &[],
            "",
        )
        .await;
        assert_eq!(lookup.status, 404, "{lookup:?}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "a token holder waited {:?} behind silent sockets",
            started.elapsed()
        );
    }
    // The rendezvous holds at most the pending pool of them; the rest were closed, oldest first.
    let closed = tests::siege::closed_by_peer(&mut silent).await;
    assert!(
        closed >= SILENT - MAX_PENDING_CONNECTIONS - 5,
        "only {closed} of {SILENT} silent sockets were closed"
    );
}

/// Open a websocket upgrade on `path` with `token` and keep the connection: the status, the
/// body of a refusal, and the stream.
async fn hold_socket(
    registry: &str,
    path: &str,
    token: &str,
) -> (u16, String, tokio::net::TcpStream) {
    let (answer, stream) = http_keep(registry, "GET", path, Some(token), &UPGRADE, "").await;
    (answer.status, answer.body, stream)
}

/// One credential cannot take every socket: past `--max-sockets-per-credential` its next
/// websocket is refused with 503 naming the limit, another credential still gets one, and a
/// closed socket frees its place.
#[tokio::test]
async fn one_credential_holds_at_most_its_share_of_sockets() {
    let rendezvous =
        start_rendezvous_with("127.0.0.1:0", None, &["--max-sockets-per-credential", "2"]);
    let registry = &rendezvous.first_line;
    for (id, token) in [
        ("env-cap", EXECUTOR_TOKEN),
        ("env-narrow", tests::relay::NARROW_EXECUTOR_TOKEN),
    ] {
        let register = json!({"name": id, "publicKey": public_key(1)}).to_string();
        let path = format!("/v1/environments/{id}");
        let registered = http(registry, "POST", &path, Some(token), &[], &register).await;
        assert_eq!(registered.status, 200, "{registered:?}");
    }
    let executor = "/v1/environments/env-cap/executor";
    let harness = "/v1/environments/env-cap/harness";
    let (status, text, _executor) = hold_socket(registry, executor, EXECUTOR_TOKEN).await;
    assert_eq!(status, 101, "{text}");
    let (first, text, first_socket) = hold_socket(registry, harness, TOKEN).await;
    assert_eq!(first, 101, "{text}");
    let (second, text, _second_socket) = hold_socket(registry, harness, TOKEN).await;
    assert_eq!(second, 101, "{text}");
    let (third, text, _) = hold_socket(registry, harness, TOKEN).await;
    assert_eq!(third, 503, "{text}");
    assert!(text.contains("at most 2"), "{text}");
    // Another credential is not held back by the first one's sockets.
    let (other, text, _other_socket) = hold_socket(
        registry,
        "/v1/environments/env-narrow/executor",
        tests::relay::NARROW_EXECUTOR_TOKEN,
    )
    .await;
    assert_eq!(other, 101, "{text}");
    // Closing a socket gives its place back (once the rendezvous has seen the close).
    drop(first_socket);
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (status, text, socket) = hold_socket(registry, harness, TOKEN).await;
        if status == 101 {
            drop(socket);
            break;
        }
        assert_eq!(status, 503, "{text}");
        assert!(
            std::time::Instant::now() < until,
            "a closed socket never gave its place back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await; // polling interval
    }
}
