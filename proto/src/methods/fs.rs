//! `fs/*` params and results. Every path is a [`FileUri`]; every method accepts an optional
//! `sandbox` object (see policies/README.md).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::uri::FileUri;

fn default_true() -> bool {
    true
}

/// Params of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileParams {
    /// A regular file.
    pub path: FileUri,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
}

/// Result of `fs/readFile`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadFileResult {
    /// The file's bytes, base64.
    pub data_base64: String,
}

/// Params of `fs/writeFile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub sandbox: Option<Value>,
}

/// Params of `fs/createDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateDirectoryParams {
    /// The directory.
    pub path: FileUri,
    /// Create missing parents and accept an existing directory (default true).
    #[serde(default = "default_true")]
    pub recursive: bool,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
}

/// Params of `fs/getMetadata`, `fs/canonicalize` and `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathParams {
    /// The path.
    pub path: FileUri,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
}

/// Result of `fs/getMetadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[serde(rename_all = "camelCase")]
pub struct CanonicalizeResult {
    /// The absolute path with every symlink, `.` and `..` resolved.
    pub path: FileUri,
}

/// One entry of `fs/readDirectory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[serde(rename_all = "camelCase")]
pub struct ReadDirectoryResult {
    /// Entries sorted by name bytes.
    pub entries: Vec<DirectoryEntry>,
}

/// Params of `fs/remove`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub sandbox: Option<Value>,
}

/// Params of `fs/copy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub sandbox: Option<Value>,
}

/// Params of `fs/open`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenParams {
    /// Caller-chosen handle id (1 to 32 bytes), unique on the connection.
    pub handle_id: String,
    /// A regular file.
    pub path: FileUri,
    /// Optional sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
}

/// Result of `fs/open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenResult {
    /// The handle id from the request.
    pub handle_id: String,
}

/// Params of `fs/readBlock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[serde(rename_all = "camelCase")]
pub struct ReadBlockResult {
    /// The bytes read, base64 (shorter than `len` only at end of file).
    pub chunk: String,
    /// The end of the file was reached.
    pub eof: bool,
}

/// Params of `fs/close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloseParams {
    /// The handle to close.
    pub handle_id: String,
}
