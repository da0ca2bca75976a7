//! `initialize`: the first request of every connection.

use serde::{Deserialize, Serialize};

/// Params of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// A name for logs.
    pub client_name: String,
    /// Re-attach this detached session instead of creating a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_session_id: Option<String>,
}

/// Result of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The session's id (UUIDv4); pass it as `resumeSessionId` after a disconnect.
    pub session_id: String,
}
