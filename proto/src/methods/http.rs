//! `http/request`: the executor makes an HTTP request for the harness (remote HTTP tool servers
//! are reached through it), and `http/request/bodyDelta`, the notifications of a streamed body.
//!
//! A streamed request answers with status and headers (empty body) first; the body follows as
//! `bodyDelta` notifications numbered from 1, the last one with `done: true` or an `error`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One header; the list keeps order and repeats.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// The name as sent on the wire.
    pub name: String,
    /// The value (UTF-8; response headers whose value is not UTF-8 are left out).
    pub value: String,
    /// The reference's "append this executor environment variable to the value". Not
    /// supported here (a request carrying it is refused rather than sent with a wrong value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env_var: Option<String>,
}

/// What to do with a redirect response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum HttpRedirectPolicy {
    /// Follow it (at most `MAX_HTTP_REDIRECTS` hops, each checked like the first).
    #[default]
    Follow,
    /// Return the redirect response itself.
    Stop,
}

/// Params of `http/request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestParams {
    /// `GET`, `POST`, ...
    pub method: String,
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    /// Request headers, in order; repeated names are kept.
    #[serde(default)]
    pub headers: Vec<HttpHeader>,
    /// The request body, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    /// Deadline for the whole exchange, body included, in milliseconds; absent or `null`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Follow redirects (default) or return them.
    #[serde(default)]
    pub redirect_policy: HttpRedirectPolicy,
    /// Caller-chosen id; a streamed body's notifications carry it. Unique among the
    /// connection's active streamed requests.
    pub request_id: String,
    /// Answer once the headers are in and stream the body as `http/request/bodyDelta`.
    #[serde(default)]
    pub stream_response: bool,
    /// The policy the request runs under (same shapes as `process/start`); a policy whose
    /// network is off refuses the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
    /// Allow link-local targets (169.254.0.0/16, fe80::/10, cloud metadata addresses).
    #[serde(default)]
    pub allow_link_local: bool,
    /// Allow execward servers' listeners: the server's own listening addresses and every other
    /// registered server's ports on this host.
    #[serde(default)]
    pub allow_own_listeners: bool,
}

/// Result of `http/request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Response headers, in order; repeated names are kept.
    pub headers: Vec<HttpHeader>,
    /// The body, base64; empty for a streamed request.
    pub body_base64: String,
}

/// `http/request/bodyDelta` notification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct HttpBodyDelta {
    /// The request's `requestId`.
    pub request_id: String,
    /// 1 for the first delta of a request, then one more per delta.
    pub seq: u64,
    /// Body bytes, base64 (empty in the last delta).
    pub delta_base64: String,
    /// The body ended; nothing follows for this request.
    #[serde(default)]
    pub done: bool,
    /// The body failed; set only on the last delta.
    #[serde(default)]
    pub error: Option<String>,
}
