//! The environment end of remote mode: register, hold one websocket to the rendezvous, serve one
//! JSON-RPC connection per relay stream, reconnect with backoff and resume.
//!
//! Ordering rules:
//! - Every (re)connection registers first (the registry may have restarted and forgotten us),
//!   then opens the websocket it was given; only then are streams told to resume.
//! - A new `stream_id` must open with a handshake; it is refused with a reset when
//!   [`MAX_RELAY_STREAMS`] streams exist or [`MAX_PENDING_HANDSHAKES`] are unconfirmed.
//!   More than [`MAX_HANDSHAKE_FAILURES_PER_SOCKET`] failed handshakes close the socket.
//! - Streams outlive sockets: they keep their state across a reconnect and end only by reset,
//!   liveness timeout, or the server's shutdown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use base64::Engine as _;
use futures_util::StreamExt;
use proto::relay::noise::StaticKeypair;
use proto::relay::{Body, Frame, SecureStream};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::driver::{AppOut, StreamChannels, connect_socket, run_stream, send_batch};
use super::registry::{self, RegisterRequest};
use super::{
    APP_QUEUE_MESSAGES, MAX_HANDSHAKE_FAILURES_PER_SOCKET, MAX_PENDING_HANDSHAKES,
    MAX_RELAY_STREAMS, RECENTLY_CLOSED_STREAMS, RECONNECT_BACKOFF_INITIAL, REGISTRY_TOKEN_ENV,
    SOCKET_OUTBOX_FRAMES, STREAM_INBOX_FRAMES, next_backoff,
};
use crate::rpc::connection::{Inbound, OutboundFrame, serve_transport};
use crate::server::ServerState;

/// Where and as what an environment registers.
#[derive(Clone)]
pub struct RemoteEnvironmentConfig {
    /// `http://HOST:PORT` of the registry.
    pub registry_url: String,
    /// The environment id harnesses connect to.
    pub environment_id: String,
    /// Display name.
    pub name: String,
    /// Bearer token for the registry and the rendezvous.
    pub bearer_token: String,
}

impl std::fmt::Debug for RemoteEnvironmentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEnvironmentConfig")
            .field("registry_url", &self.registry_url)
            .field("environment_id", &self.environment_id)
            .field("name", &self.name)
            .field("bearer_token", &"<redacted>")
            .finish()
    }
}

/// Why remote mode cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No token in the environment.
    #[error("remote mode needs the registry's bearer token in ${REGISTRY_TOKEN_ENV}")]
    MissingToken,
    /// Bad environment id.
    #[error("{0}")]
    EnvironmentId(String),
    /// The static key could not be generated.
    #[error(transparent)]
    Noise(#[from] proto::relay::noise::NoiseError),
    /// The local server could not start.
    #[error(transparent)]
    Server(#[from] crate::server::ExecServerError),
}

impl RemoteEnvironmentConfig {
    /// A config with an explicit token (for embedding and tests); the name defaults to the id.
    pub fn with_bearer_token(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        bearer_token: impl Into<String>,
    ) -> Self {
        let environment_id = environment_id.into();
        Self {
            registry_url: registry_url.into(),
            name: environment_id.clone(),
            environment_id,
            bearer_token: bearer_token.into(),
        }
    }

    /// A config whose token comes from `$EXECWARD_REGISTRY_TOKEN`.
    ///
    /// # Errors
    /// [`RemoteError::MissingToken`] when the variable is unset or blank.
    pub fn from_env(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        name: Option<String>,
    ) -> Result<Self, RemoteError> {
        let token = std::env::var(REGISTRY_TOKEN_ENV).unwrap_or_default();
        let token = token.trim();
        if token.is_empty() {
            return Err(RemoteError::MissingToken);
        }
        let mut config = Self::with_bearer_token(registry_url, environment_id, token);
        if let Some(name) = name {
            config.name = name;
        }
        Ok(config)
    }
}

struct StreamHandle {
    inbox: mpsc::Sender<Frame>,
    confirmed: Arc<AtomicBool>,
}

/// Everything the socket loop needs across reconnects.
struct Executor {
    config: RemoteEnvironmentConfig,
    keypair: StaticKeypair,
    server: Arc<ServerState>,
    streams: HashMap<String, StreamHandle>,
    recently_closed: VecDeque<String>,
    recently_closed_set: HashSet<String>,
    outbox: mpsc::Sender<Vec<u8>>,
    finished: mpsc::Sender<String>,
    reconnects: watch::Receiver<u64>,
}

/// Serve harness streams through the registry and rendezvous until the server shuts down.
///
/// Runs beside the local listener (see [`crate::server::BoundServer::state`]); connection
/// failures are logged and retried with backoff, never returned.
///
/// # Errors
/// [`RemoteError`] when the config is unusable or the key cannot be generated.
pub async fn run_remote_environment(
    config: RemoteEnvironmentConfig,
    server: Arc<ServerState>,
) -> Result<(), RemoteError> {
    registry::validate_environment_id(&config.environment_id)
        .map_err(RemoteError::EnvironmentId)?;
    let keypair = StaticKeypair::generate()?;
    let (outbox, mut outbox_rx) = mpsc::channel(SOCKET_OUTBOX_FRAMES);
    let (finished, mut finished_rx) = mpsc::channel(MAX_RELAY_STREAMS);
    let (reconnect_tx, reconnects) = watch::channel(0u64);
    let mut shutdown = server.shutdown.clone();
    let mut executor = Executor {
        config,
        keypair,
        server,
        streams: HashMap::new(),
        recently_closed: VecDeque::new(),
        recently_closed_set: HashSet::new(),
        outbox,
        finished,
        reconnects,
    };
    let mut backoff = RECONNECT_BACKOFF_INITIAL;
    let mut connected_before = false;
    loop {
        match executor.connect().await {
            Ok(socket) => {
                if connected_before {
                    reconnect_tx.send_modify(|generation| *generation += 1);
                }
                connected_before = true;
                tracing::info!(environment = %executor.config.environment_id, "connected to the rendezvous");
                executor
                    .serve_socket(socket, &mut outbox_rx, &mut finished_rx, &mut shutdown)
                    .await;
                tracing::warn!(environment = %executor.config.environment_id, "rendezvous socket lost; reconnecting");
                backoff = RECONNECT_BACKOFF_INITIAL;
            }
            Err(reason) => {
                tracing::warn!(%reason, retry_in = ?backoff, "cannot reach the registry or rendezvous");
            }
        }
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut shutdown) => break,
        }
        backoff = next_backoff(backoff);
    }
    Ok(())
}

/// Resolves once shutdown started (without holding the watch guard).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}

impl Executor {
    async fn connect(&self) -> Result<super::driver::RelaySocket, String> {
        let request = RegisterRequest {
            name: self.config.name.clone(),
            public_key: base64::engine::general_purpose::STANDARD.encode(self.keypair.public()),
        };
        let registered = registry::register(
            &self.config.registry_url,
            &self.config.environment_id,
            &request,
            &self.config.bearer_token,
        )
        .await
        .map_err(|e| e.to_string())?;
        connect_socket(&registered.rendezvous_url, &self.config.bearer_token)
            .await
            .map_err(|e| format!("rendezvous {}: {e}", registered.rendezvous_url))
    }

    async fn serve_socket(
        &mut self,
        socket: super::driver::RelaySocket,
        outbox_rx: &mut mpsc::Receiver<Vec<u8>>,
        finished_rx: &mut mpsc::Receiver<String>,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let (mut sink, mut incoming) = socket.split();
        let mut failures = 0u32;
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => {
                        if !self.route(&bytes, &mut failures) {
                            tracing::warn!(failures, "too many failed handshakes on this socket; closing it");
                            return;
                        }
                    }
                    Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => {}
                },
                frame = outbox_rx.recv() => {
                    let Some(frame) = frame else { return };
                    if send_batch(&mut sink, frame, outbox_rx).await.is_err() {
                        return;
                    }
                }
                id = finished_rx.recv() => {
                    if let Some(id) = id {
                        self.forget(id);
                    }
                }
                () = stopped(shutdown) => {
                    use futures_util::SinkExt;
                    let _ = sink.close().await;
                    return;
                }
            }
        }
    }

    fn forget(&mut self, id: String) {
        self.streams.remove(&id);
        if self.recently_closed.len() >= RECENTLY_CLOSED_STREAMS
            && let Some(oldest) = self.recently_closed.pop_front()
        {
            self.recently_closed_set.remove(&oldest);
        }
        self.recently_closed_set.insert(id.clone());
        self.recently_closed.push_back(id);
    }

    fn reply_reset(&self, stream_id: &str, reason: String) {
        let frame = Frame::new(stream_id, Body::Reset { reason });
        let _ = self.outbox.try_send(frame.into_encoded());
    }

    /// Route one frame; false when the socket must be closed.
    fn route(&mut self, bytes: &[u8], failures: &mut u32) -> bool {
        let frame = match Frame::decode(bytes) {
            Ok(frame) => frame,
            Err(error) => {
                tracing::debug!(%error, "dropping a malformed relay frame");
                return true;
            }
        };
        if let Some(handle) = self.streams.get(&frame.stream_id) {
            if handle.inbox.try_send(frame).is_err() {
                tracing::debug!("stream inbox full: frame dropped");
            }
            return true;
        }
        match &frame.body {
            Body::Handshake(_) => {}
            Body::Reset { .. } => return true,
            _ => {
                self.reply_reset(
                    &frame.stream_id,
                    "unknown stream: open it with a handshake".into(),
                );
                return true;
            }
        }
        if self.recently_closed_set.contains(&frame.stream_id) {
            self.reply_reset(&frame.stream_id, "stream already closed".into());
            return true;
        }
        if self.streams.len() >= MAX_RELAY_STREAMS {
            self.reply_reset(
                &frame.stream_id,
                format!("environment busy: MAX_RELAY_STREAMS ({MAX_RELAY_STREAMS}) streams open"),
            );
            return true;
        }
        let pending = self
            .streams
            .values()
            .filter(|handle| !handle.confirmed.load(Ordering::Relaxed))
            .count();
        if pending >= MAX_PENDING_HANDSHAKES {
            self.reply_reset(
                &frame.stream_id,
                format!("environment busy: MAX_PENDING_HANDSHAKES ({MAX_PENDING_HANDSHAKES}) handshakes pending"),
            );
            return true;
        }
        match SecureStream::accept(
            &self.keypair,
            &self.config.environment_id,
            &frame,
            Instant::now(),
        ) {
            Ok(stream) => {
                self.spawn_stream(stream);
                true
            }
            Err(error) => {
                *failures += 1;
                tracing::warn!(stream = %frame.stream_id, %error, "relay handshake failed");
                self.reply_reset(&frame.stream_id, format!("handshake failed: {error}"));
                *failures <= MAX_HANDSHAKE_FAILURES_PER_SOCKET
            }
        }
    }

    fn spawn_stream(&mut self, stream: SecureStream) {
        let id = stream.stream_id().to_owned();
        tracing::info!(stream = %id, "relay stream opened");
        let (inbox_tx, inbox) = mpsc::channel(STREAM_INBOX_FRAMES);
        let (to_app, app_rx) = mpsc::channel::<Vec<u8>>(APP_QUEUE_MESSAGES);
        let (app_tx, from_app) = mpsc::channel::<AppOut>(APP_QUEUE_MESSAGES);
        let confirmed = Arc::new(AtomicBool::new(false));
        self.streams.insert(
            id.clone(),
            StreamHandle {
                inbox: inbox_tx,
                confirmed: confirmed.clone(),
            },
        );
        let channels = StreamChannels {
            inbox,
            outbox: self.outbox.clone(),
            to_app,
            from_app,
            reconnects: self.reconnects.clone(),
            established: None,
            confirmed,
        };
        let finished = self.finished.clone();
        tokio::spawn(async move {
            let reason = run_stream(stream, channels).await;
            tracing::info!(stream = %id, %reason, "relay stream ended");
            let _ = finished.send(id).await;
        });
        let incoming = futures_util::stream::unfold(app_rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|message| (Inbound::Message(message), rx))
        });
        let outgoing = futures_util::sink::unfold(app_tx, |tx, frame: OutboundFrame| async move {
            let out = match frame {
                OutboundFrame::Text(text) => AppOut::Message(text.into_bytes()),
                OutboundFrame::Close(_, reason) => AppOut::Close(reason),
            };
            tx.send(out).await.map(|()| tx)
        });
        let server = self.server.clone();
        tokio::spawn(serve_transport(
            Box::pin(incoming),
            Box::pin(outgoing),
            server,
        ));
    }
}

/// `exec-server --remote`: bind the local listener as usual (its URL is still the first stdout
/// line), serve relay streams through the registry and rendezvous beside it, and stop on
/// SIGINT/SIGTERM, terminating every child.
///
/// # Errors
/// [`RemoteError`] when the server or remote mode cannot start.
pub async fn run_main_remote(
    options: crate::server::ServerOptions,
    config: RemoteEnvironmentConfig,
) -> Result<(), RemoteError> {
    registry::validate_environment_id(&config.environment_id)
        .map_err(RemoteError::EnvironmentId)?;
    let signals = |e| RemoteError::Server(crate::server::ExecServerError::Signals(e));
    let shutdown = crate::server::ShutdownSignals::install().map_err(signals)?;
    let server = crate::server::BoundServer::bind(options).await?;
    crate::server::announce_url(&server.url())
        .map_err(|e| RemoteError::Server(crate::server::ExecServerError::Stdout(e)))?;
    let remote = tokio::spawn(run_remote_environment(config, server.state()));
    server.serve_until(shutdown.recv()).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), remote).await;
    Ok(())
}
