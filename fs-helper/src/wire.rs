//! The `fs/*` methods at the wire level: JSON params in, JSON result (or a JSON-RPC error) out.
//!
//! This is the one implementation of the filesystem methods. The supervisor calls [`execute`]
//! in-process for unsandboxed requests, and the sandboxed `fs-helper` binary calls it after
//! locking itself down. `fs/readBlock` and `fs/close` act on handles the supervisor holds and are
//! not executed here. The mapping from [`FsError`] to JSON-RPC errors lives here too, so the
//! helper and the server report errors identically.

use std::fs::File;
use std::path::PathBuf;

use base64::Engine;
use proto::FileUri;
use proto::error::{self as codes, ErrorKind, RpcError};
use proto::limits::{READ_DIRECTORY_MAX_ANSWER_BYTES, READ_DIRECTORY_MAX_ENTRIES};
use proto::methods::Empty;
use proto::methods::fs::*;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{FsError, FsErrorKind, FsOperation, WriteOptions};

/// A request to the helper binary: `{"operation", "params", "sandbox"}`, the typed request
/// ([`FsRequest`]'s own JSON) plus the sandbox it must run under.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HelperRequest {
    /// The operation and its params (a `sandbox` member inside the params is ignored; the
    /// top-level one counts).
    #[serde(flatten)]
    pub request: FsRequest,
    /// The wire sandbox object the operation must run under (absent: no sandbox).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
    /// `fs/readFile` only: a file of more than this many bytes is opened and examined under the
    /// policy (every check of the read, its errors unchanged) but not read, and the answer is
    /// its size ([`HelperResponse::Size`]). The server asks this so that it backs an answer
    /// with memory only from what the helper could open, never from its own view of the path.
    #[serde(rename = "sizeAbove", skip_serializing_if = "Option::is_none")]
    pub size_above: Option<u64>,
}

/// The envelope of a [`HelperRequest`] before its params are parsed: strict (an unknown member
/// is an error), while the params follow the tolerant rules of the wire.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    operation: String,
    #[serde(default)]
    params: Value,
    #[serde(default)]
    sandbox: Option<Value>,
    #[serde(default, rename = "sizeAbove")]
    size_above: Option<u64>,
}

impl HelperRequest {
    /// Decode a helper request from JSON: the envelope strictly, then the params as the server
    /// parses a method's params ([`FsRequest::parse`]), so the helper reports bad params
    /// exactly as the server does.
    ///
    /// # Errors
    /// -32600 when the bytes are not a `{"operation", "params", "sandbox", "sizeAbove"}` object
    /// or `sizeAbove` comes with another method than `fs/readFile`, -32601 for an operation that
    /// is not a helper-executed `fs/*` method, -32602 for bad params.
    pub fn decode(bytes: &[u8]) -> Result<Self, RpcError> {
        let envelope: Envelope = serde_json::from_slice(bytes).map_err(|error| {
            RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                format!(
                    "helper request must be {{\"operation\", \"params\", \"sandbox\", \"sizeAbove\"}}: {error}"
                ),
            )
        })?;
        let request = FsRequest::parse(&envelope.operation, Some(envelope.params))?
            .ok_or_else(|| RpcError::method_not_found(&envelope.operation))?;
        if envelope.size_above.is_some() && !matches!(request, FsRequest::ReadFile(_)) {
            return Err(RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                format!(
                    "sizeAbove applies to fs/readFile only, not {}",
                    envelope.operation
                ),
            ));
        }
        Ok(HelperRequest {
            request,
            sandbox: envelope.sandbox,
            size_above: envelope.size_above,
        })
    }
}

/// The helper's answer: `{"status": "ok", "payload": result}`,
/// `{"status": "error", "payload": {code, message, data}}`, or, for a read with `sizeAbove`
/// whose file holds more, `{"status": "size", "payload": bytes}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", content = "payload", rename_all = "lowercase")]
pub enum HelperResponse {
    /// The method's result.
    Ok(Value),
    /// The JSON-RPC error.
    Error(RpcError),
    /// The size of a file opened for a read with [`HelperRequest::size_above`] and not read.
    Size(u64),
}

impl From<Result<Value, RpcError>> for HelperResponse {
    fn from(result: Result<Value, RpcError>) -> Self {
        match result {
            Ok(value) => HelperResponse::Ok(value),
            Err(error) => HelperResponse::Error(error),
        }
    }
}

impl From<Result<HelperOutcome, RpcError>> for HelperResponse {
    /// The answer to a request (a descriptor, if any, travels beside it).
    fn from(result: Result<HelperOutcome, RpcError>) -> Self {
        match result {
            Ok(HelperOutcome::Size(size)) => HelperResponse::Size(size),
            Ok(HelperOutcome::Done(Outcome::Value(value) | Outcome::Opened(_, value))) => {
                HelperResponse::Ok(value)
            }
            Err(error) => HelperResponse::Error(error),
        }
    }
}

/// What a [`HelperRequest`] produced.
#[derive(Debug)]
pub enum HelperOutcome {
    /// The operation's outcome.
    Done(Outcome),
    /// The size of the file a read with [`HelperRequest::size_above`] opened and did not read.
    Size(u64),
}

/// Execute one helper request: [`execute`], except for a read with `sizeAbove`.
///
/// # Errors
/// As [`execute`].
pub fn execute_helper_request(
    request: HelperRequest,
    sandboxed: bool,
) -> Result<HelperOutcome, RpcError> {
    let (FsRequest::ReadFile(p), Some(threshold)) = (&request.request, request.size_above) else {
        return execute(request.request, sandboxed).map(HelperOutcome::Done);
    };
    let read = crate::read_file_unless_above(p.path.as_path(), read_limit(p), threshold)
        .map_err(|error| fs_error(&error, sandboxed))?;
    match read {
        crate::ReadOrSize::Read(data) => read_file_answer(&data)
            .map(Outcome::Value)
            .map(HelperOutcome::Done),
        crate::ReadOrSize::Above(size) => Ok(HelperOutcome::Size(size)),
    }
}

/// The most bytes `fs/readFile` reads for `params`.
fn read_limit(params: &ReadFileParams) -> u64 {
    params
        .max_bytes
        .map_or(crate::READ_FILE_MAX_BYTES, |asked| {
            asked.min(crate::READ_FILE_MAX_BYTES)
        })
}

/// `fs/readFile`'s result for `data`.
fn read_file_answer(data: &[u8]) -> Result<Value, RpcError> {
    to_value(ReadFileResult {
        data_base64: base64::engine::general_purpose::STANDARD.encode(data),
    })
}

/// What an operation produced.
#[derive(Debug)]
pub enum Outcome {
    /// A JSON result.
    Value(Value),
    /// `fs/open`: the opened file, plus the `{handleId}` result.
    Opened(File, Value),
}

/// Largest request the helper accepts (a 32 MiB `fs/writeFile` in base64 plus the envelope).
pub const MAX_HELPER_REQUEST_BYTES: usize = 48 * 1024 * 1024;

/// Execute one `fs/*` request. `sandboxed` turns permission errors into `sandboxDenied`.
///
/// # Errors
/// The JSON-RPC error to send: -32602 for bad params, -32004 for missing paths, -32600 for
/// denials and other refusals, -32603 for other OS errors.
pub fn execute(request: FsRequest, sandboxed: bool) -> Result<Outcome, RpcError> {
    let fs = |error: FsError| fs_error(&error, sandboxed);
    let value = match request {
        FsRequest::ReadFile(p) => {
            let data = crate::read_file(p.path.as_path(), read_limit(&p)).map_err(fs)?;
            read_file_answer(&data)
        }
        FsRequest::WriteFile(p) => {
            let data = base64::engine::general_purpose::STANDARD
                .decode(p.data_base64.as_bytes())
                .map_err(|e| {
                    RpcError::new(
                        codes::INVALID_PARAMS,
                        ErrorKind::InvalidBase64,
                        format!("dataBase64 is not valid base64: {e}"),
                    )
                })?;
            crate::write_file(p.path.as_path(), &data, &WriteOptions { atomic: p.atomic })
                .map_err(fs)?;
            to_value(Empty {})
        }
        FsRequest::CreateDirectory(p) => {
            crate::create_directory(p.path.as_path(), p.recursive).map_err(fs)?;
            to_value(Empty {})
        }
        FsRequest::GetMetadata(p) => {
            let m = crate::get_metadata(p.path.as_path()).map_err(fs)?;
            to_value(GetMetadataResult {
                is_directory: m.is_directory,
                is_file: m.is_file,
                is_symlink: m.is_symlink,
                size: m.size,
                created_at_ms: m.created_at_ms.unwrap_or(0),
                modified_at_ms: m.modified_at_ms.unwrap_or(0),
            })
        }
        FsRequest::Canonicalize(p) => {
            let canonical = crate::canonicalize(p.path.as_path()).map_err(fs)?;
            to_value(CanonicalizeResult {
                path: uri(canonical)?,
            })
        }
        FsRequest::ReadDirectory(p) => {
            let (listed, mut truncated) =
                crate::read_directory_at_most(p.path.as_path(), READ_DIRECTORY_MAX_ENTRIES)
                    .map_err(fs)?;
            // The answer's size is counted as it is built, entry by entry, as JSON text.
            let mut answer_bytes = 0;
            let mut entries = Vec::new();
            for entry in listed {
                let entry = DirectoryEntry {
                    file_name: entry.file_name.to_string_lossy().into_owned(),
                    path: uri(p.path.as_path().join(&entry.file_name))?,
                    is_directory: entry.is_directory,
                    is_file: entry.is_file,
                    is_symlink: entry.is_symlink,
                };
                // Its text and a separator.
                answer_bytes += serde_json::to_vec(&entry).map_or(0, |text| text.len()) + 1;
                if answer_bytes > READ_DIRECTORY_MAX_ANSWER_BYTES {
                    truncated = true;
                    break;
                }
                entries.push(entry);
            }
            to_value(ReadDirectoryResult { entries, truncated })
        }
        FsRequest::Remove(p) => {
            crate::remove(p.path.as_path(), p.recursive, p.force).map_err(fs)?;
            to_value(Empty {})
        }
        FsRequest::Copy(p) => {
            crate::copy(
                p.source_path.as_path(),
                p.destination_path.as_path(),
                p.recursive,
            )
            .map_err(fs)?;
            to_value(Empty {})
        }
        FsRequest::Walk(p) => {
            let max_depth = bounded(
                "maxDepth",
                p.max_depth,
                crate::MAX_TREE_DEPTH,
                (crate::MAX_TREE_DEPTH, "MAX_TREE_DEPTH"),
            )?;
            let max_entries = bounded(
                "maxEntries",
                p.max_entries,
                crate::WALK_DEFAULT_ENTRIES,
                (crate::WALK_MAX_ENTRIES, "WALK_MAX_ENTRIES"),
            )?;
            let walk = crate::walk(p.path.as_path(), max_depth, max_entries).map_err(fs)?;
            let entries = walk
                .entries
                .into_iter()
                .map(|entry| {
                    Ok(WalkEntry {
                        path: uri(entry.path)?,
                        depth: entry.depth,
                        is_directory: entry.is_directory,
                        is_file: entry.is_file,
                        is_symlink: entry.is_symlink,
                    })
                })
                .collect::<Result<Vec<_>, RpcError>>()?;
            to_value(WalkResult {
                entries,
                truncated: walk.truncated,
            })
        }
        FsRequest::Open(p) => {
            let file = crate::open_for_streaming(p.path.as_path()).map_err(fs)?;
            return Ok(Outcome::Opened(
                file,
                to_value(OpenResult {
                    handle_id: p.handle_id,
                })?,
            ));
        }
    }?;
    Ok(Outcome::Value(value))
}

/// `value` (`default` when absent) if it is from 1 to the named `limit`.
fn bounded(
    name: &str,
    value: Option<usize>,
    default: usize,
    (limit, limit_name): (usize, &str),
) -> Result<usize, RpcError> {
    match value {
        None => Ok(default),
        Some(value) if (1..=limit).contains(&value) => Ok(value),
        Some(value) => Err(RpcError::invalid_params(format!(
            "{name} must be from 1 to {limit} ({limit_name}), got {value}"
        ))),
    }
}

fn to_value<T: Serialize>(result: T) -> Result<Value, RpcError> {
    serde_json::to_value(result)
        .map_err(|e| RpcError::internal(format!("cannot serialize the result: {e}")))
}

fn uri(path: PathBuf) -> Result<FileUri, RpcError> {
    FileUri::from_path(path).map_err(|e| RpcError::internal(e.to_string()))
}

/// Map a filesystem error to JSON-RPC. `sandboxed` turns permission errors (EACCES, EPERM,
/// EROFS) into `sandboxDenied`; the operation and path are always in `data`.
pub fn fs_error(error: &FsError, sandboxed: bool) -> RpcError {
    let (code, kind) = match error.kind() {
        FsErrorKind::NotFound => (codes::NOT_FOUND, ErrorKind::NotFound),
        FsErrorKind::PermissionDenied if sandboxed => {
            (codes::INVALID_REQUEST, ErrorKind::SandboxDenied)
        }
        FsErrorKind::PermissionDenied => (codes::INVALID_REQUEST, ErrorKind::PermissionDenied),
        FsErrorKind::AlreadyExists => (codes::INVALID_REQUEST, ErrorKind::AlreadyExists),
        FsErrorKind::NotADirectory => (codes::INVALID_REQUEST, ErrorKind::NotADirectory),
        FsErrorKind::IsADirectory => (codes::INVALID_REQUEST, ErrorKind::IsADirectory),
        FsErrorKind::DirectoryNotEmpty => (codes::INVALID_REQUEST, ErrorKind::DirectoryNotEmpty),
        FsErrorKind::NotRegularFile => (codes::INVALID_REQUEST, ErrorKind::NotAFile),
        FsErrorKind::TooLarge => (codes::INVALID_REQUEST, ErrorKind::LimitExceeded),
        FsErrorKind::InvalidInput => (codes::INVALID_PARAMS, ErrorKind::InvalidParams),
        FsErrorKind::Other => (codes::INTERNAL_ERROR, ErrorKind::Io),
    };
    // The reference client maps -32600 to InvalidInput; a copy into itself is that.
    let (code, kind) = match error {
        FsError::CopyIntoItself { .. } => (codes::INVALID_REQUEST, ErrorKind::InvalidRequest),
        _ => (code, kind),
    };
    let mut rpc =
        RpcError::new(code, kind, error.to_string()).with_operation(error.operation().as_str());
    if let Some(message) = reference_message(error, kind) {
        rpc = rpc.with_reference_message(message);
    }
    if let (Some(limit), Some(data)) = (error.limit(), rpc.data.as_mut()) {
        data.limit = Some(limit);
    }
    if let Some(uri) = error.path().and_then(|path| FileUri::from_path(path).ok()) {
        rpc = rpc.with_path(uri.to_uri_string());
    }
    rpc
}

/// The reference server's text for the errors whose text its clients and tests compare (our own
/// message then goes to `data.detail`); `None` keeps our message. A sandbox denial reads "is not
/// permitted", which the reference's tests accept for a refused (-32600) request.
fn reference_message(error: &FsError, kind: ErrorKind) -> Option<String> {
    let op = error.operation();
    if kind == ErrorKind::SandboxDenied {
        return Some(match error.path() {
            Some(path) => format!(
                "{op}: {verb} {path} is not permitted by the sandbox",
                verb = op.verb(),
                path = path.display()
            ),
            None => format!("{op} is not permitted by the sandbox"),
        });
    }
    match error {
        FsError::IsDirectoryNeedsRecursive {
            op: FsOperation::Copy,
            ..
        } => Some("fs/copy requires recursive: true when sourcePath is a directory".into()),
        FsError::CopyIntoItself { .. } => {
            Some("fs/copy cannot copy a directory to itself or one of its descendants".into())
        }
        FsError::NotRegularFile {
            op: FsOperation::Copy,
            ..
        }
        | FsError::UnsupportedFileType {
            op: FsOperation::Copy,
            ..
        } => Some("fs/copy only supports regular files, directories, and symlinks".into()),
        FsError::NotRegularFile {
            op: FsOperation::Open | FsOperation::ReadFile,
            path,
            ..
        } => Some(format!("path `{}` is not a file", path.display())),
        FsError::TooLarge {
            op: FsOperation::ReadFile,
            limit,
            ..
        } => Some(format!("file is too large to read: limit is {limit} bytes")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn response_shape_is_status_and_payload() {
        let ok = serde_json::to_value(HelperResponse::Ok(json!({"x": 1}))).unwrap();
        assert_eq!(ok, json!({"status": "ok", "payload": {"x": 1}}));
        let error = HelperResponse::Error(RpcError::not_found("gone"));
        assert_eq!(
            serde_json::to_value(error).unwrap()["payload"]["code"],
            json!(-32004)
        );
    }

    #[test]
    fn denial_in_a_sandbox_is_sandbox_denied_with_operation_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let error = FsError::Io {
            op: crate::FsOperation::WriteFile,
            path: dir.path().join("x"),
            source: std::io::Error::from_raw_os_error(libc::EROFS),
        };
        let rpc = fs_error(&error, true);
        assert_eq!(rpc.code, codes::INVALID_REQUEST);
        assert!(rpc.message.contains("is not permitted"), "{rpc:?}");
        let data = rpc.data.unwrap();
        assert_eq!(data.kind, ErrorKind::SandboxDenied);
        assert_eq!(data.detail.as_deref(), Some(error.to_string().as_str()));
        assert_eq!(data.operation.as_deref(), Some("fs/writeFile"));
        assert!(data.path.unwrap().ends_with("/x"));
        assert_eq!(
            fs_error(&error, false).kind(),
            Some(ErrorKind::PermissionDenied)
        );
    }

    fn request(method: &str, params: Value) -> FsRequest {
        FsRequest::parse(method, Some(params)).unwrap().unwrap()
    }

    #[test]
    fn execute_round_trips_a_file_and_maps_missing_paths() {
        let dir = tempfile::tempdir().unwrap();
        let path = FileUri::from_path(dir.path().join("f"))
            .unwrap()
            .to_uri_string();
        let write = request("fs/writeFile", json!({"path": path, "dataBase64": "aGk="}));
        assert!(matches!(execute(write, false).unwrap(), Outcome::Value(_)));
        let Outcome::Value(read) =
            execute(request("fs/readFile", json!({"path": path})), false).unwrap()
        else {
            panic!()
        };
        assert_eq!(read, json!({"dataBase64": "aGk="}));
        let missing = FileUri::from_path(dir.path().join("nope"))
            .unwrap()
            .to_uri_string();
        let error = execute(request("fs/readFile", json!({"path": missing})), false).unwrap_err();
        assert_eq!(error.code, codes::NOT_FOUND);
    }

    #[test]
    fn helper_request_decodes_strict_envelope_and_tolerant_params() {
        let bytes = br#"{"operation": "fs/readFile", "params": {"path": "file:///x", "newer": 1},
                         "sandbox": {"profile": "read-only"}}"#;
        let decoded = HelperRequest::decode(bytes).unwrap();
        assert_eq!(decoded.request.method(), "fs/readFile");
        assert_eq!(decoded.sandbox, Some(json!({"profile": "read-only"})));
        let encoded = serde_json::to_vec(&decoded).unwrap();
        assert_eq!(HelperRequest::decode(&encoded).unwrap(), decoded);
        assert_eq!(
            serde_json::from_slice::<Value>(&encoded).unwrap(),
            json!({"operation": "fs/readFile", "params": {"path": "file:///x"},
                   "sandbox": {"profile": "read-only"}})
        );
        let envelope = HelperRequest::decode(br#"{"operation": "fs/readFile", "x": 1}"#);
        assert_eq!(envelope.unwrap_err().code, codes::INVALID_REQUEST);
        let unknown = HelperRequest::decode(br#"{"operation": "fs/bogus", "params": {}}"#);
        assert_eq!(unknown.unwrap_err().code, codes::METHOD_NOT_FOUND);
        let handle = HelperRequest::decode(br#"{"operation": "fs/close", "params": {}}"#);
        assert_eq!(handle.unwrap_err().code, codes::METHOD_NOT_FOUND);
        let bad = HelperRequest::decode(br#"{"operation": "fs/readFile", "params": {}}"#);
        assert_eq!(bad.unwrap_err().code, codes::INVALID_PARAMS);
    }
}
