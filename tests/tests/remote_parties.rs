//! Remote mode against parties holding valid credentials (issue 32, items 3 to 6), with the real
//! `exec-rendezvous` and `exec-server --remote`: an executor credential shared by two
//! environments cannot take over the one whose key it lacks, an operator's pin displaces a
//! squatter, a revoked credential loses its live sockets within a second, and one harness
//! credential cannot take more than its share of an executor's streams.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use proto::relay::noise::{Initiator, StaticKeypair};
use proto::relay::proof;
use proto::relay::{Body, Frame};
use serde_json::json;
use supervisor::relay::RemoteConnectArgs;
use supervisor::relay::driver::{RelaySocket, connect_socket};
use tests::DEADLINE;
use tests::relay::{
    EXECUTOR_TOKEN, Process, RemoteClient, TOKEN, client_tls, credentials_toml, registry_client,
    start_executor, start_executor_with, start_rendezvous, start_rendezvous_with, wait_registered,
};
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// A second harness credential, granted every environment (revoked, or hogging, in the tests).
const OTHER_HARNESS_TOKEN: &str = "relay-test-second-harness-token";
/// An executor credential granted only `env-revoke`.
const REVOCABLE_EXECUTOR_TOKEN: &str = "relay-test-revocable-executor";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn second_harness() -> String {
    format!(
        "\n[[harness]]\ntoken = \"{OTHER_HARNESS_TOKEN}\"\nenvironments = [\"*\"]\n\n\
         [[executor]]\ntoken = \"{REVOCABLE_EXECUTOR_TOKEN}\"\nenvironments = [\"env-revoke\"]\n"
    )
}

/// Write `text` as the rendezvous's credentials file and send SIGHUP; returns once the
/// rendezvous logged the reload (counting `credentials reloaded` lines), and the instant the
/// signal was sent.
async fn reload(rendezvous: &Process, text: &str) -> Instant {
    let path = rendezvous
        .dir
        .as_ref()
        .unwrap()
        .path()
        .join("credentials.toml");
    let before = rendezvous.stderr().matches("credentials reloaded").count();
    std::fs::write(&path, text).unwrap();
    let sent = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rendezvous.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let until = Instant::now() + DEADLINE;
    while rendezvous.stderr().matches("credentials reloaded").count() == before {
        assert!(
            Instant::now() < until,
            "no reload:\n{}",
            rendezvous.stderr()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sent
}

/// The keypair stored in an executor's identity file.
fn identity_keypair(path: &std::path::Path) -> StaticKeypair {
    let text = std::fs::read_to_string(path).unwrap();
    let field = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        let value = line.split('"').nth(1).unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(value)
            .unwrap()
    };
    StaticKeypair::from_stored(field("private_key"), field("public_key")).unwrap()
}

fn socket_url(registry: &str, environment: &str, role: &str) -> String {
    registry.replacen("http://", "ws://", 1) + &format!("/v1/environments/{environment}/{role}")
}

async fn open_socket(registry: &str, environment: &str, role: &str, token: &str) -> RelaySocket {
    let tls = client_tls(registry, None);
    connect_socket(&socket_url(registry, environment, role), token, &tls)
        .await
        .unwrap()
}

/// What an executor socket saw: proof challenges, and any other frame (a harness's).
#[derive(Default)]
struct Seen {
    challenges: usize,
    harness_frames: usize,
    accepted: bool,
}

/// Read `socket` for up to `window`, answering the key challenge with `keypair` (a wrong key
/// answers garbage), and count what arrives.
async fn watch_executor_socket(
    socket: &mut RelaySocket,
    environment: &str,
    keypair: &StaticKeypair,
    window: Duration,
    seen: &mut Seen,
) {
    let until = tokio::time::Instant::now() + window;
    while let Ok(Some(Ok(message))) = tokio::time::timeout_at(until, socket.next()).await {
        let WsMessage::Binary(bytes) = message else {
            continue;
        };
        let frame = Frame::decode(&bytes).unwrap();
        if !proof::is_proof_stream(&frame.stream_id) {
            seen.harness_frames += 1;
            continue;
        }
        match &frame.body {
            Body::Handshake(_) => {
                seen.challenges += 1;
                let reply = match proof::answer(keypair, environment, &frame).unwrap() {
                    Ok(reply) => reply,
                    // Not the key: answer something anyway.
                    Err(_) => {
                        Frame::new(frame.stream_id.clone(), Body::Handshake(vec![7; 48].into()))
                    }
                };
                if socket
                    .send(WsMessage::binary(reply.into_encoded()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Body::Ack => seen.accepted = true,
            _ => {}
        }
    }
}

/// Send one harness handshake for `environment` (towards `key`) on a harness socket.
async fn harness_handshake(registry: &str, environment: &str, key: &[u8], stream: &str) {
    let mut socket = open_socket(registry, environment, "harness", TOKEN).await;
    let (_, message) =
        Initiator::start(environment, stream, key, proto::relay::Cipher::ChaChaPoly).unwrap();
    let frame = Frame::new(stream, Body::Handshake(message.into()));
    socket
        .send(WsMessage::binary(frame.into_encoded()))
        .await
        .unwrap();
    // Held a moment so that the rendezvous routes it before the socket goes.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn timed_true(client: &mut RemoteClient, id: String) -> Duration {
    let started = Instant::now();
    let answer = client
        .call(
            "process/start",
            json!({"processId": id, "argv": ["/bin/true"], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(answer.is_ok(), "{answer:?}");
    started.elapsed()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

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

/// The segments of the message a half-sender never finishes.
const HALF_SENT_SEGMENTS: u32 = 1000;

/// One relay stream on its own harness socket that sends `initialize`, then 999 of the 1,000
/// segments of a message and never the last; returns why and when the stream ended.
async fn half_send(
    registry: String,
    environment: &'static str,
    key: Vec<u8>,
    n: usize,
) -> (String, Instant) {
    use proto::relay::limits::MAX_SEGMENT_PLAINTEXT_BYTES;
    use proto::relay::{SecureStream, StreamEvent};
    let tls = client_tls(&registry, None);
    let url = socket_url(&registry, environment, "harness");
    let mut socket = match connect_socket(&url, TOKEN, &tls).await {
        Ok(socket) => socket,
        Err(error) => return (format!("no socket: {error}"), Instant::now()),
    };
    let id = format!("half-sent-{n}");
    let mut stream = SecureStream::initiate(environment, &id, &key, Instant::now()).unwrap();
    let initialize = json!({"id": 1, "method": "initialize", "params": {"clientName": "half"}});
    stream
        .send_message(initialize.to_string().into_bytes())
        .unwrap();
    stream
        .send_message(vec![
            b' ';
            HALF_SENT_SEGMENTS as usize
                * MAX_SEGMENT_PLAINTEXT_BYTES
        ])
        .unwrap();
    loop {
        let now = Instant::now();
        while let Some(frame) = stream.poll_transmit(now) {
            if let Body::Data(data) = &frame.body
                && data.segment_count == HALF_SENT_SEGMENTS
                && data.segment_index == HALF_SENT_SEGMENTS - 1
            {
                continue;
            }
            if socket
                .send(WsMessage::binary(frame.into_encoded()))
                .await
                .is_err()
            {
                return ("the socket closed".into(), Instant::now());
            }
        }
        while let Some(event) = stream.poll_event() {
            if let StreamEvent::Closed { reason, .. } = event {
                return (reason, Instant::now());
            }
        }
        let deadline = stream
            .poll_timeout()
            .unwrap_or(now + Duration::from_secs(1));
        tokio::select! {
            message = socket.next() => match message {
                Some(Ok(WsMessage::Binary(bytes))) => {
                    if let Ok(frame) = Frame::decode(&bytes) {
                        stream.handle_frame(frame, Instant::now());
                    }
                }
                Some(Ok(_)) => {}
                _ => return ("the socket closed".into(), Instant::now()),
            },
            () = tokio::time::sleep_until(deadline.into()) => stream.handle_timeout(Instant::now()),
        }
    }
}

/// 20 streams each send 999 of a 1,000-segment message (62 MiB each, 1.25 GiB in all) and
/// never the last: the executor's RSS grows by at most its receive budget, the streams'
/// allowances and their send windows in transit (RELAY_RECEIVE_BUDGET_BYTES 256 MiB + 20 x
/// (RELAY_STREAM_RECEIVE_ALLOWANCE 1 MiB + MAX_UNACKED_BYTES 8 MiB) + 64 MiB, 500 MiB, where it
/// took 1.25 GiB before), a harness's commands still run meanwhile, and the streams holding
/// unfinished messages are reset at REASSEMBLY_DEADLINE (30 s), not before.
#[tokio::test(flavor = "multi_thread")]
async fn half_sent_relay_messages_stay_within_the_receive_budget_and_are_reset_at_the_deadline() {
    use proto::relay::limits::{
        MAX_UNACKED_BYTES, REASSEMBLY_DEADLINE, RELAY_RECEIVE_BUDGET_BYTES,
        RELAY_STREAM_RECEIVE_ALLOWANCE,
    };
    const STREAMS: usize = 20;
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let executor = start_executor(&registry, "env-half").await;
    let key = base64::engine::general_purpose::STANDARD
        .decode(
            registry_client(&registry, None)
                .connect("env-half", TOKEN)
                .await
                .unwrap()
                .public_key,
        )
        .unwrap();
    // The bystander connects first: the attack is about memory, not connection setup.
    let mut harness = RemoteClient::connect(&registry, "env-half").await;
    timed_true(&mut harness, "before".into()).await;
    let pid = executor.pid() as i32;
    let before = tests::rss_kib(pid);
    let started = Instant::now();
    let senders: Vec<_> = (0..STREAMS)
        .map(|n| tokio::spawn(half_send(registry.clone(), "env-half", key.clone(), n)))
        .collect();
    let mut peak = before;
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(20) {
        peak = peak.max(tests::rss_kib(pid));
        timed_true(&mut harness, format!("beside-{n}")).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Held: the budget and each stream's allowance. In transit: each stream's send window
    // (MAX_UNACKED_BYTES) may sit decoded in the executor's queues. Plus 64 MiB for the
    // allocator. Without the budget: 20 x 62 MiB = 1.25 GiB.
    let bound_kib = ((RELAY_RECEIVE_BUDGET_BYTES
        + STREAMS * (RELAY_STREAM_RECEIVE_ALLOWANCE + MAX_UNACKED_BYTES)
        + 64 * 1024 * 1024)
        / 1024) as u64;
    eprintln!("executor RSS {before} KiB, peak {peak} KiB (growth bound {bound_kib} KiB)");
    assert!(
        peak - before <= bound_kib,
        "executor RSS grew from {before} KiB to {peak} KiB, over the bound of {bound_kib} KiB"
    );
    let mut deadline_resets = 0;
    for sender in senders {
        let Ok(ended) = tokio::time::timeout_at(
            (started + REASSEMBLY_DEADLINE * 2 + Duration::from_secs(10)).into(),
            sender,
        )
        .await
        else {
            continue;
        };
        let (reason, at) = ended.unwrap();
        if reason.contains("REASSEMBLY_DEADLINE") {
            assert!(
                at.duration_since(started) >= REASSEMBLY_DEADLINE,
                "reset after {:?}: {reason}",
                at.duration_since(started)
            );
            deadline_resets += 1;
        }
    }
    assert!(
        deadline_resets > 0,
        "no stream was reset at REASSEMBLY_DEADLINE; executor:\n{}",
        executor.stderr()
    );
}

/// Relay streams have connection slots of their own: with every one of an executor's
/// `MAX_RELAY_STREAMS` (256) relay sessions initialized (one credential allowed them all here)
/// and the next stream refused for it, the executor's local listener still takes and
/// initializes a client. (They used to share `MAX_CONNECTIONS`, 256: the local client was
/// refused.)
#[tokio::test(flavor = "multi_thread")]
async fn relay_streams_at_their_cap_leave_the_local_listener_open() {
    const MAX_RELAY_STREAMS: usize = supervisor::relay::MAX_RELAY_STREAMS;
    const BATCH: usize = 16;
    let rendezvous = start_rendezvous_with(
        "127.0.0.1:0",
        None,
        &["--max-streams-per-credential", "1000"],
    );
    let registry = rendezvous.first_line.clone();
    let executor = start_executor(&registry, "env-slots").await;
    let mut sessions = Vec::new();
    while sessions.len() < MAX_RELAY_STREAMS {
        let batch: Vec<_> = (0..BATCH.min(MAX_RELAY_STREAMS - sessions.len()))
            .map(|_| {
                let registry = registry.clone();
                tokio::spawn(async move { RemoteClient::connect(&registry, "env-slots").await })
            })
            .collect();
        for task in batch {
            sessions.push(task.await.unwrap());
        }
    }
    let refused = supervisor::relay::RelayHarnessConnection::connect(&tests::relay::connect_args(
        &registry,
        "env-slots",
    ))
    .await
    .err()
    .expect("a relay stream past MAX_RELAY_STREAMS was opened");
    assert!(
        refused.to_string().contains("MAX_RELAY_STREAMS"),
        "{refused}"
    );
    let mut local = tests::Client::connect(&executor.first_line).await.unwrap();
    let session = local.initialize().await;
    assert!(!session.is_empty());
    drop(sessions);
}
