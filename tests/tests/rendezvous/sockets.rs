//! Silent sockets and one credential's share of sockets.

use pretty_assertions::assert_eq;

use super::*;

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
