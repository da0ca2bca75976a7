//! Sessions outlive connections. A connection attaches to a new session at `initialize` (or
//! re-attaches a detached one with `resumeSessionId`); when it closes, the session is detached:
//! processes keep running and output keeps being retained, notifications go nowhere. A session
//! left detached for the TTL is removed and its processes are terminated.
//!
//! Attach and detach go through one lock ([`Attachment`]) and detach names the connection it
//! belongs to, so a late detach from an old connection can never clear a newer attachment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::process::ProcessTable;
use crate::process::handlers::terminate_sessions;
use crate::rpc::connection::OutboundSender;

/// Which connection (if any) receives a session's notifications.
#[derive(Default)]
pub struct Attachment {
    current: Mutex<AttachmentState>,
}

#[derive(Default)]
struct AttachmentState {
    connection: Option<(u64, OutboundSender)>,
    /// Bumped on every detach, so an expiry timer knows whether it is still the latest.
    detach_generation: u64,
}

impl Attachment {
    fn lock(&self) -> MutexGuard<'_, AttachmentState> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The attached connection's outbound queue.
    pub fn sender(&self) -> Option<OutboundSender> {
        self.lock()
            .connection
            .as_ref()
            .map(|(_, sender)| sender.clone())
    }
}

/// Why a session could not be resumed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Unknown or expired id.
    #[error(
        "unknown or expired session {0:?}; call initialize without resumeSessionId to start a new session"
    )]
    Unknown(String),
    /// Another live connection holds it.
    #[error(
        "session {0:?} is still attached to another connection; retry shortly (the old connection may still be closing)"
    )]
    StillAttached(String),
}

/// One session.
pub struct Session {
    /// UUIDv4.
    pub id: String,
    /// Its processes.
    pub processes: Arc<ProcessTable>,
    /// Its notification sink.
    pub attachment: Arc<Attachment>,
}

/// All sessions of the server.
pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    ttl: Duration,
}

impl SessionRegistry {
    /// A registry whose detached sessions live for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new session attached to `connection`.
    pub fn create(&self, connection: u64, sender: OutboundSender) -> Arc<Session> {
        let attachment = Attachment::default();
        attachment.lock().connection = Some((connection, sender));
        let session = Arc::new(Session {
            id: uuid::Uuid::new_v4().to_string(),
            processes: Arc::new(ProcessTable::default()),
            attachment: Arc::new(attachment),
        });
        self.lock().insert(session.id.clone(), session.clone());
        session
    }

    /// Re-attach a detached session to `connection`.
    ///
    /// # Errors
    /// [`SessionError::Unknown`] or [`SessionError::StillAttached`].
    pub fn resume(
        &self,
        id: &str,
        connection: u64,
        sender: OutboundSender,
    ) -> Result<Arc<Session>, SessionError> {
        let sessions = self.lock();
        let session = sessions
            .get(id)
            .cloned()
            .ok_or_else(|| SessionError::Unknown(id.to_owned()))?;
        let mut state = session.attachment.lock();
        if state.connection.is_some() {
            return Err(SessionError::StillAttached(id.to_owned()));
        }
        state.connection = Some((connection, sender));
        drop(state);
        Ok(session)
    }

    /// Detach `session` from `connection` (no-op if another connection holds it now) and start
    /// the expiry timer.
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, connection: u64) {
        let generation = {
            let mut state = session.attachment.lock();
            match &state.connection {
                Some((current, _)) if *current == connection => {}
                _ => return,
            }
            state.connection = None;
            state.detach_generation += 1;
            state.detach_generation
        };
        let registry = Arc::clone(self);
        let session = Arc::clone(session);
        tokio::spawn(async move {
            tokio::time::sleep(registry.ttl).await;
            let expired = {
                let mut sessions = registry.lock();
                let state = session.attachment.lock();
                let expired = state.connection.is_none() && state.detach_generation == generation;
                if expired {
                    sessions.remove(&session.id);
                }
                expired
            };
            if expired {
                tracing::info!(session_id = %session.id, "detached session expired; terminating its processes");
                terminate_sessions(std::slice::from_ref(&session.processes)).await;
            }
        });
    }

    /// Every session (for shutdown).
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.lock().values().cloned().collect()
    }
}
