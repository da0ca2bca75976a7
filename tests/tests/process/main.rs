//! `process/start`, `write`, `signal`, `resize`, `terminate`: what the child sees and how it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::{Client, ExecServer, assert_rpc_error, b64, file_uri, sh, stat_field};

mod io;
mod signals;
mod start;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Start `sh -c 'echo $$; exec ...'`-style processes and return the pid the shell printed.
async fn first_line_pid(client: &mut Client, process_id: &str) -> i32 {
    let text = client.wait_for_output(process_id, "\n").await;
    text.lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("first line of {process_id} is not a pid ({e}): {text:?}"))
}
