//! The relay frame decoder ([`Frame::decode`]): one binary websocket message from the
//! rendezvous, i.e. from anyone on the network.
//!
//! Invariants:
//! - no panic on any bytes;
//! - nothing larger than `MAX_RELAY_FRAME_BYTES` is accepted;
//! - an accepted frame satisfies every documented field limit (stream id, segment index/count,
//!   seq, payload, handshake and reason sizes);
//! - it re-encodes within `MAX_RELAY_FRAME_BYTES` to bytes that decode to the same frame;
//! - `route_stream_id` (what the rendezvous uses) accepts every frame `decode` accepts, with the
//!   same stream id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::relay::frame::{route_stream_id, validate_stream_id};
use proto::relay::limits::{
    MAX_HANDSHAKE_BYTES, MAX_RELAY_FRAME_BYTES, MAX_RESET_REASON_BYTES, MAX_SEGMENT_PAYLOAD_BYTES,
    MAX_SEGMENTS_PER_MESSAGE, MAX_STREAM_ID_BYTES,
};
use proto::relay::{Body, Frame};

fn check_limits(frame: &Frame) {
    assert!(validate_stream_id(&frame.stream_id).is_ok());
    assert!(frame.stream_id.len() <= MAX_STREAM_ID_BYTES);
    match &frame.body {
        Body::Data(data) => {
            assert!(data.segment_count >= 1 && data.segment_count <= MAX_SEGMENTS_PER_MESSAGE);
            assert!(data.segment_index < data.segment_count);
            assert!(u64::from(data.segment_index) <= data.seq);
            assert!(data.seq < u64::MAX);
            assert!(data.payload.len() <= MAX_SEGMENT_PAYLOAD_BYTES);
        }
        Body::Handshake(handshake) => assert!(handshake.payload.len() <= MAX_HANDSHAKE_BYTES),
        Body::Reset { reason } => assert!(reason.len() <= MAX_RESET_REASON_BYTES),
        Body::Ack | Body::Heartbeat | Body::Resume { .. } => {}
    }
}

fuzz_target!(|data: &[u8]| {
    match Frame::decode(data) {
        Ok(frame) => {
            assert!(data.len() <= MAX_RELAY_FRAME_BYTES);
            check_limits(&frame);
            let encoded = frame.encode();
            assert!(encoded.len() <= MAX_RELAY_FRAME_BYTES);
            assert_eq!(Frame::decode(&encoded), Ok(frame.clone()));
            assert_eq!(route_stream_id(data), Ok(frame.stream_id));
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            // The router checks only the envelope: it may pass a frame whose body the
            // endpoints reject, but anything it rejects, decode rejects too (checked above).
            if let Ok(stream_id) = route_stream_id(data) {
                assert!(validate_stream_id(&stream_id).is_ok());
            }
        }
    }
});
