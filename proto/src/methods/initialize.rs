//! `initialize`: the first request of every connection.

use serde::{Deserialize, Serialize};

/// Params of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// A name for logs.
    pub client_name: String,
    /// Re-attach this detached session instead of creating a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_session_id: Option<String>,
    /// How long the session is kept once its connection ends, in seconds: at most the
    /// server's `--detached-session-ttl` (a larger value is capped); `0` terminates its
    /// processes as soon as the connection ends (a client that will never resume, such as
    /// `exec-server exec`). Absent: the server's TTL. Applies from this `initialize` on, resumes
    /// included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached_session_ttl_seconds: Option<u64>,
    /// Send `process/output` to this connection as binary frames
    /// ([`crate::methods::process::binary`]) instead of JSON with base64. The answer's
    /// `binaryOutput` says whether the server does (every transport, relay streams included).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary_output: bool,
    /// The client answers `egress/approve` requests ([`crate::methods::egress`]). Without it,
    /// a destination an asking allowlist refuses is refused at once, as without `ask`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress_approve: bool,
}

/// Result of `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The session's id (UUIDv4); pass it as `resumeSessionId` after a disconnect.
    pub session_id: String,
    /// `process/output` comes as binary frames on this connection (asked for with
    /// `binaryOutput`, and granted).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub binary_output: bool,
}
