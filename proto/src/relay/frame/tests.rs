//! Frame encoding and decoding: round trips, limits, routing and the appended source.

use super::*;
use pretty_assertions::assert_eq;

fn data_frame(seq: u64, index: u32, count: u32, payload: usize) -> pb::RelayMessageFrame {
    Frame::new(
        "s-1",
        Body::Data(Data {
            seq,
            segment_index: index,
            segment_count: count,
            payload: vec![7; payload],
        }),
    )
    .to_pb()
}

#[test]
fn every_body_round_trips() {
    let bodies = [
        Body::Data(Data {
            seq: 9,
            segment_index: 2,
            segment_count: 3,
            payload: b"xyz".to_vec(),
        }),
        Body::Ack,
        Body::Resume { next_seq: 41 },
        Body::Reset {
            reason: "bye".into(),
        },
        Body::Heartbeat,
        Body::Handshake(vec![1, 2, 3].into()),
    ];
    for body in bodies {
        let mut frame = Frame::new("0b6f6d5e-4a4e-4d4c-9a1e-7f1f3f5e2a10", body);
        frame.ack = Some(17);
        frame.ack_bits = 0x8000_0001;
        assert_eq!(Frame::decode(&frame.encode()), Ok(frame.clone()));
        let encoded = frame.clone().into_encoded();
        assert_eq!(encoded, frame.encode());
        assert_eq!(
            route(&encoded),
            Ok(Route {
                stream_id: frame.stream_id.clone(),
                handshake: matches!(frame.body, Body::Handshake(_)),
            })
        );
    }
}

#[test]
fn the_router_checks_the_envelope_and_skips_the_body() {
    let mut bad_version = data_frame(0, 0, 1, 1);
    bad_version.version = 2;
    let mut blank = data_frame(0, 0, 1, 1);
    blank.stream_id = "  ".into();
    assert_eq!(
        route_stream_id(&bad_version.encode_to_vec()),
        Err(FrameError::Version { got: 2 })
    );
    assert_eq!(
        route_stream_id(&blank.encode_to_vec()),
        Err(FrameError::BlankStreamId)
    );
    assert!(matches!(
        route_stream_id(&vec![0u8; MAX_RELAY_FRAME_BYTES + 1]),
        Err(FrameError::TooLarge { .. })
    ));
    assert!(matches!(
        route_stream_id(&[0xff_u8; 16]),
        Err(FrameError::Decode(_))
    ));
    // A body only the endpoints can judge (segment index out of range) is routed.
    let odd_body = data_frame(5, 3, 3, 1).encode_to_vec();
    assert!(Frame::decode(&odd_body).is_err());
    assert_eq!(route_stream_id(&odd_body), Ok("s-1".to_owned()));
}

#[test]
fn malformed_frames_are_rejected_with_the_reason() {
    let mut bad_version = data_frame(0, 0, 1, 1);
    bad_version.version = 2;
    let mut blank = data_frame(0, 0, 1, 1);
    blank.stream_id = "  ".into();
    let mut long_id = data_frame(0, 0, 1, 1);
    long_id.stream_id = "x".repeat(MAX_STREAM_ID_BYTES + 1);
    let mut no_body = data_frame(0, 0, 1, 1);
    no_body.body = None;
    let cases = [
        (bad_version, FrameError::Version { got: 2 }),
        (blank, FrameError::BlankStreamId),
        (long_id, FrameError::BadStreamId { len: 65 }),
        (no_body, FrameError::MissingBody),
        (
            data_frame(5, 3, 3, 1),
            FrameError::SegmentIndex { index: 3, count: 3 },
        ),
        (
            data_frame(5, 0, 0, 1),
            FrameError::SegmentCount { count: 0 },
        ),
        (
            data_frame(5, 0, u32::MAX, 1),
            FrameError::SegmentCount { count: u32::MAX },
        ),
        (
            data_frame(1, 2, 3, 1),
            FrameError::SegmentBeforeStart { index: 2, seq: 1 },
        ),
        (
            data_frame(1, 0, 1, MAX_SEGMENT_PAYLOAD_BYTES + 1),
            FrameError::PayloadTooLarge {
                len: MAX_SEGMENT_PAYLOAD_BYTES + 1,
            },
        ),
    ];
    for (raw, expected) in cases {
        assert_eq!(Frame::decode(&raw.encode_to_vec()), Err(expected));
    }
}

#[test]
fn the_appended_source_overrides_the_senders() {
    let mut frame = Frame::new("s-1", Body::Heartbeat);
    frame.source = 99;
    let tagged = append_source(&frame.encode(), 7);
    assert_eq!(Frame::decode(&tagged).map(|f| f.source), Ok(7));
    assert_eq!(route_stream_id(&tagged), Ok("s-1".to_owned()));
}

#[test]
fn oversize_frames_are_refused_before_decoding() {
    let bytes = vec![0u8; MAX_RELAY_FRAME_BYTES + 1];
    assert_eq!(
        Frame::decode(&bytes),
        Err(FrameError::TooLarge {
            len: MAX_RELAY_FRAME_BYTES + 1
        })
    );
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    for bytes in [&[0xff_u8; 16][..], &[0x12, 0xff, 0xff, 0xff, 0x0f], &[0x08]] {
        assert!(matches!(Frame::decode(bytes), Err(FrameError::Decode(_))));
    }
}

#[test]
fn long_reset_reasons_are_truncated_on_a_char_boundary() {
    let frame = Frame::new(
        "s",
        Body::Reset {
            reason: "é".repeat(MAX_RESET_REASON_BYTES),
        },
    );
    let decoded = Frame::decode(&frame.encode());
    assert!(
        matches!(decoded, Ok(Frame { body: Body::Reset { ref reason }, .. }) if reason.len() <= MAX_RESET_REASON_BYTES)
    );
}

proptest::proptest! {
    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = Frame::decode(&bytes);
    }
}
