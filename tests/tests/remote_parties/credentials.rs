//! Revoked credentials and one harness credential's share of an environment's streams.

use super::*;

/// Wait until `client`'s stream ends (its reads return `None`); returns when.
async fn stream_end(mut client: RemoteClient) -> Instant {
    while client.connection.recv().await.is_some() {}
    Instant::now()
}

/// A harness credential removed by SIGHUP loses its live stream within a second and cannot
/// connect again, while another harness keeps working; then the executor's credential is
/// removed: its socket closes and the streams through it end within a second, and the executor
/// is refused from then on. Control: before each revocation the same stream worked.
#[tokio::test(flavor = "multi_thread")]
async fn revoked_credentials_lose_their_sockets_and_streams_within_a_second() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    reload(&rendezvous, &(credentials_toml() + &second_harness())).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, REVOCABLE_EXECUTOR_TOKEN).unwrap();
    let executor = start_executor_with(
        &registry,
        "env-revoke",
        &dir.path().join("identity"),
        &["--token-file", token_file.to_str().unwrap()],
    );
    wait_registered(&registry, "env-revoke", &executor).await;
    let revocable_args = RemoteConnectArgs::new(&registry, "env-revoke", OTHER_HARNESS_TOKEN);
    let mut revocable = RemoteClient::connect_with(&revocable_args).await;
    timed_true(&mut revocable, "before-revocation".into()).await;
    let mut other = RemoteClient::connect(&registry, "env-revoke").await;
    timed_true(&mut other, "other-before".into()).await;

    // The harness credential goes.
    let ended = tokio::spawn(stream_end(revocable));
    let sent = reload(
        &rendezvous,
        &(credentials_toml()
            + &format!(
                "\n[[executor]]\ntoken = \"{REVOCABLE_EXECUTOR_TOKEN}\"\nenvironments = [\"env-revoke\"]\n"
            )),
    )
    .await;
    let ended_at = tokio::time::timeout(Duration::from_secs(1), ended)
        .await
        .expect("the revoked harness's stream still runs a second after SIGHUP")
        .unwrap();
    assert!(ended_at.duration_since(sent) < Duration::from_secs(1));
    let refused = supervisor::relay::RelayHarnessConnection::connect(&revocable_args)
        .await
        .err()
        .expect("a revoked credential connected");
    assert!(refused.to_string().contains("401"), "{refused}");
    timed_true(&mut other, "other-after-harness-revocation".into()).await;

    // The executor credential goes.
    let ended = tokio::spawn(stream_end(other));
    let sent = reload(&rendezvous, &credentials_toml()).await;
    let ended_at = tokio::time::timeout(Duration::from_secs(1), ended)
        .await
        .expect("a stream through the revoked executor still runs a second after SIGHUP")
        .unwrap();
    assert!(ended_at.duration_since(sent) < Duration::from_secs(1));
    let until = Instant::now() + DEADLINE;
    while !executor
        .stderr()
        .contains("the registry refuses this executor")
    {
        assert!(Instant::now() < until, "{}", executor.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        executor.stderr().contains("rendezvous socket lost"),
        "{}",
        executor.stderr()
    );
}

/// Open up to `count` relay streams to `environment` with `token`, each on its own socket, each
/// given `patience` to finish its handshake; returns the open ones.
async fn open_streams(
    registry: &str,
    environment: &str,
    token: &str,
    count: usize,
    patience: Duration,
) -> Vec<supervisor::relay::RelayHarnessConnection> {
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let args = RemoteConnectArgs::new(registry, environment, token);
            tokio::spawn(async move {
                tokio::time::timeout(
                    patience,
                    supervisor::relay::RelayHarnessConnection::connect(&args),
                )
                .await
                .ok()
                .and_then(Result::ok)
            })
        })
        .collect();
    let mut open = Vec::new();
    for task in tasks {
        if let Some(connection) = task.await.unwrap() {
            open.push(connection);
        }
    }
    open
}

/// One harness credential opening 24 streams (one socket each) against a rendezvous that
/// grants a credential 16 streams of an environment gets exactly 16, while another credential
/// still connects and runs a command. Control: with the default share (128) the same 24 all
/// open.
#[tokio::test(flavor = "multi_thread")]
async fn one_harness_credential_cannot_take_more_than_its_share_of_streams() {
    const SHARE: usize = 16;
    const WANTED: usize = 24;
    for (share, expected) in [(None, WANTED), (Some(SHARE), SHARE)] {
        let share_text = share.map(|s| s.to_string());
        let extra: Vec<&str> = match &share_text {
            Some(text) => vec!["--max-streams-per-credential", text.as_str()],
            None => Vec::new(),
        };
        let rendezvous = start_rendezvous_with("127.0.0.1:0", None, &extra);
        let registry = rendezvous.first_line.clone();
        reload(&rendezvous, &(credentials_toml() + &second_harness())).await;
        let _executor = start_executor(&registry, "env-share").await;
        let hog = open_streams(
            &registry,
            "env-share",
            OTHER_HARNESS_TOKEN,
            WANTED,
            // Under the executor's INITIALIZE_TIMEOUT (5 s): the hog never initializes, and
            // streams it lost that way would free routes for late ones.
            Duration::from_secs(4),
        )
        .await;
        assert_eq!(hog.len(), expected, "share {share:?}");
        let mut other = RemoteClient::connect(&registry, "env-share").await;
        timed_true(&mut other, "another-party".into()).await;
        drop(hog);
    }
}
