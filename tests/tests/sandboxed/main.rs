//! Sandboxed operations through helpers: `fs/*` under read-only and workspace-write run in
//! pooled `fs-helper` processes, denials come back as `sandboxDenied` and leave the disk
//! unchanged, and sandboxed `process/start` runs through `sandbox-run`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Client, ExecServer, assert_rpc_error, b64, file_uri, sh, unb64};

mod fs;
mod helpers;
mod process;
mod reads;

/// [`tests::SandboxDirs`] with a `.git`, a file and an `escape` symlink to the outside.
struct Dirs {
    workspace: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
        std::fs::create_dir(workspace.path().join(".git")).unwrap();
        std::fs::write(
            workspace.path().join(".git/HEAD"),
            b"ref: refs/heads/main\n",
        )
        .unwrap();
        std::fs::write(workspace.path().join("in.txt"), b"inside").unwrap();
        std::os::unix::fs::symlink(outside.path(), workspace.path().join("escape")).unwrap();
        Dirs { workspace, outside }
    }

    fn ws(&self, name: &str) -> PathBuf {
        self.workspace.path().join(name)
    }

    fn out(&self, name: &str) -> PathBuf {
        self.outside.path().join(name)
    }

    fn write_policy(&self) -> Value {
        json!({"profile": "workspace-write", "cwd": file_uri(self.workspace.path())})
    }
}

fn read_only() -> Value {
    json!({"profile": "read-only"})
}

async fn fs_call(
    client: &mut Client,
    method: &str,
    mut params: Value,
    sandbox: Value,
) -> Result<Value, tests::RpcError> {
    params["sandbox"] = sandbox;
    client.request(method, params).await
}

fn assert_denied(result: Result<Value, tests::RpcError>, operation: &str, path: &Path) {
    let error = assert_rpc_error(result, -32600, "sandboxDenied");
    let data = error.data.clone().expect("denial carries data");
    assert_eq!(
        data.operation.as_deref(),
        Some(operation),
        "operation of {error:?}"
    );
    let reported = data.path.expect("denial names the path");
    let expected = file_uri(path);
    assert!(
        reported == expected || expected.starts_with(&reported) || reported.starts_with(&expected),
        "denial path {reported} should name {expected}"
    );
}
