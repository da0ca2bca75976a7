//! Frame queues bounded in bytes as well as in frames (a leaf module: the router's socket queues
//! and the cluster's publish queue both count with it).
//!
//! A bound in frames alone is a bound in bytes only as large as the largest frame allows:
//! 4,096 relay frames of up to ~65 KiB are ~270 MB for one socket. A harness that stops reading
//! its socket while its executor keeps sending (or retransmitting) would fill that much of the
//! rendezvous's memory per socket it holds. Each queue therefore also counts the bytes it holds
//! and drops a frame that would pass its byte bound, as it drops one past its frame bound; the
//! relay endpoints retransmit what a rendezvous drops.
//!
//! Socket bounds alone still multiply: by the sockets of a credential (up to
//! `--max-sockets-per-credential`), by the executors a credential sends to, and by the sockets
//! of a node. So the frames queued for a harness socket, and the frames a harness socket sent
//! while they wait in an executor's queue ([`FrameSender::try_send_charged`]), also count
//! against its credential's [`CREDENTIAL_QUEUE_BYTES`], and every socket's against the node's
//! [`NODE_QUEUE_BYTES`]: what one node holds in queued frames is bounded whatever the number of
//! sockets, credentials or streams, and one credential holds at most its bound of it.
//!
//! An executor socket's queue has many sources: every harness credential of its environment.
//! One bound for all would let one credential fill it (a flood, or just a faster link than the
//! executor's) and have every other credential's frames dropped. So that queue keeps a lane per
//! credential, holds each to its [`Share::of_source`] and serves the lanes in turn
//! ([`executor_socket_queue`]). A cluster node's publish queue has the same many sources (every
//! harness credential with a socket or an executor on the node) and the same lanes
//! ([`fair_queue`]).

mod lanes;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use lanes::{
    FrameReceiver, FrameSender, Share, Weighed, executor_socket_queue, fair_queue, socket_queue,
};

/// Frames queued for one socket; more are dropped (the endpoints retransmit).
pub const SOCKET_QUEUE_FRAMES: usize = 4096;
/// Bytes of frames queued for one socket; a frame that would pass it is dropped. Twice an
/// endpoint's `MAX_UNACKED_BYTES` (8 MiB in flight per stream), so one stream at full speed
/// never loses a frame here to the bound.
pub const SOCKET_QUEUE_BYTES: usize = 16 * 1024 * 1024;

/// Bytes of frames queued for all the harness sockets of one credential together.
pub const CREDENTIAL_QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// Bytes of frames queued for all the sockets of one rendezvous node together.
pub const NODE_QUEUE_BYTES: usize = 512 * 1024 * 1024;

/// Bytes held by a queue, against its bound (cheap to clone: the halves of a queue share it).
#[derive(Clone, Debug, Default)]
pub struct QueuedBytes(Arc<AtomicUsize>);

impl QueuedBytes {
    /// Count `bytes` more unless that passes `limit`; `false` (nothing counted) when it would.
    pub fn try_add(&self, bytes: usize, limit: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                queued.checked_add(bytes).filter(|total| *total <= limit)
            })
            .is_ok()
    }

    /// `bytes` left the queue.
    pub fn remove(&self, bytes: usize) {
        self.0.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Whether no queue but the caller's counts with it any more.
    pub fn is_unshared(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }
}

/// The byte bounds a queue counts against, each with its limit: a socket's own and the shared
/// ones given to [`socket_queue`] (its credential's, its node's) (cheap to clone).
#[derive(Clone)]
pub struct Budgets(Arc<[(QueuedBytes, usize)]>);

impl Budgets {
    /// Count `bytes` in every bound, or in none (`false`) when one would be passed.
    fn try_add(&self, bytes: usize) -> bool {
        for (at, (queued, limit)) in self.0.iter().enumerate() {
            if !queued.try_add(bytes, *limit) {
                for (queued, _) in &self.0[..at] {
                    queued.remove(bytes);
                }
                return false;
            }
        }
        true
    }

    /// `bytes` left the queue.
    pub fn remove(&self, bytes: usize) {
        for (queued, _) in self.0.iter() {
            queued.remove(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_bytes_count_up_to_the_bound_and_are_freed_as_they_leave() {
        let queued = QueuedBytes::default();
        let limit = 1000;
        assert!(queued.try_add(600, limit));
        assert!(!queued.try_add(401, limit), "past the bound");
        assert_eq!(queued.get(), 600, "a refused add is not counted");
        assert!(queued.try_add(400, limit), "exactly at the bound");
        queued.remove(600);
        assert!(queued.try_add(600, limit), "what left made room");
        assert!(!queued.try_add(usize::MAX, limit), "no overflow");
    }
}
