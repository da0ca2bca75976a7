//! In-memory routing state: registered environments, their executor socket, and which harness
//! socket owns each `stream_id`.
//!
//! Rules:
//! - A harness socket owns a stream from its first frame on it; a later harness socket sending
//!   on the same `stream_id` takes it over (that is how a reconnected harness resumes).
//! - Frames from a harness go to the environment's current executor socket; frames from the
//!   executor go to the socket owning their stream. No route, or a full queue: dropped.
//! - Only the envelope is decoded (for `stream_id`); payloads are never inspected.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use futures_util::StreamExt;
use proto::relay::frame::route_stream_id;
use proto::relay::noise::PUBLIC_KEY_BYTES;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Bytes, Message as WsMessage};

use crate::relay::driver::send_batch;
use crate::relay::registry::RegisterRequest;

/// Environments registered at once.
pub const MAX_ENVIRONMENTS: usize = 1024;
/// Streams routed per environment; frames opening more are dropped.
pub const MAX_STREAMS_PER_ENVIRONMENT: usize = 4096;
/// Frames queued for one socket; more are dropped (the endpoints retransmit).
pub const SOCKET_QUEUE_FRAMES: usize = 4096;
/// Longest display name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

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

    /// Register (or re-register) an environment.
    ///
    /// # Errors
    /// A message when the key or name is unusable or the table is full.
    pub fn register(&self, id: &str, registration: RegisterRequest) -> Result<(), String> {
        let key = base64::engine::general_purpose::STANDARD
            .decode(&registration.public_key)
            .map_err(|e| format!("publicKey must be base64: {e}"))?;
        if key.len() != PUBLIC_KEY_BYTES {
            return Err(format!(
                "publicKey must be {PUBLIC_KEY_BYTES} bytes (got {})",
                key.len()
            ));
        }
        if registration.name.len() > MAX_NAME_BYTES {
            return Err(format!("name must be at most {MAX_NAME_BYTES} bytes"));
        }
        let mut table = self.table();
        if !table.contains_key(id) && table.len() >= MAX_ENVIRONMENTS {
            return Err(format!(
                "registry full: MAX_ENVIRONMENTS ({MAX_ENVIRONMENTS})"
            ));
        }
        let entry = table.entry(id.to_owned()).or_insert_with(|| Environment {
            name: String::new(),
            public_key: String::new(),
            executor: None,
            streams: HashMap::new(),
        });
        entry.name = registration.name;
        entry.public_key = registration.public_key;
        Ok(())
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
        let (mut sink, mut incoming) = socket.split();
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => {
                        self.route_from_harness(environment, socket_id, &queue, bytes);
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
        if let Some(env) = self.table().get_mut(environment) {
            env.streams.retain(|_, (owner, _)| *owner != socket_id);
        }
    }

    fn route_from_harness(&self, environment: &str, socket_id: u64, queue: &Queue, frame: Bytes) {
        let Ok(stream_id) = route_stream_id(&frame) else {
            return;
        };
        let mut table = self.table();
        let Some(env) = table.get_mut(environment) else {
            return;
        };
        let owned = env
            .streams
            .get(&stream_id)
            .is_some_and(|(owner, _)| *owner == socket_id);
        if !owned {
            if !env.streams.contains_key(&stream_id)
                && env.streams.len() >= MAX_STREAMS_PER_ENVIRONMENT
            {
                return;
            }
            env.streams.insert(stream_id, (socket_id, queue.clone()));
        }
        if let Some((_, executor)) = &env.executor
            && executor.try_send(frame).is_err()
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
