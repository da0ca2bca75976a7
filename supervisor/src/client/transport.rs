//! How the client reaches a server: a [`Transport`] opens one message channel per connection
//! generation. [`WebSocketTransport`] speaks to a local `exec-server` over `ws://` or `unix:`;
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

#[derive(Debug, Clone)]
enum Target {
    Tcp { host_port: String },
    Unix { path: std::path::PathBuf },
}

/// A websocket to a local `exec-server`: `ws://HOST:PORT[/PATH]` or `unix:/path.sock`, with an
/// optional bearer token sent as `Authorization: Bearer <token>` on the upgrade.
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
    /// Parse `url`.
    ///
    /// # Errors
    /// [`ExecServerError::InvalidUrl`] for anything but `ws://HOST:PORT[/PATH]` or
    /// `unix:/absolute/path`.
    pub fn new(
        url: &str,
        auth_token: Option<String>,
        connect_timeout: Duration,
    ) -> Result<Self, ExecServerError> {
        let invalid = |reason: &str| ExecServerError::InvalidUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let target = if let Some(path) = url.strip_prefix("unix:") {
            let path = std::path::PathBuf::from(path);
            if !path.is_absolute() {
                return Err(invalid("the socket path must be absolute"));
            }
            Target::Unix { path }
        } else if let Some(rest) = url.strip_prefix("ws://") {
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
            Target::Tcp {
                host_port: host_port.to_owned(),
            }
        } else {
            return Err(invalid("unsupported scheme"));
        };
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
            Target::Tcp { host_port } => {
                let stream = tokio::net::TcpStream::connect(host_port.as_str())
                    .await
                    .map_err(|e| error(e.to_string()))?;
                stream.set_nodelay(true).map_err(|e| error(e.to_string()))?;
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
            Err(WsError::Http(response)) if response.status() == StatusCode::UNAUTHORIZED => {
                return Err(ExecServerError::Unauthorized {
                    endpoint: self.url.clone(),
                    token_sent: self.auth_token.is_some(),
                });
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
