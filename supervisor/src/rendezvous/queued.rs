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
//! `--max-sockets-per-credential`) and by the sockets of a node. So a harness socket's frames
//! also count against its credential's [`CREDENTIAL_QUEUE_BYTES`], and every socket's against
//! the node's [`NODE_QUEUE_BYTES`]: what one node holds in queued frames is bounded whatever
//! the number of sockets, credentials or streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Bytes;

use crate::relay::driver::Outbox;

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
/// ones given to [`socket_queue`] (its credential's, its node's), or the cluster's publish
/// queue's one (cheap to clone).
#[derive(Clone)]
pub struct Budgets(Arc<[(QueuedBytes, usize)]>);

impl Budgets {
    /// One bound of `limit` bytes, counted from zero.
    pub fn new(limit: usize) -> Self {
        Self(Arc::new([(QueuedBytes::default(), limit)]))
    }

    /// Queue `item`, of `bytes`, on `queue` without waiting, unless that passes a bound or the
    /// queue is full or closed (`false`: dropped, and counted nowhere). Whoever takes it off
    /// the queue calls [`Self::remove`].
    pub fn try_send<T>(&self, queue: &mpsc::Sender<T>, item: T, bytes: usize) -> bool {
        if !self.try_add(bytes) {
            return false;
        }
        if queue.try_send(item).is_err() {
            self.remove(bytes);
            return false;
        }
        true
    }

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

/// The sending half of a socket's queue (cheap to clone).
#[derive(Clone)]
pub struct FrameSender {
    frames: mpsc::Sender<Bytes>,
    budgets: Budgets,
}

/// The receiving half of a socket's queue: its socket's writer.
pub struct FrameReceiver {
    frames: mpsc::Receiver<Bytes>,
    budgets: Budgets,
}

impl Drop for FrameReceiver {
    /// Frames still queued when the socket ends leave the shared bounds with it.
    fn drop(&mut self) {
        self.frames.close();
        while let Ok(frame) = self.frames.try_recv() {
            self.budgets.remove(frame.len());
        }
    }
}

/// A socket's queue: at most [`SOCKET_QUEUE_FRAMES`] frames holding at most
/// [`SOCKET_QUEUE_BYTES`], and counting against each of `shared` (a bound shared with other
/// sockets' queues, and its limit).
pub fn socket_queue(shared: &[(&QueuedBytes, usize)]) -> (FrameSender, FrameReceiver) {
    let (sender, receiver) = mpsc::channel(SOCKET_QUEUE_FRAMES);
    let budgets = Budgets(
        std::iter::once((QueuedBytes::default(), SOCKET_QUEUE_BYTES))
            .chain(
                shared
                    .iter()
                    .map(|(queued, limit)| ((*queued).clone(), *limit)),
            )
            .collect(),
    );
    (
        FrameSender {
            frames: sender,
            budgets: budgets.clone(),
        },
        FrameReceiver {
            frames: receiver,
            budgets,
        },
    )
}

impl FrameSender {
    /// Queue `frame` without waiting; `Err` when it was dropped (a bound reached, the socket
    /// gone).
    pub fn try_send(&self, frame: Bytes) -> Result<(), ()> {
        let len = frame.len();
        if self.budgets.try_send(&self.frames, frame, len) {
            Ok(())
        } else {
            Err(())
        }
    }

    /// Whether the socket's writer is gone.
    pub fn is_closed(&self) -> bool {
        self.frames.is_closed()
    }
}

impl FrameReceiver {
    /// The next frame; `None` once every sender is gone.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let frame = self.frames.recv().await?;
        self.budgets.remove(frame.len());
        Some(frame)
    }
}

impl Outbox<Bytes> for FrameReceiver {
    fn try_next(&mut self) -> Option<Bytes> {
        let frame = self.frames.try_recv().ok()?;
        self.budgets.remove(frame.len());
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use proto::relay::limits::{MAX_RELAY_FRAME_BYTES, MAX_UNACKED_BYTES};

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

    #[tokio::test]
    async fn a_socket_queue_refuses_frames_past_its_bytes_and_takes_them_again_once_read() {
        let (sender, mut receiver) = socket_queue(&[]);
        let frame = Bytes::from(vec![7u8; MAX_RELAY_FRAME_BYTES]);
        let fits = SOCKET_QUEUE_BYTES / MAX_RELAY_FRAME_BYTES;
        assert!(
            fits < SOCKET_QUEUE_FRAMES,
            "the byte bound is the one reached"
        );
        for _ in 0..fits {
            sender.try_send(frame.clone()).unwrap();
        }
        assert!(
            sender.try_send(frame.clone()).is_err(),
            "a frame past the byte bound is dropped"
        );
        assert!(
            sender.try_send(Bytes::from_static(b"small")).is_ok(),
            "a frame that still fits is not"
        );
        assert_eq!(receiver.recv().await.unwrap().len(), MAX_RELAY_FRAME_BYTES);
        assert!(
            sender.try_send(frame.clone()).is_ok(),
            "a frame read by the writer made room"
        );
        let mut read = 1;
        while let Some(next) = receiver.try_next() {
            read += usize::from(next.len() == MAX_RELAY_FRAME_BYTES);
        }
        assert_eq!(read, fits + 1);
        assert_eq!(
            sender.budgets.0[0].0.get(),
            0,
            "an emptied queue holds nothing"
        );
        const { assert!(SOCKET_QUEUE_BYTES >= 2 * MAX_UNACKED_BYTES) };
    }

    #[test]
    fn sockets_sharing_a_bound_hold_at_most_it_together_and_a_closed_one_gives_its_bytes_back() {
        let credential = QueuedBytes::default();
        let limit = 3 * SOCKET_QUEUE_BYTES / 2;
        let frame = Bytes::from(vec![1u8; 1024 * 1024]);
        let (first, first_receiver) = socket_queue(&[(&credential, limit)]);
        let (second, _second_receiver) = socket_queue(&[(&credential, limit)]);
        let mut queued = 0;
        while first.try_send(frame.clone()).is_ok() {
            queued += 1;
        }
        assert_eq!(
            queued,
            SOCKET_QUEUE_BYTES / frame.len(),
            "the socket's own bound"
        );
        while second.try_send(frame.clone()).is_ok() {
            queued += 1;
        }
        assert_eq!(
            queued,
            limit / frame.len(),
            "the shared bound, reached first"
        );
        assert_eq!(credential.get(), limit);
        assert_eq!(
            second.budgets.0[0].0.get(),
            limit - SOCKET_QUEUE_BYTES,
            "a refused frame is counted nowhere"
        );
        drop(first_receiver);
        assert_eq!(
            credential.get(),
            limit - SOCKET_QUEUE_BYTES,
            "a socket that ended took its queued frames out of the shared bound"
        );
        assert!(first.try_send(frame.clone()).is_err(), "closed");
        assert!(
            second.try_send(frame).is_ok(),
            "room again for the other socket"
        );
        assert!(!credential.is_unshared());
    }

    #[test]
    fn a_frame_to_a_closed_socket_is_not_counted() {
        let node = QueuedBytes::default();
        let (sender, receiver) = socket_queue(&[(&node, NODE_QUEUE_BYTES)]);
        drop(receiver);
        assert!(sender.is_closed());
        assert!(sender.try_send(Bytes::from_static(b"frame")).is_err());
        assert_eq!(sender.budgets.0[0].0.get(), 0);
        assert_eq!(node.get(), 0);
    }
}
