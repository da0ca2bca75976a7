//! `exec-server exec` as people and scripts use it: the real binary as a client of a real
//! server, with pipes or (for `--tty`) a PTY driving it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use tests::*;

mod sandbox_and_exits;
mod session;
mod signals;
mod tty;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

fn exec(url: &str, extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", url, "--cwd", "/"])
        .args(extra)
        .arg("--")
        .args(command);
    cmd
}
