//! Typed params and results of every method, and the method names.
//!
//! Params use `camelCase`. Unknown top-level fields are tolerated and logged at debug (clients of
//! the reference protocol add fields over time: the reference client always sends `envPolicy`);
//! a `sandbox` object is never tolerant, it is parsed strictly where it is resolved.

pub mod environment;
pub mod fs;
pub mod http;
pub mod initialize;
pub mod process;

/// `initialize` (request).
pub const INITIALIZE: &str = "initialize";
/// `initialized` (client notification after the `initialize` response).
pub const INITIALIZED: &str = "initialized";
/// `process/start`.
pub const PROCESS_START: &str = "process/start";
/// `process/read`.
pub const PROCESS_READ: &str = "process/read";
/// `process/write`.
pub const PROCESS_WRITE: &str = "process/write";
/// `process/signal`.
pub const PROCESS_SIGNAL: &str = "process/signal";
/// `process/resize`.
pub const PROCESS_RESIZE: &str = "process/resize";
/// `process/terminate`.
pub const PROCESS_TERMINATE: &str = "process/terminate";
/// `process/output` (server notification).
pub const PROCESS_OUTPUT: &str = "process/output";
/// `process/exited` (server notification).
pub const PROCESS_EXITED: &str = "process/exited";
/// `process/denied` (server notification, processes started with `auditDenials`).
pub const PROCESS_DENIED: &str = "process/denied";
/// `process/closed` (server notification).
pub const PROCESS_CLOSED: &str = "process/closed";
/// `fs/readFile`.
pub const FS_READ_FILE: &str = "fs/readFile";
/// `fs/writeFile`.
pub const FS_WRITE_FILE: &str = "fs/writeFile";
/// `fs/createDirectory`.
pub const FS_CREATE_DIRECTORY: &str = "fs/createDirectory";
/// `fs/getMetadata`.
pub const FS_GET_METADATA: &str = "fs/getMetadata";
/// `fs/canonicalize`.
pub const FS_CANONICALIZE: &str = "fs/canonicalize";
/// `fs/readDirectory`.
pub const FS_READ_DIRECTORY: &str = "fs/readDirectory";
/// `fs/remove`.
pub const FS_REMOVE: &str = "fs/remove";
/// `fs/copy`.
pub const FS_COPY: &str = "fs/copy";
/// `fs/open`.
pub const FS_OPEN: &str = "fs/open";
/// `fs/readBlock`.
pub const FS_READ_BLOCK: &str = "fs/readBlock";
/// `fs/close`.
pub const FS_CLOSE: &str = "fs/close";
/// `environment/info`.
pub const ENVIRONMENT_INFO: &str = "environment/info";
/// `http/request`.
pub const HTTP_REQUEST: &str = "http/request";
/// `http/request/bodyDelta` (server notification of a streamed `http/request` body).
pub const HTTP_REQUEST_BODY_DELTA: &str = "http/request/bodyDelta";

/// An empty result object `{}` (or params without fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Empty {}

/// Parse a method's params; absent or `null` params are read as `{}` so the error names the
/// missing field. Fields the method does not know are ignored and logged at debug.
///
/// # Errors
/// -32602 naming the method and what was wrong (`invalidPath` for a bad `file:` URI).
pub fn parse_params<T: serde::de::DeserializeOwned>(
    method: &str,
    params: Option<serde_json::Value>,
) -> Result<T, crate::error::RpcError> {
    use crate::error::{ErrorKind, INVALID_PARAMS, RpcError};
    let params = match params {
        None | Some(serde_json::Value::Null) => serde_json::Value::Object(Default::default()),
        Some(params) => params,
    };
    let mut ignored = Vec::new();
    let parsed = serde_ignored::deserialize(params, |path| ignored.push(path.to_string()));
    if !ignored.is_empty() {
        tracing::debug!(
            method,
            ?ignored,
            "ignoring params fields this server does not know"
        );
    }
    parsed.map_err(|error| {
        let message = format!("invalid params for {method}: {error}");
        // FileUri's errors all say "file: URI"; classify them so clients can tell a path mistake.
        let kind = if message.contains("file: URI") {
            ErrorKind::InvalidPath
        } else {
            ErrorKind::InvalidParams
        };
        RpcError::new(INVALID_PARAMS, kind, message)
    })
}
