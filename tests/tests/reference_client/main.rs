//! The wire shapes the reference client sends, against the real `exec-server`: every field of its
//! `process/start` (`envPolicy` null or full, native `cwd`, fields we do not know),
//! `environment/info` with null params, buffered and streamed `http/request` against a local HTTP
//! server started here, `process/write` statuses, a recursive copy with a FIFO inside, and the
//! error codes the reference client maps to error kinds. Then the library client's
//! `environment_info()`, `http_request()` and `http_request_stream()`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::{any, get};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tests::{
    Client, CutProxy, DEADLINE, ExecServer, assert_rpc_error, b64, exec_server_binary, file_uri,
    library_client, unb64,
};
use tokio::sync::watch;

mod environment_and_fs;
mod http;
mod library;
mod process;
mod wording;

// ---------------------------------------------------------------------------------------------
// A local HTTP server for http/request
// ---------------------------------------------------------------------------------------------

/// A local HTTP server on 127.0.0.1:0.
///
/// - `/echo` answers `{method, headers: [[name, value]...], bodyBase64, peer}` (`peer`: the
///   client's address, so connection reuse shows) with two `x-multi` response headers;
/// - `/gated` sends `part-1\n`, waits until [`Upstream::open_gate`], then `part-2\n` ..
///   `part-5\n`; every dropped `/gated` or `/hang-body` body bumps [`Upstream::dropped`];
/// - `/hang` never answers; `/hang-body` sends its headers and `first`, then never more;
/// - `/redirect` is a 302 to `/echo`; `/big` is larger than `MAX_HTTP_RESPONSE_BODY_BYTES`.
struct Upstream {
    addr: SocketAddr,
    gate: watch::Sender<bool>,
    dropped: watch::Sender<u32>,
}

#[derive(Clone)]
struct UpstreamState {
    gate: watch::Receiver<bool>,
    dropped: watch::Sender<u32>,
}

/// Bumps the dropped-body counter when the body is dropped (sent to the end or abandoned).
struct DropSignal(watch::Sender<u32>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count += 1);
    }
}

/// `MAX_HTTP_RESPONSE_BODY_BYTES` from docs/protocol.md.
const MAX_HTTP_RESPONSE_BODY_BYTES: usize = 32 * 1024 * 1024;
/// `MAX_HTTP_REQUEST_BODY_BYTES` from docs/protocol.md.
const MAX_HTTP_REQUEST_BODY_BYTES: usize = 32 * 1024 * 1024;
/// `HTTP_BODY_DELTA_BYTES` from docs/protocol.md.
const HTTP_BODY_DELTA_BYTES: usize = 256 * 1024;

impl Upstream {
    async fn start() -> Upstream {
        let (gate, gate_rx) = watch::channel(false);
        let (dropped, _) = watch::channel(0);
        let state = UpstreamState {
            gate: gate_rx,
            dropped: dropped.clone(),
        };
        let app = Router::new()
            .route("/echo", any(echo))
            .route("/gated", get(gated))
            .route("/hang", get(hang))
            .route("/hang-body", get(hang_body))
            .route("/redirect", any(redirect))
            .route("/big", get(big))
            .route("/length", any(length))
            .route("/megabyte", get(megabyte))
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Upstream {
            addr,
            gate,
            dropped,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    async fn wait_dropped(&self, count: u32) {
        let mut dropped = self.dropped.subscribe();
        tokio::time::timeout(DEADLINE, dropped.wait_for(|n| *n >= count))
            .await
            .unwrap_or_else(|_| panic!("{count} upstream bodies not dropped within {DEADLINE:?}"))
            .unwrap();
    }
}

async fn echo(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let headers: Vec<Value> = headers
        .iter()
        .map(|(name, value)| json!([name.as_str(), value.to_str().unwrap()]))
        .collect();
    let text = json!({"method": method.as_str(), "headers": headers, "bodyBase64": b64(&body),
                      "peer": peer.to_string()});
    Response::builder()
        .header("x-multi", "one")
        .header("x-multi", "two")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(text.to_string()))
        .unwrap()
}

async fn gated(State(state): State<UpstreamState>) -> Response {
    let guard = DropSignal(state.dropped.clone());
    let stream = futures_util::stream::unfold(
        (1u32, state.gate.clone(), guard),
        |(part, mut gate, guard)| async move {
            if part > 5 {
                return None;
            }
            if part == 2 {
                gate.wait_for(|open| *open).await.ok()?;
            }
            let chunk = Bytes::from(format!("part-{part}\n"));
            Some((Ok::<_, std::io::Error>(chunk), (part + 1, gate, guard)))
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn hang() -> &'static str {
    std::future::pending::<()>().await;
    "never"
}

async fn hang_body(State(state): State<UpstreamState>) -> Response {
    let guard = DropSignal(state.dropped.clone());
    let stream = futures_util::stream::unfold((0u32, guard), |(sent, guard)| async move {
        if sent > 0 {
            std::future::pending::<()>().await;
        }
        Some((
            Ok::<_, std::io::Error>(Bytes::from_static(b"first")),
            (sent + 1, guard),
        ))
    });
    Response::new(Body::from_stream(stream))
}

async fn redirect() -> Response {
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, "/echo")
        .body(Body::empty())
        .unwrap()
}

async fn big() -> Vec<u8> {
    vec![b'x'; MAX_HTTP_RESPONSE_BODY_BYTES + 1]
}

/// The request body's length, in decimal (read whole: axum's default 2 MB limit applies only
/// to the `Bytes` extractor).
async fn length(body: Body) -> String {
    axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap()
        .len()
        .to_string()
}

/// One MiB and one byte, numbered so a reordered or lost piece shows.
async fn megabyte() -> Vec<u8> {
    (0..1024 * 1024 + 1u32)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Messages in arrival order until `http/request/bodyDelta` of `request_id` says `done`; the
/// response to `id` and every delta of the request, in the order they came. Other messages are
/// discarded (use it when only this request is active).
async fn response_and_deltas(client: &mut Client, id: &Value, request_id: &str) -> Vec<Value> {
    let until = tokio::time::Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    loop {
        let remaining = until.saturating_duration_since(tokio::time::Instant::now());
        let message = client.next_message(remaining).await.unwrap_or_else(|| {
            panic!("request {request_id} not done within {DEADLINE:?}; seen: {seen:?}")
        });
        let ours =
            message.get("id") == Some(id) || message["params"]["requestId"] == json!(request_id);
        if !ours {
            continue;
        }
        let done = message["params"]["done"] == json!(true);
        seen.push(message);
        if done {
            return seen;
        }
    }
}

/// The child's environment, from `/usr/bin/env` output.
fn parse_env(output: &str) -> BTreeMap<String, String> {
    output
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every field the reference client sends with `process/start`, plus one it may add later.
fn reference_start(process_id: &str, argv: &[&str], cwd: &str, env_policy: Value) -> Value {
    json!({
        "processId": process_id,
        "argv": argv,
        "cwd": cwd,
        "envPolicy": env_policy,
        "env": {"PATH": "/usr/bin:/bin", "FROM_ENV": "1"},
        "tty": false,
        "pipeStdin": false,
        "arg0": null,
        "sandbox": null,
        "enforceManagedNetwork": false,
        "managedNetwork": null,
        "someFieldFromANewerClient": {"nested": true},
    })
}
