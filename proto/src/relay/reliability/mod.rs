//! The sans-I/O reliable stream: whole messages in, frames out; frames in, whole messages out,
//! exactly once and in order, through loss, duplication, reordering and reconnects.
//!
//! Rules (see docs/remote.md for the wire view):
//! - Each direction numbers segments `0, 1, 2, ...`; a message of n bytes becomes
//!   `max(1, ceil(n / MAX_SEGMENT_PLAINTEXT_BYTES))` segments with contiguous seqs, and the
//!   receiver finds its start as `seq - segment_index`.
//! - A segment is sealed by the [`SegmentCipher`] once, when it gets its seq; retransmissions
//!   resend the same bytes. The plaintext starts with the segment index and count, so a router
//!   cannot re-label segments.
//! - Every outbound frame carries the cumulative `ack` and `ack_bits`. An ack-only frame goes
//!   out at once for out-of-order, duplicate or refused data and for every
//!   [`ACK_EVERY_SEGMENTS`]th in-order segment; otherwise in-order data waits up to
//!   [`ACK_DELAY`] for a frame (a reply, the next request) to carry its ack.
//! - Unacknowledged segments are retransmitted after the retransmission timeout (RFC 6298
//!   estimate, doubled for each timeout of the oldest segment while nothing is heard from the
//!   peer, up to [`MAX_RTO`]; back to the estimate once a frame arrives), or at once when
//!   [`FAST_RETRANSMIT_SACKS`] later seqs were acknowledged. Timers only resend segments within
//!   [`ACK_BITS_SPAN`] of the oldest unacknowledged one, the part of the window the peer's acks
//!   can describe; later segments wait until the front moves.
//! - Limits: [`MAX_UNACKED_SEGMENTS`] / [`MAX_UNACKED_BYTES`] in flight,
//!   [`RECEIVE_WINDOW_SEGMENTS`] / [`MAX_OUT_OF_ORDER_BYTES`] held out of order,
//!   [`MAX_UNDELIVERED_BYTES`] waiting for the application, [`MAX_MESSAGE_BYTES`] per message;
//!   what is held out of order or in reassembly is also charged to the endpoint's
//!   [`ReceiveBudget`] when it has one. A segment over a receive limit is dropped
//!   unacknowledged and arrives again later. A stream holding an unfinished message that
//!   completes no message for [`REASSEMBLY_DEADLINE`] is reset.
//! - Any protocol violation by the peer resets the stream (a `reset` frame goes out).
//! - Acks are authenticated: every frame this stream sends carries `ack_auth`, the ack fields,
//!   the body's kind and a resume's `next_seq` sealed by the cipher under nonce
//!   [`ACK_NONCE_BASE`] + a per-direction counter. A frame whose `ack_auth` is missing while it
//!   carries ack fields or a resume (resets excepted), does not open, or does not match the
//!   frame's clear fields is forged: the stream is reset. A counter not above the highest one accepted is a replay (or a
//!   reordered duplicate): its ack and resume are ignored and counted, the data it carries is
//!   still considered (data authenticates itself). Only an authenticated frame counts as
//!   hearing from the peer (liveness, [`ReliableStream::peer_authenticated`]). A cipher that
//!   does not authenticate ([`PlaintextCipher`]) uses the clear fields.

mod budget;
mod receive;
mod rtt;
mod send;

pub use budget::ReceiveBudget;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::frame::Body;
use super::limits::{ACK_RECORD_BYTES, MAX_MESSAGE_BYTES, MAX_SEND_QUEUE_BYTES};
// Named only by the doc comments (the code that uses them is in the submodules).
#[cfg(doc)]
use super::limits::{
    ACK_BITS_SPAN, ACK_DELAY, ACK_EVERY_SEGMENTS, ACK_NONCE_BASE, FAST_RETRANSMIT_SACKS,
    MAX_OUT_OF_ORDER_BYTES, MAX_RTO, MAX_UNACKED_BYTES, MAX_UNACKED_SEGMENTS,
    MAX_UNDELIVERED_BYTES, REASSEMBLY_DEADLINE, RECEIVE_WINDOW_SEGMENTS,
};

use budget::HeldCharge;
use receive::{Reassembly, Received};
use rtt::RttEstimator;
use send::InFlight;

/// Seals and opens segments; `seq` is the nonce. Implemented by the Noise transport keys
/// ([`super::noise::NoiseCipher`]) and, for tests and benchmarks, [`PlaintextCipher`].
pub trait SegmentCipher {
    /// Encrypt and authenticate one segment.
    ///
    /// # Errors
    /// [`CipherError`] when the cipher refuses (e.g. nonce exhausted).
    fn seal(&mut self, seq: u64, plaintext: &[u8]) -> Result<Vec<u8>, CipherError>;
    /// Decrypt and check one segment.
    ///
    /// # Errors
    /// [`CipherError`] when authentication fails.
    fn open(&mut self, seq: u64, ciphertext: &[u8]) -> Result<Vec<u8>, CipherError>;
    /// [`Self::seal`], appending the ciphertext to `out` (no allocation when `out` has room:
    /// the per-frame `ack_auth` is sealed straight into the field).
    ///
    /// # Errors
    /// As [`Self::seal`].
    fn seal_append(
        &mut self,
        seq: u64,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), CipherError> {
        out.extend_from_slice(&self.seal(seq, plaintext)?);
        Ok(())
    }
    /// [`Self::open`] into `out`; returns the plaintext's length (the per-frame `ack_auth`
    /// record opens into a stack buffer).
    ///
    /// # Errors
    /// As [`Self::open`], and when the plaintext is longer than `out`.
    fn open_into(
        &mut self,
        seq: u64,
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CipherError> {
        let plaintext = self.open(seq, ciphertext)?;
        let Some(target) = out.get_mut(..plaintext.len()) else {
            return Err(CipherError {
                seq,
                reason: format!(
                    "plaintext of {} bytes does not fit a {}-byte buffer",
                    plaintext.len(),
                    out.len()
                ),
            });
        };
        target.copy_from_slice(&plaintext);
        Ok(plaintext.len())
    }
    /// Whether [`Self::open`] authenticates (false only for [`PlaintextCipher`]); acks are
    /// authenticated only with a cipher that does.
    fn authenticates(&self) -> bool {
        true
    }
}

/// A cipher refused a segment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("segment {seq}: {reason}")]
pub struct CipherError {
    /// The segment.
    pub seq: u64,
    /// What failed (never key material).
    pub reason: String,
}

/// No encryption: the identity. For tests and the relay benchmark's baseline only.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlaintextCipher;

impl SegmentCipher for PlaintextCipher {
    fn seal(&mut self, _seq: u64, plaintext: &[u8]) -> Result<Vec<u8>, CipherError> {
        Ok(plaintext.to_vec())
    }
    fn open(&mut self, _seq: u64, ciphertext: &[u8]) -> Result<Vec<u8>, CipherError> {
        Ok(ciphertext.to_vec())
    }
    fn authenticates(&self) -> bool {
        false
    }
}

/// Something the application should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The Noise handshake finished ([`super::SecureStream`] only).
    Established,
    /// One whole application message.
    Message(Vec<u8>),
    /// The stream ended; nothing more will be delivered.
    Closed {
        /// Why.
        reason: String,
        /// True when the peer sent the reset (or vanished); false when we reset it.
        by_peer: bool,
    },
}

/// Why a message could not be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The message is larger than [`MAX_MESSAGE_BYTES`].
    #[error("message of {len} bytes exceeds MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES})")]
    MessageTooLarge {
        /// Its size.
        len: usize,
    },
    /// [`MAX_SEND_QUEUE_BYTES`] are already queued; wait for [`ReliableStream::can_accept_message`].
    #[error("send queue full ({MAX_SEND_QUEUE_BYTES} bytes); wait until it drains")]
    QueueFull,
    /// The stream is closed.
    #[error("stream is closed: {0}")]
    Closed(String),
    /// Sealing failed.
    #[error("cannot seal a segment: {0}")]
    Cipher(#[from] CipherError),
}

/// Counters, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    /// Data segments sent for the first time.
    pub segments_sent: u64,
    /// Data segments sent again.
    pub retransmissions: u64,
    /// Data segments received that were already received.
    pub duplicates: u64,
    /// Data segments dropped by a receive limit.
    pub dropped_over_limit: u64,
    /// Data segments that failed authentication.
    pub auth_failures: u32,
    /// Authenticated acks ignored because their counter was not new (replayed or reordered).
    pub replayed_acks: u64,
}

/// One direction pair of a relay stream; see the module docs.
#[derive(Debug)]
pub struct ReliableStream<C> {
    stream_id: String,
    cipher: C,
    // Sending.
    next_seq: u64,
    send_queue: VecDeque<Vec<u8>>,
    queued_bytes: usize,
    head_offset: usize,
    head_index: u32,
    /// Where the next segment's plaintext is built before sealing (kept between segments up to
    /// `send::PLAINTEXT_SCRATCH_KEPT_BYTES`).
    plaintext_scratch: Vec<u8>,
    in_flight: BTreeMap<u64, InFlight>,
    in_flight_bytes: usize,
    next_retransmit: Option<Instant>,
    rtt: RttEstimator,
    /// Timeouts of the oldest segment since an ack last acknowledged new data: retransmission
    /// timeouts are the RTO doubled this many times (capped at [`MAX_RTO`]).
    backoff: u32,
    /// A frame arrived since the oldest segment last timed out.
    heard_since_timeout: bool,
    // Receiving.
    expected: u64,
    out_of_order: BTreeMap<u64, Received>,
    out_of_order_bytes: usize,
    reassembly: Option<Reassembly>,
    delivered: VecDeque<Vec<u8>>,
    delivered_bytes: usize,
    /// The out-of-order and reassembly bytes, charged to the endpoint's budget.
    held: HeldCharge,
    /// Messages completed so far (the reassembly deadline restarts with each).
    delivered_total: u64,
    /// Since when an unfinished message has been held with no message completed
    /// ([`REASSEMBLY_DEADLINE`]).
    incomplete_since: Option<Instant>,
    /// An ack-only frame goes out on the next poll (unless another frame carries the ack).
    ack_pending: bool,
    /// In-order data arrived: an ack-only frame goes out at this time unless a frame carrying
    /// the ack leaves first ([`ACK_DELAY`]).
    ack_deadline: Option<Instant>,
    /// In-order data segments received since the last frame went out ([`ACK_EVERY_SEGMENTS`]).
    unacked_in_order: u32,
    // Control.
    control: VecDeque<Body>,
    closed: Option<String>,
    events: VecDeque<StreamEvent>,
    last_sent: Instant,
    last_received: Instant,
    stats: StreamStats,
    // Ack authentication.
    /// Counter of the next `ack_auth` sent.
    ack_counter: u64,
    /// Highest `ack_auth` counter accepted from the peer.
    peer_ack_counter: Option<u64>,
    /// The peer sent a frame that authenticated (it holds the transport keys).
    peer_authenticated: bool,
}

impl<C: SegmentCipher> ReliableStream<C> {
    /// A fresh stream; `now` starts the heartbeat and liveness clocks.
    pub fn new(stream_id: impl Into<String>, cipher: C, now: Instant) -> Self {
        Self {
            stream_id: stream_id.into(),
            cipher,
            next_seq: 0,
            send_queue: VecDeque::new(),
            queued_bytes: 0,
            head_offset: 0,
            head_index: 0,
            plaintext_scratch: Vec::new(),
            in_flight: BTreeMap::new(),
            in_flight_bytes: 0,
            next_retransmit: None,
            backoff: 0,
            heard_since_timeout: false,
            rtt: RttEstimator {
                srtt: None,
                rttvar: Duration::ZERO,
            },
            expected: 0,
            out_of_order: BTreeMap::new(),
            out_of_order_bytes: 0,
            reassembly: None,
            delivered: VecDeque::new(),
            delivered_bytes: 0,
            held: HeldCharge::default(),
            delivered_total: 0,
            incomplete_since: None,
            ack_pending: false,
            ack_deadline: None,
            unacked_in_order: 0,
            control: VecDeque::new(),
            closed: None,
            events: VecDeque::new(),
            last_sent: now,
            last_received: now,
            stats: StreamStats::default(),
            ack_counter: 0,
            peer_ack_counter: None,
            peer_authenticated: false,
        }
    }

    /// True once the peer sent a frame that authenticated with the stream's keys (always, with
    /// a cipher that does not authenticate, once any frame arrived).
    pub fn peer_authenticated(&self) -> bool {
        self.peer_authenticated
    }

    /// Send an ack-only frame on the next poll (key confirmation, or an answer to a repeated
    /// handshake message).
    pub fn request_ack(&mut self) {
        if self.closed.is_none() {
            self.ack_pending = true;
        }
    }

    /// Charge what this stream holds out of order or in reassembly to `budget`, shared with
    /// the endpoint's other streams.
    pub fn set_receive_budget(&mut self, budget: ReceiveBudget) {
        self.held.attach(budget);
    }

    /// The stream id.
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// A one-line summary of the stream's state, for logs.
    pub fn summary(&self) -> String {
        format!(
            "next_seq={} in_flight={} {:?}..{:?} ({} B) queued={} B expected={} out_of_order={} {:?}..{:?} ({} B) delivered={} B rto={:?} {:?}",
            self.next_seq,
            self.in_flight.len(),
            self.in_flight.keys().next(),
            self.in_flight.keys().next_back(),
            self.in_flight_bytes,
            self.queued_bytes,
            self.expected,
            self.out_of_order.len(),
            self.out_of_order.keys().next(),
            self.out_of_order.keys().next_back(),
            self.out_of_order_bytes,
            self.delivered_bytes,
            self.rtt.rto(),
            self.stats,
        )
    }

    /// Counters.
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// Bytes held for receiving: out of order, in reassembly, and delivered but not yet taken.
    /// Bounded by [`MAX_OUT_OF_ORDER_BYTES`] + [`MAX_MESSAGE_BYTES`] + [`MAX_UNDELIVERED_BYTES`].
    pub fn buffered_bytes(&self) -> usize {
        self.out_of_order_bytes
            + self.reassembly.as_ref().map_or(0, |r| r.bytes.len())
            + self.delivered_bytes
    }

    /// True once reset (by either side) or failed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// True when every message queued so far was acknowledged by the peer.
    pub fn is_idle(&self) -> bool {
        self.send_queue.is_empty() && self.in_flight.is_empty()
    }

    /// Whether [`Self::send_message`] would accept a message now.
    pub fn can_accept_message(&self) -> bool {
        self.closed.is_none() && self.queued_bytes < MAX_SEND_QUEUE_BYTES
    }

    /// Queue one application message.
    ///
    /// # Errors
    /// [`StreamError`] when it is too large, the queue is full, or the stream is closed.
    pub fn send_message(&mut self, message: Vec<u8>) -> Result<(), StreamError> {
        if let Some(reason) = &self.closed {
            return Err(StreamError::Closed(reason.clone()));
        }
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(StreamError::MessageTooLarge { len: message.len() });
        }
        if self.queued_bytes >= MAX_SEND_QUEUE_BYTES {
            return Err(StreamError::QueueFull);
        }
        self.queued_bytes += message.len();
        self.send_queue.push_back(message);
        Ok(())
    }

    /// The next whole message or state change, if any.
    pub fn poll_event(&mut self) -> Option<StreamEvent> {
        if let Some(message) = self.delivered.pop_front() {
            self.delivered_bytes -= message.len();
            return Some(StreamEvent::Message(message));
        }
        self.events.pop_front()
    }

    /// Reset the stream from this side; a `reset` frame goes out on the next poll.
    pub fn reset(&mut self, reason: impl Into<String>) {
        self.fail(reason.into(), false);
    }

    fn fail(&mut self, reason: String, by_peer: bool) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(reason.clone());
        self.control.clear();
        if !by_peer {
            self.control.push_back(Body::Reset {
                reason: reason.clone(),
            });
        }
        self.send_queue.clear();
        self.in_flight.clear();
        self.in_flight_bytes = 0;
        self.out_of_order.clear();
        self.out_of_order_bytes = 0;
        self.reassembly = None;
        self.held.release_all();
        self.incomplete_since = None;
        self.events
            .push_back(StreamEvent::Closed { reason, by_peer });
    }
}

/// The fields `ack_auth` covers, in a fixed layout ([`ACK_RECORD_BYTES`]); on the stack, since
/// every frame sent and received builds one.
fn ack_record(ack: Option<u64>, ack_bits: u32, body: &Body) -> [u8; ACK_RECORD_BYTES] {
    let (kind, next_seq) = match body {
        Body::Data(_) => (1u8, 0),
        Body::Ack => (2, 0),
        Body::Resume { next_seq } => (3, *next_seq),
        Body::Reset { .. } => (4, 0),
        Body::Heartbeat => (5, 0),
        Body::Handshake(_) => (6, 0),
    };
    let mut record = [0u8; ACK_RECORD_BYTES];
    record[0] = u8::from(ack.is_some());
    record[1..9].copy_from_slice(&ack.unwrap_or(0).to_be_bytes());
    record[9..13].copy_from_slice(&ack_bits.to_be_bytes());
    record[13] = kind;
    record[14..22].copy_from_slice(&next_seq.to_be_bytes());
    record
}
