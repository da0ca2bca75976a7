//! `fs/*` methods against a real directory tree: data round trips, symlinks, FIFOs, non-UTF-8
//! names, handles and their limits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tests::{Client, ExecServer, RpcError, assert_rpc_error, b64, error_kind, file_uri, unb64};

mod files;
mod handles;
mod tree;
mod walk;

/// `MAX_OPEN_HANDLES` from docs/protocol.md.
const MAX_OPEN_HANDLES: usize = 128;
/// `READ_BLOCK_MAX_BYTES` from docs/protocol.md.
const READ_BLOCK_MAX_BYTES: u64 = 1024 * 1024;
/// `READ_FILE_MAX_BYTES` from docs/protocol.md.
const READ_FILE_MAX_BYTES: u64 = 32 * 1024 * 1024;

async fn setup() -> (ExecServer, Client, tempfile::TempDir) {
    let server = ExecServer::start(&["--listen", "ws://127.0.0.1:0"]);
    let client = server.client().await;
    (server, client, tempfile::tempdir().unwrap())
}

async fn read_file(client: &mut Client, path: &Path) -> Result<Vec<u8>, RpcError> {
    let result = client
        .request("fs/readFile", json!({"path": file_uri(path)}))
        .await?;
    Ok(unb64(result["dataBase64"].as_str().expect("dataBase64")))
}

async fn metadata(client: &mut Client, path: &Path) -> Result<Value, RpcError> {
    client
        .request("fs/getMetadata", json!({"path": file_uri(path)}))
        .await
}
