//! A socket's place in the cluster: the subscriptions and leases a node holds for the executor
//! and harness sockets it serves (`router.rs` drives them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;

use super::bus::{FramePiece, NODE_LANE, ToHarness};
use super::pieces::{Reassembly, ReassemblyBySource};
use super::{Cluster, Control, LEASE_RENEW_INTERVAL};
use crate::rendezvous::credentials::CredentialSecret;
use crate::rendezvous::queue::{NewStreamLimiter, Queue};
use crate::rendezvous::queued::{FrameSender, QueuedBytes};

/// Harness sockets of other nodes one executor seat keeps state for (a limiter and a reply
/// subject each). Matches the single node's `MAX_RENDEZVOUS_CONNECTIONS`. Past it, the socket
/// heard from longest ago gives way ([`make_room`]): a socket whose close never arrived (its
/// `SocketClosed` lost to NATS, or dropped from a publish lane its own credential keeps full)
/// must not hold a place for good and lock every new harness socket out of the executor.
pub const MAX_REMOTE_HARNESS_SOCKETS: usize = 4096;

/// Why a seat could not be taken.
#[derive(Debug, thiserror::Error)]
#[error("NATS subscription: {0}")]
pub struct SeatError(String);

/// A message of an environment's subject, decoded.
pub struct Received {
    /// What it says.
    pub control: Control,
    /// Its reply subject (a harness socket's, for frames).
    pub reply: Option<async_nats::Subject>,
}

/// What the executor's node keeps for one harness socket of any node.
pub struct RemoteHarness {
    /// Frames back to it.
    pub queue: Queue,
    /// Its credential's party.
    pub party: u64,
    /// Its credential's account on this node, which its frames waiting in the executor's queue
    /// are charged to.
    pub account: QueuedBytes,
    /// Its new-stream limiter (the stream table's half of it).
    pub limiter: NewStreamLimiter,
    /// When a frame of it last arrived.
    pub last_seen: Instant,
}

/// Room for one more socket in `remote` (which holds at most `cap`): when it is full, the
/// socket heard from longest ago gives way (a live one that speaks again is kept anew, with a
/// fresh limiter). Returns the socket that gave way.
pub fn make_room(remote: &mut HashMap<u64, RemoteHarness>, cap: usize) -> Option<u64> {
    if remote.len() < cap {
        return None;
    }
    let (&oldest, _) = remote.iter().min_by_key(|(_, harness)| harness.last_seen)?;
    remote.remove(&oldest);
    Some(oldest)
}

/// A proven executor socket's hold on its environment's subject and lease.
pub struct ExecutorSeat {
    cluster: Arc<Cluster>,
    environment: String,
    subscriber: async_nats::Subscriber,
    nonce: [u8; 16],
    remote: HashMap<u64, RemoteHarness>,
    in_pieces: ReassemblyBySource,
    renew: tokio::time::Interval,
}

impl ExecutorSeat {
    /// Subscribe to `environment`'s subject, announce the takeover (any other holder closes),
    /// write the lease.
    ///
    /// # Errors
    /// [`SeatError`] when NATS refuses the subscription.
    pub async fn take(cluster: &Arc<Cluster>, environment: &str) -> Result<Self, SeatError> {
        let subject = async_nats::Subject::from(cluster.executor_subject(environment));
        let subscriber = cluster
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|e| SeatError(e.to_string()))?;
        let nonce = *uuid::Uuid::new_v4().as_bytes();
        cluster.publisher().try_publish(
            NODE_LANE,
            &subject,
            Control::Takeover { node: nonce }.encode(),
        );
        let mut renew = tokio::time::interval(LEASE_RENEW_INTERVAL);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Self {
            cluster: cluster.clone(),
            environment: environment.to_owned(),
            subscriber,
            nonce,
            remote: HashMap::new(),
            in_pieces: ReassemblyBySource::default(),
            renew,
        })
    }

    /// This seat's id in takeover announcements.
    pub fn nonce(&self) -> [u8; 16] {
        self.nonce
    }

    /// The next message (malformed ones skipped), renewing the lease when it is due; `None`
    /// once the subscription ended.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            tokio::select! {
                message = self.subscriber.next() => {
                    let message = message?;
                    let control = if let Some(FramePiece { socket, party, piece }) =
                        FramePiece::decode(&message.payload)
                    {
                        let Some(frame) = self.in_pieces.push(socket, &piece) else {
                            continue;
                        };
                        Control::Frame { socket, party, frame }
                    } else if let Some(control) = Control::decode(&message.payload) {
                        control
                    } else {
                        continue;
                    };
                    return Some(Received { control, reply: message.reply });
                }
                _ = self.renew.tick() => {
                    let cluster = self.cluster.clone();
                    let environment = self.environment.clone();
                    tokio::spawn(async move { cluster.renew_lease(&environment).await });
                }
            }
        }
    }

    /// The state of harness socket `socket` of credential `party` (created on its first frame,
    /// which must carry its reply subject, with the credential's `account`, making room if
    /// needed); `None` when its first frame carries no harness reply subject.
    pub fn remote(
        &mut self,
        socket: u64,
        party: u64,
        account: impl FnOnce() -> QueuedBytes,
        reply: Option<async_nats::Subject>,
    ) -> Option<&mut RemoteHarness> {
        let now = Instant::now();
        if let Some(harness) = self.remote.get_mut(&socket) {
            harness.last_seen = now;
        } else {
            let subject = reply.filter(|s| s.starts_with("execward.h."))?;
            if let Some(evicted) = make_room(&mut self.remote, MAX_REMOTE_HARNESS_SOCKETS) {
                self.in_pieces.forget(evicted);
            }
            self.remote.insert(
                socket,
                RemoteHarness {
                    queue: Queue::Remote {
                        subject,
                        party,
                        publisher: self.cluster.publisher().clone(),
                    },
                    party,
                    account: account(),
                    limiter: NewStreamLimiter::new(now),
                    last_seen: now,
                },
            );
        }
        self.remote.get_mut(&socket)
    }

    /// Harness socket `socket` closed: what was kept for it, if anything.
    pub fn forget(&mut self, socket: u64) -> Option<RemoteHarness> {
        self.in_pieces.forget(socket);
        self.remote.remove(&socket)
    }
}

impl Drop for ExecutorSeat {
    fn drop(&mut self) {
        let cluster = self.cluster.clone();
        let environment = std::mem::take(&mut self.environment);
        tokio::spawn(async move { cluster.drop_lease(&environment).await });
    }
}

/// A harness socket's subject (frames for it arrive there) and its way to the executor.
pub struct HarnessSeat {
    cluster: Arc<Cluster>,
    subject: async_nats::Subject,
    executor: async_nats::Subject,
    party: u64,
    forward: tokio::task::JoinHandle<()>,
}

impl HarnessSeat {
    /// Subscribe a fresh subject whose frames go into `queue`.
    ///
    /// # Errors
    /// [`SeatError`] when NATS refuses the subscription.
    pub async fn take(
        cluster: &Arc<Cluster>,
        environment: &str,
        secret: &CredentialSecret,
        queue: &FrameSender,
    ) -> Result<Self, SeatError> {
        let subject = async_nats::Subject::from(cluster.harness_subject());
        let mut subscriber = cluster
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|e| SeatError(e.to_string()))?;
        let queue = queue.clone();
        let forward = tokio::spawn(async move {
            let mut in_pieces = Reassembly::default();
            while let Some(message) = subscriber.next().await {
                let frame = match ToHarness::decode(&message.payload) {
                    Some(ToHarness::Whole(frame)) => frame,
                    Some(ToHarness::Piece(piece)) => match in_pieces.push(&piece) {
                        Some(frame) => frame,
                        None => continue,
                    },
                    None => continue,
                };
                if queue.try_send(frame).is_err() && queue.is_closed() {
                    break;
                }
            }
        });
        Ok(Self {
            cluster: cluster.clone(),
            subject,
            executor: async_nats::Subject::from(cluster.executor_subject(environment)),
            party: cluster.party(secret.token()),
            forward,
        })
    }

    /// Send a harness frame to the node holding the executor socket.
    pub fn forward(&self, socket: u64, frame: &[u8]) {
        if !self.cluster.publisher().try_publish_to_executor(
            &self.executor,
            &self.subject,
            socket,
            self.party,
            frame,
        ) {
            tracing::debug!("NATS publish queue full: frame dropped");
        }
    }

    /// The socket closed: the executor's node forgets its streams.
    pub fn closed(self, socket: u64) {
        let _ = self.cluster.publisher().try_publish(
            self.party,
            &self.executor,
            Control::SocketClosed { socket }.encode(),
        );
    }
}

impl Drop for HarnessSeat {
    fn drop(&mut self) {
        self.forward.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rendezvous::queued::socket_queue;

    fn harness(last_seen: Instant) -> RemoteHarness {
        RemoteHarness {
            queue: Queue::Local(socket_queue(&[]).0),
            party: 1,
            account: QueuedBytes::default(),
            limiter: NewStreamLimiter::new(last_seen),
            last_seen,
        }
    }

    #[test]
    fn a_full_table_makes_room_by_the_socket_heard_from_longest_ago() {
        let start = Instant::now();
        let mut remote: HashMap<u64, RemoteHarness> = (0..4u64)
            .map(|n| (n, harness(start + Duration::from_secs(10 - n))))
            .collect();
        assert_eq!(make_room(&mut remote, 5), None, "room left: nothing goes");
        assert_eq!(remote.len(), 4);
        assert_eq!(
            make_room(&mut remote, 4),
            Some(3),
            "full: the one heard from longest ago goes"
        );
        assert_eq!(remote.len(), 3);
        remote.get_mut(&2).unwrap().last_seen = start + Duration::from_secs(60);
        remote.insert(9, harness(start + Duration::from_secs(30)));
        assert_eq!(
            make_room(&mut remote, 4),
            Some(1),
            "a socket that spoke again stays"
        );
        assert!(remote.contains_key(&2) && remote.contains_key(&9));
    }
}
