//! The receiving half of [`ReliableStream`]: applying frames from the peer, checking their
//! `ack_auth`, processing acks (loss detection, fast retransmission, round-trip samples),
//! and reassembling segments into the messages delivered as events.

use std::time::Instant;

use super::send::InFlight;
use super::{ReliableStream, SegmentCipher, ack_record};
use crate::relay::frame::{Body, Data, Frame};
use crate::relay::limits::{
    ACK_BITS_SPAN, ACK_DELAY, ACK_EVERY_SEGMENTS, ACK_NONCE_BASE, ACK_RECORD_BYTES,
    FAST_RETRANSMIT_SACKS, MAX_AUTH_FAILURES, MAX_DATA_SEQ, MAX_MESSAGE_BYTES,
    MAX_OUT_OF_ORDER_BYTES, MAX_SEGMENT_PLAINTEXT_BYTES, MAX_UNDELIVERED_BYTES,
    RECEIVE_WINDOW_SEGMENTS, REORDERING_WINDOW_MIN, SEGMENT_HEADER_BYTES,
};

#[derive(Debug)]
pub(super) struct Received {
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
pub(super) struct Reassembly {
    start_seq: u64,
    count: u32,
    next_index: u32,
    pub(super) bytes: Vec<u8>,
}

impl<C: SegmentCipher> ReliableStream<C> {
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
                if let Err(reason) = self.receive_data(data, now) {
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
        let mut record = [0u8; ACK_RECORD_BYTES];
        let len = self
            .cipher
            .open_into(ACK_NONCE_BASE + counter, sealed, &mut record)
            .map_err(|e| format!("forged ack: ack_auth {counter} does not authenticate ({e})"))?;
        if len != ACK_RECORD_BYTES || record != ack_record(frame.ack, frame.ack_bits, &frame.body) {
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

    /// Data arrived: in-order data may wait for its ack to ride on a later frame (up to
    /// [`ACK_DELAY`], or until [`ACK_EVERY_SEGMENTS`] segments wait); anything else (a gap, a
    /// duplicate) is acknowledged at once so the sender's loss detection sees it promptly.
    fn schedule_ack(&mut self, in_order: bool, now: Instant) {
        self.unacked_in_order += u32::from(in_order);
        if !in_order || self.unacked_in_order >= ACK_EVERY_SEGMENTS {
            self.ack_pending = true;
        } else {
            self.ack_deadline.get_or_insert(now + ACK_DELAY);
        }
    }

    fn receive_data(&mut self, data: Data, now: Instant) -> Result<(), String> {
        let seq = data.seq;
        self.schedule_ack(seq == self.expected, now);
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
        let content = plaintext.len() - SEGMENT_HEADER_BYTES;
        if !self.held.try_charge(content) {
            // The endpoint's receive budget is spent (by this stream's unfinished messages or
            // others'): like any limit, the segment comes again later.
            self.stats.dropped_over_limit += 1;
            return Ok(());
        }
        self.out_of_order_bytes += content;
        self.out_of_order.insert(
            seq,
            Received {
                index: data.segment_index,
                count: data.segment_count,
                plaintext,
            },
        );
        let completed = self.delivered_total;
        while let Some(segment) = self.out_of_order.remove(&self.expected) {
            self.out_of_order_bytes -= segment.content().len();
            let seq = self.expected;
            self.expected += 1;
            self.reassemble(seq, segment)?;
        }
        // The reassembly deadline runs while something unfinished is held, from the last
        // message completed.
        let holding = self.reassembly.is_some() || !self.out_of_order.is_empty();
        self.incomplete_since = match self.incomplete_since {
            _ if !holding => None,
            Some(since) if self.delivered_total == completed => Some(since),
            _ => Some(now),
        };
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
            self.held.release(bytes.len());
            self.delivered_total += 1;
            self.delivered_bytes += bytes.len();
            self.delivered.push_back(bytes);
            return Ok(());
        }
        message.bytes.extend_from_slice(segment.content());
        message.next_index += 1;
        if message.next_index == message.count {
            self.held.release(message.bytes.len());
            self.delivered_total += 1;
            self.delivered_bytes += message.bytes.len();
            self.delivered.push_back(message.bytes);
        } else {
            self.reassembly = Some(message);
        }
        Ok(())
    }
}
