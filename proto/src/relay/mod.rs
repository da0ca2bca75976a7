//! The relay of remote mode, sans I/O: frames ([`frame`]), the reliable stream
//! ([`reliability`]), Noise per stream ([`noise`]) and the two together ([`secure`]); an
//! executor socket's proof that it holds its environment's key ([`proof`]).
//!
//! Layering, from the socket up:
//! 1. A binary websocket message is one protobuf [`pb::RelayMessageFrame`];
//!    [`frame::Frame::decode`] bounds its size *before* decoding and validates it into
//!    [`frame::Frame`], so nothing downstream sees an unvalidated frame.
//! 2. [`secure::SecureStream`] runs the Noise IK handshake in `handshake` frames, then hands the
//!    Noise transport keys to a [`reliability::ReliableStream`], which numbers, encrypts
//!    (nonce = seq), acknowledges, retransmits, reorders and reassembles segments.
//! 3. Out come whole application messages (one JSON-RPC message each), exactly once, in order.
//!
//! Nothing here reads a clock or a socket: frames and `Instant`s go in, frames and events come
//! out, so every behaviour is tested deterministically. The tokio glue is in the supervisor.

pub mod cipher;
pub mod frame;
pub mod limits;
pub mod noise;
pub mod proof;
pub mod reliability;
pub mod secure;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;

/// The generated protobuf types of `proto/relay/v1/relay.proto` (package `execward.relay.v1`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/execward.relay.v1.rs"));
}

pub use frame::{Body, Data, Frame, FrameError, Handshake};
pub use noise::{Cipher, CipherChoice, CipherPolicy};
pub use reliability::{ReceiveBudget, ReliableStream, SegmentCipher, StreamError, StreamEvent};
pub use secure::SecureStream;
