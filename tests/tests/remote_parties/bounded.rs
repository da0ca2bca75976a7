//! The rendezvous's memory for frames queued towards a socket that stops reading: bounded in
//! bytes per socket (`SOCKET_QUEUE_BYTES`, 16 MiB), not only in frames (4,096 frames of up to
//! ~65 KiB were ~270 MB per socket).

use super::*;

/// Data frames of this many payload bytes, about a full relay segment.
const FRAME_PAYLOAD: usize = 64 * 1024;
/// Frames the executor sends: 200 MiB, far past the byte bound and within the frame bound.
const FLOOD_FRAMES: usize = 3200;

/// `VmRSS` of the rendezvous in MiB.
fn rss_mib(rendezvous: &Process) -> u64 {
    tests::rss_kib(rendezvous.pid() as i32) / 1024
}

/// A harness opens a stream and then never reads its socket; the environment's (proven)
/// executor sends 200 MiB of data frames on that stream. The rendezvous's RSS grows by less
/// than 64 MiB, and once the harness reads, it receives at most the byte bound plus what the
/// kernel's socket buffers held (and some frames: the route was live), not the 200 MiB.
#[tokio::test(flavor = "multi_thread")]
async fn a_harness_that_stops_reading_costs_the_rendezvous_at_most_its_queue_bounds() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let (mut executor, key) = proven_executor_socket(&registry, "bounded").await;
    let mut seen = Seen::default();

    // A harness opens stream `flood` (its handshake reaches the executor) and stops reading.
    let mut harness = open_socket(&registry, "bounded", "harness", TOKEN).await;
    let (_, message) = Initiator::start(
        "bounded",
        "flood",
        key.public(),
        proto::relay::Cipher::ChaChaPoly,
    )
    .unwrap();
    harness
        .send(WsMessage::binary(
            Frame::new("flood", Body::Handshake(message.into())).into_encoded(),
        ))
        .await
        .unwrap();
    watch_executor_socket(
        &mut executor,
        "bounded",
        &key,
        Duration::from_secs(1),
        &mut seen,
    )
    .await;
    assert!(
        seen.harness_frames > 0,
        "the harness's handshake never arrived"
    );

    let before = rss_mib(&rendezvous);
    for seq in 0..FLOOD_FRAMES {
        let frame = Frame::new(
            "flood",
            Body::Data(proto::relay::frame::Data {
                seq: seq as u64,
                segment_index: 0,
                segment_count: 1,
                payload: vec![(seq % 251) as u8; FRAME_PAYLOAD],
            }),
        );
        executor
            .send(WsMessage::binary(frame.into_encoded()))
            .await
            .unwrap();
    }
    // The rendezvous has read every frame once a ping sent after them is answered.
    executor
        .send(WsMessage::Ping(vec![1].into()))
        .await
        .unwrap();
    let answered = tokio::time::timeout(DEADLINE, async {
        while let Some(Ok(message)) = executor.next().await {
            if matches!(message, WsMessage::Pong(_)) {
                return;
            }
        }
        panic!("the executor socket ended");
    });
    answered.await.expect("the rendezvous never read the flood");
    let grown = rss_mib(&rendezvous).saturating_sub(before);
    let sent_mib = FLOOD_FRAMES * FRAME_PAYLOAD / (1024 * 1024);
    assert!(
        grown < 64,
        "the rendezvous grew by {grown} MiB while {sent_mib} MiB waited for a harness that does not read"
    );

    // The harness reads now: what it gets is what was held for it.
    let mut received = 0usize;
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_millis(500), harness.next()).await
    {
        let Ok(message) = message else { break };
        // A flood frame as routed: the executor's frame, whole.
        if let WsMessage::Binary(bytes) = message
            && bytes.len() > FRAME_PAYLOAD
        {
            received += 1;
        }
    }
    let received_mib = received * FRAME_PAYLOAD / (1024 * 1024);
    eprintln!(
        "rendezvous grew {grown} MiB; {received_mib} MiB of {sent_mib} MiB reached the harness"
    );
    assert!(
        received >= 64,
        "only {received} frames reached the harness: the route was not live"
    );
    assert!(
        received_mib <= 16 + 24,
        "{received_mib} MiB of {sent_mib} MiB reached the harness: more than the 16 MiB queue \
         bound and the socket buffers were held for it"
    );
}
