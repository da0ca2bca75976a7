//! One harness credential flooding its executor does not crowd another credential's frames out
//! of the queues on the way at the rendezvous: the executor socket's queue, and in a cluster the
//! publish queue of the harnesses' node. Each credential holds at most its share of a queue, and
//! the queue serves the credentials in turn.

use super::*;

/// A flood of full relay segments: 100 MiB, far past the executor socket's 16 MiB queue.
const BIG_FLOOD: (u64, usize) = (1600, proto::relay::limits::MAX_SEGMENT_PAYLOAD_BYTES);
/// A flood of small frames: 20,000 of 1 KiB, past the queue's 4,096 frame slots (and what the
/// kernel's socket buffers hold) while its bytes stay far below the byte bounds.
const SMALL_FLOOD: (u64, usize) = (20_000, 1024);
/// A flood of small frames through a cluster node whose NATS link stalls: 60,000 of 1 KiB, past
/// everything that can hold them on the way (the node's 16,384-frame publish queue, the NATS
/// client's 2,048 commands, both ends' socket buffers).
const CLUSTER_FLOOD: (u64, usize) = (60_000, 1024);
/// The other credential's frames, small ones (requests): 20 KB in all.
const OTHER_FRAMES: u64 = 20;

/// What the executor read after credential A's flood of `frames` data frames of `payload`
/// bytes and then credential B's 20 small frames, its socket not read meanwhile: the flood's
/// frames read, B's, and how many of the flood's came after B's last.
///
/// The executor's socket is on `executor_node`, the harnesses' on `harness_node` (the same
/// rendezvous, or two nodes of a cluster). With `stalled`, that NATS server is stopped (SIGSTOP)
/// while both credentials send and continued before the executor reads: what the harnesses'
/// node sends towards the executor waits in its publish queue meanwhile.
async fn flood_then_other(
    executor_node: &str,
    harness_node: &str,
    environment: &str,
    (frames, payload): (u64, usize),
    stalled: Option<&Nats>,
) -> (usize, usize, usize) {
    let (mut executor, key) = proven_executor_socket(executor_node, environment).await;
    let mut seen = Seen::default();
    let window = Duration::from_millis(500);

    // Each credential opens a stream: its handshake reaches the executor and routes the stream.
    let mut sockets = Vec::new();
    for (token, stream) in [(TOKEN, "flood"), (OTHER_HARNESS_TOKEN, "other")] {
        let socket = harness_with_stream(harness_node, environment, token, stream, key.public());
        sockets.push(socket.await);
    }
    watch_executor_socket(&mut executor, environment, &key, window, &mut seen).await;
    assert_eq!(seen.harness_frames, 2, "both handshakes reach the executor");
    let (mut flooder, mut other) = (sockets.remove(0), sockets.remove(0));

    // From here the executor's socket is not read until both credentials have sent.
    let nats_pid = stalled.map(|nats| nix::unistd::Pid::from_raw(nats.pid() as i32));
    if let Some(pid) = nats_pid {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    }
    for seq in 0..frames {
        flooder
            .feed(data_frame("flood", seq, payload))
            .await
            .unwrap();
    }
    flooder.flush().await.unwrap();
    read_by_rendezvous(&mut flooder).await;
    for seq in 0..OTHER_FRAMES {
        other.send(data_frame("other", seq, 1000)).await.unwrap();
    }
    read_by_rendezvous(&mut other).await;
    if let Some(pid) = nats_pid {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    }

    // The executor reads again.
    let mut order = Vec::new();
    while let Ok(Some(Ok(message))) =
        tokio::time::timeout(Duration::from_millis(500), executor.next()).await
    {
        if let WsMessage::Binary(bytes) = message {
            order.push(Frame::decode(&bytes).unwrap().stream_id == "other");
        }
    }
    let others = order.iter().filter(|other| **other).count();
    let floods = order.len() - others;
    let after = order
        .iter()
        .rposition(|other| *other)
        .map_or(0, |last| order.len() - 1 - last);
    eprintln!(
        "{environment}: the executor read {floods} of the flood's {frames} frames and {others} \
         of the other credential's {OTHER_FRAMES}, {after} of the flood's after the last of those"
    );
    (floods, others, after)
}

/// The environment's executor socket stops reading (a slow link fills its queue the same way);
/// credential A floods its stream, then credential B sends 20 small frames on its own. When the
/// executor reads again, every one of B's frames is there (none was dropped because A filled
/// the queue), and they are not behind the whole of A's queued frames. Twice: a flood of full
/// segments (the byte bound) and one of small frames (the frame slots). With one queue for every
/// harness, B got 4 of its 20 frames through the first, and with a byte share alone none
/// through the second.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_harness_credential_does_not_crowd_another_out_of_its_executors_queue() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    reload(&rendezvous, &(credentials_toml() + &second_harness())).await;
    for (environment, flood) in [("fair-big", BIG_FLOOD), ("fair-small", SMALL_FLOOD)] {
        let (floods, others, after) =
            flood_then_other(&registry, &registry, environment, flood, None).await;
        assert!(
            floods > 64,
            "{environment}: the flood's stream was not routed"
        );
        assert_eq!(
            others, OTHER_FRAMES as usize,
            "{environment}: frames of another credential were dropped because one credential \
             filled the executor's queue"
        );
        assert!(
            after > 32,
            "{environment}: the other credential's frames came after (almost) all of the \
             flood's queued frames ({after} flood frames after them): not served in turn"
        );
    }
}

/// The same two credentials through a cluster: the executor on node A, both harnesses on node B.
/// NATS stalls while they send, so node B's publish queue (one per node, every local harness's
/// frames to executors of other nodes) fills with credential A's flood; every one of B's frames
/// still reaches the executor once NATS is back. With one queue for every harness of the node,
/// B's frames were dropped while the flood held it.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_harness_credential_does_not_crowd_another_out_of_its_nodes_publish_queue() {
    let nats = Nats::start();
    let node = |name: &str| {
        start_rendezvous_with(
            "127.0.0.1:0",
            None,
            &["--cluster", &nats.url(), "--node-name", name],
        )
    };
    let (a, b) = (node("a"), node("b"));
    for rendezvous in [&a, &b] {
        reload(rendezvous, &(credentials_toml() + &second_harness())).await;
    }
    let environment = "fair-cluster";
    let (floods, others, _) = flood_then_other(
        &a.first_line,
        &b.first_line,
        environment,
        CLUSTER_FLOOD,
        Some(&nats),
    )
    .await;
    assert!(floods > 64, "the flood's stream was not routed");
    assert_eq!(
        others, OTHER_FRAMES as usize,
        "frames of another credential were dropped because one credential filled its node's \
         publish queue"
    );
}
