//! A session's `egress/approve` bookkeeping: the server's requests waiting for the client's
//! answers, and the host:port pairs the client approved for the whole session. It lives apart
//! from [`super::approve`] (which asks) because the session holds it and the asking reads the
//! session.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::jsonrpc::RequestId;
use serde_json::Value;
use tokio::sync::oneshot;

/// Most `egress/approve` requests of one session waiting for their answers (each process asks
/// one at a time; more than this many processes asking at once are refused at once).
pub const MAX_PENDING_APPROVALS: usize = 64;

/// Most host:port pairs one session remembers as approved for the session.
pub const MAX_SESSION_APPROVALS: usize = 1024;

/// A session's `egress/approve` requests in flight and its approvals for the session.
#[derive(Default)]
pub struct Approvals {
    next: AtomicU64,
    pending: Mutex<HashMap<String, oneshot::Sender<Option<Value>>>>,
    remembered: Mutex<HashSet<(String, u16)>>,
}

impl Approvals {
    /// A new request id (`approve-N`) and where its answer will arrive; `None` when
    /// [`MAX_PENDING_APPROVALS`] wait already.
    pub(super) fn register(&self) -> Option<(String, oneshot::Receiver<Option<Value>>)> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() >= MAX_PENDING_APPROVALS {
            return None;
        }
        let id = format!("approve-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let (tx, rx) = oneshot::channel();
        pending.insert(id.clone(), tx);
        Some((id, rx))
    }

    pub(super) fn forget(&self, id: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Delivers a client's response (`Some(result)`, or `None` for an error response) to the
    /// request `id`; `false` when no such request waits (the caller reports it as unexpected).
    pub fn complete(&self, id: &RequestId, result: Option<Value>) -> bool {
        let RequestId::String(id) = id else {
            return false;
        };
        let waiter = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(result);
                true
            }
            None => false,
        }
    }

    pub(super) fn remembered(&self, host: &str, port: u16) -> bool {
        self.remembered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(host.to_owned(), port))
    }

    pub(super) fn remember(&self, host: &str, port: u16) {
        let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        if remembered.len() < MAX_SESSION_APPROVALS {
            remembered.insert((host.to_owned(), port));
        }
    }
}
