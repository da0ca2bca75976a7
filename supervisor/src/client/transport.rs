//! How the client reaches a server: a [`Transport`] opens one message channel per connection
//! generation. [`WebSocketTransport`] speaks to an `exec-server` over `ws://`, `wss://` (with
//! the `remote` feature, which brings rustls) or `unix:`, and refuses before it connects to send
//! a token over plain `ws://` to a host that is not loopback (`crate::plain_text`);
//! `RelayTransport` (remote mode, feature `remote`) implements the same small trait.
//!
//! A [`TransportConnection`] is message-oriented: each outgoing `String` is one JSON-RPC message
//! and each incoming item one whole message. The incoming channel ends when the connection is
//! lost; dropping the [`TransportConnection`] tears the connection down.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::AbortHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::error::ExecServerError;

/// Largest message accepted from the server. A 32 MiB `fs/readFile` result is about 43 MiB of
/// base64 plus envelope; this leaves room and still bounds memory per message.
pub const MAX_INCOMING_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Messages queued for the socket writer before callers wait (backpressure, not buffering).
pub const OUTGOING_QUEUE_MESSAGES: usize = 256;
/// Whole messages read ahead of the RPC reader.
pub const INCOMING_QUEUE_MESSAGES: usize = 256;
/// Default time to establish one connection (TCP/unix connect plus websocket upgrade).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for each step of a websocket close (sending our close frame, the server's
/// answer): a server that stopped reading must not hold a closing client.
pub const CLOSE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// A boxed, sendable future (what [`Transport::connect`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One established connection: whole JSON-RPC messages in both directions.
pub struct TransportConnection {
    /// Messages to send, one JSON text each. Sending fails once the connection is gone.
    pub outgoing: mpsc::Sender<String>,
    /// Messages received. Ends (`None`) when the connection is lost or closed.
    pub incoming: mpsc::Receiver<Vec<u8>>,
    /// Tasks serving this connection; aborted when the connection is dropped.
    pub tasks: Vec<AbortHandle>,
}

impl Drop for TransportConnection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Something that can open connections to one exec server, again and again (recovery opens a
/// new one after each loss).
pub trait Transport: Send + Sync + 'static {
    /// Open a new connection.
    ///
    /// # Errors
    /// [`ExecServerError::Connect`] (or [`ExecServerError::Timeout`]) when it cannot be opened.
    fn connect(&self) -> BoxFuture<'_, Result<TransportConnection, ExecServerError>>;

    /// Where this transport connects, for messages.
    fn endpoint(&self) -> String;
}

/// Byte stream a websocket runs over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone)]
enum Target {
    Tcp {
        host_port: String,
        /// `wss://`: the TLS settings and the name the certificate must carry.
        #[cfg(feature = "remote")]
        tls: Option<(
            Arc<rustls::ClientConfig>,
            rustls_pki_types::ServerName<'static>,
        )>,
    },
    Unix {
        path: std::path::PathBuf,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp { host_port, .. } => {
                f.debug_struct("Tcp").field("host_port", host_port).finish()
            }
            Self::Unix { path } => f.debug_struct("Unix").field("path", path).finish(),
        }
    }
}

/// A websocket to an `exec-server`: `ws://HOST:PORT[/PATH]`, `wss://HOST:PORT[/PATH]` or
/// `unix:/path.sock`, with an optional bearer token sent as `Authorization: Bearer <token>` on
/// the upgrade.
#[derive(Debug, Clone)]
pub struct WebSocketTransport {
    url: String,
    target: Target,
    auth_token: Option<String>,
    connect_timeout: Duration,
    /// Connections whose socket is still open (clones share it).
    open_connections: Arc<watch::Sender<usize>>,
}

impl WebSocketTransport {
    /// Parse `url` ([`Self::with_ca_file`] without a CA file: `wss://` trusts the system's
    /// roots).
    ///
    /// # Errors
    /// As [`Self::with_ca_file`].
    pub fn new(
        url: &str,
        auth_token: Option<String>,
        connect_timeout: Duration,
    ) -> Result<Self, ExecServerError> {
        Self::with_ca_file(url, auth_token, connect_timeout, None)
    }

    /// Parse `url`; a `wss://` server's certificate must chain to the system's roots or to a
    /// certificate of `ca_file` (PEM).
    ///
    /// # Errors
    /// [`ExecServerError::InvalidUrl`] for anything but `ws://HOST:PORT[/PATH]`,
    /// `wss://HOST:PORT[/PATH]` or `unix:/absolute/path`;
    /// [`ExecServerError::PlainTextToken`] for a token to be sent over `ws://` to a host that is
    /// not loopback; [`ExecServerError::Tls`] when the TLS settings are unusable.
    pub fn with_ca_file(
        url: &str,
        auth_token: Option<String>,
        connect_timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, ExecServerError> {
        let invalid = |reason: &str| ExecServerError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (rest, tls) = match (url.strip_prefix("ws://"), url.strip_prefix("wss://")) {
            (Some(rest), _) => (Some(rest), false),
            (None, Some(rest)) => (Some(rest), true),
            (None, None) => (None, false),
        };
        let target = if let Some(path) = url.strip_prefix("unix:") {
            let path = std::path::PathBuf::from(path);
            if !path.is_absolute() {
                return Err(invalid("the socket path must be absolute"));
            }
            Target::Unix { path }
        } else if let Some(rest) = rest {
            let host_port = rest.split('/').next().unwrap_or_default();
            let Some((host, port)) = host_port.rsplit_once(':').filter(|(host, _)| {
                !host.is_empty() && (!host.starts_with('[') || host.ends_with(']'))
            }) else {
                return Err(invalid("missing HOST:PORT"));
            };
            match port.parse::<u16>() {
                Ok(0) => return Err(invalid("port 0 cannot be connected to")),
                Ok(_) => {}
                Err(_) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                    return Err(invalid(&format!(
                        "port {port} is out of range (1 to 65535)"
                    )));
                }
                Err(_) => {
                    return Err(invalid(&format!(
                        "port {port:?} (after host {host:?}) is not a number from 1 to 65535"
                    )));
                }
            }
            if auth_token.is_some() && !tls && !crate::plain_text::is_loopback_host(host) {
                return Err(ExecServerError::PlainTextToken {
                    url: url.to_owned(),
                    host: host.to_owned(),
                });
            }
            Target::Tcp {
                host_port: host_port.to_owned(),
                #[cfg(feature = "remote")]
                tls: if tls {
                    Some(tls_settings(url, host, ca_file)?)
                } else {
                    None
                },
            }
        } else {
            return Err(invalid("unsupported scheme"));
        };
        #[cfg(not(feature = "remote"))]
        if tls || ca_file.is_some() {
            return Err(invalid(
                "wss:// needs the supervisor crate's `remote` feature (rustls)",
            ));
        }
        Ok(Self {
            url: url.to_owned(),
            target,
            auth_token,
            connect_timeout,
            open_connections: Arc::new(watch::channel(0).0),
        })
    }

    async fn open(&self) -> Result<TransportConnection, ExecServerError> {
        let error = |reason: String| ExecServerError::Connect {
            endpoint: self.url.clone(),
            reason,
        };
        let (stream, request_url): (Box<dyn Io>, String) = match &self.target {
            Target::Unix { path } => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| error(e.to_string()))?;
                (Box::new(stream), "ws://localhost/".to_owned())
            }
            Target::Tcp {
                host_port,
                #[cfg(feature = "remote")]
                tls,
            } => {
                let stream = tokio::net::TcpStream::connect(host_port.as_str())
                    .await
                    .map_err(|e| error(e.to_string()))?;
                stream.set_nodelay(true).map_err(|e| error(e.to_string()))?;
                #[cfg(feature = "remote")]
                if let Some((config, name)) = tls {
                    let stream = tokio_rustls::TlsConnector::from(config.clone())
                        .connect(name.clone(), stream)
                        .await
                        .map_err(|e| error(format!("TLS handshake: {e}")))?;
                    (Box::new(stream), self.url.clone())
                } else {
                    (Box::new(stream), self.url.clone())
                }
                #[cfg(not(feature = "remote"))]
                (Box::new(stream), self.url.clone())
            }
        };
        let mut request = request_url
            .into_client_request()
            .map_err(|e| error(e.to_string()))?;
        if let Some(token) = &self.auth_token {
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| error("the auth token is not a valid header value".into()))?;
            request.headers_mut().insert("Authorization", value);
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_INCOMING_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_INCOMING_MESSAGE_BYTES));
        let websocket = match tokio_tungstenite::client_async_with_config(
            request,
            stream,
            Some(config),
        )
        .await
        {
            Ok((websocket, _response)) => websocket,
            Err(WsError::Http(response)) => {
                let reason = response
                    .body()
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                if response.status() == StatusCode::UNAUTHORIZED {
                    return Err(ExecServerError::Unauthorized {
                        endpoint: self.url.clone(),
                        token_sent: self.auth_token.is_some(),
                        reason,
                    });
                }
                return Err(error(format!("HTTP {}: {reason}", response.status())));
            }
            Err(e) => return Err(error(e.to_string())),
        };
        Ok(serve(
            websocket,
            OpenConnection::new(&self.open_connections),
        ))
    }

    /// Waits until every connection this transport (or a clone) opened has finished its close
    /// handshake, or was lost. Bound it with a timeout: a server that never answers the close
    /// keeps it waiting until [`CLOSE_HANDSHAKE_TIMEOUT`].
    pub async fn wait_connections_closed(&self) {
        let mut open = self.open_connections.subscribe();
        let _ = open.wait_for(|count| *count == 0).await;
    }
}

/// The TLS settings for a `wss://` URL to `host`: the system's roots plus `ca_file`
/// (`relay::tls::client_config`, the remote client's), and the name the certificate must carry.
#[cfg(feature = "remote")]
fn tls_settings(
    url: &str,
    host: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<
    (
        Arc<rustls::ClientConfig>,
        rustls_pki_types::ServerName<'static>,
    ),
    ExecServerError,
> {
    let tls_error = |reason: String| ExecServerError::Tls {
        url: url.to_owned(),
        reason,
    };
    let config = crate::relay::tls::client_config(ca_file).map_err(|e| tls_error(e.to_string()))?;
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let name = rustls_pki_types::ServerName::try_from(bare)
        .map_err(|e| tls_error(format!("{host:?} is not a server name: {e}")))?;
    Ok((config, name))
}

/// Counts one open websocket while its tasks live.
struct OpenConnection(Arc<watch::Sender<usize>>);

impl OpenConnection {
    fn new(count: &Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|open| *open += 1);
        Self(count.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open = open.saturating_sub(1));
    }
}

/// Bridge one websocket to the client's message channels.
///
/// Neither task is in [`TransportConnection::tasks`], so dropping the connection does not cut
/// the socket: the reader sees the client's incoming channel close, asks the writer to send a
/// close frame, and reads on until the server's close frame answers it (or
/// [`CLOSE_HANDSHAKE_TIMEOUT`] passes), so the server sees a websocket closed properly, not a
/// reset. A lost connection ends both tasks the same way, at once.
fn serve<S>(websocket: WebSocketStream<S>, open: OpenConnection) -> TransportConnection
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = websocket.split();
    let (outgoing, mut to_send) = mpsc::channel::<String>(OUTGOING_QUEUE_MESSAGES);
    let (received, incoming) = mpsc::channel::<Vec<u8>>(INCOMING_QUEUE_MESSAGES);
    let close_requested = Arc::new(Notify::new());
    let writer = {
        let close_requested = close_requested.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    text = to_send.recv() => match text {
                        Some(text) => {
                            if sink.send(WsMessage::text(text)).await.is_err() {
                                return;
                            }
                        }
                        None => break,
                    },
                    () = close_requested.notified() => break,
                }
            }
            let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, sink.close()).await;
        })
    };
    tokio::spawn(async move {
        let _open = open;
        loop {
            tokio::select! {
                frame = stream.next() => {
                    let payload = match frame {
                        Some(Ok(WsMessage::Text(text))) => text.as_bytes().to_vec(),
                        Some(Ok(WsMessage::Binary(bytes))) => bytes.to_vec(),
                        Some(Ok(WsMessage::Close(_)) | Err(_)) | None => break,
                        Some(Ok(_)) => continue,
                    };
                    if received.send(payload).await.is_err() {
                        break;
                    }
                }
                () = received.closed() => break,
            }
        }
        // The client learns at once that the connection is over; then the writer sends the
        // close frame, and the server's answering close frame (or the end of the stream)
        // completes the handshake.
        drop(received);
        close_requested.notify_one();
        let drained = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, async {
            while let Some(Ok(frame)) = stream.next().await {
                if frame.is_close() {
                    break;
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::debug!("the exec server did not answer the websocket close in time");
        }
        let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, writer).await;
    });
    TransportConnection {
        outgoing,
        incoming,
        tasks: Vec::new(),
    }
}

impl Transport for WebSocketTransport {
    fn connect(&self) -> BoxFuture<'_, Result<TransportConnection, ExecServerError>> {
        Box::pin(async move {
            tokio::time::timeout(self.connect_timeout, self.open())
                .await
                .map_err(|_| ExecServerError::Timeout {
                    what: format!("connecting to {}", self.url),
                    timeout: self.connect_timeout,
                })?
        })
    }

    fn endpoint(&self) -> String {
        self.url.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_or_refused_with_the_expected_form() {
        let ok = |url| WebSocketTransport::new(url, None, DEFAULT_CONNECT_TIMEOUT).is_ok();
        assert!(ok("ws://127.0.0.1:9"));
        assert!(ok("ws://localhost:9/"));
        assert!(ok("unix:/tmp/x.sock"));
        assert!(!ok("unix:relative.sock"));
        assert!(!ok("http://127.0.0.1:9"));
        assert!(!ok("ws://"));
        assert!(ok("ws://[::1]:9"));
        let reason = |url| match WebSocketTransport::new(url, None, DEFAULT_CONNECT_TIMEOUT) {
            Err(ExecServerError::InvalidUrl { reason, .. }) => reason,
            other => panic!("{url}: {other:?}"),
        };
        assert_eq!(
            reason("ws://127.0.0.1:99999"),
            "port 99999 is out of range (1 to 65535)"
        );
        assert_eq!(reason("ws://127.0.0.1:0"), "port 0 cannot be connected to");
        assert_eq!(reason("ws://[::1]"), "missing HOST:PORT");
        assert!(reason("ws://h:x").contains("is not a number"));
    }
}
