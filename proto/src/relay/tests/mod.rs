//! Deterministic and property tests of the relay state machines over a simulated network with
//! a simulated clock: loss, duplication, reordering and delay come from a seeded generator.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

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

mod budget;
mod properties;
mod reliable;
mod secure;
