//! The harness end of one relay stream: a JSON-RPC message channel to a remote environment,
//! through the registry and the rendezvous, that survives rendezvous reconnects.
//!
//! [`RelayHarnessConnection::connect`] asks the registry for the rendezvous URL and the
//! environment's public key, picks a UUIDv4 `stream_id`, opens the websocket and finishes the
//! Noise handshake before returning. Afterwards a socket task reconnects with backoff whenever
//! the socket drops and the stream resumes; the caller sees one uninterrupted message stream.
//! A JSON-RPC client (`ExecServerClient`) can use [`RelayHarnessConnection::send`] and
//! [`RelayHarnessConnection::recv`] as its transport.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use futures_util::StreamExt;
use proto::relay::limits::HANDSHAKE_TIMEOUT;
use proto::relay::{Frame, SecureStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::driver::{AppOut, RelaySocket, StreamChannels, connect_socket, run_stream, send_batch};
use super::registry::{self, RegistryError};
use super::{
    APP_QUEUE_MESSAGES, RECONNECT_BACKOFF_INITIAL, SOCKET_OUTBOX_FRAMES, STREAM_INBOX_FRAMES,
    next_backoff,
};

/// Longest wait in [`RelayHarnessConnection::close`] for the socket to send the final reset.
pub const SOCKET_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where to connect.
#[derive(Clone)]
pub struct RemoteConnectArgs {
    /// `http://HOST:PORT` of the registry.
    pub registry_url: String,
    /// The environment.
    pub environment_id: String,
    /// Bearer token for the registry and the rendezvous.
    pub bearer_token: String,
}

impl std::fmt::Debug for RemoteConnectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConnectArgs")
            .field("registry_url", &self.registry_url)
            .field("environment_id", &self.environment_id)
            .field("bearer_token", &"<redacted>")
            .finish()
    }
}

/// Why a remote connection failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The registry call failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The environment's key is unusable.
    #[error(transparent)]
    Noise(#[from] proto::relay::noise::NoiseError),
    /// The rendezvous websocket could not be opened.
    #[error("rendezvous {url}: {source}")]
    Socket {
        /// The URL.
        url: String,
        /// The error.
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// The handshake failed or the stream was reset before it finished.
    #[error("relay stream {stream_id} could not be opened: {reason}")]
    Handshake {
        /// The stream.
        stream_id: String,
        /// Why.
        reason: String,
    },
    /// The stream is closed.
    #[error("relay stream closed")]
    Closed,
}

/// One JSON-RPC session with a remote environment; see the module docs.
pub struct RelayHarnessConnection {
    stream_id: String,
    to_stream: mpsc::Sender<AppOut>,
    from_stream: mpsc::Receiver<Vec<u8>>,
    socket_task: JoinHandle<()>,
    stream_task: JoinHandle<String>,
}

impl Drop for RelayHarnessConnection {
    fn drop(&mut self) {
        self.socket_task.abort();
        self.stream_task.abort();
    }
}

impl RelayHarnessConnection {
    /// Look the environment up, open the socket and the stream, finish the handshake.
    ///
    /// # Errors
    /// [`HarnessError`] naming the step that failed.
    pub async fn connect(args: &RemoteConnectArgs) -> Result<Self, HarnessError> {
        let info =
            registry::connect(&args.registry_url, &args.environment_id, &args.bearer_token).await?;
        let public_key = info.public_key_bytes()?;
        let stream_id = uuid::Uuid::new_v4().to_string();
        let stream = SecureStream::initiate(
            &args.environment_id,
            &stream_id,
            &public_key,
            Instant::now(),
        )?;
        let socket = connect_socket(&info.rendezvous_url, &args.bearer_token)
            .await
            .map_err(|source| HarnessError::Socket {
                url: info.rendezvous_url.clone(),
                source: Box::new(source),
            })?;
        let (inbox_tx, inbox) = mpsc::channel(STREAM_INBOX_FRAMES);
        let (outbox, outbox_rx) = mpsc::channel(SOCKET_OUTBOX_FRAMES);
        let (to_app, from_stream) = mpsc::channel(APP_QUEUE_MESSAGES);
        let (to_stream, from_app) = mpsc::channel(APP_QUEUE_MESSAGES);
        let (reconnect_tx, reconnects) = watch::channel(0u64);
        let (established_tx, established) = oneshot::channel();
        let socket_task = tokio::spawn(socket_loop(SocketLoop {
            socket,
            url: info.rendezvous_url,
            token: args.bearer_token.clone(),
            stream_id: stream_id.clone(),
            inbox: inbox_tx,
            outbox: outbox_rx,
            reconnects: reconnect_tx,
        }));
        let stream_task = tokio::spawn(run_stream(
            stream,
            StreamChannels {
                inbox,
                outbox,
                to_app,
                from_app,
                reconnects,
                established: Some(established_tx),
                confirmed: Arc::new(AtomicBool::new(false)),
            },
        ));
        let connection = Self {
            stream_id: stream_id.clone(),
            to_stream,
            from_stream,
            socket_task,
            stream_task,
        };
        let failed = |reason: String| HarnessError::Handshake {
            stream_id: stream_id.clone(),
            reason,
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, established).await {
            Ok(Ok(Ok(()))) => Ok(connection),
            Ok(Ok(Err(reason))) => Err(failed(reason)),
            Ok(Err(_)) => Err(failed("the stream task ended".into())),
            Err(_) => Err(failed(format!("no answer within {HANDSHAKE_TIMEOUT:?}"))),
        }
    }

    /// The stream id (a UUIDv4).
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// Send one JSON-RPC message.
    ///
    /// # Errors
    /// [`HarnessError::Closed`] when the stream has ended.
    pub async fn send(&self, message: impl Into<Vec<u8>>) -> Result<(), HarnessError> {
        self.to_stream
            .send(AppOut::Message(message.into()))
            .await
            .map_err(|_| HarnessError::Closed)
    }

    /// A sending handle usable while [`Self::recv`] is being awaited elsewhere. An application
    /// must keep receiving while it sends: with both sides' windows full, a sender that stops
    /// reading can wait forever for acknowledgements that need room on its own side.
    pub fn sender(&self) -> RelaySender {
        RelaySender {
            to_stream: self.to_stream.clone(),
        }
    }

    /// The next JSON-RPC message; `None` once the stream has ended.
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        self.from_stream.recv().await
    }

    /// Close: flush what was sent (up to the linger time), then reset the stream, and wait
    /// (up to [`SOCKET_FLUSH_TIMEOUT`]) until the reset has been handed to the socket.
    pub async fn close(mut self) {
        let _ = self
            .to_stream
            .send(AppOut::Close("closed by the harness".into()))
            .await;
        let _ = (&mut self.stream_task).await;
        // The stream task has dropped the outbox: the socket task sends what is still queued
        // (the reset), closes the websocket and ends. Dropping `self` first would abort it.
        let _ = tokio::time::timeout(SOCKET_FLUSH_TIMEOUT, &mut self.socket_task).await;
    }
}

/// A cloneable sending half of a [`RelayHarnessConnection`].
#[derive(Debug, Clone)]
pub struct RelaySender {
    to_stream: mpsc::Sender<AppOut>,
}

impl RelaySender {
    /// Send one JSON-RPC message.
    ///
    /// # Errors
    /// [`HarnessError::Closed`] when the stream has ended.
    pub async fn send(&self, message: impl Into<Vec<u8>>) -> Result<(), HarnessError> {
        self.to_stream
            .send(AppOut::Message(message.into()))
            .await
            .map_err(|_| HarnessError::Closed)
    }
}

struct SocketLoop {
    socket: RelaySocket,
    url: String,
    token: String,
    stream_id: String,
    inbox: mpsc::Sender<Frame>,
    outbox: mpsc::Receiver<Vec<u8>>,
    reconnects: watch::Sender<u64>,
}

async fn socket_loop(mut state: SocketLoop) {
    let mut socket = Some(state.socket);
    let mut backoff = RECONNECT_BACKOFF_INITIAL;
    loop {
        if let Some(current) = socket.take() {
            if !pump(current, &state.stream_id, &state.inbox, &mut state.outbox).await {
                return;
            }
            tracing::warn!(stream = %state.stream_id, "rendezvous socket lost; reconnecting");
            backoff = RECONNECT_BACKOFF_INITIAL;
        }
        if state.inbox.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = next_backoff(backoff);
        match connect_socket(&state.url, &state.token).await {
            Ok(reconnected) => {
                state.reconnects.send_modify(|generation| *generation += 1);
                socket = Some(reconnected);
            }
            Err(error) => tracing::debug!(%error, "rendezvous reconnect failed"),
        }
    }
}

/// Carry frames until the socket fails (true: reconnect) or the stream ended (false).
async fn pump(
    socket: RelaySocket,
    stream_id: &str,
    inbox: &mpsc::Sender<Frame>,
    outbox: &mut mpsc::Receiver<Vec<u8>>,
) -> bool {
    let (mut sink, mut incoming) = socket.split();
    loop {
        tokio::select! {
            message = incoming.next() => match message {
                Some(Ok(WsMessage::Binary(bytes))) => match Frame::decode(&bytes) {
                    Ok(frame) if frame.stream_id == stream_id => {
                        if inbox.try_send(frame).is_err() {
                            tracing::debug!("stream inbox full: frame dropped");
                        }
                    }
                    Ok(_) => {}
                    Err(error) => tracing::debug!(%error, "dropping a malformed relay frame"),
                },
                Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => return true,
                Some(Ok(_)) => {}
            },
            frame = outbox.recv() => {
                let Some(frame) = frame else {
                    use futures_util::SinkExt;
                    let _ = sink.close().await;
                    return false;
                };
                if send_batch(&mut sink, frame, outbox).await.is_err() {
                    return true;
                }
            }
        }
    }
}
