//! One harness credential flooding its executor does not crowd another credential's frames out
//! of the executor socket's queue at the rendezvous: each credential holds at most its share of
//! that queue, and the queue serves the credentials in turn.

use super::*;

/// Data frames of this many payload bytes: a full relay segment.
const FRAME_PAYLOAD: usize = proto::relay::limits::MAX_SEGMENT_PAYLOAD_BYTES;
/// The flooding credential's frames: 100 MiB, far past the executor socket's 16 MiB queue.
const FLOOD_FRAMES: u64 = 1600;
/// The other credential's frames, small ones (requests): 20 KB in all.
const OTHER_FRAMES: u64 = 20;

fn data(stream: &str, seq: u64, bytes: usize) -> WsMessage {
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

/// The environment's executor socket stops reading (a slow link fills its queue the same way);
/// credential A sends 100 MiB of data frames on its stream, then credential B sends 20 small
/// ones on its own. When the executor reads again, every one of B's frames is there (none was
/// dropped because A filled the queue), and they are not behind the whole of A's queued frames.
/// With one queue for every harness, A's flood took all 16 MiB and B's frames were dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_harness_credential_does_not_crowd_another_out_of_its_executors_queue() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    reload(&rendezvous, &(credentials_toml() + &second_harness())).await;
    let (mut executor, key) = proven_executor_socket(&registry, "fair").await;
    let mut seen = Seen::default();
    let window = Duration::from_millis(500);

    // Each credential opens a stream: its handshake reaches the executor and routes the stream.
    let mut sockets = Vec::new();
    for (token, stream) in [(TOKEN, "flood"), (OTHER_HARNESS_TOKEN, "other")] {
        let mut socket = open_socket(&registry, "fair", "harness", token).await;
        let (_, message) = Initiator::start(
            "fair",
            stream,
            key.public(),
            proto::relay::Cipher::ChaChaPoly,
        )
        .unwrap();
        let handshake = Frame::new(stream, Body::Handshake(message.into()));
        socket
            .send(WsMessage::binary(handshake.into_encoded()))
            .await
            .unwrap();
        sockets.push(socket);
    }
    watch_executor_socket(&mut executor, "fair", &key, window, &mut seen).await;
    assert_eq!(seen.harness_frames, 2, "both handshakes reach the executor");
    let (mut flooder, mut other) = (sockets.remove(0), sockets.remove(0));

    // From here the executor's socket is not read until both credentials have sent.
    for seq in 0..FLOOD_FRAMES {
        flooder
            .send(data("flood", seq, FRAME_PAYLOAD))
            .await
            .unwrap();
    }
    read_by_rendezvous(&mut flooder).await;
    for seq in 0..OTHER_FRAMES {
        other.send(data("other", seq, 1000)).await.unwrap();
    }
    read_by_rendezvous(&mut other).await;

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
    let last_other = order.iter().rposition(|other| *other);
    eprintln!(
        "the executor read {floods} of the flood's {FLOOD_FRAMES} frames and {others} of the \
         other credential's {OTHER_FRAMES}; the last of those at {last_other:?}"
    );
    assert!(floods > 64, "the flood's stream was not routed");
    assert_eq!(
        others, OTHER_FRAMES as usize,
        "frames of another credential were dropped because one credential filled the \
         executor's queue"
    );
    let after = floods - last_other.unwrap_or(0).saturating_sub(others - 1);
    assert!(
        after > 32,
        "the other credential's frames came after (almost) all of the flood's queued frames \
         ({after} flood frames after them): not served in turn"
    );
}
