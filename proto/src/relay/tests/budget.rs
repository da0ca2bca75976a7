//! The shared receive budget, per-stream allowances and the reassembly deadline.

use pretty_assertions::assert_eq;

use super::*;

/// Streams sharing a receive budget, each sent 9 of a message's 10 segments: together they hold
/// no more than the budget (the segments past it are dropped unacknowledged), and the stream
/// holding the unfinished message is reset at REASSEMBLY_DEADLINE, giving its share back.
#[test]
fn unfinished_messages_are_charged_to_a_shared_budget_and_reset_at_the_deadline() {
    let now = Instant::now();
    let limit = 4 * MAX_SEGMENT_PLAINTEXT_BYTES;
    let budget = ReceiveBudget::new(limit, 0);
    let mut receivers = Vec::new();
    for _ in 0..3 {
        let (mut a, mut b) = pair(now);
        b.set_receive_budget(budget.clone());
        a.send_message(vec![7u8; 10 * MAX_SEGMENT_PLAINTEXT_BYTES])
            .unwrap();
        let mut data = Vec::new();
        while let Some(frame) = a.poll_transmit(now) {
            if matches!(frame.body, Body::Data(_)) {
                data.push(frame);
            }
        }
        assert_eq!(data.len(), 10);
        for frame in data.into_iter().take(9) {
            b.handle_frame(frame, now);
        }
        assert!(budget.used() <= limit, "{} over {limit}", budget.used());
        receivers.push(b);
    }
    assert_eq!(budget.used(), limit);
    let dropped: Vec<u64> = receivers
        .iter()
        .map(|b| b.stats().dropped_over_limit)
        .collect();
    assert_eq!(dropped, vec![5, 9, 9]);
    // Just before the deadline nothing happens; at it, the holder is reset.
    for b in &mut receivers {
        b.handle_timeout(now + REASSEMBLY_DEADLINE - Duration::from_millis(1));
        assert!(!b.is_closed());
    }
    assert!(receivers[0].poll_timeout().unwrap() <= now + REASSEMBLY_DEADLINE);
    for b in &mut receivers {
        b.handle_timeout(now + REASSEMBLY_DEADLINE);
    }
    assert!(receivers[0].is_closed());
    assert!(!receivers[1].is_closed() && !receivers[2].is_closed());
    let closed = std::iter::from_fn(|| receivers[0].poll_event()).last();
    assert!(
        matches!(&closed, Some(StreamEvent::Closed { reason, by_peer: false }) if reason.contains("REASSEMBLY_DEADLINE")),
        "{closed:?}"
    );
    assert_eq!(budget.used(), 0);
    // A stream dropped without a reset gives its share back too.
    let (mut a, mut b) = pair(now);
    b.set_receive_budget(budget.clone());
    a.send_message(vec![1u8; 3 * MAX_SEGMENT_PLAINTEXT_BYTES])
        .unwrap();
    while let Some(frame) = a.poll_transmit(now) {
        if matches!(frame.body, Body::Data(ref d) if d.segment_index < 2) {
            b.handle_frame(frame, now);
        }
    }
    assert_eq!(budget.used(), 2 * MAX_SEGMENT_PLAINTEXT_BYTES);
    drop(b);
    assert_eq!(budget.used(), 0);
}

/// Each stream's allowance is its own: with the shared budget spent, a stream still receives
/// messages within its allowance, and only what lies beyond draws on the budget.
#[test]
fn a_streams_allowance_gets_small_messages_through_a_spent_budget() {
    let now = Instant::now();
    let segment = MAX_SEGMENT_PLAINTEXT_BYTES;
    let budget = ReceiveBudget::new(2 * segment, 3 * segment);
    // A hog: 9 of 10 segments; 3 in its allowance, 2 in the budget, 4 dropped.
    let (mut a, mut hog) = pair(now);
    hog.set_receive_budget(budget.clone());
    a.send_message(vec![7u8; 10 * segment]).unwrap();
    while let Some(frame) = a.poll_transmit(now) {
        if matches!(frame.body, Body::Data(ref d) if d.segment_index < 9) {
            hog.handle_frame(frame, now);
        }
    }
    assert_eq!(budget.used(), 2 * segment);
    assert_eq!(hog.stats().dropped_over_limit, 4);
    // Another stream's two-segment message fits its allowance and is delivered.
    let (mut c, mut small) = pair(now);
    small.set_receive_budget(budget.clone());
    let message = vec![3u8; 2 * segment];
    c.send_message(message.clone()).unwrap();
    while let Some(frame) = c.poll_transmit(now) {
        small.handle_frame(frame, now);
    }
    assert_eq!(small.poll_event(), Some(StreamEvent::Message(message)));
    assert_eq!(budget.used(), 2 * segment);
    drop(hog);
    assert_eq!(budget.used(), 0);
}

/// A stream that keeps completing messages is not reset by the reassembly deadline, however
/// long it runs with a message in progress.
#[test]
fn completing_messages_restarts_the_reassembly_deadline() {
    let start = Instant::now();
    let (mut a, mut b) = pair(start);
    let mut now = start;
    for round in 0..4u32 {
        a.send_message(vec![round as u8; 2 * MAX_SEGMENT_PLAINTEXT_BYTES])
            .unwrap();
    }
    let mut frames = Vec::new();
    while let Some(frame) = a.poll_transmit(now) {
        if matches!(frame.body, Body::Data(_)) {
            frames.push(frame);
        }
    }
    // Segment 0 of message 1, then every 20 s one more segment: a message completes every
    // other step, and one is always in progress.
    for frame in frames {
        b.handle_frame(frame, now);
        now += Duration::from_secs(20);
        b.handle_timeout(now);
        assert!(!b.is_closed(), "reset at {:?}", now - start);
    }
    let delivered = std::iter::from_fn(|| b.poll_event())
        .filter(|e| matches!(e, StreamEvent::Message(_)))
        .count();
    assert_eq!(delivered, 4);
}
