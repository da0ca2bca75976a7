//! One JSON-RPC connection (a websocket, or a relay stream through [`serve_transport`]): a reader
//! loop, a writer task, and a task per request.
//!
//! Ordering rules:
//! - `initialize` is handled inline by the reader, so every later request sees its session.
//! - Other requests run concurrently, at most [`MAX_INFLIGHT_REQUESTS`] at once; when all slots
//!   are busy the reader stops reading (backpressure on the socket).
//! - All outgoing messages go through one bounded queue drained by the writer task.
//!
//! What the request tasks share of the connection ([`Connection`]) lives in [`super::shared`];
//! the tasks run [`super::dispatch::respond`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use proto::error::{ErrorKind, RpcError};
use proto::jsonrpc::{ErrorResponse, Message, Request, RequestId};
use proto::methods::INITIALIZED;
use proto::methods::call::Call;
use proto::methods::fs::FsRequest;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Bytes;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::budget::{ConnectionBudget, content_answer_bytes};
use crate::fs::HandleTable;
use crate::limits::{
    CLOSE_DRAIN_TIMEOUT, INITIALIZE_TIMEOUT, MAX_CLIENT_NAME_BYTES, MAX_CONNECTIONS,
    MAX_FRAME_BYTES, MAX_HTTP_RESPONSE_BODY_BYTES, MAX_INFLIGHT_REQUESTS, READ_BLOCK_MAX_BYTES,
    READ_DIRECTORY_MAX_ANSWER_BYTES, READ_FILE_MAX_BYTES, SMALL_RESPONSE_BYTES,
};
use crate::state::ServerState;
use crate::transport::admission::{PendingTicket, evicted};
use crate::transport::frame_meter::MeterError;
use crate::transport::hangup::{PeerHangup, peer_gone};
use crate::transport::identity::ClientIdentity;

use crate::outbound::{Outbound, Queued, outbound_queue};

use super::shared::{Connection, ConnectionError, LARGE_MESSAGE_BYTES, reply_message};

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// One incoming JSON-RPC message (or transport condition) for [`serve_transport`].
#[derive(Debug)]
pub enum Inbound {
    /// The bytes of one JSON-RPC message: the transport's own buffer, not a copy (a frame of
    /// tens of MiB copied, and its original freed, on an async worker stalls every connection
    /// that worker serves).
    Message(Bytes),
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
    /// A binary `process/output` frame (only to a client that asked for them).
    Binary(tokio_tungstenite::tungstenite::Bytes),
    /// Close with this code and reason (a websocket close frame; a relay reset).
    Close(CloseCode, String),
}

/// Serve one upgraded websocket until it closes; it still holds its pending slot from admission
/// (see [`serve_admitted`]).
pub async fn serve_pending<S>(
    websocket: WebSocketStream<S>,
    server: Arc<ServerState>,
    ticket: PendingTicket,
    client: ClientIdentity,
    budget: ConnectionBudget,
    hangup: Arc<PeerHangup>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_websocket(websocket, server, Some(ticket), client, budget, hangup).await;
}

async fn serve_websocket<S>(
    websocket: WebSocketStream<S>,
    server: Arc<ServerState>,
    ticket: Option<PendingTicket>,
    client: ClientIdentity,
    budget: ConnectionBudget,
    hangup: Arc<PeerHangup>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sink, stream) = websocket.split();
    let sink = sink.with(|frame: OutboundFrame| {
        futures_util::future::ready(Ok::<_, WsError>(match frame {
            OutboundFrame::Text(text) => WsMessage::text(text),
            OutboundFrame::Binary(bytes) => WsMessage::binary(bytes),
            OutboundFrame::Close(code, reason) => WsMessage::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })),
        }))
    });
    let stream = stream.filter_map(|frame| {
        futures_util::future::ready(match frame {
            Ok(WsMessage::Text(text)) => Some(Inbound::Message(text.into())),
            Ok(WsMessage::Binary(bytes)) => Some(Inbound::Message(bytes)),
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
            Err(WsError::Io(error)) if meter_error(&error).is_some() => {
                match meter_error(&error) {
                    // Left while the rest of a message waited for in-flight room.
                    Some(MeterError::PeerGone) => Some(Inbound::Closed),
                    Some(MeterError::Timeout) => {
                        Some(Inbound::Refused(CloseCode::Policy, error.to_string()))
                    }
                    _ => Some(Inbound::Refused(CloseCode::Again, error.to_string())),
                }
            }
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
    serve_admitted(
        Box::pin(stream),
        Box::pin(sink),
        server,
        ticket,
        client,
        budget,
        Some(hangup),
    )
    .await;
}

/// The meter's refusal inside an I/O error of the websocket layer.
fn meter_error(error: &std::io::Error) -> Option<&MeterError> {
    error.get_ref()?.downcast_ref::<MeterError>()
}

/// Serve one JSON-RPC connection over any transport that carries one message per item (a
/// websocket, a relay stream) until it ends. Behaves exactly like [`serve_pending`] in every other
/// way.
pub async fn serve_transport<I, O>(
    stream: I,
    sink: O,
    server: Arc<ServerState>,
    client: ClientIdentity,
) where
    I: futures_util::Stream<Item = Inbound> + Unpin + Send,
    O: futures_util::Sink<OutboundFrame> + Unpin + Send + 'static,
{
    let budget = ConnectionBudget::new(server.budgets.clone());
    serve_admitted(stream, sink, server, None, client, budget, None).await;
}

/// [`serve_transport`] for a connection that still holds a pending slot from admission
/// ([`crate::transport::admission`]): until `initialize` succeeds the connection may be evicted
/// (the pool closes its oldest entries when full), and it is closed when
/// [`INITIALIZE_TIMEOUT`] passes first. A successful `initialize` trades the pending slot for one
/// of the [`crate::limits::MAX_CONNECTIONS`] connection slots.
///
/// `hangup` watches the transport's socket, when it has one: while the reader waits instead of
/// reading (backpressure), the peer closing or half-closing its end ends the connection there and
/// then (its session detaches, its waiting work is cancelled, the socket closes).
pub async fn serve_admitted<I, O>(
    mut stream: I,
    mut sink: O,
    server: Arc<ServerState>,
    mut pending: Option<PendingTicket>,
    client: ClientIdentity,
    budget: ConnectionBudget,
    hangup: Option<Arc<PeerHangup>>,
) where
    I: futures_util::Stream<Item = Inbound> + Unpin + Send,
    O: futures_util::Sink<OutboundFrame> + Unpin + Send + 'static,
{
    let (outbound, mut queue) = outbound_queue();
    // Flips when the connection ends: the reader saw it end, or the writer could not write
    // (the peer is gone). Either way nothing more is read, dispatched or worked on for it.
    let (closed_tx, mut closed) = watch::channel(false);
    let closed_tx = Arc::new(closed_tx);
    let writer_closed = closed_tx.clone();
    let writer = tokio::spawn(async move {
        while let Some(item) = queue.recv().await {
            match item {
                Queued::Text(text, held) => {
                    let sent = sink.send(OutboundFrame::Text(text)).await;
                    // The bytes are out of the queue now; let producers continue.
                    drop(held);
                    if sent.is_err() {
                        break;
                    }
                }
                Queued::Binary(bytes, held) => {
                    let sent = sink.send(OutboundFrame::Binary(bytes)).await;
                    drop(held);
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
        writer_closed.send_replace(true);
        let _ = sink.close().await;
    });
    let connection = Arc::new(Connection {
        id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
        client,
        server: server.clone(),
        outbound,
        session: Mutex::new(None),
        slot: Mutex::new(None),
        handles: HandleTable::new(server.budgets.clone()),
        http: crate::http::ConnectionHttp::default(),
        budget,
        closed: closed.clone(),
    });
    let slots = Arc::new(Semaphore::new(MAX_INFLIGHT_REQUESTS));
    let mut shutdown = server.shutdown.clone();
    let initialize_by = tokio::time::Instant::now() + INITIALIZE_TIMEOUT;
    tracing::debug!(connection = connection.id, "connection open");
    loop {
        let initialized = connection.session().is_some();
        if initialized {
            // The connection slot replaced the pending one.
            pending = None;
        }
        let frame = tokio::select! {
            frame = stream.next() => frame,
            _ = shutdown.wait_for(|stopping| *stopping) => break,
            _ = closed.wait_for(|closed| *closed) => {
                tracing::debug!(connection = connection.id, "the peer is gone: a write failed");
                break;
            }
            () = evicted(&mut pending) => {
                tracing::debug!(connection = connection.id, "pending connection evicted: the admission pool is full");
                break;
            }
            () = tokio::time::sleep_until(initialize_by), if !initialized => Some(Inbound::Refused(
                CloseCode::Policy,
                format!("initialize was not sent within {INITIALIZE_TIMEOUT:?}"),
            )),
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
        // Waiting here (for a request slot, for in-flight bytes, for room in the outbound queue)
        // must not outlive the peer: the requests still buffered behind it would each be worked
        // on for nobody, and its socket would sit in CLOSE-WAIT.
        let flow = tokio::select! {
            flow = handle_payload(&connection, &slots, payload) => flow,
            _ = closed.wait_for(|closed| *closed) => Flow::Close,
            () = peer_gone(hangup.as_deref()) => {
                tracing::debug!(connection = connection.id, "the peer closed its end while its requests waited");
                Flow::Close
            }
        };
        if flow == Flow::Close {
            break;
        }
    }
    closed_tx.send_replace(true);
    connection.handles.close_all();
    if let Some(session) = connection.session() {
        server.sessions.detach(&session, connection.id);
    }
    connection
        .slot
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    // Let queued responses drain briefly, then stop the writer.
    let _ = connection
        .outbound
        .try_send(Outbound::Close(CloseCode::Normal, String::new()));
    drop(connection);
    let abort = writer.abort_handle();
    if tokio::time::timeout(CLOSE_DRAIN_TIMEOUT, writer)
        .await
        .is_err()
    {
        abort.abort();
    }
}

/// Whether the reader goes on after a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
}

async fn handle_payload(
    connection: &Arc<Connection>,
    slots: &Arc<Semaphore>,
    payload: Bytes,
) -> Flow {
    let payload_bytes = payload.len();
    // Parsing a large message takes milliseconds: not on an async worker.
    let parsed = if payload_bytes > LARGE_MESSAGE_BYTES {
        match connection
            .budget
            .cpu(move || (Message::from_slice(&payload), payload))
            .await
        {
            Ok((parsed, payload)) => {
                crate::cpu_pool::free_off_runtime(payload);
                parsed
            }
            Err(error) => {
                tracing::warn!(connection = connection.id, %error, "cannot parse a message");
                return Flow::Close;
            }
        }
    } else {
        Message::from_slice(&payload)
    };
    let message = match parsed {
        Ok(message) => message,
        Err(error) => {
            connection.send(Message::Error(error.to_response())).await;
            return Flow::Continue;
        }
    };
    match message {
        Message::Request(request) if request.method == proto::methods::INITIALIZE => {
            let id = request.id.clone();
            let (reply, flow) = match initialize(connection, &request) {
                Ok(result) => (Ok(result), Flow::Continue),
                // Refused for lack of room: nothing else can be done on this connection.
                Err(error) if error.kind() == Some(ErrorKind::LimitExceeded) => {
                    (Err(error), Flow::Close)
                }
                Err(error) => (Err(error), Flow::Continue),
            };
            connection.send(reply_message(id, reply)).await;
            flow
        }
        Message::Request(request) => {
            let Some(session) = connection.session() else {
                let error = RpcError::from(ConnectionError::NotInitialized {
                    method: request.method.clone(),
                });
                connection.send(reply_message(request.id, Err(error))).await;
                return Flow::Continue;
            };
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return Flow::Continue;
            };
            // The one place a method name is matched: from here on the request is a typed call.
            let Request { id, method, params } = request;
            let call = match Call::parse(&method, params) {
                Ok(call) => call,
                Err(error) => {
                    connection.send(reply_message(id, Err(error))).await;
                    return Flow::Continue;
                }
            };
            // Count the payload and the worst case of the answer in this connection's in-flight
            // bytes before any work (waiting, and so not reading, while they are full), and back
            // the payload with memory now; the answer is backed once its size is known.
            let request_bytes = 2 * payload_bytes;
            let answer_bytes = answer_reservation(&call);
            let mut charge = match connection
                .budget
                .reserve(request_bytes + answer_bytes, request_bytes)
                .await
            {
                Ok(charge) => charge,
                Err(error) => {
                    connection.send(reply_message(id, Err(error.into()))).await;
                    return Flow::Continue;
                }
            };
            let request_charge = charge.split(request_bytes);
            let connection = connection.clone();
            tokio::spawn(async move {
                let method = call.method();
                let began = std::time::Instant::now();
                super::dispatch::respond(&connection, &session, id, call, request_charge, charge)
                    .await;
                connection
                    .server
                    .metrics
                    .request_done(method, began.elapsed());
                drop(slot);
            });
            Flow::Continue
        }
        Message::Notification(notification) if notification.method == INITIALIZED => Flow::Continue,
        Message::Notification(notification) => {
            let error = RpcError::from(ConnectionError::UnexpectedNotification {
                method: notification.method,
            });
            connection
                .send(Message::Error(ErrorResponse {
                    id: RequestId::UNKNOWN,
                    error,
                }))
                .await;
            Flow::Continue
        }
        // The answer to a request of the server's (`egress/approve`).
        Message::Response(response)
            if connection.session().is_some_and(|session| {
                session
                    .attachment
                    .approvals
                    .complete(&response.id, Some(response.result.clone()))
            }) =>
        {
            Flow::Continue
        }
        Message::Error(error)
            if connection
                .session()
                .is_some_and(|session| session.attachment.approvals.complete(&error.id, None)) =>
        {
            Flow::Continue
        }
        Message::Response(_) | Message::Error(_) => {
            let error = RpcError::from(ConnectionError::UnexpectedResponse);
            connection
                .send(Message::Error(ErrorResponse {
                    id: RequestId::UNKNOWN,
                    error,
                }))
                .await;
            Flow::Continue
        }
    }
}

/// Bytes counted in flight for the answer of `request` before it runs: twice the largest answer
/// its method can produce for the content-bearing methods (the answer is built once as a value
/// and once as text), [`SMALL_RESPONSE_BYTES`] for the rest. `process/read` backs what it needs
/// once it knows there is output to return; other answers that turn out larger draw on the
/// budgets when they are sent.
pub(super) fn answer_reservation(call: &Call) -> usize {
    match call {
        Call::Fs(FsRequest::ReadFile(_)) => content_answer_bytes(READ_FILE_MAX_BYTES),
        Call::FsReadBlock(params) => {
            content_answer_bytes(params.len.min(READ_BLOCK_MAX_BYTES as u64))
        }
        Call::HttpRequest(params) if !params.stream_response => {
            content_answer_bytes(MAX_HTTP_RESPONSE_BODY_BYTES as u64)
        }
        // At most READ_DIRECTORY_MAX_ANSWER_BYTES as text; built as a value first (several
        // times the text's size), then as text.
        Call::Fs(FsRequest::ReadDirectory(_)) => 4 * READ_DIRECTORY_MAX_ANSWER_BYTES,
        _ => SMALL_RESPONSE_BYTES,
    }
}

fn initialize(connection: &Connection, request: &Request) -> Result<serde_json::Value, RpcError> {
    if connection.session().is_some() {
        return Err(ConnectionError::AlreadyInitialized.into());
    }
    let params: proto::methods::initialize::InitializeParams =
        proto::methods::parse_params(proto::methods::INITIALIZE, request.params.clone())?;
    if params.client_name.len() > MAX_CLIENT_NAME_BYTES {
        return Err(ConnectionError::ClientNameTooLong {
            length: params.client_name.len(),
            limit: MAX_CLIENT_NAME_BYTES,
        }
        .into());
    }
    // Relay streams have slots of their own: harnesses holding every one of them never lock
    // out a local client (and the other way round).
    let (slots, limit, kind) = match connection.client {
        ClientIdentity::Relay(_) => (
            &connection.server.relay_slots,
            crate::limits::MAX_RELAY_STREAMS,
            "relay streams (MAX_RELAY_STREAMS)",
        ),
        _ => (
            &connection.server.connection_slots,
            MAX_CONNECTIONS,
            "connections (MAX_CONNECTIONS)",
        ),
    };
    let slot = slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| ConnectionError::TooManyConnections { limit, kind })?;
    let sessions = &connection.server.sessions;
    let ttl = params
        .detached_session_ttl_seconds
        .map(std::time::Duration::from_secs);
    // Granted on every transport: a relay stream carries the binary frame as its message
    // inside the Noise channel (its first byte, 0x01, tells it from JSON). Set before the
    // session attaches, so its output never comes in both forms.
    let binary_output = params.binary_output;
    connection.outbound.set_binary_output(binary_output);
    let attacher = crate::session::Attacher {
        approves: params.egress_approve,
        ..connection.attacher()
    };
    let session = match &params.resume_session_id {
        Some(id) => sessions.resume(id, attacher, ttl)?,
        None => sessions.create(attacher, ttl)?,
    };
    tracing::info!(
        connection = connection.id,
        session_id = %session.id,
        client = %crate::untrusted::LogField(&params.client_name),
        "initialized"
    );
    *connection.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(slot);
    connection.set_session(session.clone());
    proto::methods::to_value(proto::methods::initialize::InitializeResult {
        session_id: session.id.clone(),
        binary_output,
    })
}
