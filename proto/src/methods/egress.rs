//! `egress/approve`: a request the *server* sends its client, when a sandboxed process whose
//! allowlist asks (`network.ask`) tries a destination no `allow` pattern matches, and the
//! client declared `egressApprove` at `initialize`. The connection is held until the answer
//! or the server's wait (`ASK_TIMEOUT`, 30 s) ends; no answer is a refusal.

use serde::{Deserialize, Serialize};

/// Params of `egress/approve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApproveParams {
    /// The process that asks.
    pub process_id: String,
    /// The destination host as the command named it (normalised).
    pub host: String,
    /// The destination port.
    pub port: u16,
    /// How the command asked the proxy: `connect`, `http` or `socks5`.
    pub protocol: String,
    /// The request method (plain HTTP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The request path (plain HTTP only; long paths are cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The rule that would allow it (`--allow-domain host:port`).
    pub rule: String,
}

/// Result of `egress/approve`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApproveResult {
    /// `deny`, `connection` (this connection), `process` (this process's connections to
    /// the same host and port) or `session` (every process of the session); anything else
    /// is read as `deny`.
    pub decision: String,
}
