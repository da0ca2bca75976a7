//! The `fs/*` methods. Unsandboxed requests run in-process through the `fs-helper` library on
//! the blocking pool (one implementation for both paths); a request whose `sandbox` restricts the
//! filesystem is never run unsandboxed.

mod handles;

use std::sync::Arc;

use base64::Engine;
use fs_helper::{FsError, WriteOptions};
use proto::FileUri;
use proto::error::RpcError;
use proto::methods::Empty;
use proto::methods::fs::*;
use serde_json::Value;

pub use handles::HandleTable;

use crate::limits::READ_FILE_MAX_BYTES;
use crate::rpc::connection::Connection;
use crate::rpc::dispatch::to_value;

/// Why an `fs/*` request failed before or around the filesystem operation.
#[derive(Debug, thiserror::Error)]
pub enum FsRequestError {
    /// The operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// `dataBase64` does not decode.
    #[error("dataBase64 is not valid base64: {0}")]
    InvalidBase64(String),
    /// A param is out of its domain.
    #[error("{0}")]
    InvalidParams(String),
    /// No such handle.
    #[error("unknown handle {0:?}; open it with fs/open first")]
    UnknownHandle(String),
    /// Handle id in use.
    #[error("handle {0:?} is already open on this connection; choose another handleId")]
    DuplicateHandle(String),
    /// Too many open handles.
    #[error(
        "this connection already has {0} open handles (MAX_OPEN_HANDLES); close some with fs/close"
    )]
    TooManyHandles(usize),
    /// Sandboxed operations are not available.
    #[error("{0}")]
    SandboxUnsupported(String),
    /// The blocking task died.
    #[error("filesystem task failed: {0}")]
    Join(String),
}

/// Refuse a restricting sandbox: the operation must never silently run without it.
fn require_unsandboxed(method: &str, sandbox: &Option<Value>) -> Result<(), FsRequestError> {
    let Some(sandbox) = sandbox.as_ref().filter(|value| !value.is_null()) else {
        return Ok(());
    };
    let full_access = ["profile", "type"]
        .iter()
        .any(|key| sandbox.get(key).and_then(Value::as_str) == Some("danger-full-access"));
    if full_access {
        return Ok(());
    }
    Err(FsRequestError::SandboxUnsupported(format!(
        "{method} with a restricting sandbox is not available in this build; refusing to run it unsandboxed"
    )))
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, FsRequestError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| FsRequestError::Join(e.to_string()))?
        .map_err(FsRequestError::from)
}

fn uri(path: std::path::PathBuf) -> Result<FileUri, FsRequestError> {
    FileUri::from_path(path).map_err(|e| FsRequestError::InvalidParams(e.to_string()))
}

/// `fs/readFile`.
pub async fn read_file(_: &Arc<Connection>, params: ReadFileParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_READ_FILE, &params.sandbox)?;
    let path = params.path.into_path_buf();
    let data = blocking(move || fs_helper::read_file(&path, READ_FILE_MAX_BYTES)).await?;
    to_value(ReadFileResult {
        data_base64: base64::engine::general_purpose::STANDARD.encode(data),
    })
}

/// `fs/writeFile`.
pub async fn write_file(_: &Arc<Connection>, params: WriteFileParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_WRITE_FILE, &params.sandbox)?;
    let data = base64::engine::general_purpose::STANDARD
        .decode(params.data_base64.as_bytes())
        .map_err(|e| FsRequestError::InvalidBase64(e.to_string()))?;
    let path = params.path.into_path_buf();
    let options = WriteOptions {
        atomic: params.atomic,
    };
    blocking(move || fs_helper::write_file(&path, &data, &options)).await?;
    to_value(Empty {})
}

/// `fs/createDirectory`.
pub async fn create_directory(
    _: &Arc<Connection>,
    params: CreateDirectoryParams,
) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_CREATE_DIRECTORY, &params.sandbox)?;
    let path = params.path.into_path_buf();
    blocking(move || fs_helper::create_directory(&path, params.recursive)).await?;
    to_value(Empty {})
}

/// `fs/getMetadata`.
pub async fn get_metadata(_: &Arc<Connection>, params: PathParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_GET_METADATA, &params.sandbox)?;
    let path = params.path.into_path_buf();
    let metadata = blocking(move || fs_helper::get_metadata(&path)).await?;
    to_value(GetMetadataResult {
        is_directory: metadata.is_directory,
        is_file: metadata.is_file,
        is_symlink: metadata.is_symlink,
        size: metadata.size,
        created_at_ms: metadata.created_at_ms.unwrap_or(0),
        modified_at_ms: metadata.modified_at_ms.unwrap_or(0),
    })
}

/// `fs/canonicalize`.
pub async fn canonicalize(_: &Arc<Connection>, params: PathParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_CANONICALIZE, &params.sandbox)?;
    let path = params.path.into_path_buf();
    let canonical = blocking(move || fs_helper::canonicalize(&path)).await?;
    to_value(CanonicalizeResult {
        path: uri(canonical)?,
    })
}

/// `fs/readDirectory`.
pub async fn read_directory(_: &Arc<Connection>, params: PathParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_READ_DIRECTORY, &params.sandbox)?;
    let path = params.path.into_path_buf();
    let dir = path.clone();
    let entries = blocking(move || fs_helper::read_directory(&dir)).await?;
    let entries = entries
        .into_iter()
        .map(|entry| {
            Ok(DirectoryEntry {
                file_name: entry.file_name.to_string_lossy().into_owned(),
                path: uri(path.join(&entry.file_name))?,
                is_directory: entry.is_directory,
                is_file: entry.is_file,
                is_symlink: entry.is_symlink,
            })
        })
        .collect::<Result<Vec<_>, FsRequestError>>()?;
    to_value(ReadDirectoryResult { entries })
}

/// `fs/remove`.
pub async fn remove(_: &Arc<Connection>, params: RemoveParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_REMOVE, &params.sandbox)?;
    let path = params.path.into_path_buf();
    blocking(move || fs_helper::remove(&path, params.recursive, params.force)).await?;
    to_value(Empty {})
}

/// `fs/copy`.
pub async fn copy(_: &Arc<Connection>, params: CopyParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_COPY, &params.sandbox)?;
    let (source, destination) = (
        params.source_path.into_path_buf(),
        params.destination_path.into_path_buf(),
    );
    blocking(move || fs_helper::copy(&source, &destination, params.recursive)).await?;
    to_value(Empty {})
}

/// `fs/open`.
pub async fn open(connection: &Arc<Connection>, params: OpenParams) -> Result<Value, RpcError> {
    require_unsandboxed(proto::methods::FS_OPEN, &params.sandbox)?;
    let reservation = connection.handles.reserve(&params.handle_id)?;
    let path = params.path.into_path_buf();
    let file = blocking(move || fs_helper::open_for_streaming(&path)).await?;
    reservation.fill(file);
    to_value(OpenResult {
        handle_id: params.handle_id,
    })
}

/// `fs/readBlock`.
pub async fn read_block(
    connection: &Arc<Connection>,
    params: ReadBlockParams,
) -> Result<Value, RpcError> {
    if params.len == 0 || params.len > fs_helper::READ_BLOCK_MAX_BYTES as u64 {
        return Err(FsRequestError::InvalidParams(format!(
            "len must be from 1 to {} (READ_BLOCK_MAX_BYTES), got {}",
            fs_helper::READ_BLOCK_MAX_BYTES,
            params.len
        ))
        .into());
    }
    let file = connection.handles.get(&params.handle_id)?;
    let (offset, len) = (params.offset, params.len as usize);
    let (data, eof) = blocking(move || fs_helper::read_block(&file, offset, len)).await?;
    to_value(ReadBlockResult {
        chunk: base64::engine::general_purpose::STANDARD.encode(data),
        eof,
    })
}

/// `fs/close`.
pub fn close(connection: &Arc<Connection>, params: CloseParams) -> Result<Value, RpcError> {
    connection.handles.close(&params.handle_id)?;
    to_value(Empty {})
}
