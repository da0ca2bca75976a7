//! The sending half of [`ReliableStream`]: segmenting queued messages, the in-flight table,
//! retransmission, and building outbound frames with their ack fields and sealed `ack_auth`.

use std::time::Instant;

use super::{ReliableStream, SegmentCipher, StreamError, ack_record};
use crate::relay::frame::{Body, Data, Frame};
use crate::relay::limits::{
    ACK_AUTH_BYTES, ACK_BITS_SPAN, ACK_NONCE_BASE, HEARTBEAT_INTERVAL, MAX_DATA_SEQ, MAX_RTO,
    MAX_SEGMENT_PLAINTEXT_BYTES, MAX_UNACKED_BYTES, MAX_UNACKED_SEGMENTS, NOISE_TAG_BYTES,
};

/// Largest plaintext buffer, in bytes, a stream keeps between segments for building the next
/// one: enough for every JSON-RPC request and reply of an interactive session, so those cost no
/// allocation for it; a bulk segment's larger buffer is freed, so an idle stream holds little.
const PLAINTEXT_SCRATCH_KEPT_BYTES: usize = 4096;

#[derive(Debug)]
pub(super) struct InFlight {
    /// Plaintext bytes (what the window counts).
    pub(super) len: usize,
    index: u32,
    count: u32,
    payload: Vec<u8>,
    pub(super) first_sent: Instant,
    /// When this segment was last (re)sent.
    pub(super) last_sent: Instant,
    pub(super) retransmit_at: Instant,
    pub(super) attempts: u32,
    /// Sent again after a reconnect (its backoff restarted, so `attempts` alone cannot tell).
    pub(super) resent: bool,
    pub(super) fast_retransmitted: bool,
    /// A fast retransmission is due (not a timeout: it does not count towards the backoff).
    pub(super) fast_pending: bool,
}

impl<C: SegmentCipher> ReliableStream<C> {
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

    /// The next frame to send, if any. Every frame carries the current ack and ack_bits.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Frame> {
        let body = self.next_body(now)?;
        self.last_sent = now;
        self.ack_pending = false;
        self.ack_deadline = None;
        self.unacked_in_order = 0;
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
        let mut auth = Vec::with_capacity(ACK_AUTH_BYTES);
        auth.extend_from_slice(&counter.to_be_bytes());
        match self
            .cipher
            .seal_append(ACK_NONCE_BASE + counter, &record, &mut auth)
        {
            Ok(()) => auth,
            Err(_) => Vec::new(),
        }
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
        if self.ack_pending || self.ack_deadline.is_some_and(|at| now >= at) {
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
        // The plaintext is built in a buffer the stream keeps (one allocation less per segment)
        // and sealed straight into the payload.
        let plaintext = &mut self.plaintext_scratch;
        plaintext.clear();
        plaintext.extend_from_slice(&index.to_be_bytes());
        plaintext.extend_from_slice(&count.to_be_bytes());
        plaintext.extend_from_slice(&head[self.head_offset..end]);
        let seq = self.next_seq;
        let mut payload = Vec::with_capacity(plaintext.len() + NOISE_TAG_BYTES);
        self.cipher.seal_append(seq, plaintext, &mut payload)?;
        if plaintext.capacity() > PLAINTEXT_SCRATCH_KEPT_BYTES {
            // A bulk segment's buffer is not kept: an idle stream holds no 64 KiB.
            *plaintext = Vec::new();
        }
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

    pub(super) fn retransmit_all(&mut self, now: Instant) {
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
}
