//! Listeners (TCP and unix socket) and the per-connection handshake.
//!
//! Every accepted stream is admitted to the pending pool ([`admission`]), finishes its TLS
//! handshake on a `wss://` listener, and goes through [`http::read_head`]; an upgrade without
//! the bearer token is then judged by who owns the peer's socket ([`access`]), and only an
//! accepted upgrade reaches the JSON-RPC layer in
//! [`crate::rpc::connection`], which trades the pending slot for a connection slot at
//! `initialize`. No connection slot is taken before that, so sockets that never speak cannot
//! lock out clients that do.

pub mod access;
pub mod admission;
pub mod frame_meter;
pub mod hangup;
pub mod http;
pub mod identity;

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::limits::{MAX_FRAME_BYTES, UPGRADE_HEAD_TIMEOUT};
use crate::listen::ListenAddress;
use crate::state::ServerState;
use admission::{PendingTicket, Source};
use identity::ClientIdentity;

/// A bound listener.
pub enum Listener {
    /// TCP, serving `wss://` when it has a TLS acceptor.
    Tcp(TcpListener, Option<tokio_rustls::TlsAcceptor>),
    /// Unix socket; the file is removed when the listener is dropped.
    Unix(UnixListener, UnixSocketFile),
}

/// Removes the socket file on drop.
pub struct UnixSocketFile(PathBuf);

impl Drop for UnixSocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Why binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The OS refused the bind.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// What we tried to bind.
        address: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A non-socket file is in the way of the unix socket.
    #[error("cannot listen on unix:{0}: a file that is not a socket already exists there")]
    NotASocket(PathBuf),
}

impl Listener {
    /// Bind the address. A unix socket is created with mode 0600; a stale socket file is replaced.
    /// A `wss://` address serves TLS with `tls` (the caller checked it is given).
    ///
    /// # Errors
    /// [`BindError`] naming the address.
    pub async fn bind(
        address: &ListenAddress,
        tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    ) -> Result<Self, BindError> {
        match address {
            ListenAddress::Tcp(socket_address) | ListenAddress::Wss(socket_address) => {
                let acceptor = match address {
                    ListenAddress::Wss(_) => tls.map(tokio_rustls::TlsAcceptor::from),
                    _ => None,
                };
                // Peer lookups of every accepted client share this one netlink socket.
                crate::sys::sock_diag::open_shared();
                TcpListener::bind(socket_address)
                    .await
                    .map(|listener| Self::Tcp(listener, acceptor))
                    .map_err(|source| BindError::Bind {
                        address: socket_address.to_string(),
                        source,
                    })
            }
            ListenAddress::Unix(path) => {
                use std::os::unix::fs::FileTypeExt;
                if let Ok(metadata) = std::fs::symlink_metadata(path) {
                    if !metadata.file_type().is_socket() {
                        return Err(BindError::NotASocket(path.clone()));
                    }
                    let _ = std::fs::remove_file(path);
                }
                // Only the owner may connect: create the socket under umask 0177 so it is never
                // reachable with wider permissions, not even briefly. The server is still
                // single-threaded in effect here (no other task creates files at startup).
                let previous =
                    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
                let bound = UnixListener::bind(path);
                nix::sys::stat::umask(previous);
                let listener = bound.map_err(|source| BindError::Bind {
                    address: format!("unix:{}", path.display()),
                    source,
                })?;
                Ok(Self::Unix(listener, UnixSocketFile(path.clone())))
            }
        }
    }

    /// The URL clients connect to, printed on stdout at startup.
    pub fn url(&self) -> String {
        match self {
            Self::Tcp(listener, tls) => {
                let scheme = if tls.is_some() { "wss" } else { "ws" };
                match listener.local_addr() {
                    Ok(address) => format!("{scheme}://{address}"),
                    Err(_) => format!("{scheme}://unknown"),
                }
            }
            Self::Unix(_, UnixSocketFile(path)) => format!("unix:{}", path.display()),
        }
    }

    /// The TCP port listened on (`None` for a unix socket).
    pub fn tcp_port(&self) -> Option<u16> {
        match self {
            Self::Tcp(listener, _) => listener.local_addr().ok().map(|address| address.port()),
            Self::Unix(..) => None,
        }
    }

    /// Accept one connection and serve it on its own task.
    pub async fn accept_and_spawn(&self, state: &Arc<ServerState>) {
        let accepted = match self {
            Self::Tcp(listener, tls) => listener.accept().await.map(|(stream, peer)| {
                let _ = stream.set_nodelay(true);
                let local = stream.local_addr().ok();
                let identity = PeerIdentity::Tcp { peer, local };
                match tls {
                    None => spawn_connection(stream, Source::of(peer), identity, state.clone()),
                    Some(acceptor) => spawn_tls_connection(
                        stream,
                        acceptor.clone(),
                        Source::of(peer),
                        identity,
                        state.clone(),
                    ),
                }
            }),
            Self::Unix(listener, _) => listener.accept().await.map(|(stream, _)| {
                // The peer's uid; a peer whose credentials cannot be read counts as one local
                // client with every other such peer.
                let identity = stream.peer_cred().map_or(
                    ClientIdentity::Address(Source::Local),
                    |credentials| {
                        ClientIdentity::local(credentials.uid(), || {
                            credentials
                                .pid()
                                .is_some_and(crate::sys::user_namespace::pid_in_own_user_namespace)
                        })
                    },
                );
                let identity = PeerIdentity::Known(identity);
                spawn_connection(stream, Source::Local, identity, state.clone());
            }),
        };
        if let Err(error) = accepted {
            // EMFILE and friends: back off briefly instead of spinning.
            tracing::warn!(%error, "accept failed");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// What is known of a peer at accept; a TCP peer's owner is looked up once it asked to
/// upgrade (while it waits for the answer, so its socket is open).
enum PeerIdentity {
    Known(ClientIdentity),
    Tcp {
        peer: std::net::SocketAddr,
        local: Option<std::net::SocketAddr>,
    },
}

impl PeerIdentity {
    async fn resolve(self) -> ClientIdentity {
        match self {
            Self::Known(identity) => identity,
            // Reads the kernel's socket table: blocking file I/O, off the async workers.
            Self::Tcp { peer, local } => {
                tokio::task::spawn_blocking(move || ClientIdentity::of_tcp(peer, local))
                    .await
                    .unwrap_or(ClientIdentity::Address(Source::of(peer)))
            }
        }
    }
}

fn spawn_connection<S>(stream: S, source: Source, identity: PeerIdentity, state: Arc<ServerState>)
where
    S: AsyncRead + AsyncWrite + AsFd + Unpin + Send + 'static,
{
    let ticket = state.admission.admit(source);
    tokio::spawn(handle_stream(stream, state, ticket, identity));
}

/// Serve a `wss://` connection: the TLS handshake (within [`UPGRADE_HEAD_TIMEOUT`], in the
/// pending pool like the head that follows it), then [`handle_stream`] over the TLS stream.
fn spawn_tls_connection(
    stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    source: Source,
    identity: PeerIdentity,
    state: Arc<ServerState>,
) {
    let mut ticket = state.admission.admit(source);
    tokio::spawn(async move {
        let handshake = tokio::time::timeout(UPGRADE_HEAD_TIMEOUT, acceptor.accept(stream));
        let stream = tokio::select! {
            accepted = handshake => match accepted {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake not finished within {UPGRADE_HEAD_TIMEOUT:?}");
                    return;
                }
            },
            () = ticket.evicted() => {
                tracing::debug!("pending connection evicted during its TLS handshake");
                return;
            }
        };
        handle_stream(TlsConnection(stream), state, ticket, identity).await;
    });
}

/// A `wss://` connection: the TLS stream, with its TCP socket's descriptor for the watch that
/// notices a client that left (`hangup`).
struct TlsConnection(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl AsFd for TlsConnection {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.get_ref().0.as_fd()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The websocket settings: frames and messages above [`MAX_FRAME_BYTES`] are refused on their
/// header.
pub fn websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

async fn handle_stream<S>(
    mut stream: S,
    state: Arc<ServerState>,
    mut ticket: PendingTicket,
    identity: PeerIdentity,
) where
    S: AsyncRead + AsyncWrite + AsFd + Unpin + Send + 'static,
{
    let head = tokio::select! {
        head = http::read_head(&mut stream, state.access.token()) => head,
        () = ticket.evicted() => {
            tracing::debug!("pending connection evicted before its head: the admission pool is full");
            return;
        }
    };
    match head {
        Ok(http::HeadDecision::Upgrade {
            key,
            leftover,
            token,
        }) => {
            let Some(identity) = admit(&mut stream, &state, token, identity).await else {
                return;
            };
            ticket.authenticated();
            if http::write_upgrade(&mut stream, &key).await.is_err() {
                return;
            }
            let budget = crate::budget::ConnectionBudget::new(state.budgets.clone());
            // The peer leaving is noticed even while nothing is read (see `hangup`).
            let hangup = match hangup::PeerHangup::watch(&stream) {
                Ok(hangup) => Arc::new(hangup),
                Err(error) => {
                    tracing::warn!(%error, "cannot watch a connection for its close; dropping it");
                    return;
                }
            };
            // Bytes read past the head are the start of the first frames: the meter follows them.
            let stream = frame_meter::MeteredStream::new(
                stream,
                budget.clone(),
                Some(hangup.clone()),
                &leftover,
            );
            let websocket = WebSocketStream::from_partially_read(
                stream,
                leftover,
                Role::Server,
                Some(websocket_config()),
            )
            .await;
            crate::rpc::connection::serve_pending(
                websocket, state, ticket, identity, budget, hangup,
            )
            .await;
        }
        Ok(http::HeadDecision::Page { page, token }) => {
            if admit(&mut stream, &state, token, identity).await.is_none() {
                return;
            }
            ticket.authenticated();
            match crate::observe::status::page(&state, page).await {
                Ok(body) => {
                    let _ = http::write_page(&mut stream, page.content_type(), &body).await;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot render a status page");
                    let _ = http::write_rejection(
                        &mut stream,
                        "500 Internal Server Error",
                        "the page could not be rendered\n",
                    )
                    .await;
                }
            }
        }
        Ok(http::HeadDecision::Reject { status, body }) => {
            if status.starts_with("401") || status.starts_with("403") {
                state
                    .metrics
                    .listener_refused(if status.starts_with("401") {
                        "wrongToken"
                    } else {
                        "origin"
                    });
            }
            let _ = http::write_rejection(&mut stream, status, body).await;
        }
        Err(error) => tracing::debug!(%error, "dropping connection before upgrade"),
    }
}

/// Admit a peer that passed the head checks (an upgrade, or a `/status` or `/metrics` page): a
/// right token admits it; without one, its owner decides ([`access`]). A refused peer is
/// answered and counted here; `None` then.
async fn admit<S: AsyncWrite + Unpin>(
    stream: &mut S,
    state: &ServerState,
    token: http::TokenPresented,
    identity: PeerIdentity,
) -> Option<ClientIdentity> {
    // Looked up while the peer waits for our answer: its socket is open.
    let identity = identity.resolve().await;
    if token == http::TokenPresented::None
        && let Err(refusal) = state.access.admit_without_token(identity)
    {
        tracing::warn!(peer = %identity, reason = %refusal, "refused a connection");
        state.metrics.listener_refused(refusal.label());
        let _ = http::write_rejection(stream, refusal.status(), &refusal.body()).await;
        return None;
    }
    Some(identity)
}
