//! The fair queue: a lane per source, served in turn (see the parent module). A socket's queue
//! holds relay frames; the cluster's publish queue holds NATS messages (each weighed by its
//! bytes).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Bytes;

use super::{Budgets, QueuedBytes, SOCKET_QUEUE_BYTES, SOCKET_QUEUE_FRAMES};
use crate::relay::driver::Outbox;

/// An amount of a queue, in bytes and in frames: a queue's own bound, or the most of it one
/// source may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Bytes.
    pub bytes: usize,
    /// Frames.
    pub frames: usize,
}

/// A socket's own bound.
pub const SOCKET_QUEUE: Share = Share {
    bytes: SOCKET_QUEUE_BYTES,
    frames: SOCKET_QUEUE_FRAMES,
};

impl Share {
    /// The most of a fair queue bounded by `self` one source may hold while `other_sources`
    /// others have frames queued: the queue less a quarter kept back, split evenly. A newcomer
    /// finds the quarter kept back (for a source flooding with small frames, whose bytes stay
    /// far below any byte bound, the frames kept back). Alone, a source holds 12 MiB and 3,072
    /// frames of a socket's queue: more than a stream's whole window, `MAX_UNACKED_BYTES` in
    /// `MAX_UNACKED_SEGMENTS`, so one stream at full speed never loses a frame there. A source over its share once others join queues nothing
    /// until the receiver's turns have taken it back below, and those turns serve every source
    /// alike ([`FrameReceiver`]): a source that keeps its share full delays another's frame by
    /// one frame of its own, never by the whole queue.
    pub fn of_source(self, other_sources: usize) -> Self {
        let split = other_sources.saturating_add(1);
        Self {
            bytes: (self.bytes - self.bytes / 4) / split,
            frames: (self.frames - self.frames / 4) / split,
        }
    }
}

/// What a queue's byte bounds count of an item.
pub trait Weighed {
    /// Its bytes.
    fn bytes(&self) -> usize;
}

impl Weighed for Bytes {
    fn bytes(&self) -> usize {
        self.len()
    }
}

/// One source's frames in a queue, each with the account it is also charged to and the bytes
/// charged, if any ([`FrameSender::try_send_charged`]).
struct Lane<T> {
    frames: VecDeque<(T, Option<(QueuedBytes, usize)>)>,
    bytes: usize,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Self {
            frames: VecDeque::new(),
            bytes: 0,
        }
    }
}

/// A queue's frames, by source, and the order in which the sources are served.
struct Lanes<T> {
    lanes: HashMap<u64, Lane<T>>,
    /// Sources with frames queued, next to be served first.
    turn: VecDeque<u64>,
    frames: usize,
    /// The receiver is gone: nothing is queued any more.
    closed: bool,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turn: VecDeque::new(),
            frames: 0,
            closed: false,
        }
    }
}

/// What both halves of a queue share.
struct Shared<T> {
    lanes: Mutex<Lanes<T>>,
    /// A frame was queued, or the last sender went.
    ready: Notify,
    senders: AtomicUsize,
    /// The queue's own byte bound first, then the bounds it shares with other queues.
    budgets: Budgets,
    /// The queue's own bound in frames (and in bytes, as `budgets`' first).
    bound: Share,
    /// Each source is held to its [`Share::of_source`] of `bound`.
    shares: bool,
}

impl<T: Weighed> Shared<T> {
    fn lanes(&self) -> std::sync::MutexGuard<'_, Lanes<T>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next frame in turn (its bytes leave the bounds), if one is queued.
    fn pop(&self) -> Option<T> {
        let mut lanes = self.lanes();
        let source = lanes.turn.pop_front()?;
        let lane = lanes.lanes.get_mut(&source)?;
        let (frame, charged) = lane.frames.pop_front()?;
        let bytes = frame.bytes();
        lane.bytes -= bytes;
        if lane.frames.is_empty() {
            lanes.lanes.remove(&source);
        } else {
            lanes.turn.push_back(source);
        }
        lanes.frames -= 1;
        drop(lanes);
        self.budgets.remove(bytes);
        if let Some((account, bytes)) = charged {
            account.remove(bytes);
        }
        Some(frame)
    }
}

/// The sending half of a queue (cheap to clone; the queue ends when every clone and the
/// receiver's reads are done, as a channel's would).
pub struct FrameSender<T = Bytes> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for FrameSender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for FrameSender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.ready.notify_one();
        }
    }
}

/// The receiving half of a queue: its socket's writer, or the task handing messages to NATS.
pub struct FrameReceiver<T = Bytes> {
    shared: Arc<Shared<T>>,
}

impl<T> Drop for FrameReceiver<T> {
    /// Frames still queued when the receiver ends leave the shared bounds with it.
    fn drop(&mut self) {
        let held = {
            let mut lanes = self
                .shared
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            lanes.closed = true;
            lanes.turn.clear();
            lanes.frames = 0;
            let mut held = 0;
            for lane in std::mem::take(&mut lanes.lanes).into_values() {
                held += lane.bytes;
                for (_, charged) in lane.frames {
                    if let Some((account, bytes)) = charged {
                        account.remove(bytes);
                    }
                }
            }
            held
        };
        // Every bound counts each frame once, so the total leaves at once.
        self.shared.budgets.remove(held);
    }
}

/// A socket's queue: at most [`SOCKET_QUEUE_FRAMES`] frames holding at most
/// [`SOCKET_QUEUE_BYTES`], and counting against each of `shared` (a bound shared with other
/// sockets' queues, and its limit). For a harness socket: one source (its executor), served in
/// order.
pub fn socket_queue(shared: &[(&QueuedBytes, usize)]) -> (FrameSender, FrameReceiver) {
    queue(SOCKET_QUEUE, shared, false)
}

/// An executor socket's queue: as [`socket_queue`], and each source (the harness credential
/// given to [`FrameSender::try_send_from`]) holds at most its [`Share::of_source`] and is served in
/// turn with the others. One harness flooding its executor neither fills the queue against the
/// others nor delays their frames behind its own.
pub fn executor_socket_queue(shared: &[(&QueuedBytes, usize)]) -> (FrameSender, FrameReceiver) {
    queue(SOCKET_QUEUE, shared, true)
}

/// A queue of at most `bound` (frames, and bytes as [`Weighed`] counts them) whose sources
/// each hold at most their [`Share::of_source`] of it and are served in turn.
pub fn fair_queue<T: Weighed>(bound: Share) -> (FrameSender<T>, FrameReceiver<T>) {
    queue(bound, &[], true)
}

fn queue<T: Weighed>(
    bound: Share,
    shared: &[(&QueuedBytes, usize)],
    shares: bool,
) -> (FrameSender<T>, FrameReceiver<T>) {
    let budgets = Budgets(
        std::iter::once((QueuedBytes::default(), bound.bytes))
            .chain(
                shared
                    .iter()
                    .map(|(queued, limit)| ((*queued).clone(), *limit)),
            )
            .collect(),
    );
    let shared = Arc::new(Shared {
        lanes: Mutex::default(),
        ready: Notify::new(),
        senders: AtomicUsize::new(1),
        budgets,
        bound,
        shares,
    });
    (
        FrameSender {
            shared: shared.clone(),
        },
        FrameReceiver { shared },
    )
}

impl<T: Weighed> FrameSender<T> {
    /// Queue `frame` without waiting; `Err` when it was dropped (a bound reached, the socket
    /// gone). For a queue with one source (a harness socket: everything comes from its
    /// executor).
    pub fn try_send(&self, frame: T) -> Result<(), ()> {
        self.try_send_from(0, frame)
    }

    /// Queue `frame` from `source` (for an executor socket: the harness's credential) without
    /// waiting; `Err` when it was dropped: the queue's or a shared bound reached, `source`'s
    /// share of the queue ([`Share::of_source`]) reached, or the receiver gone.
    pub fn try_send_from(&self, source: u64, frame: T) -> Result<(), ()> {
        self.push(source, frame, None)
    }

    /// [`Self::try_send_from`], and the frame is also charged to `account` (the bound of
    /// everything `source` holds in any queue, `limit`) until it leaves this queue; dropped
    /// when that would pass `limit`.
    pub fn try_send_charged(
        &self,
        source: u64,
        frame: T,
        account: &QueuedBytes,
        limit: usize,
    ) -> Result<(), ()> {
        self.push(source, frame, Some((account, limit)))
    }

    fn push(
        &self,
        source: u64,
        frame: T,
        account: Option<(&QueuedBytes, usize)>,
    ) -> Result<(), ()> {
        let len = frame.bytes();
        let bound = self.shared.bound;
        let mut lanes = self.shared.lanes();
        if lanes.closed || lanes.frames >= bound.frames {
            return Err(());
        }
        // A source has a lane exactly while it has frames queued, and is then in the turn.
        let (held_bytes, held_frames, queued) = lanes
            .lanes
            .get(&source)
            .map_or((0, 0, false), |lane| (lane.bytes, lane.frames.len(), true));
        let over_share = self.shared.shares && {
            let share = bound.of_source(lanes.lanes.len() - usize::from(queued));
            held_bytes.saturating_add(len) > share.bytes || held_frames >= share.frames
        };
        if over_share || !self.shared.budgets.try_add(len) {
            return Err(());
        }
        if let Some((account, limit)) = account
            && !account.try_add(len, limit)
        {
            self.shared.budgets.remove(len);
            return Err(());
        }
        if !queued {
            lanes.turn.push_back(source);
        }
        let lane = lanes.lanes.entry(source).or_default();
        lane.frames
            .push_back((frame, account.map(|(account, _)| (account.clone(), len))));
        lane.bytes += len;
        lanes.frames += 1;
        drop(lanes);
        self.shared.ready.notify_one();
        Ok(())
    }

    /// Whether the queue's receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.lanes().closed
    }
}

impl<T: Weighed> FrameReceiver<T> {
    /// The next frame in turn, if one is queued now.
    pub fn try_recv(&mut self) -> Option<T> {
        self.shared.pop()
    }

    /// The next frame in turn; `None` once every sender is gone and nothing is queued.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            if let Some(frame) = self.shared.pop() {
                return Some(frame);
            }
            if self.shared.senders.load(Ordering::Acquire) == 0 {
                // A frame queued just before the last sender went is still delivered.
                return self.shared.pop();
            }
            // A notification sent since the check above is kept as a permit: none is lost.
            self.shared.ready.notified().await;
        }
    }
}

impl Outbox<Bytes> for FrameReceiver {
    fn try_next(&mut self) -> Option<Bytes> {
        self.try_recv()
    }
}

#[cfg(test)]
mod tests {
    use proto::relay::limits::{MAX_RELAY_FRAME_BYTES, MAX_UNACKED_BYTES};

    use super::*;
    use crate::rendezvous::queued::{NODE_QUEUE_BYTES, QueuedBytes};

    /// What one source may hold of an executor socket's queue beside `other_sources` others.
    fn source_share(other_sources: usize) -> Share {
        SOCKET_QUEUE.of_source(other_sources)
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
            sender.shared.budgets.0[0].0.get(),
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
            second.shared.budgets.0[0].0.get(),
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
        assert_eq!(sender.shared.budgets.0[0].0.get(), 0);
        assert_eq!(node.get(), 0);
    }

    #[tokio::test]
    async fn a_flooding_source_holds_at_most_its_share_and_another_is_served_in_turn() {
        let (sender, mut receiver) = executor_socket_queue(&[]);
        let big = Bytes::from(vec![1u8; 64 * 1024]);
        let mut flooded = 0;
        while sender.try_send_from(1, big.clone()).is_ok() {
            flooded += 1;
        }
        assert_eq!(
            flooded * big.len(),
            source_share(0).bytes,
            "alone, a source fills the queue but its reserve"
        );
        const { assert!(SOCKET_QUEUE_BYTES - SOCKET_QUEUE_BYTES / 4 > MAX_UNACKED_BYTES) };
        const {
            assert!(
                SOCKET_QUEUE_FRAMES - SOCKET_QUEUE_FRAMES / 4
                    > proto::relay::limits::MAX_UNACKED_SEGMENTS
            )
        };
        for n in 0..3u8 {
            sender
                .try_send_from(2, Bytes::from(vec![n; 10]))
                .expect("another source still finds room");
        }
        assert!(
            sender.try_send_from(1, big.clone()).is_err(),
            "with another source queued, the flooder's share is smaller still"
        );
        // In turn: one of the flooder's, one of the other's, and so on.
        let order: Vec<usize> = [(); 6]
            .iter()
            .map(|()| receiver.try_next().unwrap().len())
            .collect();
        assert_eq!(order, [big.len(), 10, big.len(), 10, big.len(), 10]);
        while receiver.try_next().is_some() {}
        assert_eq!(sender.shared.budgets.0[0].0.get(), 0, "all bytes left");
        // A third source next to two that took all they could: the two are held to their
        // smaller shares now, so what the writer takes off the queue is the third's to use.
        while sender.try_send_from(1, big.clone()).is_ok() {}
        while sender.try_send_from(2, big.clone()).is_ok() {}
        assert!(sender.try_send_from(3, big.clone()).is_err(), "full");
        receiver.try_next().unwrap();
        receiver.try_next().unwrap();
        assert!(
            sender.try_send_from(1, big.clone()).is_err(),
            "over its share next to another"
        );
        assert!(sender.try_send_from(3, big.clone()).is_ok());
        drop(sender);
        let mut left = 0;
        while receiver.recv().await.is_some() {
            left += 1;
        }
        assert!(
            left > 2,
            "queued frames are delivered after the senders went"
        );
    }

    #[tokio::test]
    async fn the_receiver_wakes_for_a_frame_and_ends_when_the_last_sender_goes() {
        let (sender, mut receiver) = socket_queue(&[]);
        let second = sender.clone();
        let waiter = tokio::spawn(async move {
            let first = receiver.recv().await;
            let end = receiver.recv().await;
            (first, end)
        });
        tokio::task::yield_now().await;
        sender.try_send(Bytes::from_static(b"one")).unwrap();
        drop(sender);
        drop(second);
        let (first, end) = waiter.await.unwrap();
        assert_eq!(first.as_deref(), Some(&b"one"[..]));
        assert_eq!(end, None);
    }

    #[test]
    fn a_source_flooding_small_frames_is_held_to_its_share_of_the_frame_slots() {
        let (sender, mut receiver) = executor_socket_queue(&[]);
        let tiny = Bytes::from_static(b"x");
        let mut flooded = 0;
        while sender.try_send_from(1, tiny.clone()).is_ok() {
            flooded += 1;
        }
        assert_eq!(
            flooded,
            source_share(0).frames,
            "the frame share, not the frame bound"
        );
        assert!(flooded < SOCKET_QUEUE_FRAMES);
        sender
            .try_send_from(2, tiny.clone())
            .expect("another source still finds a slot");
        assert_eq!(receiver.try_next().as_deref(), Some(&b"x"[..]));
        assert!(
            sender.try_send_from(1, tiny).is_err(),
            "over its share next to another"
        );
    }

    #[test]
    fn frames_charged_to_an_account_count_there_until_they_leave_any_queue() {
        const MIB: usize = 1024 * 1024;
        let account = QueuedBytes::default();
        let limit = 20 * MIB;
        let (first, mut first_receiver) = executor_socket_queue(&[]);
        let (second, second_receiver) = executor_socket_queue(&[]);
        let frame = Bytes::from(vec![0u8; MIB]);
        let mut queued = 0;
        while first
            .try_send_charged(1, frame.clone(), &account, limit)
            .is_ok()
        {
            queued += 1;
        }
        assert_eq!(
            queued * MIB,
            source_share(0).bytes,
            "the first queue's share"
        );
        while second
            .try_send_charged(1, frame.clone(), &account, limit)
            .is_ok()
        {
            queued += 1;
        }
        assert_eq!(
            queued * MIB,
            limit,
            "the account's bound, across both queues"
        );
        assert_eq!(account.get(), limit);
        assert_eq!(
            second.shared.budgets.0[0].0.get(),
            limit - source_share(0).bytes,
            "a frame the account refused is counted nowhere"
        );
        assert!(
            second.try_send_from(2, frame.clone()).is_ok(),
            "another source is not charged to it"
        );
        first_receiver.try_recv().unwrap();
        assert_eq!(
            account.get(),
            limit - MIB,
            "a frame read leaves the account"
        );
        drop(second_receiver);
        assert_eq!(
            account.get(),
            source_share(0).bytes - MIB,
            "a queue that ended gives its frames' bytes back to the account"
        );
        while first_receiver.try_recv().is_some() {}
        assert_eq!(account.get(), 0);
    }

    #[test]
    fn empty_frames_keep_one_turn_per_source() {
        let (sender, mut receiver) = executor_socket_queue(&[]);
        sender.try_send_from(1, Bytes::new()).unwrap();
        sender.try_send_from(1, Bytes::new()).unwrap();
        sender.try_send_from(2, Bytes::from_static(b"b")).unwrap();
        let order: Vec<usize> =
            std::iter::from_fn(|| receiver.try_next().map(|f| f.len())).collect();
        assert_eq!(
            order,
            [0, 1, 0],
            "source 1 was queued in the turn once, not per frame"
        );
    }
}
