//! Sessions outlive connections. A connection attaches to a new session at `initialize` (or
//! re-attaches a detached one with `resumeSessionId`); when it closes, the session is detached:
//! processes keep running and output keeps being retained, notifications go nowhere. A session
//! left detached for the TTL is removed and its processes are terminated.
//!
//! Attach and detach go through one lock ([`Attachment`]) and detach names the connection it
//! belongs to, so a late detach from an old connection can never clear a newer attachment.
//!
//! Bounds: at most [`MAX_SESSIONS`] sessions exist (a new one past it is refused). A detached
//! session ends by its own TTL, or early by a cap that only ever takes the sessions of the client
//! that exceeds its share, never another client's (clients are told apart by
//! [`ClientIdentity`], not by connection):
//! - one client keeps at most [`MAX_DETACHED_SESSIONS_PER_CLIENT`] detached: one more of its
//!   sessions detaching expires its own session detached longest ago;
//! - the server keeps at most [`MAX_DETACHED_SESSIONS`]: past it, the oldest detached session of
//!   the client holding the most detached sessions (the one detaching now on a tie) expires.
//!
//! A session's pooled fs-helpers are retired when it detaches or expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::budget::ConnectionBudget;
use crate::fs::helpers::HelperPool;
use crate::limits::{MAX_DETACHED_SESSIONS, MAX_DETACHED_SESSIONS_PER_CLIENT, MAX_SESSIONS};
use crate::outbound::OutboundSender;
use crate::process::ProcessTable;
use crate::process::retention::RetentionPool;
use crate::process::terminate_sessions;
use crate::transport::identity::ClientIdentity;

/// Which connection (if any) receives a session's notifications.
#[derive(Default)]
pub struct Attachment {
    current: Mutex<AttachmentState>,
    /// `egress/approve` requests in flight and approvals for the session.
    pub approvals: crate::process::approvals::Approvals,
}

/// The connection a session attaches to, and the client it belongs to.
pub struct Attacher {
    /// The connection's id.
    pub connection: u64,
    /// Its client.
    pub client: ClientIdentity,
    /// Its outbound queue.
    pub sender: OutboundSender,
    /// Its budgets (shown by `GET /status` while it holds the session).
    pub budget: ConnectionBudget,
    /// It declared `egressApprove` at `initialize`.
    pub approves: bool,
}

#[derive(Default)]
struct AttachmentState {
    connection: Option<(u64, OutboundSender)>,
    /// The attached connection's budgets.
    budget: Option<ConnectionBudget>,
    /// The attached connection answers `egress/approve`.
    approves: bool,
    /// The client of the connection that attached it last: whose share a detached session counts
    /// against.
    client: Option<ClientIdentity>,
    /// Bumped on every detach (and early expiry), so an expiry timer knows whether it is still
    /// the latest.
    detach_generation: u64,
    /// When the session was last detached (while it is).
    detached_at: Option<Instant>,
    /// The TTL its client asked for at its latest `initialize` (capped by the server's).
    requested_ttl: Option<Duration>,
}

impl Attachment {
    fn lock(&self) -> MutexGuard<'_, AttachmentState> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The attached connection's budgets; `None` while detached.
    pub fn connection_budget(&self) -> Option<ConnectionBudget> {
        self.lock().budget.clone()
    }

    /// The attached connection's outbound queue, when it declared `egressApprove`.
    pub fn approving_sender(&self) -> Option<OutboundSender> {
        let state = self.lock();
        if !state.approves {
            return None;
        }
        state.connection.as_ref().map(|(_, sender)| sender.clone())
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
    /// The server holds as many sessions as it allows.
    #[error(
        "the server already holds {limit} sessions (MAX_SESSIONS, attached or detached); retry \
         once detached sessions expired, or resume one of yours with resumeSessionId"
    )]
    TooMany {
        /// The limit.
        limit: usize,
    },
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
    /// The server's cap on retained output, which every session's processes are charged to.
    retention: Arc<RetentionPool>,
    helpers: Arc<HelperPool>,
    launchers: Arc<crate::process::launcher::Launchers>,
}

impl SessionRegistry {
    /// A registry whose detached sessions live for `ttl`, whose processes' output is charged to
    /// `retention`, retiring their idle fs-helpers from
    /// `helpers` and their idle sandbox launchers from `launchers` when they detach.
    pub fn new(
        ttl: Duration,
        retention: Arc<RetentionPool>,
        helpers: Arc<HelperPool>,
        launchers: Arc<crate::process::launcher::Launchers>,
    ) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            ttl,
            retention,
            helpers,
            launchers,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new session attached to `connection`.
    ///
    /// # Errors
    /// [`SessionError::TooMany`] at [`MAX_SESSIONS`].
    pub fn create(
        &self,
        attacher: Attacher,
        requested_ttl: Option<Duration>,
    ) -> Result<Arc<Session>, SessionError> {
        let attachment = Attachment::default();
        {
            let mut state = attachment.lock();
            state.connection = Some((attacher.connection, attacher.sender));
            state.approves = attacher.approves;
            state.budget = Some(attacher.budget);
            state.client = Some(attacher.client);
            state.requested_ttl = requested_ttl;
        }
        let session = Arc::new(Session {
            id: uuid::Uuid::new_v4().to_string(),
            processes: Arc::new(ProcessTable::new(&self.retention)),
            attachment: Arc::new(attachment),
        });
        let mut sessions = self.lock();
        if sessions.len() >= MAX_SESSIONS {
            return Err(SessionError::TooMany {
                limit: MAX_SESSIONS,
            });
        }
        sessions.insert(session.id.clone(), session.clone());
        Ok(session)
    }

    /// The server's cap on retained output.
    pub fn retention(&self) -> &Arc<RetentionPool> {
        &self.retention
    }

    /// Sessions held now (attached or detached).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Re-attach a detached session to the `attacher`'s connection; from now on it belongs to
    /// the attacher's client.
    ///
    /// # Errors
    /// [`SessionError::Unknown`] or [`SessionError::StillAttached`].
    pub fn resume(
        &self,
        id: &str,
        attacher: Attacher,
        requested_ttl: Option<Duration>,
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
        state.connection = Some((attacher.connection, attacher.sender));
        state.approves = attacher.approves;
        state.budget = Some(attacher.budget);
        state.client = Some(attacher.client);
        state.detached_at = None;
        if requested_ttl.is_some() {
            state.requested_ttl = requested_ttl;
        }
        drop(state);
        self.helpers.session_resumed(id);
        Ok(session)
    }

    /// Detach `session` from `connection` (no-op if another connection holds it now) and start
    /// the expiry timer: the server's TTL, or the shorter one the client asked for (zero: the
    /// processes are terminated now).
    pub fn detach(self: &Arc<Self>, session: &Arc<Session>, connection: u64) {
        let (generation, ttl, client) = {
            let mut state = session.attachment.lock();
            match &state.connection {
                Some((current, _)) if *current == connection => {}
                _ => return,
            }
            state.connection = None;
            state.budget = None;
            state.detach_generation += 1;
            state.detached_at = Some(Instant::now());
            let ttl = state
                .requested_ttl
                .map_or(self.ttl, |asked| asked.min(self.ttl));
            (state.detach_generation, ttl, state.client)
        };
        self.helpers.retire_session(&session.id);
        self.launchers.retire_session(&session.id);
        self.expire_excess_detached(client);
        let registry = Arc::clone(self);
        let session = Arc::clone(session);
        tokio::spawn(async move {
            if !ttl.is_zero() {
                tokio::time::sleep(ttl).await;
            }
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
                // Launchers whose commands have ended go now; the idle timeout takes the rest.
                registry.launchers.retire_session(&session.id);
            }
        });
    }

    /// A session of `client` just detached: past [`MAX_DETACHED_SESSIONS_PER_CLIENT`] of its
    /// own, expire its own oldest detached session; past [`MAX_DETACHED_SESSIONS`] in all, expire
    /// the oldest of the client holding the most. Each detach adds one, so one expiry restores
    /// both bounds.
    fn expire_excess_detached(&self, client: Option<ClientIdentity>) {
        let (victim, reason) = {
            let mut sessions = self.lock();
            let detached: Vec<(Option<ClientIdentity>, Instant, String)> = sessions
                .values()
                .filter_map(|session| {
                    let state = session.attachment.lock();
                    match (&state.connection, state.detached_at) {
                        (None, Some(at)) => Some((state.client, at, session.id.clone())),
                        _ => None,
                    }
                })
                .collect();
            let Some((target, reason)) = over_share(&detached, client) else {
                return;
            };
            let Some((_, _, id)) = detached
                .into_iter()
                .filter(|(owner, _, _)| *owner == target)
                .min_by_key(|(_, at, _)| *at)
            else {
                return;
            };
            let Some(session) = sessions.remove(&id) else {
                return;
            };
            // The expiry timer of this detach must not act again.
            session.attachment.lock().detach_generation += 1;
            (session, reason)
        };
        tracing::info!(
            session_id = %victim.id,
            "{reason}: expiring that client's oldest detached session now and terminating its processes"
        );
        let launchers = self.launchers.clone();
        tokio::spawn(async move {
            terminate_sessions(std::slice::from_ref(&victim.processes)).await;
            launchers.retire_session(&victim.id);
        });
    }

    /// Every session (for shutdown and `GET /status`).
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.lock().values().cloned().collect()
    }
}

/// Whose detached session must go, if any, now that a session of `client` detached (`detached`
/// lists every detached session: owner, when, id), and why.
fn over_share(
    detached: &[(Option<ClientIdentity>, Instant, String)],
    client: Option<ClientIdentity>,
) -> Option<(Option<ClientIdentity>, String)> {
    let mut per_client: HashMap<Option<ClientIdentity>, usize> = HashMap::new();
    for (owner, _, _) in detached {
        *per_client.entry(*owner).or_default() += 1;
    }
    if per_client.get(&client).copied().unwrap_or(0) > MAX_DETACHED_SESSIONS_PER_CLIENT {
        return Some((
            client,
            format!(
                "{} holds more than MAX_DETACHED_SESSIONS_PER_CLIENT \
                 ({MAX_DETACHED_SESSIONS_PER_CLIENT}) detached sessions",
                describe(client)
            ),
        ));
    }
    if detached.len() <= MAX_DETACHED_SESSIONS {
        return None;
    }
    let (largest, _) = per_client
        .iter()
        .max_by_key(|(owner, count)| (**count, **owner == client))?;
    Some((
        *largest,
        format!(
            "more than MAX_DETACHED_SESSIONS ({MAX_DETACHED_SESSIONS}) detached sessions; {} holds \
             the most",
            describe(*largest)
        ),
    ))
}

fn describe(client: Option<ClientIdentity>) -> String {
    client.map_or_else(
        || "an unknown client".to_owned(),
        |client| client.to_string(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::transport::admission::Source;

    fn sessions(
        counts: &[(ClientIdentity, usize)],
    ) -> Vec<(Option<ClientIdentity>, Instant, String)> {
        let now = Instant::now();
        counts
            .iter()
            .flat_map(|(client, count)| {
                (0..*count).map(move |i| (Some(*client), now, format!("{client}-{i}")))
            })
            .collect()
    }

    #[test]
    fn a_client_past_its_share_loses_its_own_sessions_only() {
        let (victim, attacker) = (ClientIdentity::Uid(65534), ClientIdentity::Uid(0));
        let detached = sessions(&[
            (victim, 1),
            (attacker, MAX_DETACHED_SESSIONS_PER_CLIENT + 1),
        ]);
        let (target, _) = over_share(&detached, Some(attacker)).unwrap();
        assert_eq!(target, Some(attacker));
        // The victim detaching another session is within its share: nothing goes.
        let detached = sessions(&[(victim, 2), (attacker, MAX_DETACHED_SESSIONS_PER_CLIENT)]);
        assert!(over_share(&detached, Some(victim)).is_none());
    }

    #[test]
    fn past_the_server_cap_the_client_holding_the_most_loses_one() {
        let many: Vec<(ClientIdentity, usize)> = (0..8u32)
            .map(|uid| (ClientIdentity::Uid(uid), MAX_DETACHED_SESSIONS / 8))
            .chain([(ClientIdentity::Address(Source::Local), 1)])
            .collect();
        let detached = sessions(&many);
        assert!(detached.len() > MAX_DETACHED_SESSIONS);
        // The newcomer with one session detaching is not the one that loses.
        let (target, _) =
            over_share(&detached, Some(ClientIdentity::Address(Source::Local))).unwrap();
        assert_ne!(target, Some(ClientIdentity::Address(Source::Local)));
        // On a tie, the client detaching now loses its own.
        let (target, _) = over_share(&detached, Some(ClientIdentity::Uid(3))).unwrap();
        assert_eq!(target, Some(ClientIdentity::Uid(3)));
    }
}
