//! The policy model's unit tests, one file per concern; the shared fixtures are here.

mod network;
mod profiles;
mod reads;
mod roots;
mod shapes;

use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;

fn ctx() -> ResolveContext {
    ResolveContext {
        tmpdir: Some(PathBuf::from("/var/tmp")),
        homes: Vec::new(),
        ..Default::default()
    }
}

fn rule(path: &str, access: Access) -> PathRule {
    PathRule {
        path: PathBuf::from(path),
        access,
    }
}

fn spec(value: serde_json::Value) -> SandboxSpec {
    serde_json::from_value(value).unwrap()
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

/// A directory outside /tmp and $TMPDIR (which every sandbox sees a private copy of), where a
/// writable root is a host directory a sandbox can plant symlinks in.
fn host_workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

/// A directory outside `/dev` (whose paths resolve lexically, not through symlinks) and `/tmp`
/// (every sandbox's private layer).
fn disk_workspace() -> (tempfile::TempDir, PathBuf) {
    // In /srv, outside /tmp and the test $TMPDIR (/var/tmp), wherever the checkout is (a
    // workspace under /tmp has its own test:
    // a_workspace_under_tmp_is_a_host_directory_sandboxes_write_and_its_plants_are_refused).
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/srv")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}
