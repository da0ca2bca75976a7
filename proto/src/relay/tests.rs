//! Deterministic and property tests of the relay state machines over a simulated network with
//! a simulated clock: loss, duplication, reordering and delay come from a seeded generator.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::frame::{Body, Data, Frame};
use super::limits::*;
use super::noise::StaticKeypair;
use super::reliability::{
    PlaintextCipher, ReceiveBudget, ReliableStream, SegmentCipher, StreamEvent,
};
use super::secure::SecureStream;

/// xorshift64*: small, seeded, good enough to pick fates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug)]
struct Faults {
    drop_percent: u64,
    duplicate_percent: u64,
    /// Extra random delay up to this many ms (reorders frames).
    jitter_ms: u64,
}

/// One direction of the simulated network.
struct Link {
    in_transit: Vec<(Instant, u64, Vec<u8>)>,
    order: u64,
}

impl Link {
    fn new() -> Self {
        Self {
            in_transit: Vec::new(),
            order: 0,
        }
    }
    fn send(&mut self, frame: &Frame, now: Instant, faults: Faults, rng: &mut Rng) {
        // Frames cross the link encoded, as on the wire.
        let bytes = frame.encode();
        if rng.chance(faults.drop_percent) {
            return;
        }
        let copies = if rng.chance(faults.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_millis(1 + rng.below(faults.jitter_ms + 1));
            self.order += 1;
            self.in_transit
                .push((now + delay, self.order, bytes.clone()));
        }
    }
    fn due(&mut self, now: Instant) -> Vec<Frame> {
        self.in_transit.sort_by_key(|(at, order, _)| (*at, *order));
        let split = self.in_transit.partition_point(|(at, _, _)| *at <= now);
        self.in_transit
            .drain(..split)
            .map(|(_, _, bytes)| Frame::decode(&bytes).unwrap())
            .collect()
    }
    fn next_arrival(&self) -> Option<Instant> {
        self.in_transit.iter().map(|(at, _, _)| *at).min()
    }
}

/// The part of a stream the simulation drives (both layers share it).
trait Endpoint {
    fn send(&mut self, message: Vec<u8>) -> bool;
    fn frame(&mut self, frame: Frame, now: Instant);
    fn transmit(&mut self, now: Instant) -> Option<Frame>;
    fn event(&mut self) -> Option<StreamEvent>;
    fn timeout(&self) -> Option<Instant>;
    fn on_timeout(&mut self, now: Instant);
    fn reconnect(&mut self, now: Instant);
}

impl<C: SegmentCipher> Endpoint for ReliableStream<C> {
    fn send(&mut self, message: Vec<u8>) -> bool {
        self.can_accept_message() && self.send_message(message).is_ok()
    }
    fn frame(&mut self, frame: Frame, now: Instant) {
        self.handle_frame(frame, now)
    }
    fn transmit(&mut self, now: Instant) -> Option<Frame> {
        self.poll_transmit(now)
    }
    fn event(&mut self) -> Option<StreamEvent> {
        self.poll_event()
    }
    fn timeout(&self) -> Option<Instant> {
        self.poll_timeout()
    }
    fn on_timeout(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
    fn reconnect(&mut self, now: Instant) {
        self.on_reconnect(now)
    }
}

impl Endpoint for SecureStream {
    fn send(&mut self, message: Vec<u8>) -> bool {
        self.can_accept_message() && self.send_message(message).is_ok()
    }
    fn frame(&mut self, frame: Frame, now: Instant) {
        self.handle_frame(frame, now)
    }
    fn transmit(&mut self, now: Instant) -> Option<Frame> {
        self.poll_transmit(now)
    }
    fn event(&mut self) -> Option<StreamEvent> {
        self.poll_event()
    }
    fn timeout(&self) -> Option<Instant> {
        self.poll_timeout()
    }
    fn on_timeout(&mut self, now: Instant) {
        self.handle_timeout(now)
    }
    fn reconnect(&mut self, now: Instant) {
        self.on_reconnect(now)
    }
}

struct Outcome {
    a_received: Vec<Vec<u8>>,
    b_received: Vec<Vec<u8>>,
    closed: Vec<StreamEvent>,
    frames_sent: usize,
}

/// Run both ends until each has received everything the other sent (or a step limit).
/// `outage` drops every frame in a window of simulated time and then tells both ends they
/// reconnected, as after a rendezvous restart.
fn simulate(
    a: &mut dyn Endpoint,
    b: &mut dyn Endpoint,
    a_sends: &[Vec<u8>],
    b_sends: &[Vec<u8>],
    faults: Faults,
    seed: u64,
    outage: Option<(Duration, Duration)>,
) -> Outcome {
    let start = Instant::now();
    let mut now = start;
    let mut rng = Rng(seed | 1);
    let (mut ab, mut ba) = (Link::new(), Link::new());
    let mut a_queue: VecDeque<Vec<u8>> = a_sends.iter().cloned().collect();
    let mut b_queue: VecDeque<Vec<u8>> = b_sends.iter().cloned().collect();
    let mut outcome = Outcome {
        a_received: Vec::new(),
        b_received: Vec::new(),
        closed: Vec::new(),
        frames_sent: 0,
    };
    let mut reconnected = false;
    for _ in 0..2_000_000 {
        let in_outage = outage.is_some_and(|(from, to)| now >= start + from && now < start + to);
        if let Some((_, to)) = outage
            && !reconnected
            && now >= start + to
        {
            reconnected = true;
            a.reconnect(now);
            b.reconnect(now);
        }
        while let Some(message) = a_queue.front() {
            if !a.send(message.clone()) {
                break;
            }
            a_queue.pop_front();
        }
        while let Some(message) = b_queue.front() {
            if !b.send(message.clone()) {
                break;
            }
            b_queue.pop_front();
        }
        for frame in ab.due(now) {
            b.frame(frame, now);
        }
        for frame in ba.due(now) {
            a.frame(frame, now);
        }
        drain_events(a, &mut outcome.a_received, &mut outcome.closed);
        drain_events(b, &mut outcome.b_received, &mut outcome.closed);
        while let Some(frame) = a.transmit(now) {
            outcome.frames_sent += 1;
            if !in_outage {
                ab.send(&frame, now, faults, &mut rng);
            }
        }
        while let Some(frame) = b.transmit(now) {
            outcome.frames_sent += 1;
            if !in_outage {
                ba.send(&frame, now, faults, &mut rng);
            }
        }
        let done =
            outcome.b_received.len() == a_sends.len() && outcome.a_received.len() == b_sends.len();
        if done || !outcome.closed.is_empty() {
            break;
        }
        let mut next = [
            ab.next_arrival(),
            ba.next_arrival(),
            a.timeout(),
            b.timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now + Duration::from_millis(1));
        if let Some((_, to)) = outage
            && !reconnected
        {
            next = next.min(start + to);
        }
        now = next.max(now + Duration::from_micros(100));
        a.on_timeout(now);
        b.on_timeout(now);
    }
    outcome
}

fn drain_events(
    end: &mut dyn Endpoint,
    received: &mut Vec<Vec<u8>>,
    closed: &mut Vec<StreamEvent>,
) {
    while let Some(event) = end.event() {
        match event {
            StreamEvent::Message(message) => received.push(message),
            StreamEvent::Established => {}
            event @ StreamEvent::Closed { .. } => closed.push(event),
        }
    }
}

fn messages(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| (0..size).map(|j| (i * 31 + j) as u8).collect())
        .collect()
}

fn pair(
    now: Instant,
) -> (
    ReliableStream<PlaintextCipher>,
    ReliableStream<PlaintextCipher>,
) {
    (
        ReliableStream::new("s", PlaintextCipher, now),
        ReliableStream::new("s", PlaintextCipher, now),
    )
}

const CLEAN: Faults = Faults {
    drop_percent: 0,
    duplicate_percent: 0,
    jitter_ms: 0,
};

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

fn data(seq: u64, index: u32, count: u32, bytes: &[u8]) -> Frame {
    let mut payload = index.to_be_bytes().to_vec();
    payload.extend_from_slice(&count.to_be_bytes());
    payload.extend_from_slice(bytes);
    Frame::new(
        "s",
        Body::Data(Data {
            seq,
            segment_index: index,
            segment_count: count,
            payload,
        }),
    )
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

fn secure_pair(now: Instant) -> (SecureStream, SecureStream) {
    let keys = StaticKeypair::generate().unwrap();
    let mut harness = SecureStream::initiate("env", "s", keys.public(), now).unwrap();
    let first = harness.poll_transmit(now).unwrap();
    let environment = SecureStream::accept(&keys, "env", &first, now).unwrap();
    (harness, environment)
}

#[test]
fn encrypted_streams_survive_loss_including_handshake_messages() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let sent = messages(&[10, 200_000, 33, 0, 70_000]);
    let faults = Faults {
        drop_percent: 35,
        duplicate_percent: 15,
        jitter_ms: 20,
    };
    for seed in 1..6 {
        let (mut h, mut e) = secure_pair(now);
        let outcome = simulate(&mut h, &mut e, &sent, &sent, faults, seed, None);
        assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        assert!(outcome.b_received == sent && outcome.a_received == sent);
        assert!(h.is_confirmed() && e.is_confirmed());
    }
    let outcome = simulate(&mut harness, &mut environment, &sent, &[], CLEAN, 3, None);
    assert!(outcome.b_received == sent);
}

#[test]
fn encrypted_payloads_never_contain_the_plaintext() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let secret = br#"{"id":1,"method":"process/start","params":{"argv":["cat","/etc/secret"]}}"#;
    harness.send_message(secret.to_vec()).unwrap();
    // Message 2 establishes the harness.
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    let frame = harness.poll_transmit(now).unwrap();
    let Body::Data(data) = &frame.body else {
        panic!("expected data, got {frame:?}");
    };
    assert!(!data.payload.windows(14).any(|w| w == b"process/start\""));
    environment.handle_frame(frame, now);
    assert_eq!(environment.poll_event(), Some(StreamEvent::Established));
    assert_eq!(
        environment.poll_event(),
        Some(StreamEvent::Message(secret.to_vec()))
    );
}

#[test]
fn tampered_segments_are_dropped_then_the_stream_is_reset() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    harness.send_message(b"hello".to_vec()).unwrap();
    let frame = harness.poll_transmit(now).unwrap();
    for _ in 0..=MAX_AUTH_FAILURES {
        let mut forged = frame.clone();
        if let Body::Data(d) = &mut forged.body {
            d.payload[12] ^= 1;
        }
        environment.handle_frame(forged, now);
    }
    assert!(environment.is_closed());
}

/// Two established encrypted ends whose first data segment (harness -> environment) was
/// delivered, so the environment holds data to acknowledge.
fn established_pair(now: Instant) -> (SecureStream, SecureStream) {
    let (mut harness, mut environment) = secure_pair(now);
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    harness.send_message(b"hello".to_vec()).unwrap();
    while let Some(frame) = harness.poll_transmit(now) {
        environment.handle_frame(frame, now);
    }
    while environment.poll_event().is_some() {}
    while harness.poll_event().is_some() {}
    assert!(environment.is_confirmed());
    (harness, environment)
}

/// The environment's next frame, which acknowledges the harness's data.
fn ack_from(environment: &mut SecureStream, now: Instant) -> Frame {
    environment.request_ack();
    let frame = environment.poll_transmit(now).unwrap();
    assert_eq!(frame.ack, Some(0), "{frame:?}");
    assert!(!frame.ack_auth.is_empty());
    frame
}

fn closed_reason(stream: &mut SecureStream) -> Option<String> {
    while let Some(event) = stream.poll_event() {
        if let StreamEvent::Closed { reason, .. } = event {
            return Some(reason);
        }
    }
    None
}

#[test]
fn a_forged_or_altered_ack_resets_the_stream() {
    let now = Instant::now();
    type Forgery = fn(&mut Frame);
    let forgeries: [(&str, Forgery); 4] = [
        ("ack moved", |frame| frame.ack = Some(7)),
        ("ack_bits set", |frame| frame.ack_bits = 0b100),
        ("tag stripped", |frame| frame.ack_auth.clear()),
        ("tag corrupted", |frame| {
            let last = frame.ack_auth.len() - 1;
            frame.ack_auth[last] ^= 1;
        }),
    ];
    for (what, forge) in forgeries {
        let (mut harness, mut environment) = established_pair(now);
        let mut frame = ack_from(&mut environment, now);
        forge(&mut frame);
        // Across the wire, as a relay would send it.
        harness.handle_frame(Frame::decode(&frame.encode()).unwrap(), now);
        assert!(harness.is_closed(), "{what}: the forged ack was accepted");
        let reason = closed_reason(&mut harness).unwrap();
        assert!(reason.contains("forged"), "{what}: {reason}");
        assert!(
            matches!(
                harness.poll_transmit(now),
                Some(Frame {
                    body: Body::Reset { .. },
                    ..
                })
            ),
            "{what}: no reset sent"
        );
    }
    // Ack fields on a frame that never had them (an injected heartbeat) are forged too.
    let (mut harness, _environment) = established_pair(now);
    let mut injected = Frame::new("s", Body::Heartbeat);
    injected.ack = Some(0);
    harness.handle_frame(injected, now);
    assert!(harness.is_closed());
}

#[test]
fn a_replayed_ack_is_detected_and_ignored() {
    let now = Instant::now();
    let (mut harness, mut environment) = established_pair(now);
    // The harness sends a second segment; the environment's old ack (for seq 0) is replayed
    // after its newer ack (for seq 1): the replay must not count as hearing from the peer.
    let old = ack_from(&mut environment, now);
    harness.handle_frame(old.clone(), now);
    harness.send_message(b"second".to_vec()).unwrap();
    let data = harness.poll_transmit(now).unwrap();
    environment.handle_frame(data, now);
    // In-order data alone is acknowledged once ACK_DELAY passes.
    let newer = environment.poll_transmit(now + ACK_DELAY).unwrap();
    assert_eq!(newer.ack, Some(1));
    harness.handle_frame(newer, now);
    assert!(harness.is_idle());
    for _ in 0..3 {
        harness.handle_frame(old.clone(), now);
    }
    assert!(!harness.is_closed());
    let stats = harness.reliable().unwrap().stats();
    assert_eq!(stats.replayed_acks, 3);
    // A replay does not keep a silent peer alive: liveness still runs from the last fresh frame.
    harness.handle_frame(old, now + LIVENESS_TIMEOUT);
    harness.handle_timeout(now + LIVENESS_TIMEOUT);
    assert!(harness.is_closed());
}

#[test]
fn a_responder_is_confirmed_only_by_an_authenticated_frame() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    // A frame injected by the relay does not confirm the stream (nor reset it: a reset from
    // outside the stream is always possible).
    environment.handle_frame(Frame::new("s", Body::Heartbeat), now);
    assert!(!environment.is_confirmed());
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    // The harness confirms at once, before it has anything to send.
    let confirmation = harness.poll_transmit(now).unwrap();
    assert_eq!(confirmation.body, Body::Ack);
    environment.handle_frame(confirmation, now);
    assert!(environment.is_confirmed());
}

#[test]
fn a_handshake_for_the_wrong_key_is_refused() {
    let now = Instant::now();
    let keys = StaticKeypair::generate().unwrap();
    let other = StaticKeypair::generate().unwrap();
    let mut harness = SecureStream::initiate("env", "s", other.public(), now).unwrap();
    let first = harness.poll_transmit(now).unwrap();
    assert!(SecureStream::accept(&keys, "env", &first, now).is_err());
    harness.handle_timeout(now + HANDSHAKE_TIMEOUT);
    assert!(harness.is_closed());
    assert!(matches!(
        harness.poll_transmit(now + HANDSHAKE_TIMEOUT),
        Some(Frame {
            body: Body::Reset { .. },
            ..
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any mix of loss, duplication and reordering delivers the same byte sequence, exactly
    /// once and in order, in both directions.
    #[test]
    fn any_interleaving_delivers_the_same_bytes(
        seed in any::<u64>(),
        drop_percent in 0u64..45,
        duplicate_percent in 0u64..40,
        jitter_ms in 0u64..80,
        sizes in proptest::collection::vec(prop_oneof![0usize..200, 1_000usize..70_000, 100_000usize..300_000], 1..25),
        back in proptest::collection::vec(0usize..5_000, 0..10),
    ) {
        let now = Instant::now();
        let (mut a, mut b) = pair(now);
        let sent = messages(&sizes);
        let replies = messages(&back);
        let faults = Faults { drop_percent, duplicate_percent, jitter_ms };
        let outcome = simulate(&mut a, &mut b, &sent, &replies, faults, seed, None);
        prop_assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        prop_assert!(outcome.b_received == sent);
        prop_assert!(outcome.a_received == replies);
        prop_assert!(outcome.frames_sent > 0);
    }

    /// Arbitrary frames (valid envelopes, hostile contents) never panic the receiver and never
    /// make it hold more than its limits.
    #[test]
    fn hostile_frames_never_exceed_the_receive_limits(
        frames in proptest::collection::vec((0u64..2_000, 0u32..4, 1u32..5, 0usize..70_000, any::<Option<u64>>(), any::<u32>()), 1..60),
    ) {
        let now = Instant::now();
        let (_, mut b) = pair(now);
        for (seq, index, count, len, ack, ack_bits) in frames {
            let index = index.min(count - 1).min(seq as u32);
            let mut frame = data(seq, index, count, &vec![0; len.min(MAX_SEGMENT_PLAINTEXT_BYTES)]);
            frame.ack = ack;
            frame.ack_bits = ack_bits;
            b.handle_frame(frame, now);
            prop_assert!(b.buffered_bytes() <= MAX_OUT_OF_ORDER_BYTES + MAX_MESSAGE_BYTES + MAX_UNDELIVERED_BYTES);
            while b.poll_transmit(now).is_some() {}
        }
        while b.poll_event().is_some() {}
    }
}

/// The mix of the end-to-end lossy test (many small messages, some of 4 MiB, both ways) under
/// heavier faults than it injects, in simulation.
#[test]
fn a_long_mixed_exchange_survives_heavy_faults() {
    let now = Instant::now();
    let sizes: Vec<usize> = (0..3000)
        .map(|i| {
            if i % 500 == 250 {
                4 * 1024 * 1024
            } else if i % 10 == 3 {
                1000 + (i * 37) % 100_000
            } else {
                60
            }
        })
        .collect();
    let sent = messages(&sizes);
    let replies = messages(&sizes);
    let faults = Faults {
        drop_percent: 36,
        duplicate_percent: 19,
        jitter_ms: 10,
    };
    for seed in 1..3 {
        let (mut a, mut b) = pair(now);
        let outcome = simulate(&mut a, &mut b, &sent, &replies, faults, seed, None);
        assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        assert!(
            outcome.a_received == replies,
            "a got {}",
            outcome.a_received.len()
        );
        assert!(
            outcome.b_received == sent,
            "b got {}",
            outcome.b_received.len()
        );
    }
}

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
