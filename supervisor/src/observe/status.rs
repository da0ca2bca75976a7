//! The body of `GET /status` and the live part of `GET /metrics`, read from the server-wide
//! state. The page lists at most [`MAX_STATUS_PROCESSES`] processes (it is built whole in
//! memory) and counts the rest. Reading a running process's resources reads its cgroup files (blocking), so the
//! pages are built on the blocking pool ([`page`]).

use std::sync::Arc;

use proto::methods::status::{BudgetUse, ServerStatus, SessionStatus, session_tag};

use super::metrics::Snapshot;
use crate::budget::in_use;
use crate::limits::{
    MAX_CONNECTIONS, MAX_PENDING_CONNECTIONS, MAX_RELAY_STREAMS, MAX_SESSIONS, MAX_STATUS_PROCESSES,
};
use crate::state::ServerState;

/// Which page a peer asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// `GET /status`: JSON.
    Status,
    /// `GET /metrics`: the Prometheus text format.
    Metrics,
}

impl Page {
    /// The page served at `path`, if any.
    pub fn at(path: &str) -> Option<Self> {
        match path.split('?').next().unwrap_or(path) {
            "/status" => Some(Self::Status),
            "/metrics" => Some(Self::Metrics),
            _ => None,
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Status => "application/json",
            Self::Metrics => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Render `page` (on the blocking pool: it reads cgroup files).
///
/// # Errors
/// A message when the page could not be built (a bug).
pub async fn page(state: &Arc<ServerState>, page: Page) -> Result<String, String> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || match page {
        Page::Status => serde_json::to_string(&status(&state)).map_err(|error| error.to_string()),
        Page::Metrics => state
            .metrics
            .render(&snapshot(&state))
            .map_err(|error| error.to_string()),
    })
    .await
    .map_err(|error| error.to_string())?
}

/// Every budget the server keeps: the shared ones of [`crate::budget::Budgets`], connection
/// and relay slots, the admission pool, sessions and retained output.
pub fn budgets(state: &ServerState) -> Vec<BudgetUse> {
    let mut budgets = state.budgets.usage();
    budgets.push(in_use(
        "connections",
        "connections",
        MAX_CONNECTIONS,
        &state.connection_slots,
    ));
    budgets.push(in_use(
        "relayStreams",
        "streams",
        MAX_RELAY_STREAMS,
        &state.relay_slots,
    ));
    budgets.push(BudgetUse::new(
        "pendingConnections",
        "connections",
        MAX_PENDING_CONNECTIONS as u64,
        state.admission.pending() as u64,
    ));
    budgets.push(BudgetUse::new(
        "sessions",
        "sessions",
        MAX_SESSIONS as u64,
        state.sessions.len() as u64,
    ));
    let retention = state.sessions.retention();
    budgets.push(BudgetUse::new(
        "retainedOutputBytes",
        "bytes",
        retention.cap() as u64,
        retention.held() as u64,
    ));
    budgets
}

/// The body of `GET /status`.
pub fn status(state: &ServerState) -> ServerStatus {
    let mut room = MAX_STATUS_PROCESSES;
    let mut omitted = 0u64;
    let mut sessions: Vec<SessionStatus> = state
        .sessions
        .all()
        .iter()
        .map(|session| {
            let connection = session.attachment.connection_budget();
            let all = session.processes.all();
            let shown = all.len().min(room);
            room -= shown;
            omitted += (all.len() - shown) as u64;
            let mut processes: Vec<_> = all[..shown].iter().map(|process| process.info()).collect();
            processes.sort_by(|a, b| {
                (a.started_at_ms, &a.process_id).cmp(&(b.started_at_ms, &b.process_id))
            });
            SessionStatus::new(
                session_tag(&session.id),
                connection.is_some(),
                connection.map(|budget| budget.usage()).unwrap_or_default(),
                processes,
            )
        })
        .collect();
    sessions.sort_by(|a, b| a.tag.cmp(&b.tag));
    let mut status = ServerStatus::new(
        env!("CARGO_PKG_VERSION").to_owned(),
        u64::try_from(state.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        sessions,
        state.helpers.live() as u64,
        state.launchers.live() as u64,
        budgets(state),
    );
    status.processes_omitted = omitted;
    status
}

/// The live values `GET /metrics` shows beside its counters.
pub fn snapshot(state: &ServerState) -> Snapshot {
    Snapshot {
        budgets: budgets(state),
        sessions: state.sessions.len() as u64,
        relay_streams: (MAX_RELAY_STREAMS - state.relay_slots.available_permits()) as u64,
        helpers: state.helpers.live() as u64,
        launchers: state.launchers.live() as u64,
    }
}
