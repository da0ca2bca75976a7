//! The environment end of remote mode: register, hold one websocket to the rendezvous, serve one
//! JSON-RPC connection per relay stream, reconnect with backoff and resume.
//!
//! Ordering rules:
//! - Every (re)connection registers first (the registry may have restarted and forgotten us),
//!   then opens the websocket it was given and answers the rendezvous's challenge with its static
//!   key ([`proto::relay::proof`]); only once the rendezvous accepted the proof are streams told
//!   to resume.
//! - The static key is the persistent identity (`relay::identity`), so the registry's binding
//!   of the environment id to it survives restarts; a registry that refuses it (409: bound to
//!   another key) is reported at error level on every retry.
//! - A new `stream_id` must open with a handshake. Accounting is per harness socket (the
//!   rendezvous tags every frame with its `source`): [`HANDSHAKES_PER_SOURCE_PER_SECOND`](super::HANDSHAKES_PER_SOURCE_PER_SECOND)
//!   attempts, [`MAX_PENDING_HANDSHAKES_PER_SOURCE`](super::MAX_PENDING_HANDSHAKES_PER_SOURCE) pending and [`MAX_STREAMS_PER_SOURCE`] open
//!   per source; [`MAX_RELAY_STREAMS`] open and [`MAX_PENDING_HANDSHAKES`](super::MAX_PENDING_HANDSHAKES) pending in all, the
//!   oldest pending handshake of the busiest source giving way to a newcomer. A stream not
//!   confirmed within [`UNCONFIRMED_STREAM_TIMEOUT`] is dropped. Failed handshakes are answered
//!   with a reset and never close the shared socket.
//! - Memory a harness makes the executor hold before a message is whole (segments out of order,
//!   messages in reassembly) is charged to one [`ReceiveBudget`] of
//!   [`RELAY_RECEIVE_BUDGET_BYTES`] across every stream, beyond each stream's own
//!   [`RELAY_STREAM_RECEIVE_ALLOWANCE`]; a stream that completes no message
//!   for [`proto::relay::limits::REASSEMBLY_DEADLINE`] while holding an unfinished one is reset.
//! - Streams outlive sockets: they keep their state across a reconnect and end only by reset,
//!   liveness timeout, or the server's shutdown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use base64::Engine as _;
use futures_util::StreamExt;
use proto::relay::limits::{
    PROOF_TIMEOUT, RELAY_RECEIVE_BUDGET_BYTES, RELAY_STREAM_RECEIVE_ALLOWANCE,
    UNCONFIRMED_STREAM_TIMEOUT,
};
use proto::relay::noise::StaticKeypair;
use proto::relay::proof;
use proto::relay::{Body, Frame, ReceiveBudget, SecureStream};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::driver::{AppOut, StreamChannels, connect_socket, run_stream, send_batch};
use super::registry::{self, RegisterRequest, RegistryClient, RegistryError};
use super::{
    APP_QUEUE_MESSAGES, HANDSHAKES_PER_SOURCE_BURST, MAX_RELAY_STREAMS, MAX_STREAMS_PER_SOURCE,
    RECENTLY_CLOSED_STREAMS, RECONNECT_BACKOFF_INITIAL, SOCKET_OUTBOX_FRAMES, STREAM_INBOX_FRAMES,
    UNCONFIRMED_SWEEP_INTERVAL, next_backoff,
};
use crate::rpc::connection::{Inbound, OutboundFrame, serve_transport};
use crate::state::ServerState;

mod admission;
mod config;

use admission::SourceBudget;
pub use config::{RemoteEnvironmentConfig, RemoteError};

struct StreamHandle {
    inbox: mpsc::Sender<Frame>,
    confirmed: Arc<AtomicBool>,
    /// The harness socket that opened it.
    source: u64,
    opened: Instant,
}

/// Everything the socket loop needs across reconnects.
struct Executor {
    config: RemoteEnvironmentConfig,
    registry: RegistryClient,
    tls: Arc<rustls::ClientConfig>,
    keypair: StaticKeypair,
    server: Arc<ServerState>,
    streams: HashMap<String, StreamHandle>,
    budgets: HashMap<u64, SourceBudget>,
    recently_closed: VecDeque<String>,
    recently_closed_set: HashSet<String>,
    outbox: mpsc::Sender<Vec<u8>>,
    finished: mpsc::Sender<String>,
    reconnects: watch::Receiver<u64>,
    /// What every stream holds out of order or in reassembly, together
    /// ([`RELAY_RECEIVE_BUDGET_BYTES`]).
    receive_budget: ReceiveBudget,
}

/// A remote environment checked and ready to serve: key loaded, registry client built.
pub struct PreparedEnvironment {
    config: RemoteEnvironmentConfig,
    registry: RegistryClient,
    tls: Arc<rustls::ClientConfig>,
    keypair: StaticKeypair,
}

impl PreparedEnvironment {
    /// Check the config (environment id, registry URL, TLS files) and load or create the key,
    /// so that a mistake fails at start-up, before anything is served.
    ///
    /// # Errors
    /// [`RemoteError`] naming what is unusable.
    pub fn new(config: RemoteEnvironmentConfig) -> Result<Self, RemoteError> {
        registry::validate_environment_id(&config.environment_id)?;
        let tls = super::tls::client_config_for(&config.registry_url, config.ca_file.as_deref())
            .map_err(RegistryError::from)?;
        let registry = RegistryClient::new(&config.registry_url, &tls)?;
        let keypair = config.keypair()?;
        Ok(Self {
            config,
            registry,
            tls,
            keypair,
        })
    }
}

/// Serve harness streams through the registry and rendezvous until the server shuts down.
///
/// Runs beside the local listener (see [`crate::server::BoundServer::state`]); connection
/// failures are logged and retried with backoff, never returned.
///
/// # Errors
/// [`RemoteError`] when the config is unusable or the key cannot be loaded or generated.
pub async fn run_remote_environment(
    config: RemoteEnvironmentConfig,
    server: Arc<ServerState>,
) -> Result<(), RemoteError> {
    serve_prepared(PreparedEnvironment::new(config)?, server).await;
    Ok(())
}

/// [`run_remote_environment`] for a config already checked.
pub async fn serve_prepared(prepared: PreparedEnvironment, server: Arc<ServerState>) {
    let PreparedEnvironment {
        config,
        registry,
        tls,
        keypair,
    } = prepared;
    let (outbox, mut outbox_rx) = mpsc::channel(SOCKET_OUTBOX_FRAMES);
    let (finished, mut finished_rx) = mpsc::channel(MAX_RELAY_STREAMS);
    let (reconnect_tx, reconnects) = watch::channel(0u64);
    let mut shutdown = server.shutdown.clone();
    let mut executor = Executor {
        config,
        registry,
        tls,
        keypair,
        server,
        streams: HashMap::new(),
        budgets: HashMap::new(),
        recently_closed: VecDeque::new(),
        recently_closed_set: HashSet::new(),
        outbox,
        finished,
        reconnects,
        receive_budget: ReceiveBudget::new(
            RELAY_RECEIVE_BUDGET_BYTES,
            RELAY_STREAM_RECEIVE_ALLOWANCE,
        ),
    };
    let mut backoff = RECONNECT_BACKOFF_INITIAL;
    let mut connected_before = false;
    loop {
        match executor.connect().await {
            Ok((socket, first)) => {
                if connected_before {
                    reconnect_tx.send_modify(|generation| *generation += 1);
                }
                connected_before = true;
                tracing::info!(environment = %executor.config.environment_id, "connected to the rendezvous");
                if let Some(frame) = first {
                    executor.route_frame(frame);
                }
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
}

/// Why one attempt to register and open the rendezvous socket failed (the executor retries).
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    /// Registering with the registry failed.
    #[error(transparent)]
    Register(RegistryError),
    /// Opening the rendezvous websocket failed.
    #[error("rendezvous {url}: {source}")]
    Socket {
        /// The rendezvous URL the registry gave.
        url: String,
        /// Why.
        #[source]
        source: super::driver::SocketError,
    },
    /// The rendezvous did not accept the socket's proof of the key (or it went wrong).
    #[error("proving the environment's key to the rendezvous: {0}")]
    Proof(String),
}

/// The next relay frame of `socket` (malformed ones and other messages skipped); `None` at its
/// end.
async fn incoming_frame(
    socket: &mut super::driver::RelaySocket,
) -> Result<Option<Frame>, ConnectError> {
    loop {
        match socket.next().await {
            Some(Ok(WsMessage::Binary(bytes))) => {
                if let Ok(frame) = Frame::decode(&bytes) {
                    return Ok(Some(frame));
                }
            }
            Some(Ok(WsMessage::Close(_))) | None => return Ok(None),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(ConnectError::Proof(error.to_string())),
        }
    }
}

/// Resolves once shutdown started (without holding the watch guard).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}

impl Executor {
    /// Register, open the socket and prove the key; returns the socket and the first relay
    /// frame, when one arrived during the proof.
    async fn connect(&self) -> Result<(super::driver::RelaySocket, Option<Frame>), ConnectError> {
        let request = RegisterRequest {
            name: self.config.name.clone(),
            public_key: base64::engine::general_purpose::STANDARD.encode(self.keypair.public()),
        };
        let registered = self
            .registry
            .register(
                &self.config.environment_id,
                &request,
                &self.config.bearer_token,
            )
            .await
            .map_err(|e| {
                if let RegistryError::Status { status, .. } = &e
                    && matches!(status, 401 | 403 | 409)
                {
                    tracing::error!(error = %e, "the registry refuses this executor; an operator must fix the credential or the key binding");
                }
                ConnectError::Register(e)
            })?;
        tracing::info!(environment = %self.config.environment_id, "registered");
        let mut socket = connect_socket(
            &registered.rendezvous_url,
            &self.config.bearer_token,
            &self.tls,
        )
        .await
        .map_err(|source| ConnectError::Socket {
            url: registered.rendezvous_url.clone(),
            source,
        })?;
        let first = self.prove_key(&mut socket).await?;
        Ok((socket, first))
    }

    /// Answer the rendezvous's key-possession challenge on a socket just opened (every copy
    /// of it: an answer may be lost), and wait until it accepts. Before that it routes nothing
    /// to the socket; a relay frame arriving means it accepted (its acceptance was lost), and
    /// is returned to be routed.
    async fn prove_key(
        &self,
        socket: &mut super::driver::RelaySocket,
    ) -> Result<Option<Frame>, ConnectError> {
        use futures_util::SinkExt;
        let environment = &self.config.environment_id;
        let exchange = async {
            while let Some(message) = incoming_frame(socket).await? {
                if !proof::is_proof_stream(&message.stream_id) {
                    return Ok(Some(message));
                }
                let Some(answer) = proof::answer(&self.keypair, environment, &message) else {
                    match message.body {
                        Body::Ack => return Ok(None),
                        Body::Reset { reason } => return Err(ConnectError::Proof(reason)),
                        _ => continue,
                    }
                };
                let answer = answer.map_err(|e| ConnectError::Proof(e.to_string()))?;
                socket
                    .send(WsMessage::binary(answer.into_encoded()))
                    .await
                    .map_err(|e| ConnectError::Proof(e.to_string()))?;
            }
            Err(ConnectError::Proof(
                "the rendezvous closed the socket".into(),
            ))
        };
        tokio::time::timeout(PROOF_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(ConnectError::Proof(format!(
                    "no key challenge or acceptance within {PROOF_TIMEOUT:?}"
                )))
            })
    }

    async fn serve_socket(
        &mut self,
        socket: super::driver::RelaySocket,
        outbox_rx: &mut mpsc::Receiver<Vec<u8>>,
        finished_rx: &mut mpsc::Receiver<String>,
        shutdown: &mut watch::Receiver<bool>,
    ) {
        let (mut sink, mut incoming) = socket.split();
        let mut sweep = tokio::time::interval(UNCONFIRMED_SWEEP_INTERVAL);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = incoming.next() => match message {
                    Some(Ok(WsMessage::Binary(bytes))) => self.route(&bytes),
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
                _ = sweep.tick() => self.expire_unconfirmed(Instant::now()),
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
        let sources: HashSet<u64> = self.streams.values().map(|s| s.source).collect();
        self.budgets.retain(|source, budget| {
            sources.contains(source) || budget.tokens < HANDSHAKES_PER_SOURCE_BURST
        });
    }

    fn reply_reset(&self, stream_id: &str, reason: String) {
        let frame = Frame::new(stream_id, Body::Reset { reason });
        let _ = self.outbox.try_send(frame.into_encoded());
    }

    /// Drop a stream from this side: tell the harness, forget it (its task ends when its inbox
    /// closes).
    fn drop_stream(&mut self, id: &str, reason: String) {
        tracing::debug!(stream = %id, %reason, "relay stream dropped");
        self.reply_reset(id, reason);
        self.forget(id.to_owned());
    }

    /// Drop streams whose harness never proved it holds the keys.
    fn expire_unconfirmed(&mut self, now: Instant) {
        let stale: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| {
                !s.confirmed.load(Ordering::Relaxed)
                    && now.saturating_duration_since(s.opened) >= UNCONFIRMED_STREAM_TIMEOUT
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.drop_stream(
                &id,
                format!(
                    "handshake not confirmed within UNCONFIRMED_STREAM_TIMEOUT ({UNCONFIRMED_STREAM_TIMEOUT:?})"
                ),
            );
        }
    }

    /// Route one frame from the rendezvous.
    fn route(&mut self, bytes: &[u8]) {
        match Frame::decode(bytes) {
            Ok(frame) => self.route_frame(frame),
            Err(error) => tracing::debug!(%error, "dropping a malformed relay frame"),
        }
    }

    /// Route one decoded frame.
    fn route_frame(&mut self, frame: Frame) {
        if proof::is_proof_stream(&frame.stream_id) {
            // A late copy of the key challenge or its acceptance: answered only on a socket
            // just opened (`prove_key`), never a stream.
            return;
        }
        if let Some(handle) = self.streams.get(&frame.stream_id) {
            if handle.inbox.try_send(frame).is_err() {
                tracing::debug!("stream inbox full: frame dropped");
            }
            return;
        }
        match &frame.body {
            Body::Handshake(_) => {}
            Body::Reset { .. } => return,
            _ => {
                self.reply_reset(
                    &frame.stream_id,
                    "unknown stream: open it with a handshake".into(),
                );
                return;
            }
        }
        let now = Instant::now();
        if !self.spend_handshake(frame.source, now) {
            return;
        }
        if self.recently_closed_set.contains(&frame.stream_id) {
            self.reply_reset(&frame.stream_id, "stream already closed".into());
            return;
        }
        let from_source = self
            .streams
            .values()
            .filter(|s| s.source == frame.source)
            .count();
        if from_source >= MAX_STREAMS_PER_SOURCE {
            self.reply_reset(
                &frame.stream_id,
                format!("too many streams on this connection: MAX_STREAMS_PER_SOURCE ({MAX_STREAMS_PER_SOURCE})"),
            );
            return;
        }
        if self.streams.len() >= MAX_RELAY_STREAMS {
            self.reply_reset(
                &frame.stream_id,
                format!("environment busy: MAX_RELAY_STREAMS ({MAX_RELAY_STREAMS}) streams open"),
            );
            return;
        }
        if let Err(refused) = self.admit_pending(frame.source) {
            self.reply_reset(&frame.stream_id, refused.to_string());
            return;
        }
        match SecureStream::accept_with(
            &self.keypair,
            &self.config.environment_id,
            &frame,
            self.config.ciphers,
            Instant::now(),
        ) {
            Ok(mut stream) => {
                stream.set_receive_budget(self.receive_budget.clone());
                self.spawn_stream(stream, frame.source, now);
            }
            Err(error) => {
                tracing::debug!(stream = %frame.stream_id, source = frame.source, %error, "relay handshake failed");
                self.reply_reset(&frame.stream_id, format!("handshake failed: {error}"));
            }
        }
    }

    fn spawn_stream(&mut self, stream: SecureStream, source: u64, opened: Instant) {
        let id = stream.stream_id().to_owned();
        tracing::debug!(stream = %id, "relay stream opened");
        let (inbox_tx, inbox) = mpsc::channel(STREAM_INBOX_FRAMES);
        let (to_app, app_rx) = mpsc::channel::<Vec<u8>>(APP_QUEUE_MESSAGES);
        let (app_tx, from_app) = mpsc::channel::<AppOut>(APP_QUEUE_MESSAGES);
        let confirmed = Arc::new(AtomicBool::new(false));
        self.streams.insert(
            id.clone(),
            StreamHandle {
                inbox: inbox_tx,
                confirmed: confirmed.clone(),
                source,
                opened,
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
                .map(|message| (Inbound::Message(message.into()), rx))
        });
        let outgoing = futures_util::sink::unfold(app_tx, |tx, frame: OutboundFrame| async move {
            let out = match frame {
                OutboundFrame::Text(text) => AppOut::Message(text.into_bytes()),
                // A binary `process/output` frame (granted at `initialize`): the same bytes as
                // the relay message, no JSON and no base64; its first byte (0x01) is one no JSON
                // text begins with, so the harness tells the two apart.
                OutboundFrame::Binary(bytes) => AppOut::Message(Vec::from(bytes)),
                OutboundFrame::Close(_, reason) => AppOut::Close(reason),
            };
            tx.send(out).await.map(|()| tx)
        });
        let server = self.server.clone();
        tokio::spawn(serve_transport(
            Box::pin(incoming),
            Box::pin(outgoing),
            server,
            crate::transport::identity::ClientIdentity::Relay(source),
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
    let prepared = PreparedEnvironment::new(config)?;
    let signals = |e| RemoteError::Server(crate::server::ExecServerError::Signals(e));
    let shutdown = crate::server::ShutdownSignals::install().map_err(signals)?;
    let server = crate::server::BoundServer::bind(options).await?;
    server
        .announce()
        .map_err(|e| RemoteError::Server(crate::server::ExecServerError::Stdout(e)))?;
    let remote = tokio::spawn(serve_prepared(prepared, server.state()));
    server.serve_until(shutdown.recv()).await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), remote).await;
    Ok(())
}
