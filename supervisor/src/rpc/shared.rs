//! The state of one connection that its request tasks share ([`Connection`]: the server-wide
//! state, the session, the handles, the budget, the outbound queue) and how they answer
//! ([`Connection::send_answer`], [`reply_message`]). The connection loop (`rpc::connection`)
//! builds it; method routing (`rpc::dispatch`) reads it.

use std::sync::{Arc, Mutex};

use proto::error::RpcError;
use proto::jsonrpc::{ErrorResponse, Message, RequestId, Response};
use tokio::sync::{OwnedSemaphorePermit, watch};

use crate::budget::{ConnectionBudget, MemoryCharge};
use crate::fs::HandleTable;
use crate::limits::MAX_ERROR_MESSAGE_BYTES;
use crate::outbound::{Outbound, OutboundSender};
use crate::session::Attacher;
use crate::session::Session;
use crate::state::ServerState;
use crate::transport::identity::ClientIdentity;
use crate::untrusted::Untrusted;

/// Per-connection state shared with request tasks.
pub struct Connection {
    /// Unique per server run.
    pub id: u64,
    /// The client it belongs to (for per-client caps).
    pub client: ClientIdentity,
    /// Server-wide state.
    pub server: Arc<ServerState>,
    /// Outbound queue.
    pub outbound: OutboundSender,
    /// The session, once initialized.
    pub(super) session: Mutex<Option<Arc<Session>>>,
    /// The connection slot, taken by a successful `initialize`.
    pub(super) slot: Mutex<Option<OwnedSemaphorePermit>>,
    /// Open `fs/open` handles.
    pub handles: HandleTable,
    /// `http/request` slots and active stream ids.
    pub http: crate::http::ConnectionHttp,
    /// This connection's memory and blocking-work share.
    pub budget: ConnectionBudget,
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

    /// What a session attached to this connection records of it.
    pub(super) fn attacher(&self) -> Attacher {
        Attacher {
            connection: self.id,
            client: self.client,
            sender: self.outbound.clone(),
            budget: self.budget.clone(),
            approves: false,
        }
    }

    pub(super) fn set_session(&self, session: Arc<Session>) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
    }

    /// Queue a message (waits when the queue is full).
    pub async fn send(&self, message: Message) {
        let _ = self.outbound.send(Outbound::Message(message)).await;
    }

    /// Queue the answer to a request with the memory reserved for it, which is given back once
    /// the answer was written. An answer larger than its reservation grows it (waiting for this
    /// connection's in-flight bytes, not for the server budget); one the server budget cannot
    /// take is replaced by a retryable `limitExceeded` error.
    pub async fn send_answer(&self, message: Message, mut charge: MemoryCharge) {
        let id = match &message {
            Message::Response(response) => Some(response.id.clone()),
            Message::Error(error) => {
                if let Some(kind) = error.error.kind() {
                    self.server.metrics.request_failed(kind);
                }
                Some(error.id.clone())
            }
            _ => None,
        };
        // A large answer (file contents) is serialized off the async workers.
        let serialized = if is_large(&message) {
            self.budget
                .cpu(move || {
                    let text = serde_json::to_string(&message);
                    (text, message)
                })
                .await
                .map_err(|error| error.to_string())
                .and_then(|(text, message)| {
                    crate::cpu_pool::free_off_runtime(message);
                    text.map_err(|error| error.to_string())
                })
        } else {
            serde_json::to_string(&message).map_err(|error| error.to_string())
        };
        let text = match serialized {
            Ok(text) => text,
            Err(error) => {
                tracing::error!(%error, "cannot serialize an outgoing message");
                return;
            }
        };
        let text = match charge.back(&self.budget, text.len()) {
            Ok(()) => text,
            Err(error) => {
                let refusal = RpcError::from(error);
                let reply = reply_message(id.unwrap_or(RequestId::UNKNOWN), Err(refusal));
                drop(text);
                match serde_json::to_string(&reply) {
                    Ok(text) => text,
                    Err(_) => return,
                }
            }
        };
        charge.shrink_to(text.len());
        let _ = self.outbound.send_reserved(text, charge).await;
    }
}

/// Messages (in or out) larger than this are parsed or serialized on the blocking pool: a few
/// hundred microseconds of work at most stays on an async worker.
pub(super) const LARGE_MESSAGE_BYTES: usize = 256 * 1024;

/// Whether `message` serializes to more than [`LARGE_MESSAGE_BYTES`] (roughly: the strings it
/// holds; the walk stops as soon as the answer is known).
pub(super) fn is_large(message: &Message) -> bool {
    fn size(value: &serde_json::Value, budget: &mut usize) {
        if *budget == 0 {
            return;
        }
        let own = match value {
            serde_json::Value::String(text) => text.len(),
            serde_json::Value::Array(items) => {
                items.iter().for_each(|item| size(item, budget));
                items.len()
            }
            serde_json::Value::Object(map) => {
                map.iter().for_each(|(key, item)| {
                    *budget = budget.saturating_sub(key.len());
                    size(item, budget);
                });
                map.len()
            }
            _ => 8,
        };
        *budget = budget.saturating_sub(own);
    }
    let mut left = LARGE_MESSAGE_BYTES;
    match message {
        Message::Response(response) => size(&response.result, &mut left),
        Message::Error(error) => left = left.saturating_sub(error.error.message.len()),
        _ => {}
    }
    left == 0
}

/// The answer to request `id`. This is where every error message is cut to
/// [`MAX_ERROR_MESSAGE_BYTES`], so an error quoting a huge input never echoes it back whole.
pub fn reply_message(id: RequestId, reply: Result<serde_json::Value, RpcError>) -> Message {
    match reply {
        Ok(result) => Message::Response(Response { id, result }),
        Err(mut error) => {
            if error.message.len() > MAX_ERROR_MESSAGE_BYTES {
                error.message =
                    crate::untrusted::cut(&error.message, MAX_ERROR_MESSAGE_BYTES).into_owned();
            }
            Message::Error(ErrorResponse { id, error })
        }
    }
}

/// Why a message was refused by the connection itself, before any method ran.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// A request other than `initialize` before `initialize`.
    #[error(
        "{} sent before initialize; send initialize {{clientName}} first",
        Untrusted(method)
    )]
    NotInitialized {
        /// The request's method.
        method: String,
    },
    /// A notification other than `initialized`.
    #[error(
        "unexpected notification {}; the only client notification is \"initialized\"",
        Untrusted(method)
    )]
    UnexpectedNotification {
        /// The notification's method.
        method: String,
    },
    /// The connection closed while a `process/read` waited for output.
    #[error("the connection closed while this read was waiting")]
    ClosedWhileReading,
    /// A response or error response (this server sends no requests).
    #[error("unexpected response: this server sends no requests to clients")]
    UnexpectedResponse,
    /// A second `initialize`.
    #[error(
        "initialize was already called on this connection; open a new connection for another session"
    )]
    AlreadyInitialized,
    /// `clientName` is longer than its limit.
    #[error("clientName must be at most {limit} bytes (MAX_CLIENT_NAME_BYTES), got {length}")]
    ClientNameTooLong {
        /// Its length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// Every connection slot is taken.
    #[error("the server already serves {limit} {kind}; retry later")]
    TooManyConnections {
        /// Which pool: local connections (`MAX_CONNECTIONS`) or relay streams
        /// (`MAX_RELAY_STREAMS`).
        kind: &'static str,
        /// The limit.
        limit: usize,
    },
}
