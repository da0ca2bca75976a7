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
use tests::nats::Nats;
use tests::relay::{
    EXECUTOR_TOKEN, Process, RemoteClient, TOKEN, client_tls, credentials_toml, registry_client,
    start_executor, start_executor_with, start_rendezvous, start_rendezvous_with, wait_registered,
};
use tokio_tungstenite::tungstenite::Message as WsMessage;

mod bounded;
mod capacity;
mod credentials;
mod fairness;
mod takeover;

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

/// `environment` registered by a real executor (its key kept), then that executor gone and a
/// socket in its place, proven with the key: the test drives the executor's side by hand.
async fn proven_executor_socket(registry: &str, environment: &str) -> (RelaySocket, StaticKeypair) {
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity.toml");
    let executor = start_executor_with(registry, environment, &identity, &[]);
    wait_registered(registry, environment, &executor).await;
    let key = identity_keypair(&identity);
    drop(executor);
    let mut socket = open_socket(registry, environment, "executor", EXECUTOR_TOKEN).await;
    let mut seen = Seen::default();
    let window = Duration::from_millis(500);
    watch_executor_socket(&mut socket, environment, &key, window, &mut seen).await;
    assert!(seen.accepted, "the key holder was not accepted");
    (socket, key)
}

/// Open a harness socket of `token` for `environment` and send a handshake for `stream`
/// (towards the executor's public `key`): the stream's first frame, which routes it.
async fn harness_with_stream(
    registry: &str,
    environment: &str,
    token: &str,
    stream: &str,
    key: &[u8],
) -> RelaySocket {
    let mut socket = open_socket(registry, environment, "harness", token).await;
    let (_, message) =
        Initiator::start(environment, stream, key, proto::relay::Cipher::ChaChaPoly).unwrap();
    let handshake = Frame::new(stream, Body::Handshake(message.into()));
    socket
        .send(WsMessage::binary(handshake.into_encoded()))
        .await
        .unwrap();
    socket
}

/// A data frame on `stream` of `bytes` payload bytes, as a websocket message.
fn data_frame(stream: &str, seq: u64, bytes: usize) -> WsMessage {
    WsMessage::binary(
        Frame::new(
            stream,
            Body::Data(proto::relay::frame::Data {
                seq,
                segment_index: 0,
                segment_count: 1,
                payload: vec![(seq % 251) as u8; bytes],
            }),
        )
        .into_encoded(),
    )
}

/// Sends a ping on `socket` and waits for its pong: the rendezvous has read what came before.
async fn read_by_rendezvous(socket: &mut RelaySocket) {
    socket.send(WsMessage::Ping(vec![1].into())).await.unwrap();
    tokio::time::timeout(DEADLINE, async {
        while let Some(Ok(message)) = socket.next().await {
            if matches!(message, WsMessage::Pong(_)) {
                return;
            }
        }
        panic!("the socket ended");
    })
    .await
    .expect("the rendezvous never read the frames");
}

/// Send one harness handshake for `environment` (towards `key`) on a harness socket.
async fn harness_handshake(registry: &str, environment: &str, key: &[u8], stream: &str) {
    let _socket = harness_with_stream(registry, environment, TOKEN, stream, key).await;
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
