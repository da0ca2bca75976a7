//! The sans-I/O reliable stream ([`ReliableStream`]): two ends joined by a network the fuzzer
//! controls. It reorders, drops, duplicates and delays frames, lets time jump, reconnects
//! either end, and injects bogus frames (acks for anything, resumes, resets, tampered or
//! re-labelled segments, raw decoded bytes). Every frame crosses the wire as bytes through
//! [`Frame::encode`] and [`Frame::decode`].
//!
//! The cipher is a keyed 64-bit tag per direction (not Noise, which has its own target): a
//! segment moved to another seq, truncated or bit-flipped fails to open, as with Noise. The tag
//! is compared through an XOR so that libFuzzer's comparison tracing cannot learn it.
//!
//! Invariants checked after every step:
//! - no panic; every emitted frame encodes within `MAX_RELAY_FRAME_BYTES` and decodes back;
//! - one `poll_transmit` burst is bounded (no busy loop);
//! - a model of the sender's unacknowledged segments (new seqs it sent minus the acks it
//!   accepted) stays within `MAX_UNACKED_SEGMENTS` and `MAX_UNACKED_BYTES`, and the sender never
//!   retransmits a segment the peer acknowledged;
//! - the receiver holds at most `MAX_OUT_OF_ORDER_BYTES + MAX_MESSAGE_BYTES +
//!   MAX_UNDELIVERED_BYTES` (`buffered_bytes`);
//! - delivered messages are exactly the peer's sent messages, in order, each once (a prefix),
//!   and nothing is delivered after `Closed`;
//! - liveness: when nothing bogus was injected and neither end closed, a clean network then
//!   delivers every message.
#![no_main]

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use proto::relay::limits::{
    MAX_MESSAGE_BYTES, MAX_OUT_OF_ORDER_BYTES, MAX_RELAY_FRAME_BYTES, MAX_SEGMENT_PLAINTEXT_BYTES,
    MAX_UNACKED_BYTES, MAX_UNACKED_SEGMENTS, MAX_UNDELIVERED_BYTES, SEGMENT_HEADER_BYTES,
};
use proto::relay::reliability::CipherError;
use proto::relay::{Body, Data, Frame, ReliableStream, SegmentCipher, StreamEvent};

const TAG_BYTES: usize = 8;
/// Bytes of application messages one input may send in total (keeps one run within memory).
const MAX_INPUT_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
/// Bytes one wire direction holds; more is lost, as on a congested link.
const MAX_WIRE_BYTES: usize = 24 * 1024 * 1024;
const STREAM_ID: &str = "0b6f6d5e-4a4e-4d4c-9a1e-7f1f3f5e2a10";

fn tag(key: u64, seq: u64, bytes: &[u8]) -> u64 {
    let mut h = key ^ seq.wrapping_mul(0xff51_afd7_ed55_8ccd);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(word)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    for &byte in chunks.remainder() {
        h = (h ^ u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h ^ (bytes.len() as u64).wrapping_mul(0xc4ce_b9fe_1a85_ec53)
}

/// Authenticates, does not encrypt: enough for ordering and forgery checks.
struct TagCipher {
    send_key: u64,
    recv_key: u64,
}

impl SegmentCipher for TagCipher {
    fn seal(&mut self, seq: u64, plaintext: &[u8]) -> Result<Vec<u8>, CipherError> {
        let mut out = plaintext.to_vec();
        out.extend_from_slice(&tag(self.send_key, seq, plaintext).to_le_bytes());
        Ok(out)
    }

    fn open(&mut self, seq: u64, ciphertext: &[u8]) -> Result<Vec<u8>, CipherError> {
        let fail = || CipherError {
            seq,
            reason: "bad tag".into(),
        };
        let split = ciphertext.len().checked_sub(TAG_BYTES).ok_or_else(fail)?;
        let (body, given) = ciphertext.split_at(split);
        let mut word = [0u8; 8];
        word.copy_from_slice(given);
        if tag(self.recv_key, seq, body) ^ u64::from_le_bytes(word) != 0 {
            return Err(fail());
        }
        Ok(body.to_vec())
    }
}

fn message(direction: usize, index: usize, len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..len)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8) ^ index.wrapping_mul(131) ^ (direction * 17)) as u8)
        .collect();
    for (slot, byte) in bytes.iter_mut().zip((index as u32).to_be_bytes()) {
        *slot = byte;
    }
    bytes
}

struct Peer {
    stream: ReliableStream<TagCipher>,
    /// Lengths of the messages `send_message` accepted, in order.
    sent: Vec<usize>,
    /// Messages delivered from the other end so far.
    received: usize,
    closed_event: bool,
    /// Model of this end's unacknowledged segments: seq -> plaintext bytes.
    unacked: BTreeMap<u64, usize>,
    next_new_seq: u64,
    resumes_pending: usize,
}

struct Wire {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl Wire {
    fn push(&mut self, frame: Vec<u8>) {
        if self.bytes + frame.len() <= MAX_WIRE_BYTES {
            self.bytes += frame.len();
            self.frames.push_back(frame);
        }
    }
    fn remove(&mut self, index: usize) -> Option<Vec<u8>> {
        if self.frames.is_empty() {
            return None;
        }
        let frame = self.frames.remove(index % self.frames.len())?;
        self.bytes -= frame.len();
        Some(frame)
    }
}

struct World {
    now: Instant,
    peers: [Peer; 2],
    /// `wires[d]` carries frames sent by peer `d` to peer `1 - d`.
    wires: [Wire; 2],
    sent_bytes: usize,
    /// Something was injected that can break liveness (an ack for unsent data, ...).
    tainted: bool,
}

impl World {
    fn new() -> Self {
        let now = Instant::now();
        let peer = |send_key, recv_key| Peer {
            stream: ReliableStream::new(STREAM_ID, TagCipher { send_key, recv_key }, now),
            sent: Vec::new(),
            received: 0,
            closed_event: false,
            unacked: BTreeMap::new(),
            next_new_seq: 0,
            resumes_pending: 0,
        };
        let wire = || Wire {
            frames: VecDeque::new(),
            bytes: 0,
        };
        World {
            now,
            peers: [peer(0x1111, 0x2222), peer(0x2222, 0x1111)],
            wires: [wire(), wire()],
            sent_bytes: 0,
            tainted: false,
        }
    }

    fn send(&mut self, d: usize, len: usize) {
        if self.sent_bytes + len > MAX_INPUT_MESSAGE_BYTES {
            return;
        }
        let peer = &mut self.peers[d];
        let index = peer.sent.len();
        if peer.stream.send_message(message(d, index, len)).is_ok() {
            peer.sent.push(len);
            self.sent_bytes += len;
        }
    }

    /// Everything `d` wants to send now goes on its wire.
    fn pump(&mut self, d: usize) {
        let peer = &mut self.peers[d];
        let bound = 4 * MAX_UNACKED_SEGMENTS + peer.resumes_pending + 16;
        peer.resumes_pending = 0;
        let mut emitted = 0;
        while let Some(frame) = peer.stream.poll_transmit(self.now) {
            emitted += 1;
            assert!(
                emitted <= bound,
                "poll_transmit did not settle after {bound} frames"
            );
            if let Body::Data(data) = &frame.body {
                let plain = data.payload.len() - SEGMENT_HEADER_BYTES - TAG_BYTES;
                assert!(plain <= MAX_SEGMENT_PLAINTEXT_BYTES);
                if data.seq == peer.next_new_seq {
                    peer.unacked.insert(data.seq, plain);
                    peer.next_new_seq += 1;
                } else {
                    assert!(
                        peer.unacked.contains_key(&data.seq),
                        "retransmitted seq {} that the peer acknowledged (or never sent)",
                        data.seq
                    );
                }
                assert!(peer.unacked.len() <= MAX_UNACKED_SEGMENTS);
                let bytes: usize = peer.unacked.values().sum();
                assert!(bytes <= MAX_UNACKED_BYTES, "{bytes} unacked bytes");
            }
            let encoded = frame.encode();
            assert!(encoded.len() <= MAX_RELAY_FRAME_BYTES);
            assert_eq!(Frame::decode(&encoded).as_ref(), Ok(&frame));
            self.wires[d].push(encoded);
        }
    }

    /// Peer `to` applies `frame`; the ack model follows what it accepted.
    fn apply(&mut self, to: usize, frame: Frame) {
        let (ack, bits) = (frame.ack, frame.ack_bits);
        let peer = &mut self.peers[to];
        peer.stream.handle_frame(frame, self.now);
        if peer.stream.is_closed() {
            peer.unacked.clear();
            return;
        }
        let base = ack.map_or(0, |ack| ack + 1);
        peer.unacked = peer.unacked.split_off(&base);
        for i in 0..32u64 {
            if bits & (1 << i) != 0 {
                peer.unacked.remove(&(base + i));
            }
        }
        assert!(
            peer.stream.buffered_bytes()
                <= MAX_OUT_OF_ORDER_BYTES + MAX_MESSAGE_BYTES + MAX_UNDELIVERED_BYTES
        );
    }

    fn deliver_bytes(&mut self, to: usize, bytes: &[u8]) {
        if let Ok(frame) = Frame::decode(bytes) {
            self.apply(to, frame);
        }
    }

    fn deliver(&mut self, from: usize, index: usize, keep: bool) {
        let wire = &mut self.wires[from];
        let bytes = if keep {
            if wire.frames.is_empty() {
                return;
            }
            wire.frames[index % wire.frames.len()].clone()
        } else {
            match wire.remove(index) {
                Some(bytes) => bytes,
                None => return,
            }
        };
        let frame = Frame::decode(&bytes).expect("frames the stream emitted decode");
        self.apply(1 - from, frame);
    }

    fn read(&mut self, d: usize) {
        let (sent, other) = {
            let other = &self.peers[1 - d];
            (other.sent.clone(), 1 - d)
        };
        let peer = &mut self.peers[d];
        while let Some(event) = peer.stream.poll_event() {
            match event {
                StreamEvent::Message(bytes) => {
                    assert!(!peer.closed_event, "message delivered after Closed");
                    let index = peer.received;
                    assert!(index < sent.len(), "delivered more messages than were sent");
                    assert!(
                        bytes == message(other, index, sent[index]),
                        "message {index} from {other} is not what was sent ({} bytes, expected {})",
                        bytes.len(),
                        sent[index]
                    );
                    peer.received += 1;
                }
                StreamEvent::Closed { .. } => {
                    assert!(!peer.closed_event, "Closed reported twice");
                    peer.closed_event = true;
                }
                StreamEvent::Established => panic!("a ReliableStream never reports Established"),
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        for peer in &mut self.peers {
            peer.stream.handle_timeout(self.now);
            if peer.stream.is_closed() {
                peer.unacked.clear();
            }
        }
    }

    fn any_closed(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.stream.is_closed() || p.closed_event)
    }

    fn inject(&mut self, u: &mut Unstructured, to: usize) -> arbitrary::Result<()> {
        let from = 1 - to;
        match u.int_in_range(0..=6u8)? {
            // An ack for anything: may acknowledge data the peer never received.
            0 => {
                self.tainted = true;
                let ack: Option<u64> = u.arbitrary()?;
                let ack = ack.map(|a| a % (self.peers[to].next_new_seq + 2));
                let mut frame = Frame::new(STREAM_ID, Body::Ack);
                frame.ack = ack;
                frame.ack_bits = u.arbitrary()?;
                self.apply(to, frame);
            }
            // A resume with any next_seq.
            1 => {
                let next_seq = u.int_in_range(0..=self.peers[from].next_new_seq + 4)?;
                self.apply(to, Frame::new(STREAM_ID, Body::Resume { next_seq }));
            }
            // A real segment, tampered with: moved, re-labelled, truncated or bit-flipped.
            2 => {
                let wire = &self.wires[from];
                if wire.frames.is_empty() {
                    return Ok(());
                }
                let index = u.choose_index(wire.frames.len())?;
                let Ok(frame) = Frame::decode(&wire.frames[index]) else {
                    return Ok(());
                };
                let Body::Data(mut data) = frame.body else {
                    return Ok(());
                };
                match u.int_in_range(0..=3u8)? {
                    0 => data.seq = data.seq.wrapping_add(u.int_in_range(1..=600)?),
                    1 => {
                        data.segment_count = u.int_in_range(1..=8)?;
                        data.segment_index = u.int_in_range(0..=data.segment_count - 1)?;
                    }
                    2 => {
                        let keep = u.choose_index(data.payload.len().max(1))?;
                        data.payload.truncate(keep);
                    }
                    _ => {
                        if !data.payload.is_empty() {
                            let at = u.choose_index(data.payload.len())?;
                            data.payload[at] ^= 1 << u.int_in_range(0..=7u8)?;
                        }
                    }
                }
                if u64::from(data.segment_index) <= data.seq && data.seq < u64::MAX {
                    let frame = Frame::new(STREAM_ID, Body::Data(data));
                    let bytes = frame.encode();
                    self.deliver_bytes(to, &bytes);
                }
            }
            // Raw bytes from the input, as a frame.
            3 => {
                let len = u.int_in_range(0..=256usize)?;
                let bytes = u.bytes(len)?.to_vec();
                if let Ok(frame) = Frame::decode(&bytes) {
                    if frame.ack.is_some() || frame.ack_bits != 0 {
                        self.tainted = true;
                    }
                    self.apply(to, frame);
                }
            }
            // A forged segment with a plausible header but no valid tag.
            4 => {
                let count = u.int_in_range(1..=4u32)?;
                let index = u.int_in_range(0..=count - 1)?;
                let seq = u64::from(index) + u.int_in_range(0..=600u64)?;
                let mut payload = index.to_be_bytes().to_vec();
                payload.extend_from_slice(&count.to_be_bytes());
                let len = u.int_in_range(0..=64usize)?;
                payload.extend_from_slice(u.bytes(len)?);
                let frame = Frame::new(
                    STREAM_ID,
                    Body::Data(Data {
                        seq,
                        segment_index: index,
                        segment_count: count,
                        payload,
                    }),
                );
                self.apply(to, frame);
            }
            5 => self.apply(to, Frame::new(STREAM_ID, Body::Heartbeat)),
            _ => self.apply(
                to,
                Frame::new(
                    STREAM_ID,
                    Body::Reset {
                        reason: "injected".into(),
                    },
                ),
            ),
        }
        Ok(())
    }

    fn step(&mut self, u: &mut Unstructured) -> arbitrary::Result<()> {
        let d = usize::from(u.arbitrary::<bool>()?);
        match u.int_in_range(0..=11u8)? {
            0 | 1 => {
                let len = match u.int_in_range(0..=19u8)? {
                    0..=11 => usize::from(u.arbitrary::<u8>()?),
                    12..=18 => u.int_in_range(0..=3 * MAX_SEGMENT_PLAINTEXT_BYTES + 1)?,
                    _ => u.int_in_range(0..=4 * 1024 * 1024)?,
                };
                self.send(d, len);
            }
            2 => self.pump(d),
            3 => {
                let index = u.arbitrary::<u16>()?;
                self.deliver(d, usize::from(index), false);
            }
            4 => {
                let n = self.wires[d].frames.len();
                for _ in 0..n {
                    self.deliver(d, 0, false);
                }
            }
            5 => {
                let index = u.arbitrary::<u16>()?;
                self.deliver(d, usize::from(index), true);
            }
            6 => {
                let index = u.arbitrary::<u16>()?;
                self.wires[d].remove(usize::from(index));
            }
            7 => {
                let ms = u.arbitrary::<u16>()?;
                self.advance(Duration::from_millis(u64::from(ms)));
            }
            8 => self.read(d),
            9 => {
                let peer = &mut self.peers[d];
                peer.stream.on_reconnect(self.now);
                peer.resumes_pending += 1;
            }
            10 => self.wires[d].frames.make_contiguous().reverse(),
            _ => self.inject(u, d)?,
        }
        Ok(())
    }

    /// A clean network until both ends are idle; every message must arrive.
    fn settle(&mut self) {
        for _ in 0..400 {
            for d in 0..2 {
                self.peers[d].resumes_pending += 1;
                self.pump(d);
            }
            for d in 0..2 {
                while !self.wires[d].frames.is_empty() {
                    self.deliver(d, 0, false);
                }
                self.read(1 - d);
            }
            if self.any_closed() {
                return;
            }
            let done = (0..2).all(|d| {
                self.peers[d].stream.is_idle()
                    && self.peers[1 - d].received == self.peers[d].sent.len()
            });
            if done {
                return;
            }
            self.advance(Duration::from_millis(250));
        }
        if !self.any_closed() {
            panic!(
                "a clean network did not deliver everything: sent {:?}/{:?}, received {}/{}",
                self.peers[0].sent.len(),
                self.peers[1].sent.len(),
                self.peers[1].received,
                self.peers[0].received
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut world = World::new();
    while !u.is_empty() {
        if world.step(&mut u).is_err() {
            break;
        }
    }
    world.read(0);
    world.read(1);
    if !world.tainted && !world.any_closed() {
        world.settle();
    }
});
