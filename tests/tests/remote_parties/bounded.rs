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
    let mut harness = harness_with_stream(&registry, "bounded", TOKEN, "flood", key.public()).await;
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
        let frame = data_frame("flood", seq as u64, FRAME_PAYLOAD);
        executor.send(frame).await.unwrap();
    }
    read_by_rendezvous(&mut executor).await;
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

/// Environments whose executors one harness credential floods at once.
const FLOODED_EXECUTORS: usize = 16;
/// Data frames of [`FRAME_PAYLOAD`] sent on each: 16 MiB, past a credential's 12 MiB share of
/// one executor's queue.
const FRAMES_PER_EXECUTOR: usize = 256;

/// One harness credential floods the executors of 16 environments, none of which reads its
/// socket (slow links). Each executor's queue holds up to its 12 MiB share for that credential
/// alone: 192 MiB of the rendezvous's memory for one credential, past its 64 MiB
/// `CREDENTIAL_QUEUE_BYTES`, which bounded only what was queued towards its own sockets. What a
/// credential sends to executors counts against that bound too: the rendezvous grows by less
/// than 120 MiB (192 MiB before).
#[tokio::test(flavor = "multi_thread")]
async fn a_harness_credential_flooding_many_executors_holds_at_most_its_credential_bound() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let mut executors = Vec::new();
    let mut harnesses = Vec::new();
    for n in 0..FLOODED_EXECUTORS {
        let environment = format!("credential-bound-{n}");
        let (mut executor, key) = proven_executor_socket(&registry, &environment).await;
        let harness =
            harness_with_stream(&registry, &environment, TOKEN, "flood", key.public()).await;
        let mut seen = Seen::default();
        let window = Duration::from_millis(500);
        watch_executor_socket(&mut executor, &environment, &key, window, &mut seen).await;
        assert_eq!(
            seen.harness_frames, 1,
            "{environment}: the handshake never arrived"
        );
        executors.push(executor);
        harnesses.push(harness);
    }

    let before = rss_mib(&rendezvous);
    for harness in &mut harnesses {
        for seq in 0..FRAMES_PER_EXECUTOR {
            let frame = data_frame("flood", seq as u64, FRAME_PAYLOAD);
            harness.feed(frame).await.unwrap();
        }
        harness.flush().await.unwrap();
    }
    for harness in &mut harnesses {
        read_by_rendezvous(harness).await;
    }
    let grown = rss_mib(&rendezvous).saturating_sub(before);
    let sent_mib = FLOODED_EXECUTORS * FRAMES_PER_EXECUTOR * FRAME_PAYLOAD / (1024 * 1024);
    eprintln!("the rendezvous grew by {grown} MiB while one credential sent {sent_mib} MiB");
    assert!(
        grown < 120,
        "the rendezvous grew by {grown} MiB for one credential's {sent_mib} MiB towards \
         executors that do not read: more than its 64 MiB bound and the slack the other RSS tests allow"
    );
    drop(executors);
}
