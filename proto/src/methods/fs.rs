//! `fs/*` params and results. Every path is a [`FileUri`]; every method accepts an optional
//! `sandbox` object (see policies/README.md).
//!
//! [`FsRequest`] is the one typed form of the `fs/*` methods that operate on paths: the server
//! parses a request into it once, runs it in-process or sends it to a sandboxed `fs-helper`
//! (whose request JSON is the enum's own serde form), and the executor matches on it. Adding an
//! `fs/*` method means one variant here, one operation in fs-helper, and the docs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RpcError;
use crate::methods::{self, parse_params};
use crate::uri::FileUri;

/// One `fs/*` request that runs where its sandbox says (in the server or in an `fs-helper`):
/// every `fs/*` method but the handle methods `fs/readBlock` and `fs/close`.
///
/// Its JSON is `{"operation": "fs/readFile", "params": {...}}`, the shape of a helper request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "operation", content = "params")]
pub enum FsRequest {
    /// `fs/readFile`.
    #[serde(rename = "fs/readFile")]
    ReadFile(ReadFileParams),
    /// `fs/writeFile`.
    #[serde(rename = "fs/writeFile")]
    WriteFile(WriteFileParams),
    /// `fs/createDirectory`.
    #[serde(rename = "fs/createDirectory")]
    CreateDirectory(CreateDirectoryParams),
    /// `fs/getMetadata`.
    #[serde(rename = "fs/getMetadata")]
    GetMetadata(PathParams),
    /// `fs/canonicalize`.
    #[serde(rename = "fs/canonicalize")]
    Canonicalize(PathParams),
    /// `fs/readDirectory`.
    #[serde(rename = "fs/readDirectory")]
    ReadDirectory(PathParams),
    /// `fs/remove`.
    #[serde(rename = "fs/remove")]
    Remove(RemoveParams),
    /// `fs/copy`.
    #[serde(rename = "fs/copy")]
    Copy(CopyParams),
    /// `fs/open`.
    #[serde(rename = "fs/open")]
    Open(OpenParams),
    /// `fs/walk`.
    #[serde(rename = "fs/walk")]
    Walk(WalkParams),
}

impl FsRequest {
    /// Parse `method`'s params into its variant, with the rules of [`parse_params`] (absent or
    /// `null` params read as `{}`, unknown top-level fields ignored). `None` when `method` is
    /// not one of the variants (`fs/readBlock`, `fs/close`, or not an `fs/*` method at all).
    ///
    /// # Errors
    /// -32602 naming the method and what was wrong, as [`parse_params`].
    pub fn parse(method: &str, params: Option<Value>) -> Result<Option<Self>, RpcError> {
        let request = match method {
            methods::FS_READ_FILE => FsRequest::ReadFile(parse_params(method, params)?),
            methods::FS_WRITE_FILE => FsRequest::WriteFile(parse_params(method, params)?),
            methods::FS_CREATE_DIRECTORY => {
                FsRequest::CreateDirectory(parse_params(method, params)?)
            }
            methods::FS_GET_METADATA => FsRequest::GetMetadata(parse_params(method, params)?),
            methods::FS_CANONICALIZE => FsRequest::Canonicalize(parse_params(method, params)?),
            methods::FS_READ_DIRECTORY => FsRequest::ReadDirectory(parse_params(method, params)?),
            methods::FS_REMOVE => FsRequest::Remove(parse_params(method, params)?),
            methods::FS_COPY => FsRequest::Copy(parse_params(method, params)?),
            methods::FS_OPEN => FsRequest::Open(parse_params(method, params)?),
            methods::FS_WALK => FsRequest::Walk(parse_params(method, params)?),
            _ => return Ok(None),
        };
        Ok(Some(request))
    }

    /// The wire method name, e.g. `fs/readFile`.
    pub fn method(&self) -> &'static str {
        match self {
            FsRequest::ReadFile(_) => methods::FS_READ_FILE,
            FsRequest::WriteFile(_) => methods::FS_WRITE_FILE,
            FsRequest::CreateDirectory(_) => methods::FS_CREATE_DIRECTORY,
            FsRequest::GetMetadata(_) => methods::FS_GET_METADATA,
            FsRequest::Canonicalize(_) => methods::FS_CANONICALIZE,
            FsRequest::ReadDirectory(_) => methods::FS_READ_DIRECTORY,
            FsRequest::Remove(_) => methods::FS_REMOVE,
            FsRequest::Copy(_) => methods::FS_COPY,
            FsRequest::Open(_) => methods::FS_OPEN,
            FsRequest::Walk(_) => methods::FS_WALK,
        }
    }

    /// The request's `sandbox` object, unless absent or `null` (unparsed: it is resolved
    /// strictly where the request runs).
    pub fn sandbox(&self) -> Option<&Value> {
        let sandbox = match self {
            FsRequest::ReadFile(p) => &p.sandbox,
            FsRequest::WriteFile(p) => &p.sandbox,
            FsRequest::CreateDirectory(p) => &p.sandbox,
            FsRequest::GetMetadata(p)
            | FsRequest::Canonicalize(p)
            | FsRequest::ReadDirectory(p) => &p.sandbox,
            FsRequest::Remove(p) => &p.sandbox,
            FsRequest::Copy(p) => &p.sandbox,
            FsRequest::Open(p) => &p.sandbox,
            FsRequest::Walk(p) => &p.sandbox,
        };
        sandbox.as_ref().filter(|value| !value.is_null())
    }
}

fn default_true() -> bool {
    true
}

/// Params of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadFileParams {
    /// A regular file.
    pub path: FileUri,
    /// Refuse a file larger than this many bytes (-32600 `limitExceeded`, "file is too large to
    /// read: limit is N bytes"); never above `READ_FILE_MAX_BYTES`, which applies without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Result of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadFileResult {
    /// The file's bytes, base64.
    pub data_base64: String,
}

/// Params of `fs/writeFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WriteFileParams {
    /// Target file (created or truncated; its directory must exist).
    pub path: FileUri,
    /// The bytes, base64.
    pub data_base64: String,
    /// Write a temporary file beside the target and rename it over, so readers never see a
    /// partial file.
    #[serde(default)]
    pub atomic: bool,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Params of `fs/createDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectoryParams {
    /// The directory.
    pub path: FileUri,
    /// Create missing parents and accept an existing directory (default true).
    #[serde(default = "default_true")]
    pub recursive: bool,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Params of `fs/getMetadata`, `fs/canonicalize` and `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PathParams {
    /// The path.
    pub path: FileUri,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Result of `fs/getMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GetMetadataResult {
    /// The path (after following a symlink) is a directory.
    pub is_directory: bool,
    /// The path (after following a symlink) is a regular file.
    pub is_file: bool,
    /// The path itself is a symlink.
    pub is_symlink: bool,
    /// Size in bytes.
    pub size: u64,
    /// Creation time in ms since the epoch (0 where the filesystem does not record it).
    pub created_at_ms: i64,
    /// Modification time in ms since the epoch.
    pub modified_at_ms: i64,
}

/// Result of `fs/canonicalize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CanonicalizeResult {
    /// The absolute path with every symlink, `.` and `..` resolved.
    pub path: FileUri,
}

/// One entry of `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DirectoryEntry {
    /// The name (lossy UTF-8 for display; use `path` to address the entry).
    pub file_name: String,
    /// The entry's full path; exact even when the name is not UTF-8.
    pub path: FileUri,
    /// Is (or links to) a directory.
    pub is_directory: bool,
    /// Is (or links to) a regular file.
    pub is_file: bool,
    /// Is a symlink (possibly dangling: then both kinds are false).
    pub is_symlink: bool,
}

/// Result of `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadDirectoryResult {
    /// Entries sorted by name bytes.
    pub entries: Vec<DirectoryEntry>,
    /// The directory has more entries than the answer holds (`READ_DIRECTORY_MAX_ENTRIES`, or
    /// `READ_DIRECTORY_MAX_ANSWER_BYTES` of entries): these are its first ones by name. Sent
    /// only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Params of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WalkParams {
    /// The directory whose tree is listed (followed if it is a symlink).
    pub path: FileUri,
    /// Levels below `path` to list: 1 to `MAX_TREE_DEPTH` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<usize>,
    /// Entries to return at most: 1 to `WALK_MAX_ENTRIES` (default 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<usize>,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// One entry of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WalkEntry {
    /// The entry's full path; exact even when a name is not UTF-8.
    pub path: FileUri,
    /// Its level below the walked directory (1 for that directory's own entries).
    pub depth: usize,
    /// Is a directory (never true for a symlink: links are not followed).
    pub is_directory: bool,
    /// Is a regular file.
    pub is_file: bool,
    /// Is a symlink (listed, not followed).
    pub is_symlink: bool,
}

/// Result of `fs/walk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WalkResult {
    /// Depth-first, sorted by name bytes within each directory.
    pub entries: Vec<WalkEntry>,
    /// The tree has more entries than `maxEntries`.
    pub truncated: bool,
}

/// Params of `fs/remove`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RemoveParams {
    /// The path; a symlink is removed itself, never followed.
    pub path: FileUri,
    /// Remove directories with their contents (default true).
    #[serde(default = "default_true")]
    pub recursive: bool,
    /// A missing path is not an error (default true).
    #[serde(default = "default_true")]
    pub force: bool,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Params of `fs/copy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CopyParams {
    /// What to copy.
    pub source_path: FileUri,
    /// The path of the copy.
    pub destination_path: FileUri,
    /// Required to copy a directory.
    #[serde(default)]
    pub recursive: bool,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Params of `fs/open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    /// Caller-chosen handle id (1 to 32 bytes), unique on the connection.
    pub handle_id: String,
    /// A regular file.
    pub path: FileUri,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
}

/// Result of `fs/open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct OpenResult {
    /// The handle id from the request.
    pub handle_id: String,
}

/// Params of `fs/readBlock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadBlockParams {
    /// An open handle.
    pub handle_id: String,
    /// Byte offset to read from.
    pub offset: u64,
    /// Bytes to read: 1 to 1 MiB.
    pub len: u64,
}

/// Result of `fs/readBlock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ReadBlockResult {
    /// The bytes read, base64 (shorter than `len` only at end of file).
    pub chunk: String,
    /// The end of the file was reached.
    pub eof: bool,
}

/// Params of `fs/close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CloseParams {
    /// The handle to close.
    pub handle_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorKind, INVALID_PARAMS};
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn parse_tolerates_unknown_fields_and_serializes_as_a_helper_request() {
        let params = json!({"path": "file:///tmp/x", "fromANewerClient": 1,
                            "sandbox": {"profile": "read-only"}});
        let request = FsRequest::parse("fs/readDirectory", Some(params))
            .unwrap()
            .unwrap();
        assert_eq!(request.method(), "fs/readDirectory");
        assert_eq!(request.sandbox(), Some(&json!({"profile": "read-only"})));
        let wire = serde_json::to_value(&request).unwrap();
        assert_eq!(
            wire,
            json!({"operation": "fs/readDirectory",
                   "params": {"path": "file:///tmp/x", "sandbox": {"profile": "read-only"}}})
        );
        assert_eq!(serde_json::from_value::<FsRequest>(wire).unwrap(), request);
    }

    #[test]
    fn parse_reports_bad_params_as_parse_params_does_and_skips_handle_methods() {
        let error =
            FsRequest::parse("fs/readFile", Some(json!({"path": "/etc/hostname"}))).unwrap_err();
        let expected =
            parse_params::<ReadFileParams>("fs/readFile", Some(json!({"path": "/etc/hostname"})))
                .unwrap_err();
        assert_eq!(error, expected);
        assert_eq!(error.code, INVALID_PARAMS);
        assert_eq!(error.kind(), Some(ErrorKind::InvalidPath));
        let missing = FsRequest::parse("fs/remove", None).unwrap_err();
        assert!(
            missing.message.contains("missing field `path`"),
            "{missing:?}"
        );
        for method in ["fs/readBlock", "fs/close", "process/start"] {
            assert_eq!(FsRequest::parse(method, Some(json!({}))).unwrap(), None);
        }
    }

    #[test]
    fn a_null_sandbox_is_no_sandbox() {
        let request = FsRequest::parse(
            "fs/open",
            Some(json!({"handleId": "h", "path": "file:///x", "sandbox": null})),
        )
        .unwrap()
        .unwrap();
        assert_eq!(request.sandbox(), None);
    }
}
