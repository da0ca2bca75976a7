//! Failing parts under the real server: helpers and children killed with SIGKILL, the server
//! itself killed, a full disk, a read-only filesystem, and no descriptors left. Each gives a
//! clear error, no crash, nothing half-written, and the server recovers when the fault goes.
//!
//! The filesystem faults mount small tmpfs instances and so need root; they fail with a message
//! saying so otherwise. (tests/tests/sandboxed/helpers.rs already kills a pooled helper blocked
//! before it read its request; here one dies in the middle of writing.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tests::{
    Client, DEADLINE, ExecServer, RpcError, b64, cmdline, descendants, error_kind, fd_count,
    file_uri, process_is_dead, require_root, sh, unb64, wait_process_dead,
};

mod descriptors;
mod filesystems;
mod kills;

/// Prefix of the temporary file an atomic `fs/writeFile` writes beside its target.
const ATOMIC_TEMP_PREFIX: &str = ".execward-write-";

fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ew-faults-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn write_policy(dir: &Path) -> Value {
    json!({"profile": "workspace-write", "cwd": file_uri(dir)})
}

/// Pooled fs-helpers of the server (its children running `fs-helper --serve`).
fn helper_pids(server: &ExecServer) -> Vec<i32> {
    descendants(server.pid())
        .into_iter()
        .filter(|&pid| cmdline(pid).contains("--serve"))
        .collect()
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn write_file(
    client: &mut Client,
    path: &Path,
    data: &[u8],
    atomic: bool,
    sandbox: Value,
) -> Result<Value, RpcError> {
    client
        .request(
            "fs/writeFile",
            json!({"path": file_uri(path), "dataBase64": b64(data), "atomic": atomic,
                   "sandbox": sandbox}),
        )
        .await
}
