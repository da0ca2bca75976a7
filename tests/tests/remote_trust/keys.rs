//! Credentials by role, the key binding, a persistent executor key and a pinned harness.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_harness_credential_cannot_register_or_replace_an_environment() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let _executor = start_executor(&registry, "env-owned").await;
    let client = registry_client(&registry, None);
    let real_key = client.connect("env-owned", TOKEN).await.unwrap().public_key;
    let attacker = proto::relay::noise::StaticKeypair::generate().unwrap();
    let takeover = supervisor::relay::registry::RegisterRequest {
        name: "attacker".into(),
        public_key: b64(attacker.public()),
    };
    // With the shared harness credential: 403, for registering and for the executor socket.
    let refused = client
        .register("env-owned", &takeover, TOKEN)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("403"), "{refused}");
    let socket_url =
        registry.replacen("http://", "ws://", 1) + "/v1/environments/env-owned/executor";
    let tls = client_tls(&registry, None);
    let socket = supervisor::relay::driver::connect_socket(&socket_url, TOKEN, &tls)
        .await
        .err()
        .unwrap();
    assert!(socket.to_string().contains("403"), "{socket}");
    // Even an executor credential cannot replace the key the id is bound to: 409.
    let conflict = client
        .register("env-owned", &takeover, EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert!(conflict.to_string().contains("409"), "{conflict}");
    // The real executor keeps serving, under its own key.
    assert_eq!(
        client.connect("env-owned", TOKEN).await.unwrap().public_key,
        real_key
    );
    let mut harness = RemoteClient::connect(&registry, "env-owned").await;
    run_true(&mut harness, "still-mine").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_executor_keeps_its_key_and_another_key_is_refused() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let first = start_executor_with(&registry, "env-persist", &identity, &[]);
    wait_registered(&registry, "env-persist", &first).await;
    let client = registry_client(&registry, None);
    let key = client
        .connect("env-persist", TOKEN)
        .await
        .unwrap()
        .public_key;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&identity).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let text = std::fs::read_to_string(&identity).unwrap();
    assert!(
        !first.stderr().contains(
            text.lines()
                .find(|l| l.starts_with("private_key"))
                .unwrap()
                .split('"')
                .nth(1)
                .unwrap()
        ),
        "the private key was logged"
    );
    assert!(
        first.stderr().contains(&key),
        "the public key is not logged for pinning"
    );
    drop(first);
    // Same identity: registers again under the same key, and serves.
    let second = start_executor_with(&registry, "env-persist", &identity, &[]);
    wait_stderr(&second, "registered").await;
    assert_eq!(
        client
            .connect("env-persist", TOKEN)
            .await
            .unwrap()
            .public_key,
        key
    );
    let mut harness = RemoteClient::connect(&registry, "env-persist").await;
    run_true(&mut harness, "after-restart").await;
    // Another identity for the same id is refused while the binding stands.
    let other = dir.path().join("other-identity");
    let impostor = start_executor_with(&registry, "env-persist", &other, &[]);
    wait_stderr(&impostor, "bound to another public key").await;
    assert_eq!(
        client
            .connect("env-persist", TOKEN)
            .await
            .unwrap()
            .public_key,
        key
    );
    run_true(&mut harness, "still-served").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_harness_refuses_a_wrong_executor_key() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let _executor = start_executor(&registry, "env-pin").await;
    let key = registry_client(&registry, None)
        .connect("env-pin", TOKEN)
        .await
        .unwrap()
        .public_key;
    let wrong = b64(&[7u8; 32]);
    let args = connect_args(&registry, "env-pin").with_executor_key(Some(vec![7u8; 32]));
    let refused = supervisor::relay::RelayHarnessConnection::connect(&args)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("pins") && refused.contains(&wrong) && refused.contains(&key),
        "{refused}"
    );
    // The command line: a wrong pin fails with 255 and says why; the right one runs.
    let (status, _, stderr) = exec_cli(
        remote_args(
            &registry,
            "env-pin",
            &["--executor-key", &wrong],
            &["/bin/true"],
        ),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, Some(255), "{stderr}");
    assert!(stderr.contains("refusing to connect"), "{stderr}");
    let (status, stdout, stderr) = exec_cli(
        remote_args(
            &registry,
            "env-pin",
            &["--executor-key", &key],
            &["echo", "pinned"],
        ),
        Some(TOKEN),
    )
    .await;
    assert_eq!((status, stdout.as_str()), (Some(0), "pinned\n"), "{stderr}");
}
