//! Test harness for the integration tests: the real `exec-server` binary and a real websocket
//! client.
//!
//! - [`ExecServer::start`] spawns `exec-server` from the cargo target directory next to the
//!   running test executable, reads the bound URL from the first stdout line under a deadline,
//!   captures stderr for diagnostics, and kills the server (SIGKILL) when dropped.
//! - [`Client`] speaks JSON-RPC over tokio-tungstenite (`ws://` or `unix:`). Responses are matched
//!   by id; notifications that arrive meanwhile are stashed in order and handed out by
//!   [`Client::next_notification`] and [`Client::wait_for_notification`].
//!
//! Every wait has a deadline and panics with a message naming what it waited for. Nothing here
//! sleeps to wait for a condition.
//!
//! The harness is split by concern into private modules whose items are re-exported here, so
//! every item keeps its `tests::NAME` path: `server` (the process), `client` (the websocket
//! client), `wire` (encoding helpers, error assertions), `procfs` (`/proc` probes), `raw_ws` (raw
//! frames), `proxy` ([`CutProxy`]), `library` (library-client helpers), `json_schema` (validation
//! against `docs/schema/`) and `fixtures`.
#![deny(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

pub use proto::RpcError;

mod client;
mod fixtures;
mod json_schema;
mod library;
mod procfs;
mod proxy;
mod raw_ws;
mod server;
// The only unsafe code of the crate: raw calls, each behind a safe wrapper.
#[allow(unsafe_code)]
mod sys;
mod wire;

pub mod matrix;
pub mod nats;
pub mod relay;
pub mod scratch;
pub mod siege;

pub use client::{Client, Io, ProcessOutput, decode_events, probe_report, seqs, sh};
pub use fixtures::{
    SandboxDirs, median, output_within, require_root, skip_unless_ci, wait_child, wait_for_file,
};
pub use json_schema::{
    assert_messages_match_protocol, json_schema_verdicts, protocol_schema, result_schema,
};
pub use library::{
    library_client, next_event, start_params, wait_for_event_output, wait_for_state,
};
pub use procfs::{
    children_of, cmdline, descendants, fd_count, fd_targets, peak_rss_kib, process_is_dead,
    rss_kib, sleeping, stat_field, wait_process_dead,
};
pub use proxy::CutProxy;
pub use raw_ws::{
    RawEnd, opcode, raw_websocket, read_raw_frame, read_until_closed, ws_frame, ws_frame_header,
};
pub use server::{
    ExecServer, INSTALLED_BINARIES, RefusedStart, budget_in, exec_server_binary, install_binaries,
};
pub use wire::{assert_rpc_error, b64, error_kind, error_text, file_uri, unb64};

/// The default deadline for any single wait (a response, a notification, the URL line).
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Name of the server binary built by the `supervisor` crate.
pub const SERVER_BINARY: &str = "exec-server";
