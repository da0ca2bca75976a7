//! One JSON-RPC connection (a websocket, or a relay stream through [`serve_transport`]): a reader
//! loop, a writer task, and a task per request.
//!
//! Ordering rules:
//! - `initialize` is handled inline by the reader, so every later request sees its session.
//! - Other requests run concurrently, at most [`MAX_INFLIGHT_REQUESTS`] at once; when all slots
//!   are busy the reader stops reading (backpressure on the socket).
//! - All outgoing messages go through one bounded queue drained by the writer task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use proto::error::{ErrorKind, RpcError};
use proto::jsonrpc::{ErrorResponse, Message, Request, RequestId, Response};
use proto::methods::INITIALIZED;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::fs::HandleTable;
use crate::limits::{MAX_FRAME_BYTES, MAX_INFLIGHT_REQUESTS};
use crate::server::ServerState;
use crate::session::Session;

pub use super::outbound::{Outbound, OutboundSender};
use super::outbound::{Queued, outbound_queue};

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// Per-connection state shared with request tasks.
pub struct Connection {
    /// Unique per server run.
    pub id: u64,
    /// Server-wide state.
    pub server: Arc<ServerState>,
    /// Outbound queue.
    pub outbound: OutboundSender,
    /// The session, once initialized.
    session: Mutex<Option<Arc<Session>>>,
    /// Open `fs/open` handles.
    pub handles: HandleTable,
    /// `http/request` slots and active stream ids.
    pub http: crate::http::ConnectionHttp,
    /// Flips to true when the connection ends (cancels long-polls).
    pub closed: watch::Receiver<bool>,
}

impl Connection {
    /// The session, if `initialize` succeeded.
    pub fn session(&self) -> Option<Arc<Session>> {
        self.session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_session(&self, session: Arc<Session>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
    }

    /// Queue a message (waits when the queue is full).
    pub async fn send(&self, message: Message) {
        let _ = self.outbound.send(Outbound::Message(message)).await;
    }
}

/// One incoming JSON-RPC message (or transport condition) for [`serve_transport`].
#[derive(Debug)]
pub enum Inbound {
    /// The bytes of one JSON-RPC message.
    Message(Vec<u8>),
    /// The peer broke the transport's rules (a message too large, invalid UTF-8 in a text frame,
    /// a framing violation); the connection is closed with this code and reason.
    Refused(CloseCode, String),
    /// The transport ended.
    Closed,
}

/// One outgoing item for a transport.
#[derive(Debug)]
pub enum OutboundFrame {
    /// One serialized JSON-RPC message.
    Text(String),
    /// Close with this code and reason (a websocket close frame; a relay reset).
    Close(CloseCode, String),
}

/// Serve one upgraded websocket until it closes.
pub async fn serve<S>(websocket: WebSocketStream<S>, server: Arc<ServerState>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = websocket.split();
    let sink = sink.with(|frame: OutboundFrame| {
        futures_util::future::ready(Ok::<_, WsError>(match frame {
            OutboundFrame::Text(text) => WsMessage::text(text),
            OutboundFrame::Close(code, reason) => WsMessage::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })),
        }))
    });
    let stream = stream.filter_map(|frame| {
        futures_util::future::ready(match frame {
            Ok(WsMessage::Text(text)) => Some(Inbound::Message(text.as_bytes().to_vec())),
            Ok(WsMessage::Binary(bytes)) => Some(Inbound::Message(bytes.to_vec())),
            Ok(WsMessage::Close(_)) => Some(Inbound::Closed),
            Ok(_) => None,
            Err(WsError::Capacity(CapacityError::MessageTooLong { size, .. })) => {
                Some(Inbound::Refused(
                    CloseCode::Size,
                    format!("message of {size} bytes exceeds MAX_FRAME_BYTES ({MAX_FRAME_BYTES})"),
                ))
            }
            Err(WsError::Utf8(_)) => Some(Inbound::Refused(
                CloseCode::Invalid,
                "text frame is not valid UTF-8; send binary frames for other bytes".into(),
            )),
            Err(WsError::Protocol(error)) => Some(Inbound::Refused(
                CloseCode::Protocol,
                format!("websocket protocol violation: {error}"),
            )),
            Err(error) => {
                tracing::debug!(%error, "websocket error; closing");
                Some(Inbound::Closed)
            }
        })
    });
    serve_transport(Box::pin(stream), Box::pin(sink), server).await;
}

/// Serve one JSON-RPC connection over any transport that carries one message per item (a
/// websocket, a relay stream) until it ends. Behaves exactly like [`serve`] in every other way.
pub async fn serve_transport<I, O>(mut stream: I, mut sink: O, server: Arc<ServerState>)
where
    I: futures_util::Stream<Item = Inbound> + Unpin + Send,
    O: futures_util::Sink<OutboundFrame> + Unpin + Send + 'static,
{
    let (outbound, mut queue) = outbound_queue();
    let writer = tokio::spawn(async move {
        while let Some(item) = queue.recv().await {
            match item {
                Queued::Text(text, budget) => {
                    let sent = sink.send(OutboundFrame::Text(text)).await;
                    // The bytes are out of the queue now; let producers continue.
                    drop(budget);
                    if sent.is_err() {
                        break;
                    }
                }
                Queued::Close(code, reason) => {
                    let _ = sink.send(OutboundFrame::Close(code, reason)).await;
                    break;
                }
            }
        }
        let _ = sink.close().await;
    });
    let (closed_tx, closed) = watch::channel(false);
    let connection = Arc::new(Connection {
        id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
        server: server.clone(),
        outbound,
        session: Mutex::new(None),
        handles: HandleTable::default(),
        http: crate::http::ConnectionHttp::default(),
        closed,
    });
    let slots = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    let mut shutdown = server.shutdown.clone();
    tracing::debug!(connection = connection.id, "connection open");
    loop {
        let frame = tokio::select! {
            frame = stream.next() => frame,
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        };
        let payload = match frame {
            None | Some(Inbound::Closed) => {
                tracing::debug!(
                    connection = connection.id,
                    "the client closed the connection"
                );
                break;
            }
            Some(Inbound::Message(payload)) => payload,
            Some(Inbound::Refused(code, reason)) => {
                tracing::warn!(connection = connection.id, %reason, "closing connection");
                let _ = connection
                    .outbound
                    .send(Outbound::Close(code, reason))
                    .await;
                break;
            }
        };
        handle_payload(&connection, &slots, &payload).await;
    }
    let _ = closed_tx.send(true);
    connection.handles.close_all();
    if let Some(session) = connection.session() {
        server.sessions.detach(&session, connection.id);
    }
    // Let queued responses drain briefly, then stop the writer.
    let _ = connection
        .outbound
        .try_send(Outbound::Close(CloseCode::Normal, String::new()));
    drop(connection);
    let abort = writer.abort_handle();
    if tokio::time::timeout(std::time::Duration::from_secs(2), writer)
        .await
        .is_err()
    {
        abort.abort();
    }
}

async fn handle_payload(connection: &Arc<Connection>, slots: &Arc<Semaphore>, payload: &[u8]) {
    let message = match Message::from_slice(payload) {
        Ok(message) => message,
        Err(error) => {
            connection.send(Message::Error(error.to_response())).await;
            return;
        }
    };
    match message {
        Message::Request(request) if request.method == proto::methods::INITIALIZE => {
            let reply = initialize(connection, &request);
            connection.send(reply_message(request.id, reply)).await;
        }
        Message::Request(request) => {
            let Some(session) = connection.session() else {
                let error = RpcError::invalid_request(
                    ErrorKind::NotInitialized,
                    format!(
                        "{} sent before initialize; send initialize {{clientName}} first",
                        request.method
                    ),
                );
                connection.send(reply_message(request.id, Err(error))).await;
                return;
            };
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let connection = connection.clone();
            tokio::spawn(async move {
                super::dispatch::respond(&connection, &session, request).await;
                drop(slot);
            });
        }
        Message::Notification(notification) if notification.method == INITIALIZED => {}
        Message::Notification(notification) => {
            let error = RpcError::invalid_request(
                ErrorKind::UnexpectedNotification,
                format!(
                    "unexpected notification {:?}; the only client notification is \"initialized\"",
                    notification.method
                ),
            );
            connection
                .send(Message::Error(ErrorResponse {
                    id: RequestId::UNKNOWN,
                    error,
                }))
                .await;
        }
        Message::Response(_) | Message::Error(_) => {
            let error = RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                "unexpected response: this server sends no requests to clients",
            );
            connection
                .send(Message::Error(ErrorResponse {
                    id: RequestId::UNKNOWN,
                    error,
                }))
                .await;
        }
    }
}

fn initialize(connection: &Connection, request: &Request) -> Result<serde_json::Value, RpcError> {
    if connection.session().is_some() {
        return Err(RpcError::invalid_request(
            ErrorKind::AlreadyInitialized,
            "initialize was already called on this connection; open a new connection for another session",
        ));
    }
    let params: proto::methods::initialize::InitializeParams =
        super::dispatch::parse_params(proto::methods::INITIALIZE, request.params.clone())?;
    let sessions = &connection.server.sessions;
    let session = match &params.resume_session_id {
        Some(id) => sessions.resume(id, connection.id, connection.outbound.clone())?,
        None => sessions.create(connection.id, connection.outbound.clone()),
    };
    tracing::info!(connection = connection.id, session_id = %session.id, client = %params.client_name, "initialized");
    connection.set_session(session.clone());
    super::dispatch::to_value(proto::methods::initialize::InitializeResult {
        session_id: session.id.clone(),
    })
}

pub(super) fn reply_message(id: RequestId, reply: Result<serde_json::Value, RpcError>) -> Message {
    match reply {
        Ok(result) => Message::Response(Response { id, result }),
        Err(error) => Message::Error(ErrorResponse { id, error }),
    }
}
