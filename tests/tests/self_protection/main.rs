//! The supervisor cannot be reached, borrowed or swapped from inside a sandbox (issue 12): under
//! every policy shape (filesystem restricted or not, network on or off), for `ws://` and `unix:`
//! listeners, with and without a token file, and with the server run as root and as uid 65534,
//! a sandboxed command can neither connect to its server nor read its credentials; with the
//! server's binaries inside the workspace it cannot modify them, and a file replaced on disk is
//! not what the server executes. With the network on, no call or protocol that opens a
//! connection where Landlock's TCP rule does not look (TCP Fast Open, MPTCP, SCTP) reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tests::matrix::identities;
use tests::{ExecServer, file_uri, install_binaries, scratch};

mod files;
mod pools;
mod reach;

/// A workspace, an install of the binaries and a token file, owned by `uid`.
struct Setup {
    _base: tempfile::TempDir,
    workspace: PathBuf,
    bin: PathBuf,
    token_file: PathBuf,
}

impl Setup {
    fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("self-protection-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        let workspace = root.join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let bin = root.join("bin");
        install_binaries(&bin);
        let token_file = root.join("token");
        std::fs::write(&token_file, "s3cret-token\n").unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        if let Some(uid) = uid {
            for path in [&workspace, &token_file] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
        }
        Self {
            _base: base,
            workspace,
            bin,
            token_file,
        }
    }

    fn start(&self, uid: Option<u32>, args: &[&str]) -> ExecServer {
        ExecServer::start_binary(&self.bin.join("exec-server"), args, |command| {
            command
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                // Every accepted connection is logged at debug: the attacks must leave none.
                .env("RUST_LOG", "supervisor=debug");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    fn probe(&self) -> String {
        self.bin.join("probe").to_str().unwrap().to_owned()
    }
}

/// The policy shapes a sandboxed command can have (a policy that restricts nothing is no
/// sandbox at all).
fn policy_shapes(workspace: &Path) -> Vec<(&'static str, Value)> {
    let cwd = file_uri(workspace);
    vec![
        (
            "filesystem restricted, network off",
            json!({"profile": "workspace-write", "cwd": cwd}),
        ),
        (
            "filesystem restricted, network on",
            json!({"profile": "workspace-write", "cwd": cwd, "networkAccess": true}),
        ),
        (
            "filesystem unrestricted, network off",
            json!({"type": "external-sandbox"}),
        ),
    ]
}

/// Runs the probe under `sandbox` through the server; returns its JSON report.
async fn probe_through(
    client: &mut tests::Client,
    setup: &Setup,
    id: &str,
    sandbox: Option<&Value>,
    op: &[&str],
) -> Value {
    let probe = setup.probe();
    tests::probe_report(client, &probe, &setup.workspace, id, sandbox, op).await
}

fn assert_refused(result: &Value, context: &str) {
    assert_eq!(result["ok"], false, "{context}: reached it: {result}");
}

/// What the server logs for a connection it accepted, upgraded or not.
const CONNECTION_LOG_LINES: [&str; 3] = [
    "dropping connection before upgrade",
    "connection open",
    "initialized",
];

fn connection_lines(log: &str) -> usize {
    log.lines()
        .filter(|line| CONNECTION_LOG_LINES.iter().any(|l| line.contains(l)))
        .count()
}

/// The count of connection lines once the test's own client is logged as initialized.
fn settled_connection_lines(server: &ExecServer) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !server.stderr().contains("initialized") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20)); // polling interval
    }
    connection_lines(&server.stderr())
}

/// Waits (bounded) for the server to log one more connection than `before`.
fn wait_for_connection_line(server: &ExecServer, before: usize) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if connection_lines(&server.stderr()) > before {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20)); // polling interval
    }
    false
}
