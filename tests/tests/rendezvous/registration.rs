//! Registering, connecting and malformed registrations.

use pretty_assertions::assert_eq;

use super::*;

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
