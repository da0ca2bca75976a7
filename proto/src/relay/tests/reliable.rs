//! The reliable layer alone: acks, retransmission, windows, limits and resets.

use pretty_assertions::assert_eq;

use super::*;

#[test]
fn messages_of_every_size_arrive_whole_and_in_order() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let sent = messages(&[
        0,
        1,
        MAX_SEGMENT_PLAINTEXT_BYTES,
        MAX_SEGMENT_PLAINTEXT_BYTES + 1,
        3 * 1024 * 1024,
        5,
    ]);
    let outcome = simulate(&mut a, &mut b, &sent, &sent[..2], CLEAN, 1, None);
    assert_eq!(outcome.b_received, sent);
    assert_eq!(outcome.a_received, sent[..2].to_vec());
    assert!(outcome.closed.is_empty());
    assert_eq!(a.stats().retransmissions, 0);
}

#[test]
fn heavy_loss_duplication_and_reordering_still_deliver_exactly_once() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let sizes: Vec<usize> = (0..300)
        .map(|i| if i % 50 == 7 { 700_000 } else { 10 + i * 13 })
        .collect();
    let sent = messages(&sizes);
    let faults = Faults {
        drop_percent: 30,
        duplicate_percent: 20,
        jitter_ms: 40,
    };
    let outcome = simulate(&mut a, &mut b, &sent, &sent[..50], faults, 42, None);
    assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
    assert_eq!(outcome.b_received.len(), sent.len());
    assert!(outcome.b_received == sent);
    assert!(outcome.a_received == sent[..50]);
    assert!(a.stats().retransmissions > 0);
    assert!(b.stats().duplicates > 0);
    // Timers resend only what the peer's acks can describe, so the resends stay near the loss
    // rate (30% of frames, acks included) instead of re-sending the whole window per timeout.
    let stats = a.stats();
    assert!(
        stats.retransmissions < stats.segments_sent,
        "{stats:?}: more resends than segments"
    );
}

#[test]
fn streams_resume_after_an_outage_longer_than_the_backoff() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    let sent = messages(&vec![20_000; 400]);
    let outage = Some((Duration::from_millis(5), Duration::from_secs(10)));
    let outcome = simulate(&mut a, &mut b, &sent, &[], CLEAN, 7, outage);
    assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
    assert!(outcome.b_received == sent);
}

#[test]
fn ack_and_ack_bits_describe_what_arrived() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    for i in 0..6u8 {
        a.send_message(vec![i]).unwrap();
    }
    let frames: Vec<Frame> = std::iter::from_fn(|| a.poll_transmit(now)).collect();
    assert_eq!(frames.len(), 6);
    for seq in [0, 1, 3, 5] {
        b.handle_frame(frames[seq].clone(), now);
    }
    let ack = b.poll_transmit(now).unwrap();
    assert_eq!(ack.body, Body::Ack);
    assert_eq!(ack.ack, Some(1));
    // Bit i acknowledges seq ack + 1 + i: seqs 3 and 5 are bits 1 and 3.
    assert_eq!(ack.ack_bits, 0b1010);
    // Nothing else to say until something changes.
    assert_eq!(b.poll_transmit(now), None);
    // Before anything arrived the ack is absent and bit i is seq i.
    let (_, mut c) = pair(now);
    c.handle_frame(frames[2].clone(), now);
    let ack = c.poll_transmit(now).unwrap();
    assert_eq!((ack.ack, ack.ack_bits), (None, 0b100));
}

#[test]
fn in_order_data_waits_for_a_reply_to_carry_its_ack_and_anything_else_is_acked_at_once() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    for i in 0..4u8 {
        a.send_message(vec![i]).unwrap();
    }
    let frames: Vec<Frame> = std::iter::from_fn(|| a.poll_transmit(now)).collect();
    // One in-order segment: no ack-only frame yet, and the timer says when it is due.
    b.handle_frame(frames[0].clone(), now);
    assert_eq!(b.poll_transmit(now), None);
    assert_eq!(b.poll_timeout(), Some(now + ACK_DELAY));
    // A reply sent before the deadline carries the ack; no ack-only frame follows it.
    b.send_message(b"reply".to_vec()).unwrap();
    let reply = b.poll_transmit(now).unwrap();
    assert!(matches!(reply.body, Body::Data(_)), "{reply:?}");
    assert_eq!(reply.ack, Some(0));
    assert_eq!(b.poll_transmit(now + ACK_DELAY), None);
    // With nothing to send, the ack goes out alone at the deadline, not before.
    b.handle_frame(frames[1].clone(), now);
    let later = now + ACK_DELAY / 2;
    assert_eq!(b.poll_transmit(later), None);
    let ack = b.poll_transmit(now + ACK_DELAY).unwrap();
    assert_eq!((ack.body, ack.ack), (Body::Ack, Some(1)));
    // Every ACK_EVERY_SEGMENTS-th in-order segment is acknowledged at once.
    assert_eq!(ACK_EVERY_SEGMENTS, 2);
    b.handle_frame(frames[2].clone(), now);
    b.handle_frame(frames[3].clone(), now);
    let ack = b.poll_transmit(now).unwrap();
    assert_eq!((ack.body, ack.ack), (Body::Ack, Some(3)));
    // A duplicate (or a gap) is acknowledged at once, so the sender's loss detection sees it.
    b.handle_frame(frames[3].clone(), now);
    let ack = b.poll_transmit(now).unwrap();
    assert_eq!((ack.body, ack.ack), (Body::Ack, Some(3)));
    let (_, mut c) = pair(now);
    c.handle_frame(frames[1].clone(), now);
    let ack = c.poll_transmit(now).unwrap();
    assert_eq!((ack.body, ack.ack, ack.ack_bits), (Body::Ack, None, 0b10));
}

#[test]
fn unacknowledged_segments_are_retransmitted_with_backoff() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    a.send_message(b"hello".to_vec()).unwrap();
    let first = a.poll_transmit(now).unwrap();
    assert_eq!(a.poll_transmit(now), None);
    assert_eq!(a.poll_timeout(), Some(now + INITIAL_RTO));
    let again = a.poll_transmit(now + INITIAL_RTO).unwrap();
    assert_eq!(again.body, first.body);
    assert_eq!(a.poll_timeout(), Some(now + INITIAL_RTO + 2 * INITIAL_RTO));
    assert_eq!(a.poll_transmit(now + INITIAL_RTO * 2), None);
    assert!(a.poll_transmit(now + INITIAL_RTO * 3).is_some());
    assert_eq!(a.stats().retransmissions, 2);
}

#[test]
fn timers_resend_only_the_part_of_the_window_acks_can_describe() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    for i in 0..100u8 {
        a.send_message(vec![i]).unwrap();
    }
    assert_eq!(std::iter::from_fn(|| a.poll_transmit(now)).count(), 100);
    // Nothing acknowledged: at the timeout only the first ACK_BITS_SPAN seqs go again.
    let later = now + INITIAL_RTO;
    let resent: Vec<u64> = std::iter::from_fn(|| a.poll_transmit(later))
        .map(|frame| match frame.body {
            Body::Data(data) => data.seq,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(resent, (0..ACK_BITS_SPAN).collect::<Vec<_>>());
    // The peer acknowledges seqs 0..=9: seqs 32..42 come into view with a fresh timer instead
    // of going out at once (the acks that follow will say whether they arrived).
    let acked = later + Duration::from_millis(1);
    a.handle_frame(
        Frame {
            stream_id: "s".into(),
            ack: Some(9),
            ack_bits: 0,
            ack_auth: Vec::new(),
            source: 0,
            body: Body::Ack,
        },
        acked,
    );
    assert_eq!(a.poll_transmit(acked), None);
    // No round trip measured yet (every acknowledged seq was sent twice): the RTO is the initial one.
    let due = acked + INITIAL_RTO;
    let resent: Vec<u64> = std::iter::from_fn(|| a.poll_transmit(due))
        .filter_map(|frame| match frame.body {
            Body::Data(data) => Some(data.seq),
            _ => None,
        })
        .collect();
    // 10..32 were resent at the first timeout and back off to twice the RTO.
    assert_eq!(
        resent,
        (ACK_BITS_SPAN..10 + ACK_BITS_SPAN).collect::<Vec<_>>()
    );
}

#[test]
fn a_segment_that_waited_for_a_hole_is_not_a_round_trip_sample() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    for i in 0..40u8 {
        a.send_message(vec![i]).unwrap();
    }
    assert_eq!(std::iter::from_fn(|| a.poll_transmit(now)).count(), 40);
    let ack = |ack: u64| Frame {
        stream_id: "s".into(),
        ack: Some(ack),
        ack_bits: 0,
        ack_auth: Vec::new(),
        source: 0,
        body: Body::Ack,
    };
    // Seq 0 comes back after 1 ms: the RTO drops to its floor.
    a.handle_frame(ack(0), now + Duration::from_millis(1));
    assert_eq!(a.rto(), MIN_RTO);
    // Seq 1 is lost, the peer holds 2..40 but its acks are lost too. Seconds later the timer
    // resends the front (1..33); seqs 33..40, sent once, are acknowledged only now, after
    // waiting at the peer for the hole: not a round trip either.
    let late = now + Duration::from_secs(5);
    let resent = std::iter::from_fn(|| a.poll_transmit(late)).count();
    assert_eq!(resent, ACK_BITS_SPAN as usize);
    a.handle_frame(ack(39), late + Duration::from_millis(1));
    assert!(a.is_idle());
    assert_eq!(a.rto(), MIN_RTO);
}

#[test]
fn a_segment_sent_before_an_acknowledged_one_is_resent_at_once_even_twice() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let (mut a, _) = pair(t0);
    let seq_of = |frame: Frame| match frame.body {
        Body::Data(data) => data.seq,
        other => panic!("unexpected {other:?}"),
    };
    let ack = |ack_bits: u32| Frame {
        stream_id: "s".into(),
        ack: Some(0),
        ack_bits,
        ack_auth: Vec::new(),
        source: 0,
        body: Body::Ack,
    };
    a.send_message(vec![0]).unwrap();
    a.send_message(vec![1]).unwrap();
    assert_eq!(std::iter::from_fn(|| a.poll_transmit(t0)).count(), 2);
    a.send_message(vec![2]).unwrap();
    assert_eq!(seq_of(a.poll_transmit(ms(5)).unwrap()), 2);
    // Seq 0 and seq 2 arrive, seq 1 does not: one later ack is not enough to count it lost,
    // but seq 2 was sent after it, so it is resent now, long before its timeout.
    a.handle_frame(ack(0b10), ms(10));
    assert_eq!(seq_of(a.poll_transmit(ms(10)).unwrap()), 1);
    assert_eq!(a.poll_transmit(ms(10)), None);
    // The resend is lost as well; seq 3, sent after it, arrives: seq 1 goes a third time.
    a.send_message(vec![3]).unwrap();
    assert_eq!(seq_of(a.poll_transmit(ms(20)).unwrap()), 3);
    a.handle_frame(ack(0b110), ms(30));
    assert_eq!(seq_of(a.poll_transmit(ms(30)).unwrap()), 1);
    assert_eq!(a.stats().retransmissions, 2);
}

#[test]
fn after_a_reconnect_the_whole_window_is_resent_as_the_front_moves() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    for i in 0..64u8 {
        a.send_message(vec![i]).unwrap();
    }
    assert_eq!(std::iter::from_fn(|| a.poll_transmit(now)).count(), 64);
    let back = now + Duration::from_millis(1);
    a.on_reconnect(back);
    let first: Vec<Frame> = std::iter::from_fn(|| a.poll_transmit(back)).collect();
    assert!(matches!(first[0].body, Body::Resume { next_seq: 64 }));
    assert_eq!(first.len(), 1 + ACK_BITS_SPAN as usize);
    // The peer had nothing; once it acknowledges the first 32 the rest follow at once.
    let acked = back + Duration::from_millis(1);
    a.handle_frame(
        Frame {
            stream_id: "s".into(),
            ack: Some(ACK_BITS_SPAN - 1),
            ack_bits: 0,
            ack_auth: Vec::new(),
            source: 0,
            body: Body::Ack,
        },
        acked,
    );
    let rest = std::iter::from_fn(|| a.poll_transmit(acked)).count();
    assert_eq!(rest, 64 - ACK_BITS_SPAN as usize);
}

#[test]
fn a_peer_that_keeps_talking_gets_resends_without_backoff() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    a.send_message(b"hello".to_vec()).unwrap();
    a.poll_transmit(now).unwrap();
    let mut at = now;
    for _ in 0..5 {
        // The peer is alive (a heartbeat arrives) but the segment or its ack keeps getting lost.
        a.handle_frame(
            Frame {
                stream_id: "s".into(),
                ack: None,
                ack_bits: 0,
                ack_auth: Vec::new(),
                source: 0,
                body: Body::Heartbeat,
            },
            at,
        );
        at += INITIAL_RTO;
        assert!(matches!(a.poll_transmit(at).unwrap().body, Body::Data(_)));
        assert_eq!(a.poll_timeout(), Some(at + INITIAL_RTO));
    }
}

#[test]
fn three_later_acks_trigger_a_fast_retransmission() {
    let now = Instant::now();
    let (mut a, mut b) = pair(now);
    for i in 0..5u8 {
        a.send_message(vec![i]).unwrap();
    }
    let frames: Vec<Frame> = std::iter::from_fn(|| a.poll_transmit(now)).collect();
    for frame in &frames[1..] {
        b.handle_frame(frame.clone(), now);
    }
    let ack = b.poll_transmit(now).unwrap();
    let later = now + Duration::from_millis(1);
    a.handle_frame(ack, later);
    let resent = a.poll_transmit(later).unwrap();
    assert!(matches!(resent.body, Body::Data(Data { seq: 0, .. })));
}

#[test]
fn the_window_bounds_segments_in_flight() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    for _ in 0..MAX_UNACKED_SEGMENTS + 10 {
        a.send_message(vec![1]).unwrap();
    }
    let sent = std::iter::from_fn(|| a.poll_transmit(now)).count();
    assert_eq!(sent, MAX_UNACKED_SEGMENTS);
    let (mut big, _) = pair(now);
    big.send_message(vec![0; MAX_UNACKED_BYTES * 2]).unwrap();
    let sent = std::iter::from_fn(|| big.poll_transmit(now)).count();
    assert_eq!(sent, MAX_UNACKED_BYTES / MAX_SEGMENT_PLAINTEXT_BYTES);
}

#[test]
fn the_send_queue_is_bounded() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    a.send_message(vec![0; MAX_SEND_QUEUE_BYTES]).unwrap();
    assert!(!a.can_accept_message());
    assert!(a.send_message(vec![1]).is_err());
    assert!(a.send_message(vec![0; MAX_MESSAGE_BYTES + 1]).is_err());
}

#[test]
fn a_heartbeat_goes_out_when_idle_and_silence_ends_the_stream() {
    let now = Instant::now();
    let (mut a, _) = pair(now);
    assert_eq!(a.poll_transmit(now), None);
    let beat = a.poll_transmit(now + HEARTBEAT_INTERVAL).unwrap();
    assert_eq!(beat.body, Body::Heartbeat);
    a.handle_timeout(now + LIVENESS_TIMEOUT);
    assert!(matches!(
        a.poll_event(),
        Some(StreamEvent::Closed { by_peer: true, .. })
    ));
    assert!(a.is_closed());
}

fn expect_reset(stream: &mut ReliableStream<PlaintextCipher>, now: Instant) -> String {
    let Some(StreamEvent::Closed {
        reason,
        by_peer: false,
    }) = stream.poll_event()
    else {
        panic!("expected a local reset");
    };
    let frame = stream.poll_transmit(now).unwrap();
    assert_eq!(
        frame.body,
        Body::Reset {
            reason: reason.clone()
        }
    );
    reason
}

#[test]
fn protocol_violations_reset_the_stream() {
    let now = Instant::now();
    // A continuation segment with no message started.
    let (_, mut b) = pair(now);
    b.handle_frame(data(1, 1, 2, b"x"), now);
    b.handle_frame(data(0, 0, 1, b"x"), now);
    assert_eq!(b.poll_event(), Some(StreamEvent::Message(b"x".to_vec())));
    assert!(expect_reset(&mut b, now).contains("no message is in progress"));
    // A segment claiming another message's count.
    let (_, mut b) = pair(now);
    b.handle_frame(data(0, 0, 3, b"x"), now);
    b.handle_frame(data(1, 1, 2, b"x"), now);
    assert!(expect_reset(&mut b, now).contains("does not continue"));
    // An authenticated header that disagrees with the frame.
    let (_, mut b) = pair(now);
    let mut frame = data(0, 0, 1, b"x");
    if let Body::Data(d) = &mut frame.body {
        d.segment_count = 2;
    }
    b.handle_frame(frame, now);
    assert!(expect_reset(&mut b, now).contains("do not match"));
    // An ack for a seq never sent.
    let (_, mut b) = pair(now);
    let mut frame = Frame::new("s", Body::Ack);
    frame.ack = Some(0);
    b.handle_frame(frame, now);
    assert!(expect_reset(&mut b, now).contains("only seqs below 0"));
    // A resume that forgets what was already delivered.
    let (_, mut b) = pair(now);
    b.handle_frame(data(0, 0, 1, b"x"), now);
    b.handle_frame(Frame::new("s", Body::Resume { next_seq: 0 }), now);
    assert_eq!(b.poll_event(), Some(StreamEvent::Message(b"x".to_vec())));
    assert!(expect_reset(&mut b, now).contains("lost its state"));
}

#[test]
fn a_peer_reset_closes_without_answering() {
    let now = Instant::now();
    let (_, mut b) = pair(now);
    b.handle_frame(
        Frame::new(
            "s",
            Body::Reset {
                reason: "bye".into(),
            },
        ),
        now,
    );
    assert_eq!(
        b.poll_event(),
        Some(StreamEvent::Closed {
            reason: "bye".into(),
            by_peer: true
        })
    );
    assert_eq!(b.poll_transmit(now), None);
    assert!(b.send_message(vec![1]).is_err());
}

#[test]
fn a_flood_of_out_of_order_segments_is_held_within_limits() {
    let now = Instant::now();
    let (_, mut b) = pair(now);
    let chunk = vec![0u8; MAX_SEGMENT_PLAINTEXT_BYTES];
    // Seq 0 never arrives; everything after it must wait, within the limits.
    for seq in 1..(RECEIVE_WINDOW_SEGMENTS * 4) {
        b.handle_frame(data(seq, 0, 1, &chunk), now);
    }
    let held = MAX_OUT_OF_ORDER_BYTES / MAX_SEGMENT_PLAINTEXT_BYTES;
    assert_eq!(
        b.stats().dropped_over_limit,
        RECEIVE_WINDOW_SEGMENTS * 4 - 1 - held as u64
    );
    assert!(!b.is_closed());
    // Absurd seqs are just outside the window.
    b.handle_frame(data(u64::MAX - 1, 0, 1, b"x"), now);
    assert!(!b.is_closed());
}

#[test]
fn undelivered_messages_stop_the_receiver_until_taken() {
    let now = Instant::now();
    let (_, mut b) = pair(now);
    let chunk = vec![0u8; MAX_SEGMENT_PLAINTEXT_BYTES];
    let n = (MAX_UNDELIVERED_BYTES / MAX_SEGMENT_PLAINTEXT_BYTES) as u64 + 5;
    for seq in 0..n {
        b.handle_frame(data(seq, 0, 1, &chunk), now);
    }
    assert!(b.stats().dropped_over_limit > 0);
    let mut taken = 0;
    while let Some(StreamEvent::Message(_)) = b.poll_event() {
        taken += 1;
    }
    assert!(taken < n);
    // Once taken, the rest is accepted on retransmission.
    for seq in taken..n {
        b.handle_frame(data(seq, 0, 1, &chunk), now);
    }
    let mut rest = 0;
    while let Some(StreamEvent::Message(_)) = b.poll_event() {
        rest += 1;
    }
    assert_eq!(taken + rest, n);
}
