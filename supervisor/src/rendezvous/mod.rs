//! The reference registry + rendezvous (`exec-rendezvous`): small, in memory, one process; HTTP
//! through axum on hyper 1, TLS through rustls when given a certificate.
//!
//! Every request but `GET /readyz` needs `Authorization: Bearer <token>` naming a credential of
//! the credentials file (see `credentials.rs`); each endpoint needs one role:
//! - `POST /v1/environments/{id}` `{"name","publicKey"}` → `{"rendezvousUrl"}` (executor): an
//!   executor registers (again after every reconnect). The first registration binds the id to
//!   its key; another key is refused with 409 while the binding stands.
//! - `DELETE /v1/environments/{id}` (admin): release the binding; the executor socket and the
//!   streams of the environment close.
//! - `POST /v1/environments/{id}/connect` → `{"rendezvousUrl","publicKey","name"}` (harness): a
//!   harness looks an environment up (404 when unknown).
//! - `GET /v1/environments/{id}/executor` (websocket, executor): the executor's socket. It carries
//!   nothing until it proved it holds the key the id is bound to (`router.rs`,
//!   [`proto::relay::proof`]); a proven one replaces the old, an unproven one never does.
//! - `GET /v1/environments/{id}/harness` (websocket, harness): a harness socket; it may carry
//!   many streams.
//!
//! An unknown token is 401; a known one of the wrong role, or not granted the id, is 403.
//! Routing (`router.rs`) reads only a frame's envelope for its `stream_id`; payloads are opaque
//! (Noise ciphertext) and never inspected. Reliability is the endpoints' job: a frame with no
//! route, or for a full socket queue, is dropped.

pub mod cli;
pub mod cluster;
pub(crate) mod credentials;
pub(crate) mod queue;
pub(crate) mod registration;
pub(crate) mod router;

pub use router::{MAX_STREAMS_PER_CREDENTIAL, PROOF_TIMEOUT};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::Extension;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role as WsRole;

use crate::limits::{
    MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_SOURCE, MAX_UPGRADE_HEAD_BYTES, UPGRADE_HEAD_TIMEOUT,
};
use crate::relay::driver::relay_websocket_config;
use crate::relay::registry::{
    ConnectResponse, RegisterRequest, RegisterResponse, validate_environment_id,
};
use crate::transport::admission::{Admission, PendingTicket, Source, evicted};
use cluster::registry::{Binding, ClusterRegistryError, Registered};
use cluster::sockets::ClusterSocketSlot;
use cluster::{Cluster, ClusterError, ClusterOptions};
pub use credentials::CredentialsError;
use credentials::{Caller, Credentials, Role};
use registration::{RegisterError, validate_registration};
use router::Router;

/// Simultaneous TCP connections (HTTP and websockets); more are closed right after accept.
pub const MAX_RENDEZVOUS_CONNECTIONS: usize = 4096;
/// Default for [`RendezvousOptions::max_sockets_per_credential`]: websockets one credential
/// holds at once, so that a single token (a leaked harness token, a runaway CI job) cannot take
/// every one of [`MAX_RENDEZVOUS_CONNECTIONS`] and lock out everyone else.
pub const MAX_SOCKETS_PER_CREDENTIAL: usize = 1024;
/// Largest request body (a registration is a few hundred bytes); larger ones are 413.
pub const MAX_REQUEST_BODY_BYTES: usize = 16 * 1024;
/// Time for a TLS handshake after accept.
pub const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How the rendezvous runs.
#[derive(Debug, Clone)]
pub struct RendezvousOptions {
    /// Address to bind (port 0 picks one).
    pub listen: SocketAddr,
    /// The credentials file (TOML; reloaded by [`CredentialsReloader::reload`], which the
    /// binary calls on SIGHUP).
    pub credentials_file: PathBuf,
    /// Serve TLS with this PEM certificate chain and PEM private key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Base `ws(s)://HOST:PORT` handed out in `rendezvousUrl` (default: the bound address, with
    /// `wss` when serving TLS). Lets a proxy sit between endpoints and the rendezvous.
    pub public_url: Option<String>,
    /// Websockets (executor and harness) one credential may hold at once; more are refused
    /// with 503 naming the limit. At least 1.
    pub max_sockets_per_credential: usize,
    /// Streams of one environment the sockets of one harness credential may own together
    /// (default [`MAX_STREAMS_PER_CREDENTIAL`]); frames opening more are dropped. At
    /// least 1.
    pub max_streams_per_credential: usize,
    /// Join a cluster of nodes on NATS (`None`: one node, state in memory).
    pub cluster: Option<ClusterOptions>,
}

/// Why the rendezvous cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// The credentials file is unusable.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The TLS certificate or key is unusable.
    #[error(transparent)]
    Tls(#[from] crate::relay::tls::TlsError),
    /// The cluster could not be joined.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Binding failed.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

impl RendezvousError {
    /// Whether the rendezvous failed while starting to run (the OS refused the bind) rather than
    /// on what it was given (credentials file, certificate): see
    /// [`crate::cli::RUNTIME_FAILURE_STATUS`].
    pub fn is_runtime_failure(&self) -> bool {
        match self {
            Self::Credentials(_) | Self::Tls(_) => false,
            Self::Cluster(error) => matches!(
                error,
                ClusterError::Connect { .. } | ClusterError::Bucket { .. }
            ),
            Self::Bind { .. } => true,
        }
    }
}

/// A bound rendezvous.
pub struct Rendezvous {
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<AppState>,
}

struct AppState {
    credentials_file: PathBuf,
    credentials: RwLock<Arc<Credentials>>,
    public_url: String,
    router: Router,
    sockets: Arc<tokio::sync::Semaphore>,
    /// Open websockets per credential label.
    per_credential: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    max_per_credential: usize,
    /// Cluster mode: the link to NATS (registry in JetStream, frames on subjects).
    cluster: Option<Arc<Cluster>>,
}

/// One websocket counted against its credential until dropped.
struct CredentialSocket {
    state: Arc<AppState>,
    label: String,
}

impl CredentialSocket {
    /// A slot for one more websocket of `label`; none when it holds the most it may.
    fn take(state: &Arc<AppState>, label: &str) -> Option<Self> {
        let mut open = state
            .per_credential
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let count = open.entry(label.to_owned()).or_insert(0);
        if *count >= state.max_per_credential {
            return None;
        }
        *count += 1;
        Some(Self {
            state: state.clone(),
            label: label.to_owned(),
        })
    }
}

impl Drop for CredentialSocket {
    fn drop(&mut self) {
        let mut open = self
            .state
            .per_credential
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.label) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.label);
            }
        }
    }
}

impl AppState {
    fn credentials(&self) -> Arc<Credentials> {
        self.credentials
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Rendezvous {
    /// Read the credentials (and TLS files), then bind.
    ///
    /// # Errors
    /// [`RendezvousError`] naming what is unusable.
    pub async fn bind(options: RendezvousOptions) -> Result<Self, RendezvousError> {
        let credentials = Credentials::load(&options.credentials_file)?;
        let tls = match &options.tls {
            Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(
                crate::relay::tls::server_config(cert, key)?,
            )),
            None => None,
        };
        let bind = |source| RendezvousError::Bind {
            address: options.listen,
            source,
        };
        let cluster = match &options.cluster {
            Some(cluster) => Some(Cluster::join(cluster).await?),
            None => None,
        };
        let listener = TcpListener::bind(options.listen).await.map_err(bind)?;
        let address = listener.local_addr().map_err(bind)?;
        let scheme = if tls.is_some() { "wss" } else { "ws" };
        let public_url = options
            .public_url
            .unwrap_or_else(|| format!("{scheme}://{address}"));
        Ok(Self {
            listener,
            tls,
            state: Arc::new(AppState {
                credentials_file: options.credentials_file,
                credentials: RwLock::new(Arc::new(credentials)),
                public_url: public_url.trim_end_matches('/').to_owned(),
                router: Router::with_cluster(options.max_streams_per_credential, cluster.clone()),
                sockets: Arc::new(tokio::sync::Semaphore::new(MAX_RENDEZVOUS_CONNECTIONS)),
                per_credential: std::sync::Mutex::default(),
                max_per_credential: options.max_sockets_per_credential.max(1),
                cluster,
            }),
        })
    }

    /// `http(s)://HOST:PORT` of the registry endpoints.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        match self.listener.local_addr() {
            Ok(address) => format!("{scheme}://{address}"),
            Err(_) => format!("{scheme}://unknown"),
        }
    }

    /// A handle that rereads the credentials file.
    pub fn reloader(&self) -> CredentialsReloader {
        CredentialsReloader(self.state.clone())
    }

    /// Serve until `stop` resolves.
    pub async fn serve_until(self, stop: impl std::future::Future<Output = ()>) {
        let app = app(self.state.clone());
        let connections = Arc::new(tokio::sync::Semaphore::new(MAX_RENDEZVOUS_CONNECTIONS));
        // Connections that have not presented a valid token yet: the server's admission pool.
        let admission = Admission::new(MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_SOURCE);
        let _renew_counts = self
            .state
            .cluster
            .clone()
            .map(|cluster| AbortOnDrop(tokio::spawn(cluster.renew_socket_counts())));
        let _link_watch = self.state.cluster.as_ref().map(|cluster| {
            let mut link = cluster.link();
            let state = self.state.clone();
            AbortOnDrop(tokio::spawn(async move {
                while link.changed().await.is_ok() {
                    if !*link.borrow_and_update() {
                        let closed = state.router.close_all();
                        tracing::warn!(closed, "NATS link lost: every socket of this node closed");
                    }
                }
            }))
        });
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let Ok(permit) = connections.clone().try_acquire_owned() else {
                            continue;
                        };
                        let ticket = admission.admit(Source::of(peer));
                        let app = app.clone();
                        let tls = self.tls.clone();
                        tokio::spawn(async move {
                            until_evicted(ticket, move |admitted| async move {
                                match tls {
                                    None => serve_connection(stream, app, admitted).await,
                                    Some(acceptor) => {
                                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                            Ok(Ok(stream)) => serve_connection(stream, app, admitted).await,
                                            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                                            Err(_) => tracing::debug!("TLS handshake timed out"),
                                        }
                                    }
                                }
                            })
                            .await;
                            drop(permit);
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Rereads the credentials file of a running rendezvous.
#[derive(Clone)]
pub struct CredentialsReloader(Arc<AppState>);

impl CredentialsReloader {
    /// Reread the file and apply it to what is open: pins displace bindings to other keys,
    /// sockets of revoked credentials close and their streams are reset
    /// (`router.rs`). On error the credentials in force stay.
    ///
    /// # Errors
    /// [`CredentialsError`] naming what is wrong with the file.
    pub fn reload(&self) -> Result<(), CredentialsError> {
        let fresh = Credentials::load(&self.0.credentials_file)?;
        let fresh = Arc::new(fresh);
        *self
            .0
            .credentials
            .write()
            .unwrap_or_else(|p| p.into_inner()) = fresh.clone();
        let closed = self.0.router.enforce(&fresh);
        if closed > 0 {
            tracing::info!(closed, "sockets of revoked credentials closed");
        }
        Ok(())
    }
}

/// A connection's way out of the admission pool: the [`authenticate`] middleware marks it once
/// a request presented a valid token.
#[derive(Clone)]
struct Admitted(Arc<tokio::sync::watch::Sender<bool>>);

/// Serve one connection (`serve`, given the [`Admitted`] marker to put in its requests) while it
/// holds `ticket` in the admission pool: closed if the pool evicts it first, out of the pool
/// once a request authenticated.
async fn until_evicted<F>(ticket: PendingTicket, serve: impl FnOnce(Admitted) -> F)
where
    F: std::future::Future<Output = ()>,
{
    let (marker, mut admitted) = tokio::sync::watch::channel(false);
    let serve = serve(Admitted(Arc::new(marker)));
    tokio::pin!(serve);
    let mut ticket = Some(ticket);
    loop {
        tokio::select! {
            () = &mut serve => return,
            () = evicted(&mut ticket) => {
                tracing::debug!("pending connection evicted: the admission pool is full");
                return;
            }
            changed = admitted.changed(), if ticket.is_some() => {
                if changed.is_err() || *admitted.borrow() {
                    // Authenticated (or the marker is gone with the service): out of the pool.
                    ticket = None;
                }
            }
        }
    }
}

async fn serve_connection<S>(stream: S, app: axum::Router, admitted: Admitted)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app.layer(Extension(admitted)));
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(UPGRADE_HEAD_TIMEOUT)
        .max_buf_size(MAX_UPGRADE_HEAD_BYTES.max(8192))
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(error) = result {
        tracing::debug!(%error, "HTTP connection ended with an error");
    }
}

fn app(state: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/environments/{id}", post(register).delete(unbind))
        .route("/v1/environments/{id}/connect", post(connect))
        .route("/v1/environments/{id}/executor", get(executor_socket))
        .route("/v1/environments/{id}/harness", get(harness_socket))
        .fallback(|| async { text(StatusCode::NOT_FOUND, "no such endpoint\n") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .layer(DefaultBodyLimit::max(MAX_REQUEST_BODY_BYTES))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// `GET /readyz`: 200 when the node serves; in cluster mode 503 while its NATS link is down.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match &state.cluster {
        Some(cluster) if !cluster.is_linked() => text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("NATS link down (node {})\n", cluster.node()),
        ),
        Some(cluster) => text(
            StatusCode::OK,
            &format!("ready (node {}, NATS linked)\n", cluster.node()),
        ),
        None => text(StatusCode::OK, "ready\n"),
    }
}

/// The cluster registry's failure as a response: 503 (another node may answer).
fn cluster_unavailable(error: &ClusterRegistryError) -> Response {
    tracing::warn!(%error, "cluster registry unavailable");
    text(StatusCode::SERVICE_UNAVAILABLE, &format!("{error}\n"))
}

/// Name and key of `id`: from the cluster registry in cluster mode, else from memory.
async fn lookup(state: &AppState, id: &str) -> Result<Option<(String, String)>, Response> {
    match &state.cluster {
        Some(cluster) => match cluster.lookup(id).await {
            Ok(binding) => Ok(binding.map(|b| (b.name, b.public_key))),
            Err(error) => Err(cluster_unavailable(&error)),
        },
        None => Ok(state.router.lookup(id)),
    }
}

/// A plain-text response; a refusal also closes the connection (a client that was refused
/// has nothing more to say on it, and a refused upgrade must not linger).
fn text(status: StatusCode, body: &str) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.to_owned(),
    )
        .into_response();
    if status.is_client_error() || status.is_server_error() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{error}\n")),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get(header::AUTHORIZATION)?
        .as_bytes()
        .strip_prefix(b"Bearer ")
}

/// Every request past this point carries a known credential ([`Caller`] in its extensions).
async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller =
        bearer(request.headers()).and_then(|token| state.credentials().authenticate(token));
    match caller {
        Some(caller) => {
            if let Some(Admitted(marker)) = request.extensions().get::<Admitted>() {
                marker.send_replace(true);
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n"),
    }
}

/// Check the caller for `role` and `id`: `Some(response)` to send when refused.
fn refusal(request_caller: Option<&Caller>, role: Role, id: &str) -> Option<Response> {
    let Some(caller) = request_caller else {
        return Some(text(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token\n",
        ));
    };
    if let Err(reason) = validate_environment_id(id) {
        return Some(text(StatusCode::BAD_REQUEST, &format!("{reason}\n")));
    }
    if caller.role != role {
        tracing::info!(credential = %caller.label, environment = id, "refused: wrong role");
        return Some(text(
            StatusCode::FORBIDDEN,
            &format!(
                "this {} credential may not do this; it needs an {} credential\n",
                caller.role.name(),
                role.name()
            ),
        ));
    }
    if !caller.covers(id) {
        tracing::info!(credential = %caller.label, environment = id, "refused: environment not granted");
        return Some(text(
            StatusCode::FORBIDDEN,
            &format!("this credential is not granted environment {id:?}\n"),
        ));
    }
    None
}

async fn register(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Executor, &id) {
        return response;
    }
    // Read only once authorised, bounded in size and in time (a trickled body must not hold
    // a connection).
    let body = match tokio::time::timeout(
        UPGRADE_HEAD_TIMEOUT,
        axum::body::to_bytes(request.into_body(), MAX_REQUEST_BODY_BYTES),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("body over MAX_REQUEST_BODY_BYTES ({MAX_REQUEST_BODY_BYTES})\n"),
            );
        }
        Err(_) => {
            return text(
                StatusCode::REQUEST_TIMEOUT,
                &format!("body not received within {UPGRADE_HEAD_TIMEOUT:?}\n"),
            );
        }
    };
    let registration: RegisterRequest = match serde_json::from_slice(&body) {
        Ok(registration) => registration,
        Err(error) => {
            return text(
                StatusCode::BAD_REQUEST,
                &format!("body must be {{\"name\", \"publicKey\"}}: {error}\n"),
            );
        }
    };
    let credentials = state.credentials();
    let pinned = credentials.pinned_key(&id);
    let registered = match &state.cluster {
        Some(cluster) => register_in_cluster(&state, cluster, &id, registration, pinned).await,
        None => state.router.register(&id, registration, pinned),
    };
    match registered {
        Ok(()) => {
            tracing::info!(environment = %id, "environment registered");
            json(&RegisterResponse {
                rendezvous_url: format!("{}/v1/environments/{id}/executor", state.public_url),
            })
        }
        Err(error @ RegisterError::KeyConflict { .. }) => {
            tracing::warn!(environment = %id, "registration with another key refused");
            text(StatusCode::CONFLICT, &format!("{error}\n"))
        }
        Err(RegisterError::Unavailable(reason)) => {
            tracing::warn!(%reason, "cluster registry unavailable");
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the cluster registry is unavailable: {reason}\n"),
            )
        }
        Err(error) => text(StatusCode::BAD_REQUEST, &format!("{error}\n")),
    }
}

/// Cluster mode: bind (or confirm) in the cluster registry by compare-and-set, then hold the
/// binding in this node's table for the executor socket that follows.
async fn register_in_cluster(
    state: &AppState,
    cluster: &Cluster,
    id: &str,
    registration: crate::relay::registry::RegisterRequest,
    pinned: Option<&str>,
) -> Result<(), RegisterError> {
    validate_registration(id, &registration, pinned)?;
    let binding = Binding {
        name: registration.name,
        public_key: registration.public_key,
    };
    match cluster.register(id, &binding, pinned).await {
        Ok(outcome) => {
            if outcome == Registered::Displaced {
                tracing::warn!(
                    environment = id,
                    "an operator's pin displaced the binding to another key"
                );
            }
            state.router.adopt(id, binding.name, &binding.public_key);
            Ok(())
        }
        Err(ClusterRegistryError::Refused(error)) => Err(error),
        Err(error) => Err(RegisterError::Unavailable(error.to_string())),
    }
}

async fn unbind(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Admin, &id) {
        return response;
    }
    let released = match &state.cluster {
        Some(cluster) => match cluster.release(&id).await {
            Ok(released) => released | state.router.unbind(&id),
            Err(error) => return cluster_unavailable(&error),
        },
        None => state.router.unbind(&id),
    };
    if released {
        tracing::info!(environment = %id, "binding released by an operator");
        text(StatusCode::OK, "binding released\n")
    } else {
        text(StatusCode::NOT_FOUND, "environment not registered\n")
    }
}

async fn connect(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Harness, &id) {
        return response;
    }
    let known = match lookup(&state, &id).await {
        Ok(known) => known,
        Err(response) => return response,
    };
    match known {
        Some((name, public_key)) => json(&ConnectResponse {
            rendezvous_url: format!("{}/v1/environments/{id}/harness", state.public_url),
            public_key,
            name,
        }),
        None => text(StatusCode::NOT_FOUND, "environment not registered\n"),
    }
}

async fn executor_socket(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Executor, &id) {
        return response;
    }
    let Some(axum::Extension(caller)) = caller else {
        return text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n");
    };
    let known = match lookup(&state, &id).await {
        Ok(known) => known,
        Err(response) => return response,
    };
    let Some((name, public_key)) = known else {
        return text(StatusCode::NOT_FOUND, "environment not registered\n");
    };
    if state.cluster.is_some() {
        // The socket proves the key the cluster holds, here.
        state.router.adopt(&id, name, &public_key);
    }
    let cluster_slot = match cluster_socket_slot(&state, &caller, &id).await {
        Ok(slot) => slot,
        Err(response) => return response,
    };
    upgrade(state, id, &caller, true, request, cluster_slot)
}

async fn harness_socket(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    caller: Option<axum::Extension<Caller>>,
    request: Request,
) -> Response {
    if let Some(response) = refusal(caller.as_deref(), Role::Harness, &id) {
        return response;
    }
    let Some(axum::Extension(caller)) = caller else {
        return text(StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n");
    };
    match lookup(&state, &id).await {
        Ok(Some(_)) => {}
        Ok(None) => return text(StatusCode::NOT_FOUND, "environment not registered\n"),
        Err(response) => return response,
    }
    let cluster_slot = match cluster_socket_slot(&state, &caller, &id).await {
        Ok(slot) => slot,
        Err(response) => return response,
    };
    upgrade(state, id, &caller, false, request, cluster_slot)
}

/// Cluster mode: count the socket against its credential across the cluster (503 past
/// `--max-sockets-per-credential`, or when the cluster cannot count); `None` on a single node.
async fn cluster_socket_slot(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<Option<ClusterSocketSlot>, Response> {
    let Some(cluster) = &state.cluster else {
        return Ok(None);
    };
    match cluster
        .take_socket(caller.secret.token(), state.max_per_credential)
        .await
    {
        Ok(Some(slot)) => Ok(Some(slot)),
        Ok(None) => {
            tracing::info!(
                credential = %caller.label,
                environment = id,
                "refused: too many sockets for one credential across the cluster"
            );
            Err(too_many_sockets(state.max_per_credential))
        }
        Err(error) => Err(cluster_unavailable(&error)),
    }
}

fn too_many_sockets(max: usize) -> Response {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        &format!(
            "too many sockets for this credential: at most {max} at once \
             (exec-rendezvous --max-sockets-per-credential)\n"
        ),
    )
}

/// Answer a websocket upgrade with 101 and serve the socket once hyper hands it over.
fn upgrade(
    state: Arc<AppState>,
    id: String,
    caller: &Caller,
    executor: bool,
    mut request: Request,
    cluster_slot: Option<ClusterSocketSlot>,
) -> Response {
    if state.cluster.as_ref().is_some_and(|c| !c.is_linked()) {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node lost its NATS link; try another node\n",
        );
    }
    let headers = request.headers();
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return text(StatusCode::BAD_REQUEST, "expected a websocket upgrade\n");
    };
    if !is_upgrade {
        return text(StatusCode::BAD_REQUEST, "expected a websocket upgrade\n");
    }
    let Ok(permit) = state.sockets.clone().try_acquire_owned() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "too many sockets: MAX_RENDEZVOUS_CONNECTIONS ({MAX_RENDEZVOUS_CONNECTIONS})\n"
            ),
        );
    };
    let credential = caller.label.as_str();
    let secret = caller.secret.clone();
    let Some(slot) = CredentialSocket::take(&state, credential) else {
        tracing::info!(
            credential,
            environment = id,
            "refused: too many sockets for one credential"
        );
        return too_many_sockets(state.max_per_credential);
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "websocket upgrade failed");
                return;
            }
        };
        let socket = WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            WsRole::Server,
            Some(relay_websocket_config()),
        )
        .await;
        if executor {
            state.router.serve_executor(&id, socket, secret).await;
        } else {
            state.router.serve_harness(&id, socket, secret).await;
        }
        drop((slot, permit, cluster_slot));
    });
    let accept = derive_accept_key(key.as_bytes());
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(value) = HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, value);
    }
    response
}
