//! The harness end of one relay stream: a JSON-RPC message channel to a remote environment,
//! through the registry and the rendezvous, that survives rendezvous reconnects.
//!
//! [`RelayHarnessConnection::connect`] asks the registry for the rendezvous URL and the
//! environment's public key (waiting a bounded time for an environment that has not registered
//! yet, and checking the key against a pinned one), picks a UUIDv4 `stream_id`, opens the websocket and finishes the
//! Noise handshake before returning. Afterwards a socket task reconnects with backoff whenever
//! the socket drops and the stream resumes; the caller sees one uninterrupted message stream.
//! A JSON-RPC client (`ExecServerClient`) can use [`RelayHarnessConnection::send`] and
//! [`RelayHarnessConnection::recv`] as its transport.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use base64::Engine as _;
use tokio::sync::OnceCell;

use futures_util::StreamExt;
use proto::relay::limits::HANDSHAKE_TIMEOUT;
use proto::relay::noise::CIPHER_REFUSED;
use proto::relay::{Cipher, CipherChoice, Frame, SecureStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::driver::{
    AppOut, RelaySocket, SocketError, StreamChannels, connect_socket, run_stream, send_batch,
};
use super::registry::{ConnectResponse, RegistryClient, RegistryError};
use super::tls::client_config_for;
use super::{
    APP_QUEUE_MESSAGES, BUSY_RETRY_FIRST_DELAY, BUSY_RETRY_MAX_DELAY, BUSY_RETRY_WINDOW,
    HANDSHAKES_BUSY, RECONNECT_BACKOFF_INITIAL, SOCKET_OUTBOX_FRAMES, STREAM_INBOX_FRAMES,
    next_backoff,
};

/// Longest wait in [`RelayHarnessConnection::close`] for the socket to send the final reset.
pub const SOCKET_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long [`RelayHarnessConnection::connect`] waits, by default, for an environment the
/// registry does not know (404) to register: an executor started at the same moment as its
/// first harness registers within a second or two.
pub const REGISTRATION_WAIT: Duration = Duration::from_secs(10);
/// First pause between lookups of an environment that is not registered yet (doubled each time
/// up to [`super::RECONNECT_BACKOFF_MAX`]).
pub const REGISTRATION_POLL_INITIAL: Duration = Duration::from_millis(50);

/// Where to connect, and how much to trust.
///
/// Clones share one registry client and TLS configuration, built at the first connection.
#[derive(Clone)]
pub struct RemoteConnectArgs {
    /// `https://HOST:PORT` of the registry (`http://` to a loopback host only).
    pub registry_url: String,
    /// The environment.
    pub environment_id: String,
    /// The harness credential for the registry and the rendezvous.
    pub bearer_token: String,
    /// Extra trusted CA certificates (PEM) besides the system's, for `https://` and `wss://`.
    pub ca_file: Option<PathBuf>,
    /// The executor's Noise public key the registry must hand out; a different one fails the
    /// connection ([`HarnessError::KeyMismatch`]).
    pub executor_key: Option<Vec<u8>>,
    /// How long to wait for an environment the registry does not know yet
    /// ([`REGISTRATION_WAIT`] by default).
    pub registration_wait: Duration,
    /// The Noise cipher of the streams ([`CipherChoice::Auto`] by default: AES-256-GCM where
    /// this CPU has AES instructions and the environment accepts it, else ChaCha20-Poly1305).
    pub cipher: CipherChoice,
    clients: Arc<OnceCell<Clients>>,
}

/// The shared registry client and TLS settings of one [`RemoteConnectArgs`].
#[derive(Clone)]
struct Clients {
    registry: RegistryClient,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for RemoteConnectArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConnectArgs")
            .field("registry_url", &self.registry_url)
            .field("environment_id", &self.environment_id)
            .field("bearer_token", &"<redacted>")
            .field("ca_file", &self.ca_file)
            .field(
                "executor_key",
                &self.executor_key.as_deref().map(encode_key),
            )
            .field("registration_wait", &self.registration_wait)
            .field("cipher", &self.cipher)
            .finish()
    }
}

fn encode_key(key: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

impl RemoteConnectArgs {
    /// Connect to `environment_id` through the registry at `registry_url` with a harness
    /// credential; system roots, no pinned key, [`REGISTRATION_WAIT`].
    pub fn new(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        bearer_token: impl Into<String>,
    ) -> Self {
        Self {
            registry_url: registry_url.into(),
            environment_id: environment_id.into(),
            bearer_token: bearer_token.into(),
            ca_file: None,
            executor_key: None,
            registration_wait: REGISTRATION_WAIT,
            cipher: CipherChoice::Auto,
            clients: Arc::default(),
        }
    }

    /// Also trust the CA certificates in this PEM file.
    #[must_use]
    pub fn with_ca_file(mut self, ca_file: Option<PathBuf>) -> Self {
        self.ca_file = ca_file;
        self.clients = Arc::default();
        self
    }

    /// Require this executor public key.
    #[must_use]
    pub fn with_executor_key(mut self, key: Option<Vec<u8>>) -> Self {
        self.executor_key = key;
        self
    }

    /// Wait this long for an unregistered environment (zero: fail at once on 404).
    #[must_use]
    pub fn with_registration_wait(mut self, wait: Duration) -> Self {
        self.registration_wait = wait;
        self
    }

    /// Open streams with this cipher choice.
    #[must_use]
    pub fn with_cipher(mut self, cipher: CipherChoice) -> Self {
        self.cipher = cipher;
        self
    }

    async fn clients(&self) -> Result<Clients, HarnessError> {
        self.clients
            .get_or_try_init(|| async {
                let tls = client_config_for(&self.registry_url, self.ca_file.as_deref())
                    .map_err(RegistryError::from)?;
                let registry = RegistryClient::new(&self.registry_url, &tls)?;
                Ok::<_, HarnessError>(Clients { registry, tls })
            })
            .await
            .cloned()
    }

    /// Look the environment up, waiting up to [`Self::registration_wait`] while the registry
    /// answers 404 or is not listening yet (connection refused: a rendezvous started at the same
    /// moment), and check the pinned key.
    async fn lookup(&self, registry: &RegistryClient) -> Result<ConnectResponse, HarnessError> {
        let deadline = Instant::now() + self.registration_wait;
        let mut pause = REGISTRATION_POLL_INITIAL;
        let info = loop {
            match registry
                .connect(&self.environment_id, &self.bearer_token)
                .await
            {
                Ok(info) => break info,
                Err(error) if error.is_not_yet() => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(match error {
                            RegistryError::Status { .. } => HarnessError::NotRegistered {
                                environment_id: self.environment_id.clone(),
                                waited: self.registration_wait,
                            },
                            // Still refused at the deadline: say so, as it is.
                            other => other.into(),
                        });
                    }
                    // The last lookup happens at the deadline, not a backoff before it.
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = next_backoff(pause);
                }
                Err(error) => return Err(error.into()),
            }
        };
        let key = info.public_key_bytes()?;
        if let Some(expected) = &self.executor_key
            && *expected != key
        {
            return Err(HarnessError::KeyMismatch {
                environment_id: self.environment_id.clone(),
                expected: encode_key(expected),
                got: encode_key(&key),
            });
        }
        Ok(info)
    }
}

/// Why a remote connection failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The registry call failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The environment never registered within the wait.
    #[error(
        "environment {environment_id:?} is not registered: the registry answered 404 for {waited:?} (is its executor running, with the same environment id?)"
    )]
    NotRegistered {
        /// The environment.
        environment_id: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The registry handed out another key than the pinned one.
    #[error(
        "environment {environment_id:?} presents executor key {got}, but --executor-key pins {expected}: refusing to connect (the executor was replaced or its key rotated)"
    )]
    KeyMismatch {
        /// The environment.
        environment_id: String,
        /// The pinned key (base64).
        expected: String,
        /// The key the registry handed out (base64).
        got: String,
    },
    /// The environment's key is unusable.
    #[error(transparent)]
    Noise(#[from] proto::relay::noise::NoiseError),
    /// The rendezvous websocket could not be opened.
    #[error("rendezvous {url}: {source}")]
    Socket {
        /// The URL.
        url: String,
        /// The error.
        source: Box<SocketError>,
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
    cipher: Cipher,
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
    /// Look the environment up, open the socket and the stream, finish the handshake. A
    /// handshake refused because the executor has [`super::MAX_PENDING_HANDSHAKES`] pending
    /// ([`HANDSHAKES_BUSY`]) is tried again, backing off, for up to [`BUSY_RETRY_WINDOW`]. A
    /// cipher this end chose itself ([`CipherChoice::Auto`]) and the environment refused
    /// ([`CIPHER_REFUSED`]) is replaced by ChaCha20-Poly1305 at once; a cipher the caller named
    /// fails the connection with the environment's reason.
    ///
    /// # Errors
    /// [`HarnessError`] naming the step that failed.
    pub async fn connect(args: &RemoteConnectArgs) -> Result<Self, HarnessError> {
        let started = Instant::now();
        let mut delay = BUSY_RETRY_FIRST_DELAY;
        let mut cipher = match args.cipher {
            CipherChoice::Auto => Cipher::preferred(),
            CipherChoice::Only(cipher) => cipher,
        };
        loop {
            match Self::connect_once(args, cipher).await {
                Err(HarnessError::Handshake { reason, .. })
                    if reason.contains(CIPHER_REFUSED)
                        && args.cipher == CipherChoice::Auto
                        && cipher != Cipher::ChaChaPoly =>
                {
                    tracing::debug!(%cipher, %reason, "relay cipher refused; using chachapoly");
                    cipher = Cipher::ChaChaPoly;
                }
                Err(HarnessError::Handshake { reason, .. })
                    if reason.starts_with(HANDSHAKES_BUSY)
                        && started.elapsed() + delay < BUSY_RETRY_WINDOW =>
                {
                    // Jitter (up to the delay again) spreads a burst's retries apart.
                    let jitter =
                        delay.mul_f64(f64::from(uuid::Uuid::new_v4().as_bytes()[0]) / 255.0);
                    tokio::time::sleep(delay + jitter).await;
                    delay = (delay * 2).min(BUSY_RETRY_MAX_DELAY);
                }
                result => return result,
            }
        }
    }

    async fn connect_once(args: &RemoteConnectArgs, cipher: Cipher) -> Result<Self, HarnessError> {
        let clients = args.clients().await?;
        let info = args.lookup(&clients.registry).await?;
        let public_key = info.public_key_bytes()?;
        let stream_id = uuid::Uuid::new_v4().to_string();
        let stream = SecureStream::initiate_with(
            &args.environment_id,
            &stream_id,
            &public_key,
            cipher,
            Instant::now(),
        )?;
        let socket = connect_socket(&info.rendezvous_url, &args.bearer_token, &clients.tls)
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
            tls: clients.tls,
            relookup: Relookup {
                registry: clients.registry.clone(),
                environment_id: args.environment_id.clone(),
                public_key: info.public_key.clone(),
            },
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
            cipher,
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

    /// The Noise cipher the stream runs on.
    pub fn cipher(&self) -> Cipher {
        self.cipher
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
    tls: Arc<rustls::ClientConfig>,
    /// To look the environment up again when `url`'s node fails.
    relookup: Relookup,
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
        match connect_socket(&state.url, &state.token, &state.tls).await {
            Ok(reconnected) => {
                state.reconnects.send_modify(|generation| *generation += 1);
                socket = Some(reconnected);
            }
            Err(error) => {
                tracing::debug!(%error, "rendezvous reconnect failed");
                follow_registry(&state.relookup, &state.token, &mut state.url).await;
            }
        }
    }
}

/// What a harness needs to look its environment up again when its socket URL fails (another
/// node of a cluster hands out its own socket URL).
struct Relookup {
    registry: RegistryClient,
    environment_id: String,
    /// The key the stream was opened to: a lookup presenting another is not followed.
    public_key: String,
}

/// The socket URL failed: ask the registry again (its client moves on to another node of a
/// cluster when one fails) and take the socket URL it hands out, if it still presents the key
/// the stream was opened to.
async fn follow_registry(relookup: &Relookup, token: &str, url: &mut String) {
    match relookup
        .registry
        .connect(&relookup.environment_id, token)
        .await
    {
        Ok(info) if info.public_key == relookup.public_key => {
            if info.rendezvous_url != *url {
                tracing::info!(url = %info.rendezvous_url, "moving to another rendezvous node");
                *url = info.rendezvous_url;
            }
        }
        Ok(_) => tracing::warn!(
            "the registry now presents another key for this environment; staying on the stream's node"
        ),
        Err(error) => tracing::debug!(%error, "registry lookup after a failed reconnect"),
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
