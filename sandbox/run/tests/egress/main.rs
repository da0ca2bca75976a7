//! Network allowlists end to end: the real `sandbox-run` and `egress-proxy`, real clients inside
//! the sandbox (curl, pip, python sockets), and origin servers on the host's 127.0.0.1 that
//! count what reaches them. No internet: names are mapped with `--egress-hosts`.
//!
//! Every case runs as root and as uid 65534 (the denial-audit cases as 65534 only: as root
//! `--audit` would switch the kernel audit on for the whole machine).
//!
//! Shared fixtures: `harness` (running `sandbox-run` and reading what happened) and `origins`
//! (the counting origin server). Every other module is one group of cases, with the servers
//! only it uses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

#[path = "../common/mod.rs"]
mod common;
use common::scratch;

mod allowlist;
mod ask;
mod audit;
mod harness;
mod inspect;
mod origins;
mod proxy;
mod requests;
mod resolution;
mod tunnels;
mod upstream;

use harness::*;
use origins::*;

const NOBODY: u32 = 65534;
/// Deadline for any single wait.
const DEADLINE: Duration = Duration::from_secs(20);
const PYTHON: &str = "/usr/bin/python3";

fn identities() -> Vec<Option<u32>> {
    if nix::unistd::geteuid().is_root() {
        vec![None, Some(NOBODY)]
    } else {
        vec![None]
    }
}
