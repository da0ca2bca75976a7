//! Hostile clients against the real server: oversized and malformed frames, floods that do not
//! read, slow and vanishing connections, bad base64, path tricks and absurd numbers. Each gets a
//! clear error or a clean close, and the server keeps serving everyone else.
//!
//! Limits are the ones of docs/protocol.md; the numbers are repeated here as the wire contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::siege::Siege;
use tests::{
    Client, DEADLINE, ExecServer, RawEnd, assert_rpc_error, b64, fd_count, file_uri, opcode,
    raw_websocket, read_raw_frame, read_until_closed, rss_kib, sh, unb64, ws_frame,
    ws_frame_header,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod connections;
mod floods;
mod frames;
mod holdings;
mod inflight;
mod numbers;
mod payloads;
mod retention;

/// `MAX_FRAME_BYTES`: larger messages or frames close the connection with 1009.
const MAX_FRAME_BYTES: u64 = 64 * 1024 * 1024;
/// `UPGRADE_HEAD_TIMEOUT`: the whole HTTP head must arrive within this.
const UPGRADE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// `MAX_UPGRADE_HEAD_BYTES`.
const MAX_UPGRADE_HEAD_BYTES: usize = 16 * 1024;
/// `READ_BLOCK_MAX_BYTES`.
const READ_BLOCK_MAX_BYTES: u64 = 1024 * 1024;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// A server for a case measured beside a neighbour (see `tests::siege::isolate_from_host_load`).
fn besieged_server(args: &[&str]) -> ExecServer {
    let mut all = vec!["--listen", "ws://127.0.0.1:0"];
    all.extend_from_slice(args);
    ExecServer::start_with(&all, tests::siege::isolate_from_host_load)
}

/// One round trip that touches the filesystem: the server is alive and serving `client`.
async fn assert_serving(client: &mut Client) {
    let started = Instant::now();
    client
        .call("fs/getMetadata", json!({"path": "file:///"}))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a trivial request took {:?}",
        started.elapsed()
    );
}

/// A `cat` with piped stdin on `client`: proves a session with a live process is unaffected.
async fn start_echo(client: &mut Client, id: &str) {
    client
        .start(id, &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
}

async fn assert_echoes(client: &mut Client, id: &str, text: &str) {
    client
        .call(
            "process/write",
            json!({"processId": id, "chunk": b64(text)}),
        )
        .await;
    client.wait_for_output(id, text).await;
}

/// The next message must be an error response with id -1 and code -32600.
async fn expect_envelope_error(client: &mut Client, what: &str) -> Value {
    let message = client
        .next_message(DEADLINE)
        .await
        .unwrap_or_else(|| panic!("no answer to {what} within {DEADLINE:?}"));
    assert_eq!(message["id"], -1, "{what}: {message}");
    assert_eq!(message["error"]["code"], -32600, "{what}: {message}");
    message
}

/// Deterministic pseudo-random bytes (xorshift), so a failure can be replayed.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// `{"id":N,...}` → N without parsing the whole (large) response.
fn response_id(payload: &[u8]) -> Option<i64> {
    let rest = payload.strip_prefix(b"{\"id\":")?;
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit() && *b != b'-')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}
// ---------------------------------------------------------------------------------------------
// Budgets: each case runs beside a neighbour session (tests::siege) whose requests must all
// succeed with a p99 under 50 ms, with the server in a memory cgroup where the host allows, its
// RSS under the bound the case states, and its descriptors back to their baseline afterwards.
// ---------------------------------------------------------------------------------------------

/// `READ_FILE_MAX_BYTES`.
const READ_FILE_MAX_BYTES: usize = 32 * 1024 * 1024;
/// `MAX_INFLIGHT_BYTES_PER_CONNECTION`: requests and unwritten answers one connection holds.
const MAX_INFLIGHT_BYTES_PER_CONNECTION: u64 = 160 * 1024 * 1024;
/// `OUTBOUND_QUEUE_BYTES`: queued notifications per connection.
const OUTBOUND_QUEUE_BYTES: u64 = 8 * 1024 * 1024;
/// `MEMORY_BUDGET_BYTES`: requests and answers across all connections.
const MEMORY_BUDGET_BYTES: u64 = 1024 * 1024 * 1024;
/// `CONNECTION_MEMORY_ALLOWANCE`: what each connection holds outside the memory budget.
const CONNECTION_MEMORY_ALLOWANCE: u64 = 2 * 1024 * 1024;
/// Allocator slack, thread stacks and transient copies (an answer is serialized while its value
/// still exists; the websocket writer copies a frame into its buffer).
const RSS_SLACK: u64 = 64 * 1024 * 1024;
/// How long a case watches the server under attack.
const ATTACK_WINDOW: Duration = Duration::from_secs(3);

fn kib(bytes: u64) -> u64 {
    bytes / 1024
}

/// A raw websocket with `initialize` answered: the hostile client controls every byte.
async fn raw_session(
    server: &ExecServer,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
) {
    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let init = r#"{"id":0,"method":"initialize","params":{"clientName":"hostile"}}"#;
    writer
        .write_all(&ws_frame(true, opcode::TEXT, init.as_bytes()))
        .await
        .unwrap();
    let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        response_id(&answer),
        Some(0),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    (reader, writer)
}

/// Watch for `window` (the attack is underway meanwhile; the siege samples RSS).
async fn under_attack_for(window: Duration) {
    tokio::time::sleep(window).await; // observation window, not a wait for a condition
}

/// `initialize` resuming `session` on `client`.
async fn resume(client: &mut Client, session: &str) -> Result<Value, tests::RpcError> {
    client
        .request(
            "initialize",
            json!({"clientName": "tests", "resumeSessionId": session}),
        )
        .await
}
