//! Half-sent relay messages against the receive budget, relay streams at their cap.

use super::*;

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
