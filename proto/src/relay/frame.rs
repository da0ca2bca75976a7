//! Relay frames: the validated model ([`Frame`]) and its protobuf encoding.
//!
//! [`Frame::decode`] checks the encoded size against [`MAX_RELAY_FRAME_BYTES`] before prost sees
//! a byte, so decoding never allocates more than the frame itself; then every field is checked
//! (version, stream id, segment index and count, payload sizes).

use prost::Message as _;

use super::limits::{
    ACK_AUTH_BYTES, MAX_DATA_SEQ, MAX_HANDSHAKE_BYTES, MAX_RELAY_FRAME_BYTES,
    MAX_RESET_REASON_BYTES, MAX_SEGMENT_PAYLOAD_BYTES, MAX_SEGMENTS_PER_MESSAGE,
    MAX_STREAM_ID_BYTES, RELAY_PROTOCOL_VERSION,
};
use super::pb;

/// One validated relay frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The stream (non-blank, at most [`MAX_STREAM_ID_BYTES`] of printable ASCII).
    pub stream_id: String,
    /// Highest contiguous peer seq received; `None` before seq 0 arrived.
    pub ack: Option<u64>,
    /// Bit i acknowledges seq `ack + 1 + i` (`i` when `ack` is `None`).
    pub ack_bits: u32,
    /// Authentication of the ack fields (empty, or [`ACK_AUTH_BYTES`]); see
    /// [`crate::relay::reliability`].
    pub ack_auth: Vec<u8>,
    /// The harness socket the rendezvous received this frame from (0: unknown). Meaningful
    /// only on frames an executor receives; see [`append_source`].
    pub source: u64,
    /// What the frame carries.
    pub body: Body,
}

/// The body of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A segment of an application message.
    Data(Data),
    /// Only the ack fields.
    Ack,
    /// The sender reconnected; its next seq.
    Resume {
        /// Next seq the sender will assign.
        next_seq: u64,
    },
    /// The stream is over.
    Reset {
        /// Why.
        reason: String,
    },
    /// Keep-alive.
    Heartbeat,
    /// A Noise handshake message.
    Handshake(Handshake),
}

/// A handshake message and the cipher it was made in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    /// The Noise handshake message.
    pub payload: Vec<u8>,
    /// `RelayHandshake.cipher` as received ([`crate::relay::cipher::Cipher::from_wire`]); 0 is
    /// ChaCha20-Poly1305.
    pub cipher: u32,
}

impl Handshake {
    /// A handshake message made in `cipher`.
    pub fn new(payload: Vec<u8>, cipher: crate::relay::cipher::Cipher) -> Self {
        Self {
            payload,
            cipher: cipher.wire(),
        }
    }
}

impl From<Vec<u8>> for Handshake {
    /// A handshake message in the default cipher (ChaCha20-Poly1305).
    fn from(payload: Vec<u8>) -> Self {
        Self { payload, cipher: 0 }
    }
}

/// A data segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// Segment seq (per stream and direction).
    pub seq: u64,
    /// 0-based index within the message.
    pub segment_index: u32,
    /// Segments in the message (1..=[`MAX_SEGMENTS_PER_MESSAGE`]).
    pub segment_count: u32,
    /// Encrypted segment.
    pub payload: Vec<u8>,
}

/// Why a frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Larger than [`MAX_RELAY_FRAME_BYTES`].
    #[error("relay frame of {len} bytes exceeds MAX_RELAY_FRAME_BYTES ({MAX_RELAY_FRAME_BYTES})")]
    TooLarge {
        /// Encoded size.
        len: usize,
    },
    /// Not a valid protobuf `RelayMessageFrame`.
    #[error("relay frame is not a valid RelayMessageFrame: {0}")]
    Decode(String),
    /// Unsupported version.
    #[error("relay frame version {got} is not supported (expected {RELAY_PROTOCOL_VERSION})")]
    Version {
        /// The version received.
        got: u32,
    },
    /// Empty or whitespace-only stream id.
    #[error("relay frame has a blank stream_id; every frame names its stream")]
    BlankStreamId,
    /// Stream id too long or not printable ASCII.
    #[error(
        "relay frame stream_id must be 1..={MAX_STREAM_ID_BYTES} bytes of printable ASCII (got {len} bytes)"
    )]
    BadStreamId {
        /// Its length.
        len: usize,
    },
    /// No body.
    #[error("relay frame has no body")]
    MissingBody,
    /// `segment_count` is 0 or above [`MAX_SEGMENTS_PER_MESSAGE`].
    #[error("segment_count {count} is outside 1..={MAX_SEGMENTS_PER_MESSAGE}")]
    SegmentCount {
        /// The count received.
        count: u32,
    },
    /// `segment_index` not below `segment_count`.
    #[error("segment_index {index} is out of range for segment_count {count}")]
    SegmentIndex {
        /// The index.
        index: u32,
        /// The count.
        count: u32,
    },
    /// `segment_index` larger than `seq`, so the message would start before seq 0.
    #[error("segment_index {index} is larger than seq {seq}")]
    SegmentBeforeStart {
        /// The index.
        index: u32,
        /// The seq.
        seq: u64,
    },
    /// `seq` is above [`MAX_DATA_SEQ`] (higher nonces authenticate acks, and `u64::MAX` is
    /// reserved by Noise).
    #[error("seq {0} is out of range (at most {MAX_DATA_SEQ})")]
    SeqOutOfRange(u64),
    /// `ack_auth` is neither empty nor [`ACK_AUTH_BYTES`] long.
    #[error("ack_auth of {len} bytes must be empty or {ACK_AUTH_BYTES} bytes")]
    AckAuthLength {
        /// Its size.
        len: usize,
    },
    /// Data payload too large.
    #[error(
        "data payload of {len} bytes exceeds MAX_SEGMENT_PAYLOAD_BYTES ({MAX_SEGMENT_PAYLOAD_BYTES})"
    )]
    PayloadTooLarge {
        /// Its size.
        len: usize,
    },
    /// Handshake payload too large.
    #[error("handshake payload of {len} bytes exceeds MAX_HANDSHAKE_BYTES ({MAX_HANDSHAKE_BYTES})")]
    HandshakeTooLarge {
        /// Its size.
        len: usize,
    },
    /// Reset reason too long.
    #[error(
        "reset reason of {len} bytes exceeds MAX_RESET_REASON_BYTES ({MAX_RESET_REASON_BYTES})"
    )]
    ReasonTooLong {
        /// Its size.
        len: usize,
    },
}

/// Check a stream id: non-blank, at most [`MAX_STREAM_ID_BYTES`], printable ASCII.
///
/// # Errors
/// [`FrameError::BlankStreamId`] or [`FrameError::BadStreamId`].
pub fn validate_stream_id(stream_id: &str) -> Result<(), FrameError> {
    if stream_id.trim().is_empty() {
        return Err(FrameError::BlankStreamId);
    }
    if stream_id.len() > MAX_STREAM_ID_BYTES || !stream_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(FrameError::BadStreamId {
            len: stream_id.len(),
        });
    }
    Ok(())
}

impl Frame {
    /// A frame with no acknowledgement fields set.
    pub fn new(stream_id: impl Into<String>, body: Body) -> Self {
        Self {
            stream_id: stream_id.into(),
            ack: None,
            ack_bits: 0,
            ack_auth: Vec::new(),
            source: 0,
            body,
        }
    }

    /// Decode and validate one binary websocket message.
    ///
    /// # Errors
    /// [`FrameError`] naming the first thing wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() > MAX_RELAY_FRAME_BYTES {
            return Err(FrameError::TooLarge { len: bytes.len() });
        }
        let raw =
            pb::RelayMessageFrame::decode(bytes).map_err(|e| FrameError::Decode(e.to_string()))?;
        Self::from_pb(raw)
    }

    /// Validate a decoded protobuf frame.
    ///
    /// # Errors
    /// [`FrameError`] naming the first thing wrong.
    pub fn from_pb(raw: pb::RelayMessageFrame) -> Result<Self, FrameError> {
        use pb::relay_message_frame::Body as B;
        if raw.version != RELAY_PROTOCOL_VERSION {
            return Err(FrameError::Version { got: raw.version });
        }
        validate_stream_id(&raw.stream_id)?;
        if !raw.ack_auth.is_empty() && raw.ack_auth.len() != ACK_AUTH_BYTES {
            return Err(FrameError::AckAuthLength {
                len: raw.ack_auth.len(),
            });
        }
        let body = match raw.body.ok_or(FrameError::MissingBody)? {
            B::Data(data) => {
                let count = data.segment_count;
                if count == 0 || count > MAX_SEGMENTS_PER_MESSAGE {
                    return Err(FrameError::SegmentCount { count });
                }
                if data.segment_index >= count {
                    return Err(FrameError::SegmentIndex {
                        index: data.segment_index,
                        count,
                    });
                }
                if u64::from(data.segment_index) > data.seq {
                    return Err(FrameError::SegmentBeforeStart {
                        index: data.segment_index,
                        seq: data.seq,
                    });
                }
                if data.seq > MAX_DATA_SEQ {
                    return Err(FrameError::SeqOutOfRange(data.seq));
                }
                if data.payload.len() > MAX_SEGMENT_PAYLOAD_BYTES {
                    return Err(FrameError::PayloadTooLarge {
                        len: data.payload.len(),
                    });
                }
                Body::Data(Data {
                    seq: data.seq,
                    segment_index: data.segment_index,
                    segment_count: count,
                    payload: data.payload,
                })
            }
            B::AckFrame(_) => Body::Ack,
            B::Resume(resume) => Body::Resume {
                next_seq: resume.next_seq,
            },
            B::Reset(reset) => {
                if reset.reason.len() > MAX_RESET_REASON_BYTES {
                    return Err(FrameError::ReasonTooLong {
                        len: reset.reason.len(),
                    });
                }
                Body::Reset {
                    reason: reset.reason,
                }
            }
            B::Heartbeat(_) => Body::Heartbeat,
            B::Handshake(handshake) => {
                if handshake.payload.len() > MAX_HANDSHAKE_BYTES {
                    return Err(FrameError::HandshakeTooLarge {
                        len: handshake.payload.len(),
                    });
                }
                Body::Handshake(Handshake {
                    payload: handshake.payload,
                    cipher: handshake.cipher,
                })
            }
        };
        Ok(Self {
            stream_id: raw.stream_id,
            ack: raw.ack,
            ack_bits: raw.ack_bits,
            ack_auth: raw.ack_auth,
            source: raw.source,
            body,
        })
    }

    /// The protobuf form.
    pub fn to_pb(&self) -> pb::RelayMessageFrame {
        self.clone().into_pb()
    }

    /// The protobuf form, moving the payload instead of copying it.
    pub fn into_pb(self) -> pb::RelayMessageFrame {
        use pb::relay_message_frame::Body as B;
        let body = match self.body {
            Body::Data(data) => B::Data(pb::RelayData {
                seq: data.seq,
                segment_index: data.segment_index,
                segment_count: data.segment_count,
                payload: data.payload,
            }),
            Body::Ack => B::AckFrame(pb::RelayAck {}),
            Body::Resume { next_seq } => B::Resume(pb::RelayResume { next_seq }),
            Body::Reset { reason } => B::Reset(pb::RelayReset {
                reason: truncate_reason(&reason),
            }),
            Body::Heartbeat => B::Heartbeat(pb::RelayHeartbeat {}),
            Body::Handshake(Handshake { payload, cipher }) => {
                B::Handshake(pb::RelayHandshake { payload, cipher })
            }
        };
        pb::RelayMessageFrame {
            version: RELAY_PROTOCOL_VERSION,
            stream_id: self.stream_id,
            ack: self.ack,
            ack_bits: self.ack_bits,
            ack_auth: self.ack_auth,
            source: self.source,
            body: Some(body),
        }
    }

    /// Encode for one binary websocket message.
    pub fn encode(&self) -> Vec<u8> {
        self.to_pb().encode_to_vec()
    }

    /// [`Self::encode`] without copying the payload first (the send path).
    pub fn into_encoded(self) -> Vec<u8> {
        self.into_pb().encode_to_vec()
    }
}

/// The envelope fields a router needs; prost skips the body without copying it (a handshake
/// body's payload included: [`RouteHandshake`] declares no field).
#[derive(Clone, PartialEq, prost::Message)]
struct RouteHeader {
    #[prost(uint32, tag = "1")]
    version: u32,
    #[prost(string, tag = "2")]
    stream_id: String,
    #[prost(message, optional, tag = "15")]
    handshake: Option<RouteHandshake>,
}

/// A handshake body, seen only for being one.
#[derive(Clone, PartialEq, prost::Message)]
struct RouteHandshake {}

/// What a router may know of a frame: its stream, and whether it is a handshake (which costs
/// the executor a Noise operation, so routers bound their rate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The stream id.
    pub stream_id: String,
    /// The body is a handshake message.
    pub handshake: bool,
}

/// [`route_stream_id`] plus whether the body is a handshake.
///
/// # Errors
/// As [`route_stream_id`].
pub fn route(bytes: &[u8]) -> Result<Route, FrameError> {
    if bytes.len() > MAX_RELAY_FRAME_BYTES {
        return Err(FrameError::TooLarge { len: bytes.len() });
    }
    let header = RouteHeader::decode(bytes).map_err(|e| FrameError::Decode(e.to_string()))?;
    if header.version != RELAY_PROTOCOL_VERSION {
        return Err(FrameError::Version {
            got: header.version,
        });
    }
    validate_stream_id(&header.stream_id)?;
    Ok(Route {
        stream_id: header.stream_id,
        handshake: header.handshake.is_some(),
    })
}

/// Only the stream id of an encoded frame, for routers that must not look further (the
/// rendezvous): the size, the protobuf envelope, the version and the stream id are checked as
/// [`Frame::decode`] checks them, and the body is skipped, neither copied nor validated (the
/// endpoints validate it). Whatever [`Frame::decode`] accepts, this accepts with the same id.
///
/// # Errors
/// [`FrameError::TooLarge`], [`FrameError::Decode`], [`FrameError::Version`],
/// [`FrameError::BlankStreamId`] or [`FrameError::BadStreamId`].
pub fn route_stream_id(bytes: &[u8]) -> Result<String, FrameError> {
    route(bytes).map(|route| route.stream_id)
}

/// Protobuf key of `RelayMessageFrame.source` (field 6, varint).
const SOURCE_FIELD_KEY: u8 = 6 << 3;

/// Tag an encoded frame with the harness socket it came from, as the rendezvous does before it
/// hands the frame to the executor: the field is appended, and since the last occurrence of a
/// protobuf scalar wins, whatever the sender put there is overridden. Costs one copy.
pub fn append_source(frame: &[u8], source: u64) -> Vec<u8> {
    let mut tagged = Vec::with_capacity(frame.len() + 11);
    tagged.extend_from_slice(frame);
    tagged.push(SOURCE_FIELD_KEY);
    prost::encoding::encode_varint(source, &mut tagged);
    tagged
}

fn truncate_reason(reason: &str) -> String {
    if reason.len() <= MAX_RESET_REASON_BYTES {
        return reason.to_owned();
    }
    let mut end = MAX_RESET_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

#[cfg(test)]
mod tests;
