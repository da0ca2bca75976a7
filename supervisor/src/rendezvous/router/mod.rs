//! In-memory routing state: registered environments (each bound to its executor's key), their
//! executor socket, which harness socket owns each `stream_id`, and every open socket with the
//! credential it came in with.
//!
//! Rules:
//! - The first registration of an environment id binds it to its public key (or the credentials
//!   file pins one); a registration with another key is refused while the binding stands. An
//!   operator releases it with [`Router::unbind`], or pins another key ([`Router::enforce`]):
//!   either closes the environment's executor sockets and resets its streams at once.
//! - An executor socket carries nothing until it proved it holds the bound key
//!   ([`proto::relay::proof`]): the rendezvous challenges it on opening, and only a socket that
//!   answered within [`PROOF_TIMEOUT`] becomes the environment's executor, replacing the
//!   previous one (the key holder reconnecting). A socket that cannot prove is closed; it never
//!   displaces the live one and never sees a harness frame.
//! - Credentials hold for the life of a socket: [`Router::enforce`] (after every reload) closes
//!   the sockets whose credential is gone, lost its role or no longer covers the environment,
//!   and resets the streams that ran through them.
//! - A harness socket owns a stream from its first frame on it; a later harness socket sending
//!   on the same `stream_id` takes it over (that is how a reconnected harness resumes), if it
//!   comes with the same credential.
//! - Frames from a harness go to the environment's current executor socket, tagged with the
//!   harness socket's id as `source` ([`append_source`]); frames from the executor go to the
//!   socket owning their stream. No route, or a full queue: dropped. A harness frame on a proof
//!   stream id is never routed. The executor socket's queue is shared fairly between harness
//!   credentials ([`executor_socket_queue`]): each holds at most its share and they are served
//!   in turn, so a credential that floods its executor (or outruns a slow executor link) costs
//!   the others neither dropped frames nor a wait behind its own.
//! - Quotas are per party: one harness credential owns at most
//!   `max_streams_per_credential` streams of an environment whatever number of sockets it
//!   opens. One harness socket cannot crowd others out either: it sends at most
//!   [`NEW_STREAMS_PER_SOCKET_BURST`](super::queue::NEW_STREAMS_PER_SOCKET_BURST) handshakes or new streams at once and
//!   [`NEW_STREAMS_PER_SOCKET_PER_SECOND`](super::queue::NEW_STREAMS_PER_SOCKET_PER_SECOND) after that (a harness sends message 1 a few times per
//!   stream), and owns at most [`MAX_STREAMS_PER_SOCKET`]; frames beyond are dropped here,
//!   so a flood never reaches (or costs) the executor, and the executor's one socket is never
//!   closed over one party's frames.
//! - Only the envelope is decoded (for `stream_id`); payloads are never inspected.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures_util::{SinkExt, StreamExt};
use proto::relay::frame::{append_source, route, route_stream_id};
use proto::relay::proof::{Challenge, accepted_frame, is_proof_stream};
use proto::relay::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Bytes, Message as WsMessage};

use super::cluster::seat::{ExecutorSeat, HarnessSeat, Received};
use super::cluster::{Cluster, Control};
use super::credentials::{CredentialSecret, Credentials, Role};
pub(crate) use super::queue::{NewStreamLimiter, Queue};
pub use super::registration::{RegisterError, validate_registration};

mod executor;
mod harness;
use super::queued::{
    CREDENTIAL_QUEUE_BYTES, FrameReceiver, FrameSender, NODE_QUEUE_BYTES, QueuedBytes,
    executor_socket_queue, socket_queue,
};
use crate::relay::driver::{Outbox, send_batch};
use crate::relay::registry::{RegisterRequest, decode_public_key};

/// Streams routed per environment; frames opening more are dropped.
pub const MAX_STREAMS_PER_ENVIRONMENT: usize = 4096;
/// Streams one harness socket may own (a harness opens one socket per stream; 64 is far more
/// than a well-behaved one needs, and 4096 / 64 sockets are needed to fill an environment).
pub const MAX_STREAMS_PER_SOCKET: usize = 64;
/// Default for `--max-streams-per-credential`: streams of one environment that the sockets of
/// one harness credential own together. Half of the executor's `MAX_RELAY_STREAMS` (256), so one
/// credential, whatever number of sockets it opens, leaves the other half to everyone else.
pub const MAX_STREAMS_PER_CREDENTIAL: usize = 128;
pub use proto::relay::limits::PROOF_TIMEOUT;
/// How often the key challenge is sent again while unanswered (a lossy link may drop it or
/// its answer).
pub const PROOF_RESEND_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// Which harness socket owns a stream, and for which party.
struct StreamRoute {
    socket: u64,
    party: u64,
    queue: Queue,
}

struct Environment {
    name: String,
    public_key: String,
    /// The proven executor socket: (socket id, its queue).
    executor: Option<(u64, Queue)>,
    streams: HashMap<String, StreamRoute>,
}

impl Environment {
    /// Reset every stream (towards its harness, and towards the executor), forget the routes
    /// and the executor socket (dropping its queue closes it).
    fn reset_all(&mut self, reason: &str) {
        let executor = self.executor.take();
        for (stream_id, route) in self.streams.drain() {
            let reset = Bytes::from(Frame::new(stream_id.clone(), reset_body(reason)).encode());
            let _ = route.queue.try_send(reset);
            if let Some((_, executor)) = &executor {
                let frame = Frame::new(stream_id, reset_body(reason)).encode();
                let _ = executor.try_send_from(
                    route.party,
                    Bytes::from(append_source(&frame, route.socket)),
                );
            }
        }
    }
}

fn reset_body(reason: &str) -> Body {
    Body::Reset {
        reason: reason.to_owned(),
    }
}

/// One open socket: who opened it, for what, and how to close it.
struct OpenSocket {
    environment: String,
    role: Role,
    secret: CredentialSecret,
    close: Arc<Notify>,
}

/// The routing table.
pub struct Router {
    environments: Mutex<HashMap<String, Environment>>,
    sockets: Mutex<HashMap<u64, OpenSocket>>,
    next_socket: AtomicU64,
    max_streams_per_credential: usize,
    /// Environments bound at once (`--max-environments`).
    max_environments: usize,
    /// Cluster mode: the link to the other nodes.
    cluster: Option<Arc<Cluster>>,
    /// Bytes queued for all of this node's sockets ([`NODE_QUEUE_BYTES`]).
    queued: QueuedBytes,
    /// Bytes queued for each credential's harness sockets, by party
    /// ([`CREDENTIAL_QUEUE_BYTES`]).
    queued_by_credential: Mutex<HashMap<u64, QueuedBytes>>,
}

/// Unregisters a socket from [`Router`]'s table when its task ends.
struct SocketGuard<'a> {
    router: &'a Router,
    id: u64,
}

impl Drop for SocketGuard<'_> {
    fn drop(&mut self) {
        self.router.open_sockets().remove(&self.id);
    }
}

impl Router {
    /// A table whose harness credentials own at most `max_streams_per_credential` streams of
    /// an environment each, binding at most `max_environments` environments; `cluster` for a
    /// node of a cluster (`None`: a single node).
    pub fn with_cluster(
        max_streams_per_credential: usize,
        max_environments: usize,
        cluster: Option<Arc<Cluster>>,
    ) -> Self {
        // Socket ids travel between nodes in cluster mode (a frame's `source`, stream
        // ownership): the high half is random per node, so two nodes never hand out the same.
        let first_socket = match cluster {
            Some(_) => (uuid::Uuid::new_v4().as_u64_pair().0 & 0xffff_ffff_0000_0000) | 1,
            // 0 is "unknown" in a frame's `source`: never a socket.
            None => 1,
        };
        Self {
            environments: Mutex::default(),
            sockets: Mutex::default(),
            next_socket: AtomicU64::new(first_socket),
            max_streams_per_credential: max_streams_per_credential.max(1),
            max_environments: max_environments.max(1),
            cluster,
            queued: QueuedBytes::default(),
            queued_by_credential: Mutex::default(),
        }
    }

    /// A new executor socket's queue: its own bounds and the node's, a share per harness
    /// credential.
    fn executor_queue(&self) -> (FrameSender, FrameReceiver) {
        executor_socket_queue(&[(&self.queued, NODE_QUEUE_BYTES)])
    }

    /// A new harness socket's queue: its own bounds, its credential's (`party`) and the node's;
    /// and the credential's account, which the frames the socket sends to executors are charged
    /// to as well. Call [`Self::harness_queue_closed`] when the socket ends.
    fn harness_queue(&self, party: u64) -> (FrameSender, FrameReceiver, QueuedBytes) {
        let credential = self.credential_account(party);
        let (sender, receiver) = socket_queue(&[
            (&credential, CREDENTIAL_QUEUE_BYTES),
            (&self.queued, NODE_QUEUE_BYTES),
        ]);
        (sender, receiver, credential)
    }

    /// What credential `party` holds queued on this node, towards its harness sockets and from
    /// them in executors' queues ([`CREDENTIAL_QUEUE_BYTES`]).
    fn credential_account(&self, party: u64) -> QueuedBytes {
        self.queued_by_credential
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(party)
            .or_default()
            .clone()
    }

    /// A harness socket of `party` ended (here, or on another node in cluster mode): its
    /// credential's count is forgotten once nothing counts with it (an entry left while a
    /// queue's last clone is still being dropped holds nothing and is reused; there is at most
    /// one per credential).
    fn harness_queue_closed(&self, party: u64) {
        let mut by_credential = self
            .queued_by_credential
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if by_credential
            .get(&party)
            .is_some_and(QueuedBytes::is_unshared)
        {
            by_credential.remove(&party);
        }
    }

    /// Close every open socket (cluster mode: the NATS link was lost, so nothing routed here
    /// reaches anyone; the endpoints move to another node).
    pub fn close_all(&self) -> usize {
        let sockets = self.open_sockets();
        for socket in sockets.values() {
            socket.close.notify_one();
        }
        sockets.len()
    }

    /// Cluster mode: hold `id` in the local table with the cluster's binding (before an
    /// executor socket is served here); a binding to another key than the local one
    /// displaces it.
    pub fn adopt(&self, id: &str, name: String, public_key: &str) {
        let known = self.table().get(id).map(|env| env.public_key.clone());
        match known {
            Some(key) if key != public_key => self.displace(id, public_key),
            Some(_) => {}
            None => {
                self.table().insert(
                    id.to_owned(),
                    Environment {
                        name: name.clone(),
                        public_key: public_key.to_owned(),
                        executor: None,
                        streams: HashMap::new(),
                    },
                );
            }
        }
        if let Some(env) = self.table().get_mut(id) {
            env.name = name;
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Environment>> {
        self.environments.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_sockets(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OpenSocket>> {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enter a socket in the table of open sockets; it leaves when the guard drops.
    fn open(
        &self,
        environment: &str,
        role: Role,
        secret: CredentialSecret,
    ) -> (u64, Arc<Notify>, SocketGuard<'_>) {
        let id = self.next_socket.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        self.open_sockets().insert(
            id,
            OpenSocket {
                environment: environment.to_owned(),
                role,
                secret,
                close: close.clone(),
            },
        );
        (id, close, SocketGuard { router: self, id })
    }

    /// The bound of environments bound at once (`--max-environments`).
    pub fn max_environments(&self) -> usize {
        self.max_environments
    }

    /// Register (or re-register) an environment: the first registration binds the id to its
    /// key (unless `pinned` names one); later ones must present the same key. A registration
    /// with the pinned key displaces a binding to any other key.
    ///
    /// # Errors
    /// [`RegisterError`] when the key or name is unusable, the key differs from the bound one,
    /// or the table is full.
    pub fn register(
        &self,
        id: &str,
        registration: RegisterRequest,
        pinned: Option<&str>,
    ) -> Result<(), RegisterError> {
        validate_registration(id, &registration, pinned)?;
        let conflict = || RegisterError::KeyConflict { id: id.to_owned() };
        let mut table = self.table();
        match table.get_mut(id) {
            Some(entry) => {
                if entry.public_key != registration.public_key {
                    if pinned.is_none() {
                        return Err(conflict());
                    }
                    // The pin wins over a binding to another key.
                    drop(table);
                    self.displace(id, &registration.public_key);
                    table = self.table();
                }
                if let Some(entry) = table.get_mut(id) {
                    entry.name = registration.name;
                }
            }
            None => {
                if table.len() >= self.max_environments {
                    return Err(RegisterError::Full {
                        limit: self.max_environments,
                    });
                }
                table.insert(
                    id.to_owned(),
                    Environment {
                        name: registration.name,
                        public_key: registration.public_key,
                        executor: None,
                        streams: HashMap::new(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Bind `id` to `public_key` instead of the key it is bound to: its executor sockets close
    /// and its streams are reset at once.
    fn displace(&self, id: &str, public_key: &str) {
        let mut table = self.table();
        let Some(env) = table.get_mut(id) else {
            return;
        };
        if env.public_key == public_key {
            return;
        }
        tracing::warn!(
            environment = id,
            "an operator's pin displaces the binding to another key; closing its executor socket and streams"
        );
        env.public_key = public_key.to_owned();
        env.reset_all("the environment's key binding changed");
        drop(table);
        self.close_executors(id);
    }

    /// Close every executor socket of `id` (proven or still proving).
    fn close_executors(&self, id: &str) {
        for socket in self.open_sockets().values() {
            if socket.role == Role::Executor && socket.environment == id {
                socket.close.notify_one();
            }
        }
    }

    /// Release an environment's binding: forget it, close its executor socket and reset its
    /// streams. Returns whether it was registered.
    pub fn unbind(&self, id: &str) -> bool {
        let removed = self.table().remove(id);
        let Some(mut env) = removed else {
            return false;
        };
        env.reset_all("the environment's key binding was released");
        self.close_executors(id);
        true
    }

    /// Apply freshly loaded credentials to what is open: every pin displaces a binding to
    /// another key, and every socket whose credential no longer grants it (gone, another role,
    /// the environment no longer covered) is closed, the streams through it reset. Returns how
    /// many sockets were closed.
    pub fn enforce(&self, credentials: &Credentials) -> usize {
        for (id, key) in credentials.pins() {
            self.displace(id, key);
        }
        let revoked: Vec<(u64, String, Role, Arc<Notify>)> = self
            .open_sockets()
            .iter()
            .filter(|(_, socket)| {
                !credentials.grants(&socket.secret, socket.role, &socket.environment)
            })
            .map(|(id, socket)| {
                (
                    *id,
                    socket.environment.clone(),
                    socket.role,
                    socket.close.clone(),
                )
            })
            .collect();
        for (socket_id, environment, role, close) in &revoked {
            tracing::warn!(
                environment,
                socket = socket_id,
                role = role.name(),
                "credential revoked: closing its socket and resetting its streams"
            );
            let mut table = self.table();
            if let Some(env) = table.get_mut(environment) {
                match role {
                    Role::Executor => {
                        if env.executor.as_ref().is_some_and(|(id, _)| id == socket_id) {
                            env.reset_all("the executor's credential was revoked");
                        }
                    }
                    _ => {
                        let owned: Vec<String> = env
                            .streams
                            .iter()
                            .filter(|(_, route)| route.socket == *socket_id)
                            .map(|(id, _)| id.clone())
                            .collect();
                        let reason = "the harness's credential was revoked";
                        for stream_id in owned {
                            let Some(route) = env.streams.remove(&stream_id) else {
                                continue;
                            };
                            let frame = Frame::new(stream_id, reset_body(reason)).encode();
                            if let Some((_, executor)) = &env.executor {
                                let _ = executor.try_send_from(
                                    route.party,
                                    Bytes::from(append_source(&frame, *socket_id)),
                                );
                            }
                            let _ = route.queue.try_send(Bytes::from(frame));
                        }
                    }
                }
            }
            close.notify_one();
        }
        revoked.len()
    }

    /// Name and public key of an environment.
    pub fn lookup(&self, id: &str) -> Option<(String, String)> {
        self.table()
            .get(id)
            .map(|env| (env.name.clone(), env.public_key.clone()))
    }

    /// Route a harness frame through `environment`'s stream table to its executor socket (on
    /// the node that holds it): ownership, quotas, the per-socket limits.
    fn route_to_executor(
        &self,
        environment: &str,
        harness: &Harness<'_>,
        limiter: &mut NewStreamLimiter,
        route: proto::relay::frame::Route,
        frame: Bytes,
    ) {
        let mut table = self.table();
        let Some(env) = table.get_mut(environment) else {
            return;
        };
        let owner = env
            .streams
            .get(&route.stream_id)
            .map(|route| (route.socket, route.party));
        if owner.map(|(socket, _)| socket) != Some(harness.socket) {
            // Another party's stream is never taken over.
            if owner.is_some_and(|(_, party)| party != harness.party) {
                limiter.dropped += 1;
                return;
            }
            if owner.is_none() && env.streams.len() >= MAX_STREAMS_PER_ENVIRONMENT {
                return;
            }
            // Opening (or taking over) a stream: a handshake already paid; anything else pays.
            if !route.handshake && !limiter.allow(Instant::now()) {
                return;
            }
            let (by_socket, by_party) = env.streams.values().fold((0, 0), |(s, p), route| {
                (
                    s + usize::from(route.socket == harness.socket),
                    p + usize::from(route.party == harness.party),
                )
            });
            if by_socket >= MAX_STREAMS_PER_SOCKET
                || (owner.is_none() && by_party >= self.max_streams_per_credential)
            {
                limiter.dropped += 1;
                return;
            }
            env.streams.insert(
                route.stream_id,
                StreamRoute {
                    socket: harness.socket,
                    party: harness.party,
                    queue: harness.queue.clone(),
                },
            );
        }
        if let Some((_, executor)) = &env.executor
            && executor
                .try_send_charged(
                    harness.party,
                    Bytes::from(append_source(&frame, harness.socket)),
                    harness.account,
                    CREDENTIAL_QUEUE_BYTES,
                )
                .is_err()
        {
            tracing::debug!(environment, "executor socket queue full: frame dropped");
        }
    }
}

/// Send what is queued for a socket that is being closed (bounded: the queue's capacity).
async fn flush_queued<Si>(sink: &mut Si, outbox: &mut FrameReceiver)
where
    Si: futures_util::Sink<WsMessage> + Unpin,
{
    while let Some(frame) = outbox.try_next() {
        if sink.feed(WsMessage::binary(frame)).await.is_err() {
            return;
        }
    }
    let _ = sink.flush().await;
}

/// The harness socket a frame came from.
struct Harness<'a> {
    socket: u64,
    party: u64,
    queue: &'a Queue,
    /// Its credential's bound on this node ([`CREDENTIAL_QUEUE_BYTES`]): what it has queued
    /// towards its sockets and what it sent that waits in executors' queues, together.
    account: &'a QueuedBytes,
}
