//! One connection generation: requests matched to responses by id (they may complete out of
//! order), notifications handed to the client as they arrive.
//!
//! The reader task runs from the moment the connection exists, before `initialize` is even
//! sent, so a busy process's notifications never back up behind the resume handshake. When the
//! connection ends, every waiting request is released with [`CallError::Disconnected`] *before*
//! the client is told, so recovery never starts while a response could still be delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use proto::RpcError;
use proto::jsonrpc::{Message, Notification, Request, RequestId};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use proto::methods::process::binary::{OUTPUT_FRAME_KIND, OutputFrame};

use super::transport::TransportConnection;

/// Receives what a connection's reader sees. Implemented by the client.
pub(crate) trait ConnectionEvents: Send + Sync + 'static {
    /// A server notification (called on the reader task, in arrival order; must not block).
    fn notification(&self, generation: u64, notification: Notification);
    /// A binary `process/output` frame (called like `notification`).
    fn output_frame(&self, generation: u64, frame: OutputFrame<'_>);
    /// The connection ended; every pending request has already failed.
    fn disconnected(self: Arc<Self>, generation: u64);
}

/// Why a request got no result.
#[derive(Debug, Clone)]
pub(crate) enum CallError {
    /// The server answered with an error.
    Rpc(RpcError),
    /// The connection ended before the answer arrived.
    Disconnected,
}

type Waiter = oneshot::Sender<Result<Value, RpcError>>;

struct Pending {
    open: bool,
    waiters: HashMap<i64, Waiter>,
}

/// One live (or just lost) connection.
pub(crate) struct RpcConnection {
    /// Increases with every reconnect; late events of older generations are ignored.
    pub generation: u64,
    outgoing: mpsc::Sender<String>,
    pending: Mutex<Pending>,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl RpcConnection {
    /// Start serving `transport`: spawns the reader task.
    pub fn start<E: ConnectionEvents>(
        generation: u64,
        mut transport: TransportConnection,
        events: Weak<E>,
    ) -> Arc<Self> {
        let mut incoming = std::mem::replace(&mut transport.incoming, mpsc::channel(1).1);
        let connection = Arc::new(Self {
            generation,
            outgoing: transport.outgoing.clone(),
            pending: Mutex::new(Pending {
                open: true,
                waiters: HashMap::new(),
            }),
            tasks: Mutex::new(std::mem::take(&mut transport.tasks)),
        });
        drop(transport);
        let reader_connection = Arc::clone(&connection);
        let reader = tokio::spawn(async move {
            while let Some(payload) = incoming.recv().await {
                reader_connection.dispatch(&payload, &events);
            }
            reader_connection.fail_pending();
            if let Some(events) = events.upgrade() {
                events.disconnected(generation);
            }
        });
        connection.lock_tasks().push(reader.abort_handle());
        connection
    }

    fn lock_pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_tasks(&self) -> MutexGuard<'_, Vec<AbortHandle>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dispatch<E: ConnectionEvents>(&self, payload: &[u8], events: &Weak<E>) {
        // A binary output frame begins with a byte no JSON text begins with.
        if payload.first() == Some(&OUTPUT_FRAME_KIND) {
            match OutputFrame::decode(payload) {
                Ok(frame) => {
                    if let Some(events) = events.upgrade() {
                        events.output_frame(self.generation, frame);
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "ignoring a malformed output frame from the exec server");
                }
            }
            return;
        }
        let message = match Message::from_slice(payload) {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%error, "ignoring an unparsable message from the exec server");
                return;
            }
        };
        match message {
            Message::Notification(notification) => {
                if let Some(events) = events.upgrade() {
                    events.notification(self.generation, notification);
                }
            }
            Message::Response(response) => self.complete(&response.id, Ok(response.result)),
            Message::Error(error) => {
                if error.id == RequestId::UNKNOWN {
                    tracing::warn!(error = %error.error, "the exec server reported an error not tied to a request");
                }
                self.complete(&error.id, Err(error.error));
            }
            Message::Request(request) => {
                tracing::warn!(method = %request.method, "ignoring a request from the exec server");
            }
        }
    }

    fn complete(&self, id: &RequestId, result: Result<Value, RpcError>) {
        let RequestId::Integer(id) = id else {
            return;
        };
        if let Some(waiter) = self.lock_pending().waiters.remove(id) {
            let _ = waiter.send(result);
        }
    }

    fn fail_pending(&self) {
        let mut pending = self.lock_pending();
        pending.open = false;
        // Dropping a waiter's sender is what tells the caller "disconnected".
        pending.waiters.clear();
    }

    /// Whether the reader still runs.
    pub fn is_open(&self) -> bool {
        self.lock_pending().open
    }

    /// Send a request and wait for its response.
    pub async fn request(&self, id: i64, method: &str, params: Value) -> Result<Value, CallError> {
        let (waiter, response) = oneshot::channel();
        {
            let mut pending = self.lock_pending();
            if !pending.open {
                return Err(CallError::Disconnected);
            }
            pending.waiters.insert(id, waiter);
        }
        let request = Message::Request(Request {
            id: RequestId::Integer(id),
            method: method.to_owned(),
            params: Some(params),
        });
        let text = serde_json::to_string(&request).map_err(|error| {
            CallError::Rpc(RpcError::internal(format!(
                "cannot serialize {method}: {error}"
            )))
        })?;
        if self.outgoing.send(text).await.is_err() {
            self.lock_pending().waiters.remove(&id);
            return Err(CallError::Disconnected);
        }
        match response.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(CallError::Rpc(error)),
            Err(_) => Err(CallError::Disconnected),
        }
    }

    /// Send a notification (best effort).
    pub async fn notify(&self, method: &str, params: Value) {
        let message = Message::Notification(Notification {
            method: method.to_owned(),
            params: Some(params),
        });
        if let Ok(text) = serde_json::to_string(&message) {
            let _ = self.outgoing.send(text).await;
        }
    }

    /// Tear the connection down now (the reader stops; pending requests fail).
    pub fn shutdown(&self) {
        for task in self.lock_tasks().drain(..) {
            task.abort();
        }
        self.fail_pending();
    }
}

impl Drop for RpcConnection {
    fn drop(&mut self) {
        for task in self.lock_tasks().drain(..) {
            task.abort();
        }
    }
}
