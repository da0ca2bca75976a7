//! How the client reaches a server: a [`Transport`] opens one message channel per connection
//! generation. [`WebSocketTransport`] speaks to a local `exec-server` over `ws://` or `unix:`;
//! [`super::RelayTransport`] (remote mode) implements the same small trait.
//!
//! A [`TransportConnection`] is message-oriented: each outgoing `String` is one JSON-RPC message
//! and each incoming item one whole message. The incoming channel ends when the connection is
//! lost; dropping the [`TransportConnection`] tears the connection down.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
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
            if host_port.is_empty() || !host_port.contains(':') {
                return Err(invalid("missing HOST:PORT"));
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
        let (websocket, _response) =
            tokio_tungstenite::client_async_with_config(request, stream, Some(config))
                .await
                .map_err(|e| error(e.to_string()))?;
        let (mut sink, mut stream) = websocket.split();
        let (outgoing, mut to_send) = mpsc::channel::<String>(OUTGOING_QUEUE_MESSAGES);
        let (received, incoming) = mpsc::channel::<Vec<u8>>(INCOMING_QUEUE_MESSAGES);
        let writer = tokio::spawn(async move {
            while let Some(text) = to_send.recv().await {
                if sink.send(WsMessage::text(text)).await.is_err() {
                    return;
                }
            }
            let _ = sink.close().await;
        });
        let reader = tokio::spawn(async move {
            while let Some(frame) = stream.next().await {
                let payload = match frame {
                    Ok(WsMessage::Text(text)) => text.as_bytes().to_vec(),
                    Ok(WsMessage::Binary(bytes)) => bytes.to_vec(),
                    Ok(WsMessage::Close(_)) | Err(_) => break,
                    Ok(_) => continue,
                };
                if received.send(payload).await.is_err() {
                    break;
                }
            }
        });
        Ok(TransportConnection {
            outgoing,
            incoming,
            tasks: vec![writer.abort_handle(), reader.abort_handle()],
        })
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
    }
}
