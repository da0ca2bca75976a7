//! Remote mode for the client: [`RelayTransport`] opens each connection generation as a fresh
//! relay stream (registry lookup, rendezvous websocket, Noise handshake) through
//! [`RelayHarnessConnection`], so [`ExecServerClient`] works through a rendezvous with the same
//! API as over a local websocket, session recovery included.
//!
//! Two layers of recovery, and which one acts when:
//! - A dropped rendezvous socket is repaired *inside* the relay stream (reconnect, `resume`,
//!   retransmission); the client sees nothing.
//! - A stream that ends (reset by the executor, liveness timeout, executor restart) ends the
//!   [`TransportConnection`]; the client then resumes its session on a new stream with
//!   `initialize {resumeSessionId}`, exactly as after a lost websocket.
//!
//! Ordering rule: when the client gives a connection up, the stream is closed politely (its last
//! messages flushed, then a reset) rather than dropped, so the executor detaches the session at
//! once instead of after the liveness timeout, and the resume on the next stream is not refused
//! for long with -32010 (which recovery retries).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::transport::{
    BoxFuture, DEFAULT_CONNECT_TIMEOUT, INCOMING_QUEUE_MESSAGES, OUTGOING_QUEUE_MESSAGES,
    Transport, TransportConnection,
};
use super::{
    DEFAULT_INITIALIZE_TIMEOUT, ExecServerClient, ExecServerClientConnectOptions, ExecServerError,
    RECOVERY_DEADLINE,
};
use crate::relay::{CLOSE_LINGER, REGISTRATION_WAIT, RelayHarnessConnection, RemoteConnectArgs};

/// Extra time, beyond [`CLOSE_LINGER`], that closing an abandoned stream may take before its
/// tasks are simply dropped (the executor then notices through the liveness timeout).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Opens connections to one remote environment as relay streams; see the module docs.
///
/// Clones share their count of open streams ([`RelayTransport::wait_streams_closed`]).
#[derive(Debug, Clone)]
pub struct RelayTransport {
    args: RemoteConnectArgs,
    connect_timeout: Duration,
    open_streams: Arc<watch::Sender<usize>>,
}

/// Counts one open stream while it lives (also when its task is aborted).
struct OpenStream(Arc<watch::Sender<usize>>);

impl OpenStream {
    fn new(count: &Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|open| *open += 1);
        Self(count.clone())
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open = open.saturating_sub(1));
    }
}

impl RelayTransport {
    /// A transport to `args.environment_id` through the registry at `args.registry_url`; each
    /// connection (registry lookup, websocket, handshake) must be up within `connect_timeout`.
    pub fn new(args: RemoteConnectArgs, connect_timeout: Duration) -> Self {
        Self {
            args,
            connect_timeout,
            open_streams: Arc::new(watch::channel(0).0),
        }
    }

    /// Wait until every stream this transport opened has closed. After
    /// [`ExecServerClient::close`] the streams flush and reset in the background (within
    /// [`CLOSE_LINGER`] plus a second); a program about to exit waits here so that the executor
    /// frees the stream and detaches the session at once instead of after its liveness timeout.
    pub async fn wait_streams_closed(&self) {
        let mut open = self.open_streams.subscribe();
        let _ = open.wait_for(|count| *count == 0).await;
    }

    async fn open(&self) -> Result<TransportConnection, ExecServerError> {
        let connection = RelayHarnessConnection::connect(&self.args)
            .await
            .map_err(|error| ExecServerError::Connect {
                endpoint: self.endpoint(),
                reason: error.to_string(),
            })?;
        tracing::debug!(stream = connection.stream_id(), "relay stream open");
        Ok(serve(connection, OpenStream::new(&self.open_streams)))
    }
}

impl Transport for RelayTransport {
    fn connect(&self) -> BoxFuture<'_, Result<TransportConnection, ExecServerError>> {
        Box::pin(async move {
            tokio::time::timeout(self.connect_timeout, self.open())
                .await
                .map_err(|_| ExecServerError::Timeout {
                    what: format!("connecting to {}", self.endpoint()),
                    timeout: self.connect_timeout,
                })?
        })
    }

    fn endpoint(&self) -> String {
        format!(
            "environment {:?} via {}",
            self.args.environment_id, self.args.registry_url
        )
    }
}

/// Bridge one relay stream to the client's message channels.
///
/// The writer task (aborted with the [`TransportConnection`]) only sends. The pump task owns
/// the stream and keeps receiving while the writer waits for room (with both windows full, a
/// side that stopped reading would wait forever). The pump is deliberately not in
/// `TransportConnection::tasks`: when the client drops the connection, the pump sees the
/// incoming channel close and closes the stream politely before it ends.
fn serve(mut connection: RelayHarnessConnection, open: OpenStream) -> TransportConnection {
    let sender = connection.sender();
    let (outgoing, mut to_send) = mpsc::channel::<String>(OUTGOING_QUEUE_MESSAGES);
    let (received, incoming) = mpsc::channel::<Vec<u8>>(INCOMING_QUEUE_MESSAGES);
    let writer = tokio::spawn(async move {
        while let Some(text) = to_send.recv().await {
            if sender.send(text.into_bytes()).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let _open = open;
        loop {
            tokio::select! {
                message = connection.recv() => match message {
                    Some(bytes) => {
                        if received.send(bytes).await.is_err() {
                            break;
                        }
                    }
                    // The stream ended (reset or timed out): dropping `received` tells the client.
                    None => return,
                },
                () = received.closed() => break,
            }
        }
        let stream_id = connection.stream_id().to_owned();
        if tokio::time::timeout(CLOSE_LINGER + CLOSE_GRACE, connection.close())
            .await
            .is_err()
        {
            tracing::debug!(stream = %stream_id, "relay stream did not close in time; dropped");
        }
    });
    TransportConnection {
        outgoing,
        incoming,
        tasks: vec![writer.abort_handle()],
    }
}

/// How to reach an exec server in remote mode (the seeds' `RemoteExecServerConnectArgs`): the
/// registry, the environment and the bearer token, plus the same client settings as
/// [`ExecServerClientConnectOptions`].
#[derive(Debug, Clone)]
pub struct RemoteExecServerConnectArgs {
    /// Registry URL, environment id, harness credential, trust settings.
    pub relay: RemoteConnectArgs,
    /// `clientName` of `initialize` (shows in server logs).
    pub client_name: String,
    /// Resume this detached session instead of starting a new one.
    pub resume_session_id: Option<String>,
    /// How long the executor keeps the session once the stream is gone (`None`: its TTL).
    pub detached_session_ttl: Option<Duration>,
    /// Time to open one relay stream (registry lookup, websocket, Noise handshake).
    pub connect_timeout: Duration,
    /// Time for the `initialize` answer.
    pub initialize_timeout: Duration,
    /// How long recovery may take before the client fails ([`RECOVERY_DEADLINE`]).
    pub recovery_timeout: Duration,
}

impl RemoteExecServerConnectArgs {
    /// Defaults: client name `execward-client`, a connect timeout of 10 s plus
    /// [`REGISTRATION_WAIT`] (an environment that is not registered yet is waited for), 10 s
    /// initialize timeout, [`RECOVERY_DEADLINE`], system roots, no pinned key.
    pub fn new(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        bearer_token: impl Into<String>,
    ) -> Self {
        Self {
            relay: RemoteConnectArgs::new(registry_url, environment_id, bearer_token),
            client_name: "execward-client".into(),
            resume_session_id: None,
            detached_session_ttl: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT.saturating_add(REGISTRATION_WAIT),
            initialize_timeout: DEFAULT_INITIALIZE_TIMEOUT,
            recovery_timeout: RECOVERY_DEADLINE,
        }
    }

    /// Set the client name.
    #[must_use]
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Also trust the CA certificates of this PEM file (for `https://` and `wss://`).
    #[must_use]
    pub fn with_ca_file(mut self, ca_file: Option<std::path::PathBuf>) -> Self {
        self.relay = self.relay.with_ca_file(ca_file);
        self
    }

    /// Refuse to connect unless the registry hands out this executor public key.
    #[must_use]
    pub fn with_executor_key(mut self, key: Option<Vec<u8>>) -> Self {
        self.relay = self.relay.with_executor_key(key);
        self
    }

    /// Wait this long for an environment the registry does not know yet; the connect timeout
    /// grows to keep [`DEFAULT_CONNECT_TIMEOUT`] beyond it.
    #[must_use]
    pub fn with_registration_wait(mut self, wait: Duration) -> Self {
        self.relay = self.relay.with_registration_wait(wait);
        self.connect_timeout = DEFAULT_CONNECT_TIMEOUT.saturating_add(wait);
        self
    }

    /// Open the relay streams with this cipher choice (default: [`proto::relay::CipherChoice::Auto`]).
    #[must_use]
    pub fn with_cipher(mut self, cipher: proto::relay::CipherChoice) -> Self {
        self.relay = self.relay.with_cipher(cipher);
        self
    }

    /// Ask the executor to keep the session this long once the stream is gone (at most its own
    /// TTL); `Duration::ZERO`: the session's processes end with the stream.
    #[must_use]
    pub fn with_detached_session_ttl(mut self, ttl: Duration) -> Self {
        self.detached_session_ttl = Some(ttl);
        self
    }

    /// Resume an existing detached session.
    #[must_use]
    pub fn with_resume_session_id(mut self, session_id: Option<String>) -> Self {
        self.resume_session_id = session_id;
        self
    }

    /// The transport and the client options these arguments stand for.
    pub fn into_parts(self) -> (RelayTransport, ExecServerClientConnectOptions) {
        let transport = RelayTransport::new(self.relay, self.connect_timeout);
        let mut options = ExecServerClientConnectOptions::new(transport.endpoint())
            .with_client_name(self.client_name)
            .with_resume_session_id(self.resume_session_id);
        options.connect_timeout = self.connect_timeout;
        options.detached_session_ttl = self.detached_session_ttl;
        options.initialize_timeout = self.initialize_timeout;
        options.recovery_timeout = self.recovery_timeout;
        (transport, options)
    }
}

impl ExecServerClient {
    /// Connect to a remote environment through its registry and rendezvous, and `initialize`.
    /// The client then behaves as one connected with [`ExecServerClient::connect`]; a lost
    /// relay stream is recovered by resuming the session on a new stream.
    ///
    /// # Errors
    /// [`ExecServerError::Connect`] (the registry refused the token with 401, does not know the
    /// environment (404), or the handshake failed), [`ExecServerError::Timeout`], or the
    /// server's `initialize` error.
    pub async fn connect_remote(
        args: RemoteExecServerConnectArgs,
    ) -> Result<Self, ExecServerError> {
        let (transport, options) = args.into_parts();
        Self::connect_with_transport(Arc::new(transport), options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn args_carry_their_settings_into_the_client_options() {
        let args = RemoteExecServerConnectArgs::new("http://127.0.0.1:9", "laptop", "secret")
            .with_client_name("tool")
            .with_resume_session_id(Some("s-1".into()));
        let (transport, options) = args.into_parts();
        assert_eq!(
            transport.endpoint(),
            "environment \"laptop\" via http://127.0.0.1:9"
        );
        assert_eq!(options.url, transport.endpoint());
        assert_eq!(options.auth_token, None);
        assert_eq!(options.client_name, "tool");
        assert_eq!(options.resume_session_id.as_deref(), Some("s-1"));
        assert_eq!(options.recovery_timeout, RECOVERY_DEADLINE);
    }

    #[test]
    fn the_bearer_token_never_shows_in_debug_output() {
        let args = RemoteExecServerConnectArgs::new("http://127.0.0.1:9", "laptop", "secret");
        assert!(!format!("{args:?}").contains("secret"));
        let (transport, _) = args.into_parts();
        assert!(!format!("{transport:?}").contains("secret"));
    }
}
