//! Tokens on every endpoint, `/readyz` without one, unknown environments.

use pretty_assertions::assert_eq;

use super::*;

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
