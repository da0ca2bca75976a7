//! README promises of the sandbox that had no test of their own (issue 20), each checked on the
//! host as root and as uid 65534, with the known limits pinned down as they are documented.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod filesystem;
mod kernel;
mod tmp;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

const WW: &[&str] = &["--policy", "workspace-write"];

fn chown_to(uid: Option<u32>, paths: &[&std::path::Path]) {
    if let Some(uid) = uid {
        for path in paths {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }
}
