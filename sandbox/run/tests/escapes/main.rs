//! Escape classes an attacker's command tried (issue 11), each closed by construction and each
//! proven on the host: the effect did not happen. Every case runs as root and as uid 65534, in a
//! fresh `sandbox-run`, with a control run where the sandbox is what makes the difference.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support functions outside #[test]

#[path = "../common/mod.rs"]
mod common;

mod paths;
mod privileges;
mod processes;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

const WW: &[&str] = &["--policy", "workspace-write"];
