//! In-memory routing state: registered environments (each bound to its executor's key), their
//! executor socket, and which harness socket owns each `stream_id`.
//!
//! Rules:
//! - The first registration of an environment id binds it to its public key (or the credentials
//!   file pins one); a registration with another key is refused while the binding stands. An
//!   operator releases it with [`Router::unbind`].
//! - A harness socket owns a stream from its first frame on it; a later harness socket sending
//!   on the same `stream_id` takes it over (that is how a reconnected harness resumes).
//! - Frames from a harness go to the environment's current executor socket, tagged with the
//!   harness socket's id as `source` ([`append_source`]); frames from the executor go to the
//!   socket owning their stream. No route, or a full queue: dropped.
//! - One harness socket cannot crowd others out: it sends at most
//!   [`NEW_STREAMS_PER_SOCKET_BURST`] handshakes or new streams at once and
//!   [`NEW_STREAMS_PER_SOCKET_PER_SECOND`] after that (a harness sends message 1 a few times per
//!   stream), and owns at most [`MAX_STREAMS_PER_SOCKET`]; frames beyond are dropped here,
//!   so a flood never reaches (or costs) the executor, and the executor's one socket is never
//!   closed over one party's frames.
//! - Only the envelope is decoded (for `stream_id`); payloads are never inspected.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures_util::StreamExt;
use proto::relay::frame::{append_source, route, route_stream_id};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Bytes, Message as WsMessage};

use crate::relay::driver::send_batch;
use crate::relay::registry::{RegisterRequest, decode_public_key};

/// Environments registered at once.
pub const MAX_ENVIRONMENTS: usize = 1024;
/// Streams routed per environment; frames opening more are dropped.
pub const MAX_STREAMS_PER_ENVIRONMENT: usize = 4096;
/// Streams one harness socket may own (a harness opens one socket per stream; 64 is far more
/// than a well-behaved one needs, and 4096 / 64 sockets are needed to fill an environment).
pub const MAX_STREAMS_PER_SOCKET: usize = 64;
/// Handshake frames (or new streams) a harness socket may send at once (token bucket size).
pub const NEW_STREAMS_PER_SOCKET_BURST: f64 = 16.0;
/// Handshake frames (or new streams) a harness socket may send per second once its burst is
/// spent. Each costs the executor a Noise operation (four X25519 for a new stream) or an
/// answer; a flood of them is dropped here.
pub const NEW_STREAMS_PER_SOCKET_PER_SECOND: f64 = 8.0;
/// Frames queued for one socket; more are dropped (the endpoints retransmit).
pub const SOCKET_QUEUE_FRAMES: usize = 4096;
/// Longest display name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The body's public key is unusable.
    #[error(transparent)]
    PublicKey(#[from] crate::relay::registry::PublicKeyError),
    /// The body's display name is longer than [`MAX_NAME_BYTES`].
    #[error("name must be at most {limit} bytes (got {length})")]
    NameTooLong {
        /// Its length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// The id is bound to another key.
    #[error(
        "environment {id:?} is bound to another public key; an operator must release the binding (DELETE /v1/environments/{id} with an admin credential) before a new key can register"
    )]
    KeyConflict {
        /// The environment.
        id: String,
    },
    /// The table is full.
    #[error("registry full: MAX_ENVIRONMENTS ({MAX_ENVIRONMENTS})")]
    Full,
}

/// Frames are `Bytes` as the websocket delivered them: routed without a copy.
type Queue = mpsc::Sender<Bytes>;

struct Environment {
    name: String,
    public_key: String,
    executor: Option<(u64, Queue)>,
    /// stream id -> (harness socket id, its queue)
    streams: HashMap<String, (u64, Queue)>,
}

/// The routing table.
#[derive(Default)]
pub struct Router {
    environments: Mutex<HashMap<String, Environment>>,
    next_socket: AtomicU64,
}

impl Router {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Environment>> {
        self.environments.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register (or re-register) an environment: the first registration binds the id to its
    /// key (unless `pinned` names one); later ones must present the same key.
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
        decode_public_key(&registration.public_key)?;
        if registration.name.len() > MAX_NAME_BYTES {
            return Err(RegisterError::NameTooLong {
                length: registration.name.len(),
                limit: MAX_NAME_BYTES,
            });
        }
        let conflict = || RegisterError::KeyConflict { id: id.to_owned() };
        if pinned.is_some_and(|key| key != registration.public_key) {
            return Err(conflict());
        }
        let mut table = self.table();
        match table.get_mut(id) {
            Some(entry) => {
                if entry.public_key != registration.public_key {
                    return Err(conflict());
                }
                entry.name = registration.name;
            }
            None => {
                if table.len() >= MAX_ENVIRONMENTS {
                    return Err(RegisterError::Full);
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

    /// Release an environment's binding: forget it, close its executor socket and its streams.
    /// Returns whether it was registered.
    pub fn unbind(&self, id: &str) -> bool {
        self.table().remove(id).is_some()
    }

    /// Name and public key of an environment.
    pub fn lookup(&self, id: &str) -> Option<(String, String)> {
        self.table()
            .get(id)
            .map(|env| (env.name.clone(), env.public_key.clone()))
    }

    /// Serve an executor socket until it closes (it replaces any previous one).
    pub async fn serve_executor<S>(&self, environment: &str, socket: WebSocketStream<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let socket_id = self.next_socket.fetch_add(1, Ordering::Relaxed);
        let (queue, mut outbox) = mpsc::channel(SOCKET_QUEUE_FRAMES);
        if let Some(env) = self.table().get_mut(environment) {
            env.executor = Some((socket_id, queue));
        }
        tracing::info!(environment, "executor socket open");
        let (mut sink, mut incoming) = socket.split();
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => self.route_from_executor(environment, bytes),
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                frame = outbox.recv() => {
                    let Some(frame) = frame else { break };
                    if send_batch(&mut sink, frame, &mut outbox).await.is_err() {
                        break;
                    }
                }
            }
        }
        if let Some(env) = self.table().get_mut(environment)
            && env
                .executor
                .as_ref()
                .is_some_and(|(id, _)| *id == socket_id)
        {
            env.executor = None;
        }
        tracing::info!(environment, "executor socket closed");
    }

    /// Serve a harness socket until it closes.
    pub async fn serve_harness<S>(&self, environment: &str, socket: WebSocketStream<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let socket_id = self.next_socket.fetch_add(1, Ordering::Relaxed);
        let (queue, mut outbox) = mpsc::channel(SOCKET_QUEUE_FRAMES);
        let mut limiter = NewStreamLimiter::new(Instant::now());
        let (mut sink, mut incoming) = socket.split();
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => {
                        self.route_from_harness(environment, socket_id, &queue, &mut limiter, bytes);
                    }
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                },
                frame = outbox.recv() => {
                    let Some(frame) = frame else { break };
                    if send_batch(&mut sink, frame, &mut outbox).await.is_err() {
                        break;
                    }
                }
            }
        }
        if limiter.dropped > 0 {
            tracing::info!(
                environment,
                socket = socket_id,
                dropped = limiter.dropped,
                "harness socket closed; frames opening streams over its limits were dropped"
            );
        }
        if let Some(env) = self.table().get_mut(environment) {
            env.streams.retain(|_, (owner, _)| *owner != socket_id);
        }
    }

    fn route_from_harness(
        &self,
        environment: &str,
        socket_id: u64,
        queue: &Queue,
        limiter: &mut NewStreamLimiter,
        frame: Bytes,
    ) {
        let Ok(route) = route(&frame) else {
            return;
        };
        // A handshake costs the executor a Noise operation: limited before the table is
        // even locked, so a flood of them costs one envelope decode each.
        if route.handshake && !limiter.allow(Instant::now()) {
            return;
        }
        let mut table = self.table();
        let Some(env) = table.get_mut(environment) else {
            return;
        };
        let owned = env
            .streams
            .get(&route.stream_id)
            .is_some_and(|(owner, _)| *owner == socket_id);
        if !owned {
            let known = env.streams.contains_key(&route.stream_id);
            if !known && env.streams.len() >= MAX_STREAMS_PER_ENVIRONMENT {
                return;
            }
            // Opening (or taking over) a stream: a handshake already paid; anything else pays.
            if !route.handshake && !limiter.allow(Instant::now()) {
                return;
            }
            if owned_by(env, socket_id) >= MAX_STREAMS_PER_SOCKET {
                limiter.dropped += 1;
                return;
            }
            env.streams
                .insert(route.stream_id, (socket_id, queue.clone()));
        }
        if let Some((_, executor)) = &env.executor
            && executor
                .try_send(Bytes::from(append_source(&frame, socket_id)))
                .is_err()
        {
            tracing::debug!(environment, "executor socket queue full: frame dropped");
        }
    }

    fn route_from_executor(&self, environment: &str, frame: Bytes) {
        let Ok(stream_id) = route_stream_id(&frame) else {
            return;
        };
        let table = self.table();
        if let Some((_, harness)) = table
            .get(environment)
            .and_then(|env| env.streams.get(&stream_id))
            && harness.try_send(frame).is_err()
        {
            tracing::debug!(environment, "harness socket queue full: frame dropped");
        }
    }
}

/// Per harness socket: a token bucket for opening streams, and the cap on streams owned.
struct NewStreamLimiter {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
}

impl NewStreamLimiter {
    fn new(now: Instant) -> Self {
        Self {
            tokens: NEW_STREAMS_PER_SOCKET_BURST,
            refilled: now,
            dropped: 0,
        }
    }

    /// May this socket send one more handshake, or open one more stream, now?
    fn allow(&mut self, now: Instant) -> bool {
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

fn owned_by(env: &Environment, socket_id: u64) -> usize {
    env.streams
        .values()
        .filter(|(owner, _)| *owner == socket_id)
        .count()
}
