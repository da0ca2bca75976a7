//! Every limit of the relay, with its unit and the reason for it.

use std::time::Duration;

/// The only frame version spoken; others are rejected.
pub const RELAY_PROTOCOL_VERSION: u32 = 1;
/// Longest `stream_id`, in bytes (a UUID is 36).
pub const MAX_STREAM_ID_BYTES: usize = 64;
/// Largest application message, in bytes: the same as a local websocket message
/// (`supervisor::limits::MAX_FRAME_BYTES`), so remote mode carries every message local mode does.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Plaintext bytes of one segment. With the segment header and the Noise tag this keeps a
/// segment's ciphertext under Noise's 65,535-byte message limit.
pub const MAX_SEGMENT_PLAINTEXT_BYTES: usize = 65_472;
/// Segment header inside the plaintext: index and count, 4 bytes each (authenticated that way).
pub const SEGMENT_HEADER_BYTES: usize = 8;
/// Poly1305 tag appended by every Noise transport message.
pub const NOISE_TAG_BYTES: usize = 16;
/// Largest `RelayData.payload`, in bytes.
pub const MAX_SEGMENT_PAYLOAD_BYTES: usize =
    MAX_SEGMENT_PLAINTEXT_BYTES + SEGMENT_HEADER_BYTES + NOISE_TAG_BYTES;
/// Most segments one message may have: enough for [`MAX_MESSAGE_BYTES`], and no more, so an
/// absurd `segment_count` is refused on sight.
pub const MAX_SEGMENTS_PER_MESSAGE: u32 =
    MAX_MESSAGE_BYTES.div_ceil(MAX_SEGMENT_PLAINTEXT_BYTES) as u32;
/// Largest `RelayHandshake.payload` (an IK message is 96 + payload bytes; ours carry none).
pub const MAX_HANDSHAKE_BYTES: usize = 1024;
/// Longest `RelayReset.reason`, in bytes; longer reasons are truncated when sent.
pub const MAX_RESET_REASON_BYTES: usize = 512;
/// Highest data seq: nonces above it authenticate acks ([`ACK_NONCE_BASE`]), and Noise reserves
/// `u64::MAX`. At one segment per microsecond a stream would need 290,000 years to get there.
pub const MAX_DATA_SEQ: u64 = (1 << 63) - 1;
/// Nonce of ack authentication record c: `ACK_NONCE_BASE + c`, disjoint from data seqs.
pub const ACK_NONCE_BASE: u64 = 1 << 63;
/// Plaintext of an ack authentication record: ack present (1), ack (8), ack_bits (4), body
/// kind (1), resume next_seq (8).
pub const ACK_RECORD_BYTES: usize = 22;
/// `RelayMessageFrame.ack_auth`: counter (8) + sealed record + Noise tag.
pub const ACK_AUTH_BYTES: usize = 8 + ACK_RECORD_BYTES + NOISE_TAG_BYTES;
/// A responder's stream whose initiator has not proven it holds the transport keys (sent an
/// authenticated frame) within this time is dropped: a half-open handshake holds a slot no
/// longer. The initiator confirms at once with an ack, and its heartbeat follows within
/// [`HEARTBEAT_INTERVAL`] even if that ack is lost.
pub const UNCONFIRMED_STREAM_TIMEOUT: Duration = Duration::from_secs(10);
/// Time an executor socket has to answer the rendezvous's key-possession challenge
/// ([`crate::relay::proof`]), and an executor to see its answer accepted; a socket that has not
/// is closed (it never carried a frame).
pub const PROOF_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest encoded frame, in bytes: a full segment plus room for the envelope. Checked before
/// decoding, so a hostile frame costs at most this much memory.
pub const MAX_RELAY_FRAME_BYTES: usize = MAX_SEGMENT_PAYLOAD_BYTES + 1024;

/// Segments sent and not yet acknowledged, per stream and direction.
pub const MAX_UNACKED_SEGMENTS: usize = 512;
/// Bytes of segments sent and not yet acknowledged, per stream and direction: the window that
/// bounds both the sender's retransmission buffer and the bandwidth-delay product used.
pub const MAX_UNACKED_BYTES: usize = 8 * 1024 * 1024;
/// A receiver accepts seqs below `next expected + RECEIVE_WINDOW_SEGMENTS`; later ones are
/// dropped (the sender never has more in flight).
pub const RECEIVE_WINDOW_SEGMENTS: u64 = MAX_UNACKED_SEGMENTS as u64;
/// Bytes a receiver holds out of order, waiting for a gap to fill; past this, new out-of-order
/// segments are dropped and retransmitted later.
pub const MAX_OUT_OF_ORDER_BYTES: usize = MAX_UNACKED_BYTES;
/// Bytes of whole messages received and not yet taken by the application. Past this the
/// receiver stops accepting in-order segments (the sender retransmits them later): flow control.
pub const MAX_UNDELIVERED_BYTES: usize = 16 * 1024 * 1024;
/// A receiver that holds an unfinished message (segments out of order, or a message in
/// reassembly) and completes none for this long resets the stream, so half-sent messages do not
/// hold memory (or a share of the endpoint's receive budget) for ever. Longer than a rendezvous
/// restart takes in practice; shorter than [`LIVENESS_TIMEOUT`].
pub const REASSEMBLY_DEADLINE: Duration = Duration::from_secs(30);
/// Receive budget of an executor ([`crate::relay::reliability::ReceiveBudget`]): bytes held out
/// of order or in reassembly over all its streams, beyond each stream's
/// [`RELAY_STREAM_RECEIVE_ALLOWANCE`]. Each stream may hold up to [`MAX_OUT_OF_ORDER_BYTES`] +
/// [`MAX_MESSAGE_BYTES`]; 256 streams could otherwise hold 18 GiB, and 20 half-sent 64 MiB
/// messages 1.25 GiB.
pub const RELAY_RECEIVE_BUDGET_BYTES: usize = 256 * 1024 * 1024;
/// What each stream may hold out of order or in reassembly outside the shared budget, so small
/// messages (ordinary requests) get through while others hold the whole budget. With 256
/// streams: at most 256 MiB more.
pub const RELAY_STREAM_RECEIVE_ALLOWANCE: usize = 1024 * 1024;
/// Bytes of application messages queued for sending (not yet segmented). Past this
/// [`crate::relay::ReliableStream::can_accept_message`] is false and the caller waits.
pub const MAX_SEND_QUEUE_BYTES: usize = 16 * 1024 * 1024;

/// Retransmission timeout before any round trip was measured.
pub const INITIAL_RTO: Duration = Duration::from_millis(200);
/// Smallest retransmission timeout (loopback round trips are far shorter; this keeps a delayed
/// ack from causing a spurious retransmission).
pub const MIN_RTO: Duration = Duration::from_millis(100);
/// Largest retransmission timeout, also the cap of the exponential backoff. Kept short: frames
/// travel over a websocket (TCP), so a lost frame means a dropped socket or an overflowing
/// queue, not a slow link, and a reconnect resends at once anyway. Under heavy random loss a
/// segment can be lost many times in a row, and each of those waits costs up to this much.
pub const MAX_RTO: Duration = Duration::from_secs(1);
/// Seqs one frame's `ack_bits` can acknowledge beyond the cumulative ack. Retransmission timers
/// act only on the first this many unacknowledged seqs; the peer cannot report on later ones.
pub const ACK_BITS_SPAN: u64 = 32;
/// A segment is retransmitted at once when this many later seqs were acknowledged in ack_bits.
pub const FAST_RETRANSMIT_SACKS: u64 = 3;
/// Longest an ack for in-order data waits for a frame to ride on (a reply, the next request)
/// before it goes out alone. A request and its reply then cost two frames instead of four
/// (each side's ack travels on its next data frame). Well under [`MIN_RTO`], so a delayed ack
/// never makes the peer retransmit.
pub const ACK_DELAY: Duration = Duration::from_millis(5);
/// In-order data segments received without an ack going out after which one goes out at once
/// (as TCP acks every second full segment), so a bulk sender's window keeps moving.
pub const ACK_EVERY_SEGMENTS: u32 = 2;
/// Smallest reordering window of time-based loss detection: a segment sent this much (or a
/// quarter of the smoothed round trip, if longer) before one the peer acknowledged is lost.
/// Relay frames travel over one ordered websocket, so reordering is rare and short.
pub const REORDERING_WINDOW_MIN: Duration = Duration::from_millis(2);
/// An idle stream sends a heartbeat this often.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// A stream that hears nothing from its peer for this long is reset. Longer than a rendezvous
/// restart, so streams survive one.
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(45);
/// A handshake not finished within this time fails and the stream is reset.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(20);
/// Segments failing Noise authentication tolerated on one stream (they are dropped as forged or
/// corrupt); one more resets the stream.
pub const MAX_AUTH_FAILURES: u32 = 64;
