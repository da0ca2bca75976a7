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
mod endpoints;
pub(crate) mod queue;
pub(crate) mod queued;
pub(crate) mod registration;
pub(crate) mod router;

pub use registration::MAX_ENVIRONMENTS;
pub use router::{MAX_STREAMS_PER_CREDENTIAL, PROOF_TIMEOUT};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use axum::Extension;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::limits::{
    MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_SOURCE, MAX_UPGRADE_HEAD_BYTES, UPGRADE_HEAD_TIMEOUT,
};
use crate::transport::admission::{Admission, PendingTicket, Source, evicted};
use cluster::{Cluster, ClusterError, ClusterOptions};
use credentials::Credentials;
pub use credentials::CredentialsError;
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
    /// Environments bound at once, on this node or across the cluster (default
    /// [`MAX_ENVIRONMENTS`]); a registration of one more new id is refused. At least 1.
    pub max_environments: usize,
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
                router: Router::with_cluster(
                    options.max_streams_per_credential,
                    options.max_environments,
                    cluster.clone(),
                ),
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
        let app = endpoints::app(self.state.clone());
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

/// A connection's way out of the admission pool: the `authenticate` middleware marks it once
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
