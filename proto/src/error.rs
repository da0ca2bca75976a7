//! JSON-RPC error codes, the `data.kind` classification, and the error object itself.
//!
//! Every error the server sends carries `data: {"kind": ...}` so that a client can tell a sandbox
//! denial from a missing file or a bug without parsing the human message.

use serde::{Deserialize, Serialize};

/// The request is malformed or not allowed in the current state (also: sandbox denials).
pub const INVALID_REQUEST: i64 = -32600;
/// The method does not exist.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// The params do not match the method's schema.
pub const INVALID_PARAMS: i64 = -32602;
/// The server failed for a reason that is not the caller's fault.
pub const INTERNAL_ERROR: i64 = -32603;
/// A named path, process or handle does not exist.
pub const NOT_FOUND: i64 = -32004;
/// `initialize` asked to resume a session that another live connection still holds. Retryable.
pub const SESSION_ATTACHED: i64 = -32010;

/// Machine-readable error classification sent as `data.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// The message is not a valid JSON-RPC message.
    InvalidRequest,
    /// A request other than `initialize` arrived before `initialize`.
    NotInitialized,
    /// A second `initialize` arrived on the same connection.
    AlreadyInitialized,
    /// The client sent a notification the server does not accept.
    UnexpectedNotification,
    /// The method name is unknown.
    MethodNotFound,
    /// The params do not match the method's schema.
    InvalidParams,
    /// A path is not an absolute `file:` URI.
    InvalidPath,
    /// A base64 field does not decode.
    InvalidBase64,
    /// The named path, process or handle does not exist.
    NotFound,
    /// The id (process or handle) is already in use.
    AlreadyExists,
    /// The sandbox policy denied the operation.
    SandboxDenied,
    /// The operating system denied the operation (no sandbox involved).
    PermissionDenied,
    /// A named limit was exceeded (sizes, counts, lengths).
    LimitExceeded,
    /// A directory was expected.
    NotADirectory,
    /// A non-directory was expected.
    IsADirectory,
    /// The directory is not empty and `recursive` was false.
    DirectoryNotEmpty,
    /// The path is not a regular file (FIFO, socket, device, directory).
    NotAFile,
    /// The process cannot take input (no PTY and no `pipeStdin`, or stdin already closed).
    StdinUnavailable,
    /// The process is not running any more.
    ProcessExited,
    /// The session id to resume is unknown or expired.
    UnknownSession,
    /// The session to resume is still attached to another connection (retryable).
    SessionAttached,
    /// The request asks for something this server cannot do here.
    Unsupported,
    /// A sandbox helper failed to set itself up or crashed.
    HelperFailed,
    /// A deadline the request set (`timeoutMs`) passed.
    TimedOut,
    /// An operating-system error with no more specific kind.
    Io,
    /// A bug or an unexpected state in the server.
    Internal,
}

/// The `data` member of an error: a kind plus the inputs that explain it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ErrorData {
    /// The classification.
    pub kind: ErrorKind,
    /// The wire method or sandboxed operation that failed, e.g. `fs/writeFile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The path involved, as a `file:` URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The limit that was exceeded, in the unit the message names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// True when the same request may succeed if retried later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// This server's own, more specific wording, when `message` carries the reference
    /// server's text (its clients and tests compare that text; docs/protocol.md). Boxed to
    /// keep `RpcError` small: it is the error of every request's `Result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Box<str>>,
}

impl ErrorData {
    /// Data with only a kind.
    pub fn kind(kind: ErrorKind) -> Self {
        Self {
            kind,
            operation: None,
            path: None,
            limit: None,
            retryable: None,
            detail: None,
        }
    }
}

/// A JSON-RPC error object: `{code, message, data}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[error("{message} (code {code})")]
pub struct RpcError {
    /// One of the code constants in this module.
    pub code: i64,
    /// What was wrong and what is expected, for people.
    pub message: String,
    /// The machine-readable classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ErrorData>,
}

impl RpcError {
    /// An error with `data: {"kind": kind}`.
    pub fn new(code: i64, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: Some(ErrorData::kind(kind)),
        }
    }

    /// -32600 with the given kind.
    pub fn invalid_request(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, kind, message)
    }

    /// -32602 `invalidParams`.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, ErrorKind::InvalidParams, message)
    }

    /// -32601 `methodNotFound`.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            METHOD_NOT_FOUND,
            ErrorKind::MethodNotFound,
            format!(
                "unknown method {method:?}; see docs/protocol.md for the methods this server serves"
            ),
        )
    }

    /// -32004 `notFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(NOT_FOUND, ErrorKind::NotFound, message)
    }

    /// -32603 `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, ErrorKind::Internal, message)
    }

    /// -32600 `limitExceeded`, naming the limit.
    pub fn limit_exceeded(message: impl Into<String>, limit: u64) -> Self {
        let mut error = Self::new(INVALID_REQUEST, ErrorKind::LimitExceeded, message);
        if let Some(data) = error.data.as_mut() {
            data.limit = Some(limit);
        }
        error
    }

    /// Attach the operation (wire method) to `data`.
    pub fn with_operation(mut self, operation: impl Into<String>) -> Self {
        self.data
            .get_or_insert_with(|| ErrorData::kind(ErrorKind::Internal))
            .operation = Some(operation.into());
        self
    }

    /// Attach a path (a `file:` URI string) to `data`.
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.data
            .get_or_insert_with(|| ErrorData::kind(ErrorKind::Internal))
            .path = Some(path.into());
        self
    }

    /// Answer with `message` (the reference server's text, which its clients compare) and keep
    /// this server's own message in `data.detail`.
    pub fn with_reference_message(mut self, message: impl Into<String>) -> Self {
        let detail = std::mem::replace(&mut self.message, message.into());
        self.data
            .get_or_insert_with(|| ErrorData::kind(ErrorKind::Internal))
            .detail = Some(detail.into_boxed_str());
        self
    }

    /// Mark the error as retryable in `data`.
    pub fn retryable(mut self) -> Self {
        self.data
            .get_or_insert_with(|| ErrorData::kind(ErrorKind::Internal))
            .retryable = Some(true);
        self
    }

    /// The kind in `data`, if any.
    pub fn kind(&self) -> Option<ErrorKind> {
        self.data.as_ref().map(|data| data.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn error_serializes_kind_and_skips_empty_fields() {
        let error = RpcError::not_found("no such file").with_path("file:///x");
        let value = serde_json::to_value(&error).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"code": -32004, "message": "no such file",
                               "data": {"kind": "notFound", "path": "file:///x"}})
        );
    }

    #[test]
    fn limit_exceeded_names_the_limit() {
        let error = RpcError::limit_exceeded("too big", 10);
        assert_eq!(error.code, INVALID_REQUEST);
        assert_eq!(error.data.unwrap().limit, Some(10));
    }
}
