//! Executor sockets taken over: a credential without the key, a squatter displaced by a pin.

use super::*;

/// docs/remote.md's old example: one executor credential for two environments. Its holder
/// lacks laptop's key; reopening laptop's executor socket in a loop (answering the challenge
/// with garbage) it never receives a harness frame, the real executor never loses its socket,
/// and a harness's commands stay fast. Control: the same watcher, given laptop's key, is
/// accepted and does receive a harness frame, so the count above can see one.
#[tokio::test(flavor = "multi_thread")]
async fn an_executor_credential_without_the_key_cannot_take_another_environments_socket() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("laptop.identity");
    let executor = start_executor_with(&registry, "laptop", &identity, &[]);
    wait_registered(&registry, "laptop", &executor).await;
    // The other environment of the shared credential, served by its holder.
    let _ci_runner = start_executor(&registry, "ci-runner-1").await;
    let mut harness = RemoteClient::connect(&registry, "laptop").await;
    let mut quiet = Vec::new();
    for n in 0..10 {
        quiet.push(timed_true(&mut harness, format!("quiet-{n}")).await);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let attempts = Arc::new(AtomicUsize::new(0));
    let attack = {
        let (registry, stop, attempts) = (registry.clone(), stop.clone(), attempts.clone());
        tokio::spawn(async move {
            let own = StaticKeypair::generate().unwrap();
            let mut seen = Seen::default();
            let tls = client_tls(&registry, None);
            let url = socket_url(&registry, "laptop", "executor");
            while !stop.load(Ordering::Relaxed) {
                // A refused upgrade (the machine's load) is only one attempt fewer.
                let Ok(mut socket) = connect_socket(&url, EXECUTOR_TOKEN, &tls).await else {
                    continue;
                };
                attempts.fetch_add(1, Ordering::Relaxed);
                watch_executor_socket(
                    &mut socket,
                    "laptop",
                    &own,
                    Duration::from_millis(100),
                    &mut seen,
                )
                .await;
            }
            seen
        })
    };
    let mut attacked = Vec::new();
    for n in 0..30 {
        attacked.push(timed_true(&mut harness, format!("attacked-{n}")).await);
    }
    while attempts.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let seen = attack.await.unwrap();
    let attempts = attempts.load(Ordering::Relaxed);
    assert!(
        seen.challenges >= attempts / 2,
        "{} challenges for {attempts} sockets",
        seen.challenges
    );
    assert_eq!(
        seen.harness_frames, 0,
        "the key-less socket got harness frames"
    );
    assert!(!seen.accepted, "a garbage answer was accepted");
    let log = executor.stderr();
    assert_eq!(
        (
            log.matches("connected to the rendezvous").count(),
            log.matches("rendezvous socket lost").count()
        ),
        (1, 0),
        "the real executor lost its socket:\n{log}"
    );
    let (quiet, attacked) = (median(quiet), median(attacked));
    assert!(
        attacked <= quiet * 3 + Duration::from_millis(50),
        "commands slowed from {quiet:?} to {attacked:?} during {attempts} takeover attempts"
    );

    // Control: with laptop's key (the real executor stopped), the same watcher is accepted and
    // sees a harness's frame.
    let key = identity_keypair(&identity);
    drop(harness);
    drop(executor);
    let mut socket = open_socket(&registry, "laptop", "executor", EXECUTOR_TOKEN).await;
    let mut seen = Seen::default();
    watch_executor_socket(
        &mut socket,
        "laptop",
        &key,
        Duration::from_millis(500),
        &mut seen,
    )
    .await;
    assert!(seen.accepted, "the key holder was not accepted");
    let probe = tokio::spawn({
        let registry = registry.clone();
        let public = key.public().to_vec();
        async move { harness_handshake(&registry, "laptop", &public, "control-stream").await }
    });
    watch_executor_socket(
        &mut socket,
        "laptop",
        &key,
        Duration::from_secs(2),
        &mut seen,
    )
    .await;
    probe.await.unwrap();
    assert!(
        seen.harness_frames > 0,
        "the proven socket never saw the harness frame"
    );
}

/// A squatter bound `laptop-pin` first (its own key, proven) and holds its executor socket; the
/// real executor is refused with 409. The operator pins the real key and sends SIGHUP: the
/// squatter's socket closes within a second, `/connect` hands out the real key, and the real
/// executor serves. Control: before the pin the squatter's socket is live (a harness's frame
/// reaches it).
#[tokio::test(flavor = "multi_thread")]
async fn an_operators_pin_displaces_a_squatter_at_once() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let client = registry_client(&registry, None);
    let squatter = StaticKeypair::generate().unwrap();
    let request = supervisor::relay::registry::RegisterRequest {
        name: "squatter".into(),
        public_key: b64(squatter.public()),
    };
    client
        .register("laptop-pin", &request, EXECUTOR_TOKEN)
        .await
        .unwrap();
    let mut socket = open_socket(&registry, "laptop-pin", "executor", EXECUTOR_TOKEN).await;
    let mut seen = Seen::default();
    watch_executor_socket(
        &mut socket,
        "laptop-pin",
        &squatter,
        Duration::from_millis(500),
        &mut seen,
    )
    .await;
    assert!(seen.accepted, "the squatter's proof was not accepted");
    // Control: the squatter's socket is the environment's executor.
    let probe = tokio::spawn({
        let registry = registry.clone();
        let public = squatter.public().to_vec();
        async move { harness_handshake(&registry, "laptop-pin", &public, "to-squatter").await }
    });
    watch_executor_socket(
        &mut socket,
        "laptop-pin",
        &squatter,
        Duration::from_secs(1),
        &mut seen,
    )
    .await;
    probe.await.unwrap();
    assert!(seen.harness_frames > 0, "control: the squatter got nothing");

    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let executor = start_executor_with(&registry, "laptop-pin", &identity, &[]);
    let until = Instant::now() + DEADLINE;
    while !executor.stderr().contains("bound to another public key") {
        assert!(Instant::now() < until, "{}", executor.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let real = b64(identity_keypair(&identity).public());

    // The squatter's socket, watched for its end.
    let closed = tokio::spawn(async move {
        loop {
            match socket.next().await {
                Some(Ok(WsMessage::Binary(_) | WsMessage::Ping(_) | WsMessage::Pong(_))) => {}
                _ => return Instant::now(),
            }
        }
    });
    let pinned = format!(
        "{}\n[[environment]]\nid = \"laptop-pin\"\npublic_key = \"{real}\"\n",
        credentials_toml()
    );
    let sent = reload(&rendezvous, &pinned).await;
    let closed_at = tokio::time::timeout(Duration::from_secs(1), closed)
        .await
        .expect("the squatter's socket was not closed within a second of SIGHUP")
        .unwrap();
    assert!(closed_at.duration_since(sent) < Duration::from_secs(1));
    assert_eq!(
        client
            .connect("laptop-pin", TOKEN)
            .await
            .unwrap()
            .public_key,
        real
    );
    let mut harness = RemoteClient::connect(&registry, "laptop-pin").await;
    timed_true(&mut harness, "after-pin".into()).await;
}
