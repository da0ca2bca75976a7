//! Where the router sends frames, and the per-socket limiter of new streams (a leaf module:
//! the router and the cluster's seats share them).

use std::time::Instant;

use tokio_tungstenite::tungstenite::Bytes;

use super::cluster::bus::Publisher;
use super::queued::{FrameSender, QueuedBytes};

/// Handshake frames (or new streams) a harness socket may send at once (token bucket size).
pub const NEW_STREAMS_PER_SOCKET_BURST: f64 = 16.0;
/// Handshake frames (or new streams) a harness socket may send per second once its burst is
/// spent. Each costs the executor a Noise operation (four X25519 for a new stream) or an
/// answer; a flood of them is dropped here.
pub const NEW_STREAMS_PER_SOCKET_PER_SECOND: f64 = 8.0;
/// Where frames for a socket go. Frames are `Bytes` as the websocket delivered them: routed
/// without a copy.
#[derive(Clone)]
pub(crate) enum Queue {
    /// A socket of this node.
    Local(FrameSender),
    /// A harness socket of another node (cluster mode): its subject, and its credential's
    /// party (the lane of the node's publish queue its frames take).
    Remote {
        subject: async_nats::Subject,
        party: u64,
        publisher: Publisher,
    },
}

impl Queue {
    /// Queue a frame without waiting; `Err` when it was dropped (full queue, closed socket).
    pub(crate) fn try_send(&self, frame: Bytes) -> Result<(), ()> {
        self.try_send_from(0, frame)
    }

    /// Queue a frame from harness credential `source` to an executor's socket, charged to the
    /// credential's `account` too (bounded by `limit`) while it waits there; `Err` when it was
    /// dropped. An executor's socket is always on this node: any other queue refuses.
    pub(crate) fn try_send_charged(
        &self,
        source: u64,
        frame: Bytes,
        account: &QueuedBytes,
        limit: usize,
    ) -> Result<(), ()> {
        match self {
            Self::Local(queue) => queue.try_send_charged(source, frame, account, limit),
            Self::Remote { .. } => Err(()),
        }
    }

    /// Queue a frame from `source` (towards an executor: the harness's credential, whose share
    /// of the executor socket's queue it counts against) without waiting; `Err` when it was
    /// dropped. Towards a harness of another node, the frame counts against that harness's
    /// credential's share of the publish queue, whatever `source` says.
    pub(crate) fn try_send_from(&self, source: u64, frame: Bytes) -> Result<(), ()> {
        match self {
            Self::Local(queue) => queue.try_send_from(source, frame),
            Self::Remote {
                subject,
                party,
                publisher,
            } => {
                if publisher.try_publish_to_harness(subject, *party, &frame) {
                    Ok(())
                } else {
                    Err(())
                }
            }
        }
    }
}

/// Per harness socket: a token bucket for opening streams, and the cap on streams owned.
pub(crate) struct NewStreamLimiter {
    tokens: f64,
    refilled: Instant,
    /// Frames dropped over the limits.
    pub(crate) dropped: u64,
}

impl NewStreamLimiter {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            tokens: NEW_STREAMS_PER_SOCKET_BURST,
            refilled: now,
            dropped: 0,
        }
    }

    /// May this socket send one more handshake, or open one more stream, now?
    pub(crate) fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled);
        self.refilled = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * NEW_STREAMS_PER_SOCKET_PER_SECOND)
            .min(NEW_STREAMS_PER_SOCKET_BURST);
        if self.tokens < 1.0 {
            self.dropped += 1;
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}
