//! The client's open `http/request` body streams, by `requestId`: the reader task routes each
//! `http/request/bodyDelta` to its stream here (see `client::http`, whose [`HttpBody`] reads
//! them; the connection state in `client::core` holds the table).
//!
//! [`HttpBody`]: super::HttpBody

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use proto::methods::http::HttpBodyDelta;
use proto::methods::{HTTP_REQUEST, HTTP_REQUEST_BODY_DELTA};
use serde_json::Value;
use tokio::sync::mpsc;

use super::error::ExecServerError;

/// What the reader task hands a stream.
#[derive(Debug)]
pub(crate) enum BodyEvent {
    Delta(HttpBodyDelta),
    Failed(ExecServerError),
}

struct StreamEntry {
    generation: u64,
    sender: mpsc::UnboundedSender<BodyEvent>,
    unread: Arc<AtomicUsize>,
}

/// The client's open body streams, by `requestId`.
#[derive(Default)]
pub(crate) struct HttpStreams {
    entries: Mutex<HashMap<String, StreamEntry>>,
}

impl HttpStreams {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, StreamEntry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(
        &self,
        request_id: &str,
        generation: u64,
    ) -> (mpsc::UnboundedReceiver<BodyEvent>, Arc<AtomicUsize>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let unread = Arc::new(AtomicUsize::new(0));
        self.lock().insert(
            request_id.to_owned(),
            StreamEntry {
                generation,
                sender,
                unread: unread.clone(),
            },
        );
        (receiver, unread)
    }

    pub(crate) fn remove(&self, request_id: &str) {
        self.lock().remove(request_id);
    }

    /// Route an `http/request/bodyDelta` of connection `generation` (called on the reader task;
    /// never blocks). Deltas of unknown or dropped streams are ignored.
    pub(crate) fn deliver(&self, generation: u64, params: Option<Value>) {
        let Some(delta) = params.and_then(|params| {
            serde_json::from_value::<HttpBodyDelta>(params)
                .map_err(|error| tracing::warn!(%error, "ignoring a malformed {HTTP_REQUEST_BODY_DELTA}"))
                .ok()
        }) else {
            return;
        };
        let mut entries = self.lock();
        let Some(entry) = entries.get(&delta.request_id) else {
            return;
        };
        if entry.generation != generation {
            return;
        }
        let request_id = delta.request_id.clone();
        let last = delta.done || delta.error.is_some();
        let size = delta.delta_base64.len();
        let unread = entry.unread.fetch_add(size, Ordering::Relaxed) + size;
        let event = if unread > super::CLIENT_EVENT_BUFFER_BYTES {
            BodyEvent::Failed(ExecServerError::Protocol {
                method: HTTP_REQUEST.into(),
                reason: format!(
                    "the body of request {request_id:?} was not read: more than \
                     CLIENT_EVENT_BUFFER_BYTES ({} MiB) waiting",
                    super::CLIENT_EVENT_BUFFER_BYTES / (1024 * 1024)
                ),
            })
        } else {
            BodyEvent::Delta(delta)
        };
        let failed = matches!(event, BodyEvent::Failed(_));
        let _ = entry.sender.send(event);
        if last || failed {
            entries.remove(&request_id);
        }
    }

    /// End every stream of `generation`: their connection is gone.
    pub(crate) fn connection_lost(&self, generation: u64) {
        self.lock().retain(|request_id, entry| {
            if entry.generation != generation {
                return true;
            }
            let _ = entry
                .sender
                .send(BodyEvent::Failed(ExecServerError::StreamInterrupted {
                    path: format!("http/request {request_id}"),
                }));
            false
        });
    }

    /// End every stream with `error` (the client failed or was closed).
    pub(crate) fn fail_all(&self, error: &ExecServerError) {
        for (_, entry) in self.lock().drain() {
            let _ = entry.sender.send(BodyEvent::Failed(error.clone()));
        }
    }
}
