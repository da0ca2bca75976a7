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
//! - Every outbound frame carries the cumulative `ack` and `ack_bits`; an ack-only frame goes
//!   out when something arrived and nothing else is sent.
//! - Unacknowledged segments are retransmitted after the retransmission timeout (RFC 6298
//!   estimate, doubled for each timeout of the oldest segment while nothing is heard from the
//!   peer, up to [`MAX_RTO`]; back to the estimate once a frame arrives), or at once when
//!   [`FAST_RETRANSMIT_SACKS`] later seqs were acknowledged. Timers only resend segments within
//!   [`ACK_BITS_SPAN`] of the oldest unacknowledged one, the part of the window the peer's acks
//!   can describe; later segments wait until the front moves.
//! - Limits: [`MAX_UNACKED_SEGMENTS`] / [`MAX_UNACKED_BYTES`] in flight,
//!   [`RECEIVE_WINDOW_SEGMENTS`] / [`MAX_OUT_OF_ORDER_BYTES`] held out of order,
//!   [`MAX_UNDELIVERED_BYTES`] waiting for the application, [`MAX_MESSAGE_BYTES`] per message.
//!   A segment over a receive limit is dropped unacknowledged and arrives again later.
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

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::frame::{Body, Data, Frame};
use super::limits::{
    ACK_AUTH_BYTES, ACK_BITS_SPAN, ACK_NONCE_BASE, ACK_RECORD_BYTES, FAST_RETRANSMIT_SACKS,
    HEARTBEAT_INTERVAL, INITIAL_RTO, LIVENESS_TIMEOUT, MAX_AUTH_FAILURES, MAX_DATA_SEQ,
    MAX_MESSAGE_BYTES, MAX_OUT_OF_ORDER_BYTES, MAX_RTO, MAX_SEGMENT_PLAINTEXT_BYTES,
    MAX_SEND_QUEUE_BYTES, MAX_UNACKED_BYTES, MAX_UNACKED_SEGMENTS, MAX_UNDELIVERED_BYTES, MIN_RTO,
    RECEIVE_WINDOW_SEGMENTS, REORDERING_WINDOW_MIN, SEGMENT_HEADER_BYTES,
};

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

#[derive(Debug)]
struct InFlight {
    /// Plaintext bytes (what the window counts).
    len: usize,
    index: u32,
    count: u32,
    payload: Vec<u8>,
    first_sent: Instant,
    /// When this segment was last (re)sent.
    last_sent: Instant,
    retransmit_at: Instant,
    attempts: u32,
    /// Sent again after a reconnect (its backoff restarted, so `attempts` alone cannot tell).
    resent: bool,
    fast_retransmitted: bool,
    /// A fast retransmission is due (not a timeout: it does not count towards the backoff).
    fast_pending: bool,
}

#[derive(Debug)]
struct Received {
    index: u32,
    count: u32,
    /// The opened segment, header included (stripping it here would copy every segment once
    /// more; reassembly copies the content anyway).
    plaintext: Vec<u8>,
}

impl Received {
    fn content(&self) -> &[u8] {
        &self.plaintext[SEGMENT_HEADER_BYTES..]
    }
}

#[derive(Debug)]
struct Reassembly {
    start_seq: u64,
    count: u32,
    next_index: u32,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl RttEstimator {
    fn rto(&self) -> Duration {
        match self.srtt {
            None => INITIAL_RTO,
            Some(srtt) => (srtt + 4 * self.rttvar).clamp(MIN_RTO, MAX_RTO),
        }
    }

    /// RFC 6298 smoothing.
    fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }
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
    ack_pending: bool,
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
            ack_pending: false,
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

    /// The current retransmission timeout (before any per-segment backoff).
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
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

    /// The rendezvous socket came back: announce our next seq and retransmit everything
    /// unacknowledged now, with a fresh backoff.
    pub fn on_reconnect(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.control.push_back(Body::Resume {
            next_seq: self.next_seq,
        });
        self.retransmit_all(now);
    }

    /// Apply one frame from the peer.
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        let fresh = match self.check_ack_auth(&frame) {
            Ok(fresh) => fresh,
            Err(reason) => {
                self.fail(reason, false);
                return;
            }
        };
        if fresh {
            self.peer_authenticated = true;
            self.last_received = now;
            self.heard_since_timeout = true;
            if let Err(reason) = self.apply_ack(frame.ack, frame.ack_bits, now) {
                self.fail(reason, false);
                return;
            }
        }
        match frame.body {
            Body::Data(data) => {
                if let Err(reason) = self.receive_data(data) {
                    self.fail(reason, false);
                }
            }
            Body::Resume { .. } if !fresh => {}
            Body::Resume { next_seq } => {
                if next_seq < self.expected {
                    self.fail(
                        format!(
                            "peer resumed at seq {next_seq} but seq {} was already received; it lost its state",
                            self.expected - 1
                        ),
                        false,
                    );
                    return;
                }
                self.ack_pending = true;
                self.retransmit_all(now);
            }
            Body::Reset { reason } => self.fail(reason, true),
            Body::Ack | Body::Heartbeat | Body::Handshake(_) => {}
        }
    }

    /// When [`Self::handle_timeout`] should next run (absent new frames). Call
    /// [`Self::poll_transmit`] until it returns `None` before sleeping.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let heartbeat = self.last_sent + HEARTBEAT_INTERVAL;
        let liveness = self.last_received + LIVENESS_TIMEOUT;
        let mut next = heartbeat.min(liveness);
        if let Some(retransmit) = self.next_retransmit {
            next = next.min(retransmit);
        }
        Some(next)
    }

    /// Check the liveness deadline; retransmissions and heartbeats come out of
    /// [`Self::poll_transmit`].
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed.is_none() && now >= self.last_received + LIVENESS_TIMEOUT {
            self.fail(
                format!("liveness timeout: nothing heard from the peer for {LIVENESS_TIMEOUT:?}"),
                true,
            );
        }
    }

    /// The next frame to send, if any. Every frame carries the current ack and ack_bits.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Frame> {
        let body = self.next_body(now)?;
        self.last_sent = now;
        self.ack_pending = false;
        let (ack, ack_bits) = self.ack_fields();
        let ack_auth = self.seal_ack(ack, ack_bits, &body);
        Some(Frame {
            stream_id: self.stream_id.clone(),
            ack,
            ack_bits,
            ack_auth,
            source: 0,
            body,
        })
    }

    /// `ack_auth` for a frame with these fields (empty when the cipher does not authenticate,
    /// or when sealing failed: the peer then treats the frame as forged and resets).
    fn seal_ack(&mut self, ack: Option<u64>, ack_bits: u32, body: &Body) -> Vec<u8> {
        if !self.cipher.authenticates() || self.ack_counter >= MAX_DATA_SEQ {
            return Vec::new();
        }
        let counter = self.ack_counter;
        self.ack_counter += 1;
        let record = ack_record(ack, ack_bits, body);
        match self.cipher.seal(ACK_NONCE_BASE + counter, &record) {
            Ok(sealed) => {
                let mut auth = Vec::with_capacity(ACK_AUTH_BYTES);
                auth.extend_from_slice(&counter.to_be_bytes());
                auth.extend_from_slice(&sealed);
                auth
            }
            Err(_) => Vec::new(),
        }
    }

    /// Check a frame's `ack_auth`: `Ok(true)` when its ack fields (and resume) may be applied,
    /// `Ok(false)` when they must be ignored (a replay, or a reset without them), `Err` when the
    /// frame is forged.
    fn check_ack_auth(&mut self, frame: &Frame) -> Result<bool, String> {
        if !self.cipher.authenticates() {
            self.peer_authenticated = true;
            return Ok(true);
        }
        if frame.ack_auth.is_empty() {
            // A frame that claims nothing (a reset from outside the stream, or one injected by
            // the relay) is not forged, only unauthenticated: it confirms and refreshes nothing.
            let claims = frame.ack.is_some()
                || frame.ack_bits != 0
                || matches!(frame.body, Body::Resume { .. });
            if !claims || matches!(frame.body, Body::Reset { .. }) {
                return Ok(false);
            }
            return Err(format!(
                "forged ack: ack fields or resume without ack_auth (ack {:?}, ack_bits {:#x})",
                frame.ack, frame.ack_bits
            ));
        }
        let (counter_bytes, sealed) = frame.ack_auth.split_at(8);
        let mut counter = [0u8; 8];
        counter.copy_from_slice(counter_bytes);
        let counter = u64::from_be_bytes(counter);
        if counter >= MAX_DATA_SEQ {
            return Err(format!("forged ack: counter {counter} out of range"));
        }
        let record = self
            .cipher
            .open(ACK_NONCE_BASE + counter, sealed)
            .map_err(|e| format!("forged ack: ack_auth {counter} does not authenticate ({e})"))?;
        if record != ack_record(frame.ack, frame.ack_bits, &frame.body) {
            return Err(format!(
                "forged ack: ack {:?} / ack_bits {:#x} differ from what ack_auth {counter} authenticates",
                frame.ack, frame.ack_bits
            ));
        }
        if self
            .peer_ack_counter
            .is_some_and(|highest| counter <= highest)
        {
            self.stats.replayed_acks += 1;
            return Ok(false);
        }
        self.peer_ack_counter = Some(counter);
        Ok(true)
    }

    fn next_body(&mut self, now: Instant) -> Option<Body> {
        if self.closed.is_some() {
            // Only a pending reset (queued by `fail`) may still go out.
            return match self.control.pop_front() {
                Some(body @ Body::Reset { .. }) => Some(body),
                _ => {
                    self.control.clear();
                    None
                }
            };
        }
        if let Some(body) = self.control.pop_front() {
            return Some(body);
        }
        if let Some(body) = self.due_retransmission(now) {
            return Some(body);
        }
        match self.next_new_segment(now) {
            Ok(Some(body)) => return Some(body),
            Ok(None) => {}
            Err(error) => {
                self.fail(error.to_string(), false);
                return self.next_body(now);
            }
        }
        if self.ack_pending {
            return Some(Body::Ack);
        }
        if now >= self.last_sent + HEARTBEAT_INTERVAL {
            return Some(Body::Heartbeat);
        }
        None
    }

    fn due_retransmission(&mut self, now: Instant) -> Option<Body> {
        if self.next_retransmit.is_none_or(|at| at > now) {
            return None;
        }
        let rto = self.rtt.rto();
        let mut found = None;
        let mut earliest: Option<Instant> = None;
        // Only the front of the window is retransmitted on a timer: the peer's ack and ack_bits
        // describe seqs up to `front + ACK_BITS_SPAN` and nothing beyond, so a later segment
        // the peer already holds would be resent blindly, and under loss such resends were
        // most of the traffic. Later segments wait until the front moves (see `apply_ack`).
        let visible_end = self
            .in_flight
            .keys()
            .next()
            .map_or(0, |front| front + ACK_BITS_SPAN);
        let front = self.in_flight.keys().next().copied();
        for (&seq, segment) in self.in_flight.range_mut(..visible_end) {
            if found.is_none() && segment.retransmit_at <= now {
                segment.attempts += 1;
                if Some(seq) == front && !segment.fast_pending {
                    // The oldest segment timed out. A peer that went quiet gets exponentially
                    // fewer resends; one still sending frames is alive and only lost this
                    // segment (or its ack), so the next try comes one plain timeout later.
                    if self.heard_since_timeout {
                        self.backoff = 0;
                    } else {
                        self.backoff = self.backoff.saturating_add(1);
                    }
                    self.heard_since_timeout = false;
                }
                segment.fast_pending = false;
                segment.last_sent = now;
                let backoff = rto.saturating_mul(1 << self.backoff.min(8));
                segment.retransmit_at = now + backoff.min(MAX_RTO);
                found = Some(Body::Data(Data {
                    seq,
                    segment_index: segment.index,
                    segment_count: segment.count,
                    payload: segment.payload.clone(),
                }));
            }
            earliest =
                Some(earliest.map_or(segment.retransmit_at, |e| e.min(segment.retransmit_at)));
        }
        self.next_retransmit = earliest;
        if found.is_some() {
            self.stats.retransmissions += 1;
        }
        found
    }

    fn next_new_segment(&mut self, now: Instant) -> Result<Option<Body>, StreamError> {
        let Some(head) = self.send_queue.front() else {
            return Ok(None);
        };
        let count = head.len().div_ceil(MAX_SEGMENT_PLAINTEXT_BYTES).max(1);
        let end = (self.head_offset + MAX_SEGMENT_PLAINTEXT_BYTES).min(head.len());
        let chunk_len = end - self.head_offset;
        if self.in_flight.len() >= MAX_UNACKED_SEGMENTS
            || (self.in_flight_bytes + chunk_len > MAX_UNACKED_BYTES && !self.in_flight.is_empty())
        {
            return Ok(None);
        }
        // count <= MAX_SEGMENTS_PER_MESSAGE because head.len() <= MAX_MESSAGE_BYTES.
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        let index = self.head_index;
        let mut plaintext = Vec::with_capacity(SEGMENT_HEADER_BYTES + chunk_len);
        plaintext.extend_from_slice(&index.to_be_bytes());
        plaintext.extend_from_slice(&count.to_be_bytes());
        plaintext.extend_from_slice(&head[self.head_offset..end]);
        let seq = self.next_seq;
        let payload = self.cipher.seal(seq, &plaintext)?;
        self.next_seq += 1;
        if end == head.len() {
            let len = head.len();
            self.send_queue.pop_front();
            self.queued_bytes -= len;
            self.head_offset = 0;
            self.head_index = 0;
        } else {
            self.head_offset = end;
            self.head_index += 1;
        }
        let retransmit_at = now + self.rtt.rto();
        self.next_retransmit = Some(
            self.next_retransmit
                .map_or(retransmit_at, |at| at.min(retransmit_at)),
        );
        self.in_flight_bytes += chunk_len;
        self.in_flight.insert(
            seq,
            InFlight {
                len: chunk_len,
                index,
                count,
                payload: payload.clone(),
                first_sent: now,
                last_sent: now,
                retransmit_at,
                attempts: 1,
                resent: false,
                fast_retransmitted: false,
                fast_pending: false,
            },
        );
        self.stats.segments_sent += 1;
        Ok(Some(Body::Data(Data {
            seq,
            segment_index: index,
            segment_count: count,
            payload,
        })))
    }

    fn retransmit_all(&mut self, now: Instant) {
        self.backoff = 0;
        for segment in self.in_flight.values_mut() {
            segment.retransmit_at = now;
            segment.attempts = 1;
            segment.resent = true;
        }
        if !self.in_flight.is_empty() {
            self.next_retransmit = Some(now);
        }
    }

    fn ack_fields(&self) -> (Option<u64>, u32) {
        let ack = self.expected.checked_sub(1);
        let mut bits = 0u32;
        // Bit i acknowledges expected + i; bit 0 is always clear (expected is missing).
        for (&seq, _) in self
            .out_of_order
            .range(self.expected..self.expected + ACK_BITS_SPAN)
        {
            bits |= 1 << (seq - self.expected);
        }
        (ack, bits)
    }

    fn apply_ack(&mut self, ack: Option<u64>, bits: u32, now: Instant) -> Result<(), String> {
        let base = match ack {
            Some(ack) => {
                if ack >= self.next_seq {
                    return Err(format!(
                        "peer acknowledged seq {ack} but only seqs below {} were sent",
                        self.next_seq
                    ));
                }
                ack + 1
            }
            None => 0,
        };
        if bits != 0 {
            let highest = base + u64::from(31 - bits.leading_zeros());
            if highest >= self.next_seq {
                return Err(format!(
                    "peer acknowledged seq {highest} in ack_bits but only seqs below {} were sent",
                    self.next_seq
                ));
            }
        }
        let front = self.in_flight.keys().next().copied();
        // Latest first send time among the segments this ack acknowledges (loss detection).
        let mut latest: Option<Instant> = None;
        // Cumulative part. Only the oldest segment's ack is a round-trip sample: a later one
        // may have waited at the peer for a hole to fill, and counting that wait inflated the
        // timeout to MAX_RTO under loss.
        while let Some(entry) = self.in_flight.first_entry() {
            if *entry.key() >= base {
                break;
            }
            let sample = Some(*entry.key()) == front;
            let segment = entry.remove();
            latest = latest.max(Some(self.acknowledged(&segment, sample, now)));
        }
        if bits != 0 {
            latest = latest.max(self.apply_ack_bits(base, bits, now));
        }
        let new_front = self.in_flight.keys().next().copied();
        if let (Some(old), Some(new)) = (front, new_front)
            && new != old
        {
            self.front_moved(old + ACK_BITS_SPAN, new + ACK_BITS_SPAN, now);
        }
        if let (Some(latest), Some(front)) = (latest, new_front) {
            self.detect_losses(latest, front + ACK_BITS_SPAN, now);
        }
        Ok(())
    }

    /// Time-based loss detection (after RACK, RFC 8985): the peer just acknowledged a segment
    /// sent at `latest`, so an unacknowledged segment sent more than a reordering window before
    /// it is lost; resend it now rather than at its timeout. Unlike counting later acks, this
    /// also catches a lost retransmission, which otherwise waits for the (backed off) timeout.
    fn detect_losses(&mut self, latest: Instant, visible_end: u64, now: Instant) {
        let window = self.rtt.srtt.map_or(REORDERING_WINDOW_MIN, |srtt| {
            (srtt / 4).max(REORDERING_WINDOW_MIN)
        });
        for segment in self.in_flight.range_mut(..visible_end).map(|(_, s)| s) {
            if segment.last_sent + window < latest && segment.retransmit_at > now {
                segment.retransmit_at = now;
                segment.fast_pending = true;
                self.next_retransmit = Some(now);
            }
        }
    }

    /// Segments in `from..to` just came within [`ACK_BITS_SPAN`] of the front. One whose timer
    /// ran out while it was out of view gets a fresh timeout: the acks that moved the front will
    /// describe it soon, and a hole among them is fast-retransmitted. Segments queued for resending
    /// by a reconnect go at once.
    fn front_moved(&mut self, from: u64, to: u64, now: Instant) {
        let fresh = now + self.rtt.rto();
        for segment in self.in_flight.range_mut(from..to).map(|(_, s)| s) {
            if segment.retransmit_at <= now && !segment.resent {
                segment.retransmit_at = fresh;
            }
        }
        self.next_retransmit = Some(now);
    }

    /// Apply the selective part of an ack; returns the latest first send time it acknowledged.
    fn apply_ack_bits(&mut self, base: u64, bits: u32, now: Instant) -> Option<Instant> {
        let mut highest_sacked = None;
        let mut latest = None;
        for i in 0..ACK_BITS_SPAN {
            if bits & (1 << i) != 0 {
                let seq = base + i;
                highest_sacked = Some(seq);
                if let Some(segment) = self.in_flight.remove(&seq) {
                    latest = latest.max(Some(self.acknowledged(&segment, false, now)));
                }
            }
        }
        if let Some(highest) = highest_sacked {
            for (&seq, segment) in self.in_flight.range_mut(..highest) {
                if highest - seq >= FAST_RETRANSMIT_SACKS && !segment.fast_retransmitted {
                    segment.fast_retransmitted = true;
                    segment.fast_pending = true;
                    segment.retransmit_at = now;
                    self.next_retransmit = Some(now);
                }
            }
        }
        latest
    }

    /// Account for one acknowledged segment; returns the send time loss detection compares
    /// against: its first one, since which copy of a resent segment arrived is unknown.
    fn acknowledged(&mut self, segment: &InFlight, sample: bool, now: Instant) -> Instant {
        self.in_flight_bytes -= segment.len;
        // New data acknowledged: the path works, so timeouts start again from the plain RTO.
        self.backoff = 0;
        // Karn: an ack for a segment sent more than once says nothing about the round trip.
        if sample && segment.attempts == 1 && !segment.resent {
            self.rtt
                .sample(now.saturating_duration_since(segment.first_sent));
        }
        segment.first_sent
    }

    fn receive_data(&mut self, data: Data) -> Result<(), String> {
        self.ack_pending = true;
        let seq = data.seq;
        if seq < self.expected || self.out_of_order.contains_key(&seq) {
            self.stats.duplicates += 1;
            return Ok(());
        }
        let over_window = seq >= self.expected + RECEIVE_WINDOW_SEGMENTS;
        let over_buffer = seq != self.expected
            && self.out_of_order_bytes + data.payload.len() > MAX_OUT_OF_ORDER_BYTES;
        let over_undelivered = self.delivered_bytes >= MAX_UNDELIVERED_BYTES;
        if over_window || over_buffer || over_undelivered {
            self.stats.dropped_over_limit += 1;
            return Ok(());
        }
        let plaintext = match self.cipher.open(seq, &data.payload) {
            Ok(plaintext) => plaintext,
            Err(error) => {
                self.stats.auth_failures += 1;
                if self.stats.auth_failures > MAX_AUTH_FAILURES {
                    return Err(format!(
                        "more than MAX_AUTH_FAILURES ({MAX_AUTH_FAILURES}) segments failed authentication; last: {error}"
                    ));
                }
                return Ok(());
            }
        };
        let header_ok = plaintext.len() >= SEGMENT_HEADER_BYTES
            && plaintext[..4] == data.segment_index.to_be_bytes()
            && plaintext[4..8] == data.segment_count.to_be_bytes();
        if !header_ok {
            return Err(format!(
                "segment {seq}: the authenticated index/count do not match the frame's ({}/{})",
                data.segment_index, data.segment_count
            ));
        }
        self.out_of_order_bytes += plaintext.len() - SEGMENT_HEADER_BYTES;
        self.out_of_order.insert(
            seq,
            Received {
                index: data.segment_index,
                count: data.segment_count,
                plaintext,
            },
        );
        while let Some(segment) = self.out_of_order.remove(&self.expected) {
            self.out_of_order_bytes -= segment.content().len();
            let seq = self.expected;
            self.expected += 1;
            self.reassemble(seq, segment)?;
        }
        Ok(())
    }

    fn reassemble(&mut self, seq: u64, segment: Received) -> Result<(), String> {
        let Some(start_seq) = seq.checked_sub(u64::from(segment.index)) else {
            return Err(format!(
                "segment {seq} has index {} beyond its seq",
                segment.index
            ));
        };
        let mut message = match self.reassembly.take() {
            None => {
                if segment.index != 0 {
                    return Err(format!(
                        "segment {seq} has index {} but no message is in progress",
                        segment.index
                    ));
                }
                Reassembly {
                    start_seq,
                    count: segment.count,
                    next_index: 0,
                    // Reserved once: growing by doubling would copy a large message again.
                    // The count was checked against MAX_SEGMENTS_PER_MESSAGE, so this stays
                    // within MAX_MESSAGE_BYTES.
                    bytes: Vec::with_capacity(
                        (segment.count as usize)
                            .saturating_mul(MAX_SEGMENT_PLAINTEXT_BYTES)
                            .min(MAX_MESSAGE_BYTES),
                    ),
                }
            }
            Some(message) => message,
        };
        if segment.index != message.next_index
            || segment.count != message.count
            || start_seq != message.start_seq
        {
            return Err(format!(
                "segment {seq} ({}/{}) does not continue the message that started at seq {} ({} segments)",
                segment.index, segment.count, message.start_seq, message.count
            ));
        }
        if message.bytes.len() + segment.content().len() > MAX_MESSAGE_BYTES {
            return Err(format!(
                "message starting at seq {} exceeds MAX_MESSAGE_BYTES ({MAX_MESSAGE_BYTES})",
                message.start_seq
            ));
        }
        if message.next_index == 0 && segment.count == 1 {
            // Single-segment message: shift the content over the header, no new buffer.
            let mut bytes = segment.plaintext;
            bytes.drain(..SEGMENT_HEADER_BYTES);
            self.delivered_bytes += bytes.len();
            self.delivered.push_back(bytes);
            return Ok(());
        }
        message.bytes.extend_from_slice(segment.content());
        message.next_index += 1;
        if message.next_index == message.count {
            self.delivered_bytes += message.bytes.len();
            self.delivered.push_back(message.bytes);
        } else {
            self.reassembly = Some(message);
        }
        Ok(())
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
        self.events
            .push_back(StreamEvent::Closed { reason, by_peer });
    }
}

/// The fields `ack_auth` covers, in a fixed layout ([`ACK_RECORD_BYTES`]).
fn ack_record(ack: Option<u64>, ack_bits: u32, body: &Body) -> Vec<u8> {
    let mut record = Vec::with_capacity(ACK_RECORD_BYTES);
    record.push(u8::from(ack.is_some()));
    record.extend_from_slice(&ack.unwrap_or(0).to_be_bytes());
    record.extend_from_slice(&ack_bits.to_be_bytes());
    let (kind, next_seq) = match body {
        Body::Data(_) => (1u8, 0),
        Body::Ack => (2, 0),
        Body::Resume { next_seq } => (3, *next_seq),
        Body::Reset { .. } => (4, 0),
        Body::Heartbeat => (5, 0),
        Body::Handshake(_) => (6, 0),
    };
    record.push(kind);
    record.extend_from_slice(&next_seq.to_be_bytes());
    record
}
