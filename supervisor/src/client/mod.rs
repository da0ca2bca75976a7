//! `ExecServerClient`: a Rust client for `exec-server` whose process handles survive a lost
//! connection.
//!
//! One logical client stays alive while its underlying connection changes generations. When
//! the transport closes, the client resumes the server session (`initialize {resumeSessionId}`),
//! catches every process up with `process/read` from its last published event, and carries on:
//! same session, same process ids, no byte lost or repeated. See [`recovery`] for the state
//! machine and its ordering rules, [`events`] for how events are merged by seq.
//!
//! - Requests are matched by id and may complete out of order; many calls can be in flight.
//! - While recovering, new calls wait; process handles and event streams stay open.
//! - Calls that change state and were in flight at the cut are not replayed
//!   ([`ExecServerError::Disconnected`]); reads and `process/write` (which carries a `writeId`
//!   the server deduplicates) are.
//! - Recovery gives up after [`RECOVERY_DEADLINE`] (25 s, below the server's 30 s detached
//!   session TTL) or on a permanent error: the client is then [`ConnectionState::Failed`] and
//!   every process gets a terminal [`ProcessEvent::Failed`].
//!
//! Transports sit behind the [`Transport`] trait: [`WebSocketTransport`] for `ws://`, `wss://`
//! (feature `remote`) and `unix:`, which never sends a token over `ws://` to a host that is not
//! loopback; `RelayTransport` for remote mode through a rendezvous
//! (`ExecServerClient::connect_remote`, feature `remote`); any other with
//! [`ExecServerClient::connect_with_transport`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), supervisor::ExecServerError> {
//! use supervisor::protocol::process::StartParams;
//! use supervisor::{ExecServerClient, ExecServerClientConnectOptions, FileUri};
//!
//! let options = ExecServerClientConnectOptions::new("ws://127.0.0.1:4000")
//!     .with_auth_token(Some("secret".to_owned()));
//! let client = ExecServerClient::connect(options).await?;
//! let process = client
//!     .start_process(
//!         StartParams::new(
//!             "hello",
//!             ["/bin/sh", "-c", "echo hi; exit 3"],
//!             FileUri::from_path(std::path::Path::new("/tmp")).expect("absolute path"),
//!         )
//!         .with_env_var("PATH", "/usr/bin:/bin"),
//!     )
//!     .await?;
//! let output = process.wait().await?;
//! assert_eq!((output.stdout.as_slice(), output.exit_code), (&b"hi\n"[..], 3));
//! # Ok(()) }
//! ```
//!
//! An HTTP request made by the server, its body streamed as it arrives:
//! ```no_run
//! # async fn demo(client: supervisor::ExecServerClient) -> Result<(), Box<dyn std::error::Error>> {
//! use futures_util::StreamExt;
//! use supervisor::HttpRequest;
//! let shell = client.environment_info().await?.shell;
//! println!("the server runs {} ({})", shell.name, shell.path);
//! let mut response = client
//!     .http_request_stream(HttpRequest::new("GET", "http://127.0.0.1:8080/events"))
//!     .await?;
//! while let Some(chunk) = response.body.next().await {
//!     print!("{}", String::from_utf8_lossy(&chunk?));
//! }
//! # Ok(()) }
//! ```
//!
//! Streaming a large remote file:
//! ```no_run
//! # async fn demo(client: supervisor::ExecServerClient) -> Result<(), Box<dyn std::error::Error>> {
//! use tokio::io::AsyncReadExt;
//! let path = supervisor::FileUri::from_path(std::path::Path::new("/var/log/big.log"))?;
//! let mut reader = client.fs_open(path, None).await?;
//! let mut bytes = Vec::new();
//! reader.read_to_end(&mut bytes).await?;
//! # Ok(()) }
//! ```

mod connection;
mod core;
pub mod error;
pub mod events;
mod fs;
pub mod http;
mod http_streams;
pub mod process;
pub mod recovery;
#[cfg(feature = "remote")]
pub mod remote;
pub mod stream;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use proto::methods::INITIALIZE;
use proto::methods::INITIALIZED;
use proto::methods::initialize::{InitializeParams, InitializeResult};
use proto::methods::process::StartParams;
use tokio::sync::watch;

pub use self::core::ConnectionState;
use self::core::{Inner, Settings, from_result, to_params};
pub use error::ExecServerError;
pub use events::ProcessEvent;
pub use http::{HttpBody, HttpRequest, HttpResponseData, HttpStreamResponse};
pub use process::{ProcessEvents, ProcessHandle, ProcessOutput, RemoteProcess};
pub use recovery::RECOVERY_DEADLINE;
#[cfg(feature = "remote")]
pub use remote::{RelayTransport, RemoteExecServerConnectArgs};
pub use stream::RemoteFileReader;
pub use transport::{Transport, TransportConnection, WebSocketTransport};

use self::connection::{CallError, RpcConnection};

/// Default time for the `initialize` answer.
pub const DEFAULT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(10);

/// Output bytes one process's [`ProcessEvents`] may hold unread. Past this the client stops
/// following that process: its events end with [`ProcessEvent::Failed`] naming this limit
/// (the process keeps running on the server). Events are never back-pressured, so a caller
/// awaiting a call while not reading events cannot deadlock the connection; this bounds the
/// memory that costs instead.
pub const CLIENT_EVENT_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// How to reach a server and how patient to be.
#[derive(Debug, Clone)]
pub struct ExecServerClientConnectOptions {
    /// `ws://HOST:PORT`, `wss://HOST:PORT` or `unix:/path.sock`.
    pub url: String,
    /// Sent as `Authorization: Bearer <token>` on the websocket upgrade (never over plain
    /// `ws://` to a host that is not loopback: the connection is refused first).
    pub auth_token: Option<String>,
    /// For `wss://`: also trust the CA certificates of this PEM file (besides the system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// `clientName` of `initialize` (shows in server logs).
    pub client_name: String,
    /// Resume this detached session instead of starting a new one.
    pub resume_session_id: Option<String>,
    /// How long the server keeps the session once the connection ends (`None`: the server's
    /// TTL; zero: its processes end with the connection). Sent at every `initialize`.
    pub detached_session_ttl: Option<Duration>,
    /// Time to establish one connection.
    pub connect_timeout: Duration,
    /// Time for the `initialize` answer.
    pub initialize_timeout: Duration,
    /// How long recovery may take before the client fails ([`RECOVERY_DEADLINE`]).
    pub recovery_timeout: Duration,
    /// Ask for `process/output` as binary frames (no base64, no JSON); the server may keep
    /// JSON (a relay stream does). Either way the events are the same.
    pub binary_output: bool,
}

/// `detachedSessionTtlSeconds` for a requested TTL (rounded up to whole seconds, so a short
/// non-zero TTL never becomes "end with the connection").
pub(crate) fn ttl_seconds(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|ttl| ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
}

impl ExecServerClientConnectOptions {
    /// Defaults for `url`: no token, client name `execward-client`, 10 s connect and
    /// initialize timeouts, [`RECOVERY_DEADLINE`], binary output frames asked for.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            auth_token: None,
            ca_file: None,
            client_name: "execward-client".into(),
            resume_session_id: None,
            detached_session_ttl: None,
            connect_timeout: transport::DEFAULT_CONNECT_TIMEOUT,
            initialize_timeout: DEFAULT_INITIALIZE_TIMEOUT,
            recovery_timeout: RECOVERY_DEADLINE,
            binary_output: true,
        }
    }

    /// Ask for `process/output` as binary frames (the default) or as JSON.
    #[must_use]
    pub fn with_binary_output(mut self, binary: bool) -> Self {
        self.binary_output = binary;
        self
    }

    /// Set the bearer token.
    #[must_use]
    pub fn with_auth_token(mut self, token: Option<String>) -> Self {
        self.auth_token = token;
        self
    }

    /// For `wss://`: also trust the CA certificates of this PEM file.
    #[must_use]
    pub fn with_ca_file(mut self, ca_file: Option<std::path::PathBuf>) -> Self {
        self.ca_file = ca_file;
        self
    }

    /// Set the client name.
    #[must_use]
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Ask the server to keep the session this long once the connection ends (at most its own
    /// TTL); `Duration::ZERO`: the session's processes end with the connection.
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
}

/// A client of one exec-server session. Cheap to clone; all clones share the connection.
#[derive(Clone)]
pub struct ExecServerClient {
    inner: Arc<Inner>,
}

impl ExecServerClient {
    /// Connect over a websocket (`ws://`, `wss://` or `unix:`) and `initialize`.
    ///
    /// # Errors
    /// [`ExecServerError::InvalidUrl`], [`ExecServerError::PlainTextToken`] (a token for a
    /// `ws://` host that is not loopback, refused before connecting), [`ExecServerError::Tls`],
    /// [`ExecServerError::Connect`] (including an HTTP 401
    /// for a wrong token), [`ExecServerError::Timeout`], or the server's `initialize` error
    /// (e.g. -32010 when resuming a session that is still attached, -32600 `unknownSession`).
    pub async fn connect(options: ExecServerClientConnectOptions) -> Result<Self, ExecServerError> {
        let transport = WebSocketTransport::with_ca_file(
            &options.url,
            options.auth_token.clone(),
            options.connect_timeout,
            options.ca_file.as_deref(),
        )?;
        Self::connect_with_transport(Arc::new(transport), options).await
    }

    /// Connect through any [`Transport`] (`options.url` and `options.auth_token` are unused).
    ///
    /// # Errors
    /// As [`ExecServerClient::connect`].
    pub async fn connect_with_transport(
        transport: Arc<dyn Transport>,
        options: ExecServerClientConnectOptions,
    ) -> Result<Self, ExecServerError> {
        let inner = Inner::new(
            transport,
            Settings {
                client_name: options.client_name.clone(),
                detached_session_ttl: options.detached_session_ttl,
                initialize_timeout: options.initialize_timeout,
                recovery_timeout: options.recovery_timeout,
                binary_output: options.binary_output,
            },
        );
        let connection = RpcConnection::start(
            inner.new_generation(),
            inner.transport.connect().await?,
            Arc::downgrade(&inner),
        );
        let params = InitializeParams {
            client_name: options.client_name,
            resume_session_id: options.resume_session_id,
            detached_session_ttl_seconds: ttl_seconds(options.detached_session_ttl),
            binary_output: options.binary_output,
            egress_approve: false,
        };
        let answer = tokio::time::timeout(
            options.initialize_timeout,
            connection.request(
                inner.request_id(),
                INITIALIZE,
                to_params(INITIALIZE, &params)?,
            ),
        )
        .await
        .map_err(|_| ExecServerError::Timeout {
            what: "initialize".into(),
            timeout: options.initialize_timeout,
        })?;
        let result: InitializeResult = match answer {
            Ok(result) => from_result(INITIALIZE, result)?,
            Err(CallError::Rpc(error)) => {
                connection.shutdown();
                return Err(ExecServerError::Rpc {
                    method: INITIALIZE.into(),
                    error: Box::new(error),
                });
            }
            Err(CallError::Disconnected) => {
                return Err(ExecServerError::Connect {
                    endpoint: inner.transport.endpoint(),
                    reason: "the connection closed during initialize".into(),
                });
            }
        };
        let _ = inner.session_id.set(result.session_id);
        connection.notify(INITIALIZED, serde_json::json!({})).await;
        inner.install(connection);
        Ok(Self { inner })
    }

    /// The server session's id (stable across reconnects).
    pub fn session_id(&self) -> &str {
        self.inner.session_id.get().map_or("", String::as_str)
    }

    /// The current connection state.
    pub fn state(&self) -> ConnectionState {
        self.inner.state.borrow().clone()
    }

    /// Watch the connection state (e.g. to show "reconnecting…" or to time a recovery).
    pub fn subscribe_state(&self) -> watch::Receiver<ConnectionState> {
        self.inner.state.subscribe()
    }

    /// `process/start`, returning a handle whose events start at seq 1.
    ///
    /// # Errors
    /// The server's error (-32600 `alreadyExists`, -32004 missing cwd or program, ...),
    /// [`ExecServerError::DuplicateProcessId`] if this client still follows a process with the
    /// id, [`ExecServerError::StartAmbiguous`] if the connection was lost before the answer.
    pub async fn start_process(
        &self,
        params: StartParams,
    ) -> Result<ProcessHandle, ExecServerError> {
        self.inner.start_process(params).await
    }

    /// Control of a process by id (no event stream), e.g. to signal a process started elsewhere
    /// in this session.
    pub fn process(&self, process_id: &str) -> RemoteProcess {
        self.inner.remote_process(process_id)
    }

    /// Close the connection. Processes keep running on the server until the detached session
    /// expires; open process handles get a terminal [`ProcessEvent::Failed`].
    pub fn close(&self) {
        self.inner
            .fail(ExecServerError::Closed, ConnectionState::Closed);
    }
}
