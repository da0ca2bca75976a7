//! `GET /status` on the listener: what the server runs and what it holds, as JSON. Not a
//! JSON-RPC method (it answers a plain HTTP request, admitted exactly as a websocket upgrade
//! is), but its shape is a wire type like the methods' results, so clients (`exec-server ps`)
//! parse it with these types.
//!
//! Sessions are named by a tag (the first [`SESSION_TAG_CHARS`] characters of their id), never
//! by the whole id: a session id is what `initialize` resumes with, so showing it would hand
//! every admitted caller every other client's detached sessions.

use serde::{Deserialize, Serialize};

use super::process::ProcessInfo;

/// Characters of a session id shown in `GET /status` (32 of its 122 random bits; the 90 left
/// keep the id unguessable).
pub const SESSION_TAG_CHARS: usize = 8;

/// The session tag of `session_id`.
pub fn session_tag(session_id: &str) -> String {
    session_id.chars().take(SESSION_TAG_CHARS).collect()
}

/// The body of `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ServerStatus {
    /// The server's version.
    pub version: String,
    /// Milliseconds since the server started.
    pub uptime_ms: u64,
    /// Every session, attached or detached, with its processes.
    pub sessions: Vec<SessionStatus>,
    /// Processes not listed because the page holds at most the server's
    /// `MAX_STATUS_PROCESSES` (4096).
    #[serde(default)]
    pub processes_omitted: u64,
    /// Pooled fs-helpers alive now.
    pub helpers: u64,
    /// Pre-confined sandbox launchers alive now.
    pub launchers: u64,
    /// Every server-wide budget with its limit and use.
    pub budgets: Vec<BudgetUse>,
}

impl ServerStatus {
    /// A status.
    pub fn new(
        version: String,
        uptime_ms: u64,
        sessions: Vec<SessionStatus>,
        helpers: u64,
        launchers: u64,
        budgets: Vec<BudgetUse>,
    ) -> Self {
        Self {
            version,
            uptime_ms,
            sessions,
            processes_omitted: 0,
            helpers,
            launchers,
            budgets,
        }
    }

    /// The processes of every session, with their session's tag.
    pub fn processes(&self) -> impl Iterator<Item = (&str, &ProcessInfo)> {
        self.sessions.iter().flat_map(|session| {
            session
                .processes
                .iter()
                .map(|process| (session.tag.as_str(), process))
        })
    }

    /// The server-wide budget named `name`.
    pub fn budget(&self, name: &str) -> Option<&BudgetUse> {
        self.budgets.iter().find(|budget| budget.name == name)
    }
}

/// One session of `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SessionStatus {
    /// The first [`SESSION_TAG_CHARS`] characters of its id.
    pub tag: String,
    /// Whether a connection holds it now.
    pub attached: bool,
    /// The budgets of the connection that holds it (empty while detached).
    pub connection_budgets: Vec<BudgetUse>,
    /// Its processes.
    pub processes: Vec<ProcessInfo>,
}

impl SessionStatus {
    /// A session's status.
    pub fn new(
        tag: String,
        attached: bool,
        connection_budgets: Vec<BudgetUse>,
        processes: Vec<ProcessInfo>,
    ) -> Self {
        Self {
            tag,
            attached,
            connection_budgets,
            processes,
        }
    }
}

/// One budget: what it bounds, its limit and how much of it is in use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct BudgetUse {
    /// Its name (`memoryBytes`, `liveProcesses`, ...).
    pub name: String,
    /// What it counts in (`bytes`, `processes`, `descriptors`, ...).
    pub unit: String,
    /// Its limit.
    pub limit: u64,
    /// How much is in use now.
    pub in_use: u64,
}

impl BudgetUse {
    /// A budget's use.
    pub fn new(name: &str, unit: &str, limit: u64, in_use: u64) -> Self {
        Self {
            name: name.to_owned(),
            unit: unit.to_owned(),
            limit,
            in_use,
        }
    }
}
