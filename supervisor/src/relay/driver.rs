//! The task that runs one relay stream: frames from the socket in, frames to the socket out,
//! whole messages to and from the application, timers. Shared by both ends.
//!
//! Ordering rules:
//! - After every wake-up: deliver events, then send every frame the stream has, then sleep until
//!   the next frame, application message, reconnect or the stream's own deadline.
//! - A message the application cannot take yet is held (one at most) and the stream stops
//!   delivering; the relay's receive limits then push back on the peer.
//! - When the application closes, the stream lingers up to [`CLOSE_LINGER`] for its last
//!   messages to be acknowledged, then resets.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::SinkExt;
use proto::relay::limits::MAX_RELAY_FRAME_BYTES;
use proto::relay::{Frame, SecureStream, StreamEvent};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::tls::{Scheme, TlsError, check_url};
use super::{CLOSE_LINGER, REGISTRY_TIMEOUT, RELAY_READ_BUFFER_BYTES};

/// A websocket to the rendezvous.
pub type RelaySocket = WebSocketStream<RelayIo>;

/// The byte stream under a [`RelaySocket`]: TCP, or TLS over TCP for `wss://`.
pub enum RelayIo {
    /// `ws://` (loopback only).
    Plain(TcpStream),
    /// `wss://`.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for RelayIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            RelayIo::Plain(io) => Pin::new(io).poll_read(cx, buf),
            RelayIo::Tls(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RelayIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            RelayIo::Plain(io) => Pin::new(io).poll_write(cx, buf),
            RelayIo::Tls(io) => Pin::new(io).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            RelayIo::Plain(io) => Pin::new(io).poll_flush(cx),
            RelayIo::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            RelayIo::Plain(io) => Pin::new(io).poll_shutdown(cx),
            RelayIo::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// Why a rendezvous websocket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The URL is unusable, or plain text to a non-loopback host.
    #[error(transparent)]
    Url(#[from] TlsError),
    /// The URL has no host or port.
    #[error("websocket URL {url:?} has no host")]
    NoHost {
        /// The URL.
        url: String,
    },
    /// TCP connect failed or took too long.
    #[error("connecting to {address}: {source}")]
    Connect {
        /// host:port.
        address: String,
        /// The error.
        source: std::io::Error,
    },
    /// The TLS handshake failed (untrusted certificate, wrong name, ...).
    #[error("TLS with {host}: {source}")]
    Tls {
        /// The host name checked against the certificate.
        host: String,
        /// The error.
        source: std::io::Error,
    },
    /// The websocket handshake failed (401, 403, 404, ...).
    #[error("websocket handshake: {0}")]
    Handshake(Box<tokio_tungstenite::tungstenite::Error>),
}

/// From the application to its stream.
#[derive(Debug)]
pub enum AppOut {
    /// One whole message.
    Message(Vec<u8>),
    /// Finish: flush, then reset with this reason.
    Close(String),
}

/// The channels a stream task works with.
pub struct StreamChannels {
    /// Frames routed to this stream by the socket task.
    pub inbox: mpsc::Receiver<Frame>,
    /// Encoded frames for the socket (a full queue drops the frame).
    pub outbox: mpsc::Sender<Vec<u8>>,
    /// Whole messages for the application.
    pub to_app: mpsc::Sender<Vec<u8>>,
    /// Messages from the application.
    pub from_app: mpsc::Receiver<AppOut>,
    /// Bumped each time the socket reconnects.
    pub reconnects: watch::Receiver<u64>,
    /// Told once the handshake finished (`Ok`) or the stream closed before (`Err(reason)`).
    pub established: Option<oneshot::Sender<Result<(), String>>>,
    /// Set when the peer proved it holds the keys (executor: pending-handshake accounting).
    pub confirmed: Arc<AtomicBool>,
}

/// The websocket settings for relay sockets: a frame never exceeds [`MAX_RELAY_FRAME_BYTES`];
/// reads go through a [`RELAY_READ_BUFFER_BYTES`] buffer.
pub fn relay_websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_RELAY_FRAME_BYTES))
        .max_frame_size(Some(MAX_RELAY_FRAME_BYTES))
        .read_buffer_size(RELAY_READ_BUFFER_BYTES)
}

/// Open a websocket to the rendezvous with the bearer token: `wss://` through `tls`, or
/// `ws://` to a loopback host only.
///
/// # Errors
/// [`SocketError`] naming the step that failed.
pub async fn connect_socket(
    url: &str,
    token: &str,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<RelaySocket, SocketError> {
    let scheme = check_url(url, ["ws", "wss"])?;
    let handshake = |e| SocketError::Handshake(Box::new(e));
    let mut request = url.into_client_request().map_err(handshake)?;
    let value = format!("Bearer {token}").parse().map_err(|_| {
        handshake(tokio_tungstenite::tungstenite::Error::Url(
            tokio_tungstenite::tungstenite::error::UrlError::UnsupportedUrlScheme,
        ))
    })?;
    request.headers_mut().insert("authorization", value);
    let no_host = || SocketError::NoHost {
        url: url.to_owned(),
    };
    let host = request.uri().host().ok_or_else(no_host)?.to_owned();
    let port = request
        .uri()
        .port_u16()
        .unwrap_or(if scheme == Scheme::Tls { 443 } else { 80 });
    let bare_host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let address = format!("{host}:{port}");
    let connect = |source| SocketError::Connect {
        address: address.clone(),
        source,
    };
    let tcp = tokio::time::timeout(
        REGISTRY_TIMEOUT,
        TcpStream::connect((bare_host.as_str(), port)),
    )
    .await
    .map_err(|_| connect(std::io::ErrorKind::TimedOut.into()))?
    .map_err(connect)?;
    let _ = tcp.set_nodelay(true);
    let io = match scheme {
        Scheme::Plain => RelayIo::Plain(tcp),
        Scheme::Tls => {
            let tls_error = |source| SocketError::Tls {
                host: bare_host.clone(),
                source,
            };
            let name = rustls_pki_types::ServerName::try_from(bare_host.clone())
                .map_err(|e| tls_error(std::io::Error::other(e)))?;
            let stream = tokio::time::timeout(
                REGISTRY_TIMEOUT,
                tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp),
            )
            .await
            .map_err(|_| tls_error(std::io::ErrorKind::TimedOut.into()))?
            .map_err(tls_error)?;
            RelayIo::Tls(Box::new(stream))
        }
    };
    let (socket, _) =
        tokio_tungstenite::client_async_with_config(request, io, Some(relay_websocket_config()))
            .await
            .map_err(handshake)?;
    Ok(socket)
}

/// A socket's queue of frames to send, which [`send_batch`] takes more from without waiting.
pub trait Outbox<F> {
    /// The next queued frame, if one is queued now.
    fn try_next(&mut self) -> Option<F>;
}

impl<F> Outbox<F> for mpsc::Receiver<F> {
    fn try_next(&mut self) -> Option<F> {
        self.try_recv().ok()
    }
}

/// Send every queued frame on `sink`, batching what is already queued into one flush.
///
/// # Errors
/// The websocket error; the socket is then lost.
pub async fn send_batch<S, F>(
    sink: &mut S,
    first: F,
    outbox: &mut impl Outbox<F>,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: futures_util::Sink<WsMessage, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
    F: Into<tokio_tungstenite::tungstenite::Bytes>,
{
    sink.feed(WsMessage::binary(first)).await?;
    for _ in 0..256 {
        match outbox.try_next() {
            Some(frame) => sink.feed(WsMessage::binary(frame)).await?,
            None => break,
        }
    }
    sink.flush().await
}

/// Log a data frame's seq and ack at trace level (`RUST_LOG=supervisor::relay::driver=trace`):
/// with both ends' logs, a segment can be followed from send to receipt.
fn trace_data(direction: &str, frame: &Frame) {
    if tracing::enabled!(tracing::Level::TRACE)
        && let proto::relay::Body::Data(data) = &frame.body
    {
        tracing::trace!(stream = %frame.stream_id, seq = data.seq, ack = ?frame.ack, direction, "relay data");
    }
}

/// Run the stream until it closes; returns why.
pub async fn run_stream(mut stream: SecureStream, mut channels: StreamChannels) -> String {
    let mut held: Option<Vec<u8>> = None;
    let mut closing: Option<Instant> = None;
    let mut closed: Option<String> = None;
    let mut reconnects_alive = true;
    let mut app_alive = true;
    loop {
        let now = Instant::now();
        if held.is_none() {
            while let Some(event) = stream.poll_event() {
                match event {
                    StreamEvent::Established => {
                        if let Some(tx) = channels.established.take() {
                            let _ = tx.send(Ok(()));
                        }
                    }
                    StreamEvent::Message(message) => match channels.to_app.try_send(message) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(message)) => {
                            held = Some(message);
                            break;
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            closing.get_or_insert(now);
                        }
                    },
                    StreamEvent::Closed { reason, by_peer } => {
                        tracing::debug!(stream = stream.stream_id(), %reason, by_peer, "relay stream closed");
                        closed = Some(reason);
                    }
                }
            }
        }
        if let Some(since) = closing
            && !stream.is_closed()
            && (stream.is_idle() || now >= since + CLOSE_LINGER)
        {
            stream.reset("closed by the application");
            // The application is done with the stream: end now (the reset is queued below)
            // instead of at the next timer, up to CLOSE_LINGER later.
            while let Some(event) = stream.poll_event() {
                if let StreamEvent::Closed { reason, .. } = event {
                    closed = Some(reason);
                }
            }
        }
        while let Some(frame) = stream.poll_transmit(now.into_std()) {
            trace_data("out", &frame);
            if channels.outbox.try_send(frame.into_encoded()).is_err() {
                tracing::debug!(
                    stream = stream.stream_id(),
                    "socket outbox full: frame dropped"
                );
            }
        }
        if stream.is_confirmed() {
            channels.confirmed.store(true, Ordering::Relaxed);
        }
        if let Some(reason) = closed.take() {
            if let Some(tx) = channels.established.take() {
                let _ = tx.send(Err(reason.clone()));
            }
            return reason;
        }
        let mut deadline = stream
            .poll_timeout()
            .map(Instant::from_std)
            .unwrap_or(now + Duration::from_secs(3600));
        if let Some(since) = closing {
            deadline = deadline.min(since + CLOSE_LINGER);
        }
        let accepting = closing.is_none() && app_alive && stream.can_accept_message();
        tokio::select! {
            frame = channels.inbox.recv() => {
                let Some(frame) = frame else {
                    return "the relay socket task ended".into();
                };
                let now = Instant::now().into_std();
                trace_data("in", &frame);
                stream.handle_frame(frame, now);
                for _ in 0..256 {
                    match channels.inbox.try_recv() {
                        Ok(frame) => {
                            trace_data("in", &frame);
                            stream.handle_frame(frame, now);
                        }
                        Err(_) => break,
                    }
                }
            }
            permit = channels.to_app.reserve(), if held.is_some() => {
                match (permit, held.take()) {
                    (Ok(permit), Some(message)) => permit.send(message),
                    _ => { closing.get_or_insert(Instant::now()); }
                }
            }
            out = channels.from_app.recv(), if accepting => {
                let mut next = out;
                loop {
                    match next {
                        Some(AppOut::Message(message)) => {
                            if let Err(error) = stream.send_message(message) {
                                tracing::warn!(stream = stream.stream_id(), %error, "relay stream refused a message");
                                stream.reset(error.to_string());
                                break;
                            }
                        }
                        Some(AppOut::Close(reason)) => {
                            tracing::debug!(stream = stream.stream_id(), %reason, "application closed the stream");
                            closing.get_or_insert(Instant::now());
                            break;
                        }
                        None => {
                            app_alive = false;
                            closing.get_or_insert(Instant::now());
                            break;
                        }
                    }
                    if !stream.can_accept_message() {
                        break;
                    }
                    next = match channels.from_app.try_recv() {
                        Ok(out) => Some(out),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                    };
                }
            }
            changed = channels.reconnects.changed(), if reconnects_alive => {
                if changed.is_ok() {
                    stream.on_reconnect(Instant::now().into_std());
                } else {
                    reconnects_alive = false;
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                if let Some(reliable) = stream.reliable() {
                    tracing::trace!(stream = stream.stream_id(), held = held.is_some(), state = %reliable.summary(), "relay stream timer");
                }
                stream.handle_timeout(Instant::now().into_std());
            }
        }
    }
}
