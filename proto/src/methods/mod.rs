//! Typed params and results of every method, and the method names.
//!
//! Params use `camelCase`. Unknown top-level fields are tolerated and logged at debug (clients of
//! the reference protocol add fields over time: the reference client always sends `envPolicy`);
//! a `sandbox` object is never tolerant, it is parsed strictly where it is resolved.

pub mod call;
pub mod egress;
pub mod environment;
pub mod fs;
pub mod http;
pub mod initialize;
pub mod process;
pub mod status;

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
/// `process/list`.
pub const PROCESS_LIST: &str = "process/list";
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
/// `fs/walk`.
pub const FS_WALK: &str = "fs/walk";
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

/// `egress/approve` (server request to a client that declared `egressApprove`).
pub const EGRESS_APPROVE: &str = "egress/approve";

/// An empty result object `{}` (or params without fields).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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

/// Serialize a method's result.
///
/// # Errors
/// -32603 if serialization fails (a bug).
pub fn to_value<T: serde::Serialize>(
    result: T,
) -> Result<serde_json::Value, crate::error::RpcError> {
    serde_json::to_value(result).map_err(|error| {
        crate::error::RpcError::internal(format!("cannot serialize the result: {error}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::INVALID_PARAMS;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn unknown_top_level_fields_are_ignored_and_missing_ones_still_named() {
        let params: process::TerminateParams = parse_params(
            PROCESS_TERMINATE,
            Some(json!({"processId": "p", "fromANewerClient": {"x": 1}})),
        )
        .unwrap();
        assert_eq!(params.process_id, "p");
        let error =
            parse_params::<process::TerminateParams>(PROCESS_TERMINATE, Some(json!({"x": 1})))
                .unwrap_err();
        assert_eq!(error.code, INVALID_PARAMS);
        assert!(error.message.contains("processId"), "{error:?}");
    }

    #[test]
    fn start_params_take_a_native_cwd_and_an_env_policy() {
        let params: process::StartParams = parse_params(
            PROCESS_START,
            Some(
                json!({"processId": "p", "argv": ["true"], "cwd": "/tmp/a%20b",
                        "envPolicy": {"inherit": "all", "set": {"A": "1"}}}),
            ),
        )
        .unwrap();
        assert_eq!(params.cwd.as_path(), std::path::Path::new("/tmp/a%20b"));
        let policy = params.env_policy.unwrap();
        assert_eq!(policy.inherit, process::EnvInherit::All);
        assert!(!policy.ignore_default_excludes);
        assert_eq!(policy.set.get("A").map(String::as_str), Some("1"));
        let null_policy: process::StartParams = parse_params(
            PROCESS_START,
            Some(
                json!({"processId": "p", "argv": ["true"], "cwd": "file:///tmp/a%20b",
                        "envPolicy": null}),
            ),
        )
        .unwrap();
        assert_eq!(null_policy.env_policy, None);
        assert_eq!(null_policy.cwd.as_path(), std::path::Path::new("/tmp/a b"));
        let relative = parse_params::<process::StartParams>(
            PROCESS_START,
            Some(json!({"processId": "p", "argv": ["true"], "cwd": "tmp"})),
        )
        .unwrap_err();
        assert_eq!(
            relative.kind(),
            Some(crate::error::ErrorKind::InvalidPath),
            "{relative:?}"
        );
    }

    #[test]
    fn body_deltas_always_carry_error_and_write_statuses_are_camel_case() {
        let delta = http::HttpBodyDelta {
            request_id: "r".into(),
            seq: 1,
            delta_base64: String::new(),
            done: true,
            error: None,
        };
        assert_eq!(
            serde_json::to_value(delta).unwrap(),
            json!({"requestId": "r", "seq": 1, "deltaBase64": "", "done": true, "error": null})
        );
        let statuses: Vec<_> = [
            process::WriteStatus::Accepted,
            process::WriteStatus::UnknownProcess,
            process::WriteStatus::StdinClosed,
            process::WriteStatus::Starting,
        ]
        .into_iter()
        .map(|status| serde_json::to_value(status).unwrap())
        .collect();
        assert_eq!(
            statuses,
            [
                json!("accepted"),
                json!("unknownProcess"),
                json!("stdinClosed"),
                json!("starting")
            ]
        );
    }
}
