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

// ---------------------------------------------------------------------------------------------
// process/start
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn start_with_every_reference_field_and_null_env_policy_gets_exactly_env() {
    let server = server();
    let mut client = server.client().await;
    client
        .call(
            "process/start",
            reference_start("p", &["/usr/bin/env"], "file:///", Value::Null),
        )
        .await;
    let output = client.collect("p").await;
    assert_eq!(
        parse_env(&output.stdout_text()),
        map(&[("FROM_ENV", "1"), ("PATH", "/usr/bin:/bin")])
    );
}

/// The server's own environment for the envPolicy tests.
const SERVER_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/home/server"),
    ("LANG", "C.UTF-8"),
    ("EDITOR", "vi"),
    ("MY_API_KEY", "sk-secret"),
    ("GH_TOKEN", "ghp-secret"),
    ("aws_secret_access", "secret"),
    ("KEEP_ME", "kept"),
];

fn server_with_env() -> ExecServer {
    ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env_clear().envs(SERVER_ENV.iter().copied());
    })
}

async fn child_env(
    client: &mut Client,
    process_id: &str,
    env_policy: Value,
) -> BTreeMap<String, String> {
    let mut params = reference_start(process_id, &["/usr/bin/env"], "file:///", env_policy);
    params["env"] = json!({"HOME": "/overlay", "FROM_ENV": "1"});
    client.call("process/start", params).await;
    parse_env(&client.collect(process_id).await.stdout_text())
}

#[tokio::test]
async fn full_env_policy_builds_the_environment_from_the_servers_own() {
    let server = server_with_env();
    let mut client = server.client().await;

    let all = child_env(
        &mut client,
        "all",
        json!({"inherit": "all", "ignoreDefaultExcludes": false, "exclude": ["EDIT*"],
               "set": {"FROM_SET": "1"}, "includeOnly": []}),
    )
    .await;
    assert_eq!(
        all,
        map(&[
            ("FROM_ENV", "1"),
            ("FROM_SET", "1"),
            ("HOME", "/overlay"),
            ("KEEP_ME", "kept"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let core = child_env(
        &mut client,
        "core",
        json!({"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [], "set": {},
               "includeOnly": []}),
    )
    .await;
    assert_eq!(
        core,
        map(&[
            ("FROM_ENV", "1"),
            ("HOME", "/overlay"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let secrets = child_env(
        &mut client,
        "secrets",
        json!({"inherit": "all", "ignoreDefaultExcludes": true, "exclude": [], "set": {},
               "includeOnly": ["*key*", "*TOKEN", "path"]}),
    )
    .await;
    assert_eq!(
        secrets,
        map(&[
            ("FROM_ENV", "1"),
            ("GH_TOKEN", "ghp-secret"),
            ("HOME", "/overlay"),
            ("MY_API_KEY", "sk-secret"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let none = child_env(
        &mut client,
        "none",
        json!({"inherit": "none", "ignoreDefaultExcludes": false, "exclude": [],
               "set": {"ONLY": "set"}, "includeOnly": []}),
    )
    .await;
    assert_eq!(
        none,
        map(&[("FROM_ENV", "1"), ("HOME", "/overlay"), ("ONLY", "set")])
    );
}

#[tokio::test]
async fn process_start_takes_a_native_cwd_but_fs_paths_stay_uris() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let cwd = real.to_str().unwrap();
    client
        .call(
            "process/start",
            reference_start("pwd", &["/bin/pwd"], cwd, Value::Null),
        )
        .await;
    assert_eq!(
        client.collect("pwd").await.stdout_text(),
        format!("{cwd}\n")
    );

    let relative = client
        .request(
            "process/start",
            reference_start("rel", &["/bin/pwd"], "tmp", Value::Null),
        )
        .await;
    let error = assert_rpc_error(relative, -32602, "invalidPath");
    assert!(error.message.contains("absolute native path"), "{error:?}");

    let native = client
        .request("fs/readFile", json!({"path": cwd, "sandbox": null}))
        .await;
    let error = assert_rpc_error(native, -32602, "invalidPath");
    assert!(error.message.contains("file:///"), "{error:?}");
}

#[tokio::test]
async fn unknown_top_level_fields_are_tolerated_but_never_inside_sandbox() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "data").unwrap();
    let read = client
        .call(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": null, "futureOption": 1}),
        )
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"data");
    let strict = client
        .request(
            "fs/readFile",
            json!({"path": file_uri(&file),
                   "sandbox": {"profile": "read-only", "futureOption": 1}}),
        )
        .await;
    let error = assert_rpc_error(strict, -32602, "invalidParams");
    assert!(error.message.contains("futureOption"), "{error:?}");
}

#[tokio::test]
async fn enforce_managed_network_is_refused_unless_the_network_is_off() {
    let server = server();
    let mut client = server.client().await;
    let mut open = reference_start("open", &["/bin/true"], "file:///", Value::Null);
    open["enforceManagedNetwork"] = json!(true);
    let error = assert_rpc_error(
        client.request("process/start", open).await,
        -32600,
        "unsupported",
    );
    assert!(error.message.contains("enforceManagedNetwork"), "{error:?}");

    let mut closed = reference_start("closed", &["/bin/true"], "file:///", Value::Null);
    closed["enforceManagedNetwork"] = json!(true);
    closed["sandbox"] = json!({"profile": "read-only"});
    client.call("process/start", closed).await;
    assert_eq!(client.collect("closed").await.exit_code, Some(0));
}

// ---------------------------------------------------------------------------------------------
// process/write statuses
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn process_write_answers_with_statuses_not_errors() {
    let server = server();
    let mut client = server.client().await;
    let write = |process_id: &str, chunk: &[u8], extra: Value| {
        let mut params = json!({"processId": process_id, "chunk": b64(chunk),
                                "writeId": uuid_like(process_id, chunk)});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        params
    };
    assert_eq!(
        client
            .call("process/write", write("nobody", b"x", json!({})))
            .await,
        json!({"status": "unknownProcess"})
    );

    client
        .call(
            "process/start",
            json!({"processId": "no-stdin", "argv": ["/bin/sleep", "30"], "cwd": "/",
                   "env": {}, "tty": false, "pipeStdin": false}),
        )
        .await;
    assert_eq!(
        client
            .call("process/write", write("no-stdin", b"x", json!({})))
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "no-stdin"}))
        .await;

    client
        .call(
            "process/start",
            json!({"processId": "cat", "argv": ["/bin/cat"], "cwd": "/", "env": {},
                   "tty": false, "pipeStdin": true}),
        )
        .await;
    let first = write("cat", b"hello\n", json!({}));
    assert_eq!(
        client.call("process/write", first.clone()).await,
        json!({"status": "accepted"})
    );
    // A retry with the same writeId is accepted and applied once.
    assert_eq!(
        client.call("process/write", first).await,
        json!({"status": "accepted"})
    );
    assert_eq!(
        client
            .call("process/write", write("cat", b"", json!({"close": true})))
            .await,
        json!({"status": "accepted"})
    );
    assert_eq!(
        client
            .call("process/write", write("cat", b"late\n", json!({})))
            .await,
        json!({"status": "stdinClosed"})
    );
    let output = client.collect("cat").await;
    assert_eq!(output.stdout_text(), "hello\n");

    let bad = client
        .request(
            "process/write",
            json!({"processId": "cat", "chunk": "!!", "writeId": "w"}),
        )
        .await;
    assert_rpc_error(bad, -32602, "invalidBase64");
}

fn uuid_like(process_id: &str, chunk: &[u8]) -> String {
    format!("{process_id}-{}", b64(chunk))
}

// ---------------------------------------------------------------------------------------------
// environment/info
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn environment_info_answers_absent_null_and_empty_params() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let server = ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.current_dir(&cwd);
    });
    let mut client = server.client().await;
    for params in [Value::Null, json!({}), json!({"future": true})] {
        let info = client.call("environment/info", params).await;
        let path = info["shell"]["path"].as_str().unwrap();
        assert!(
            Path::new(path).is_absolute() && Path::new(path).is_file(),
            "{info}"
        );
        assert_eq!(
            info["shell"]["name"].as_str(),
            Path::new(path).file_name().and_then(|name| name.to_str()),
            "{info}"
        );
        let passwd = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .unwrap()
            .unwrap()
            .shell;
        if passwd.is_file() {
            assert_eq!(Path::new(path), passwd, "the user's login shell");
        }
        assert_eq!(info["cwd"], json!(file_uri(&cwd)));
        assert_eq!(info["os"], json!(std::env::consts::OS));
        assert_eq!(info["arch"], json!(std::env::consts::ARCH));
    }
    // What sandbox-run itself reports on this host.
    let sandbox_run = exec_server_binary().with_file_name("sandbox-run");
    let explain = std::process::Command::new(sandbox_run)
        .args(["--policy", "read-only", "--explain", "--", "true"])
        .output()
        .unwrap();
    let explain: Value = serde_json::from_slice(&explain.stdout).unwrap();
    let info = client.call("environment/info", Value::Null).await;
    let sandbox = &info["sandbox"];
    assert_eq!(sandbox["available"], json!(true), "{info}");
    assert_eq!(sandbox["landlockAbi"], explain["layers"]["landlock"]["abi"]);
    assert_eq!(
        sandbox["userNamespaces"],
        explain["layers"]["namespaces"]["available"]
    );
    assert_eq!(
        sandbox["auditDenials"],
        json!(nix::unistd::geteuid().is_root())
    );
    assert_eq!(sandbox["networkModes"], json!(["off", "on"]));
}

// ---------------------------------------------------------------------------------------------
// http/request
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn buffered_http_request_keeps_method_body_header_order_and_repeats() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let result = client
        .call(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/echo"),
                   "headers": [{"name": "X-A", "value": "1"}, {"name": "x-b", "value": "2"},
                               {"name": "x-a", "value": "3"}],
                   "bodyBase64": b64("payload"), "timeoutMs": null, "requestId": "buffered",
                   "streamResponse": false}),
        )
        .await;
    assert_eq!(result["status"], json!(200));
    let multi: Vec<&Value> = result["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "x-multi")
        .map(|h| &h["value"])
        .collect();
    assert_eq!(multi, [&json!("one"), &json!("two")]);
    let echoed: Value =
        serde_json::from_slice(&unb64(result["bodyBase64"].as_str().unwrap())).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(unb64(echoed["bodyBase64"].as_str().unwrap()), b"payload");
    let sent_a: Vec<&Value> = echoed["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == "x-a")
        .map(|h| &h[1])
        .collect();
    assert_eq!(sent_a, [&json!("1"), &json!("3")]);
    assert!(
        echoed["headers"]
            .as_array()
            .unwrap()
            .contains(&json!(["x-b", "2"])),
        "{echoed}"
    );

    // Redirects are followed (and checked hop by hop).
    let redirected = client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/redirect"), "requestId": "r"}),
        )
        .await;
    assert_eq!(redirected["status"], json!(200));
    let echoed: Value =
        serde_json::from_slice(&unb64(redirected["bodyBase64"].as_str().unwrap())).unwrap();
    assert_eq!(echoed["method"], "GET");
    // ... unless redirectPolicy says stop: the redirect itself is the answer.
    let stopped = client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/redirect"), "requestId": "r",
                   "redirectPolicy": "stop"}),
        )
        .await;
    assert_eq!(stopped["status"], json!(302));
    assert!(
        stopped["headers"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "location", "value": "/echo"})),
        "{stopped}"
    );

    let big = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/big"), "requestId": "big"}),
        )
        .await;
    let error = assert_rpc_error(big, -32600, "limitExceeded");
    assert!(error.message.contains("streamResponse"), "{error:?}");
}

#[tokio::test]
async fn streamed_http_request_answers_first_then_sends_ordered_deltas_until_done() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "s1",
                   "streamResponse": true}),
        )
        .await;
    // The answer and the first part arrive while the upstream body is still open.
    let first = client.next_message(DEADLINE).await.expect("the answer");
    assert_eq!(
        first["id"], id,
        "the answer comes before any delta: {first}"
    );
    assert_eq!(first["result"]["status"], json!(200));
    assert_eq!(first["result"]["bodyBase64"], json!(""));
    assert!(
        first["result"]["headers"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "content-type", "value": "text/event-stream"})),
        "{first}"
    );
    let delta = client
        .wait_for_notification("the first delta", DEADLINE, |n| {
            n["method"] == "http/request/bodyDelta"
        })
        .await;
    assert_eq!(delta["params"]["seq"], json!(1));
    assert_eq!(delta["params"]["done"], json!(false));
    assert_eq!(delta["params"]["error"], Value::Null);
    assert_eq!(
        unb64(delta["params"]["deltaBase64"].as_str().unwrap()),
        b"part-1\n"
    );

    upstream.open_gate();
    let rest = response_and_deltas(&mut client, &id, "s1").await;
    let mut body = b"part-1\n".to_vec();
    for (index, delta) in rest.iter().enumerate() {
        assert_eq!(delta["method"], "http/request/bodyDelta", "{delta}");
        assert_eq!(delta["params"]["seq"], json!(index + 2), "{rest:?}");
        assert_eq!(delta["params"]["error"], Value::Null, "{delta}");
        body.extend(unb64(delta["params"]["deltaBase64"].as_str().unwrap()));
    }
    let last = rest.last().unwrap();
    assert_eq!(last["params"]["done"], json!(true));
    assert!(
        rest[..rest.len() - 1]
            .iter()
            .all(|delta| delta["params"]["done"] == json!(false))
    );
    assert_eq!(body, b"part-1\npart-2\npart-3\npart-4\npart-5\n");
}

#[tokio::test]
async fn a_second_active_stream_with_the_same_request_id_is_invalid_params() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let stream = json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "dup",
                        "streamResponse": true});
    let id = client.send_request("http/request", stream.clone()).await;
    client.response(&id).await.unwrap();
    let second = client.request("http/request", stream.clone()).await;
    let error = assert_rpc_error(second, -32602, "invalidParams");
    // The reference's words exactly (its tests compare the message).
    assert_eq!(
        error.message,
        "http/request streamResponse requestId `dup` is already active"
    );
    // Buffered requests do not reserve their id.
    client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "dup"}),
        )
        .await;
    upstream.open_gate();
    response_and_deltas(&mut client, &id, "dup").await;
    // Once the first stream is done the id is free again.
    let again = client.send_request("http/request", stream).await;
    response_and_deltas(&mut client, &again, "dup").await;
}

#[tokio::test]
async fn timeout_ms_ends_a_hanging_request_and_a_hanging_body() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let hung = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/hang"), "requestId": "h",
                   "timeoutMs": 300}),
        )
        .await;
    let error = assert_rpc_error(hung, -32603, "timedOut");
    // The reference's tests check this prefix.
    assert!(
        error.message.starts_with("http/request failed: ") && error.message.contains("300"),
        "{error:?}"
    );

    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/hang-body"), "requestId": "hb",
                   "timeoutMs": 300, "streamResponse": true}),
        )
        .await;
    let seen = response_and_deltas(&mut client, &id, "hb").await;
    assert_eq!(seen[0]["result"]["status"], json!(200), "{seen:?}");
    let last = seen.last().unwrap();
    assert_eq!(last["params"]["done"], json!(true));
    assert!(
        last["params"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("timed out")),
        "{last}"
    );
    let bytes: Vec<u8> = seen[1..]
        .iter()
        .flat_map(|delta| unb64(delta["params"]["deltaBase64"].as_str().unwrap()))
        .collect();
    assert_eq!(bytes, b"first");
    upstream.wait_dropped(1).await;
}

#[tokio::test]
async fn a_stream_ends_when_its_connection_ends() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "c",
                   "streamResponse": true}),
        )
        .await;
    client.response(&id).await.unwrap();
    client.close().await;
    // The server drops the upstream response: the upstream sees its body abandoned.
    upstream.wait_dropped(1).await;
    // And the request slot is free: a new connection can stream under the same id.
    let mut client = server.client().await;
    upstream.open_gate();
    let again = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/gated"), "requestId": "c",
                   "streamResponse": true}),
        )
        .await;
    response_and_deltas(&mut client, &again, "c").await;
}

/// `MAX_HTTP_REQUESTS_PER_CONNECTION` from docs/protocol.md.
const MAX_HTTP_REQUESTS_PER_CONNECTION: usize = 32;

#[tokio::test]
async fn requests_in_flight_are_bounded_per_connection_and_connections_are_pooled() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let mut streams = Vec::new();
    for n in 0..MAX_HTTP_REQUESTS_PER_CONNECTION {
        let request_id = format!("s{n}");
        let id = client
            .send_request(
                "http/request",
                json!({"method": "GET", "url": upstream.url("/gated"), "requestId": request_id,
                       "streamResponse": true}),
            )
            .await;
        client.response(&id).await.unwrap();
        streams.push(request_id);
    }
    let over = client
        .request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "over"}),
        )
        .await;
    let error = assert_rpc_error(over, -32600, "limitExceeded");
    assert!(
        error.message.contains("MAX_HTTP_REQUESTS_PER_CONNECTION"),
        "{error:?}"
    );
    // Another connection has its own slots.
    let mut other = server.client().await;
    other
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "other"}),
        )
        .await;
    upstream.open_gate();
    let mut done = std::collections::HashSet::new();
    let until = tokio::time::Instant::now() + DEADLINE;
    while done.len() < streams.len() {
        let remaining = until.saturating_duration_since(tokio::time::Instant::now());
        let message = client.next_message(remaining).await.unwrap_or_else(|| {
            panic!(
                "only {} of {} streams done within {DEADLINE:?}",
                done.len(),
                streams.len()
            )
        });
        if message["method"] == "http/request/bodyDelta" && message["params"]["done"] == true {
            assert_eq!(message["params"]["error"], Value::Null, "{message}");
            done.insert(message["params"]["requestId"].as_str().unwrap().to_owned());
        }
    }
    // Slots are back; sequential requests to one host share a pooled connection.
    let mut peers = Vec::new();
    for n in 0..3 {
        let answer = client
            .call(
                "http/request",
                json!({"method": "GET", "url": upstream.url("/echo"), "requestId": n.to_string()}),
            )
            .await;
        let echoed: Value =
            serde_json::from_slice(&unb64(answer["bodyBase64"].as_str().unwrap())).unwrap();
        peers.push(echoed["peer"].as_str().unwrap().to_owned());
    }
    assert!(peers.windows(2).all(|pair| pair[0] == pair[1]), "{peers:?}");
}

#[tokio::test]
async fn http_request_validation_errors_are_invalid_params() {
    let server = server();
    let mut client = server.client().await;
    for (params, needle) in [
        (
            json!({"method": "GET", "url": "ftp://127.0.0.1/", "requestId": "a"}),
            "ftp",
        ),
        (
            json!({"method": "GET", "url": "not a url", "requestId": "a"}),
            "url",
        ),
        (
            json!({"method": "G E T", "url": "http://127.0.0.1/", "requestId": "a"}),
            "method",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/"}),
            "requestId",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": ""}),
            "requestId",
        ),
        (
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": "a",
                   "headers": [{"name": "bad name", "value": "x"}]}),
            "bad name",
        ),
    ] {
        let error = assert_rpc_error(
            client.request("http/request", params.clone()).await,
            -32602,
            "invalidParams",
        );
        assert!(error.message.contains(needle), "{params}: {error:?}");
    }
    let base64 = client
        .request(
            "http/request",
            json!({"method": "POST", "url": "http://127.0.0.1/", "requestId": "a",
                   "bodyBase64": "!!"}),
        )
        .await;
    assert_rpc_error(base64, -32602, "invalidBase64");
    let env_header = client
        .request(
            "http/request",
            json!({"method": "GET", "url": "http://127.0.0.1/", "requestId": "a",
                   "headers": [{"name": "authorization", "value": "Bearer ",
                                "valueEnvVar": "HOME"}]}),
        )
        .await;
    let error = assert_rpc_error(env_header, -32600, "unsupported");
    assert!(error.message.contains("valueEnvVar"), "{error:?}");
}

#[tokio::test]
async fn the_servers_own_listener_and_link_local_addresses_are_refused_unless_allowed() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let own_port = server.addr().rsplit_once(':').unwrap().1.to_owned();
    for url in [
        format!("http://{}/readyz", server.addr()),
        format!("http://localhost:{own_port}/readyz"),
        format!("http://0.0.0.0:{own_port}/readyz"),
        format!("http://[::ffff:127.0.0.1]:{own_port}/readyz"),
    ] {
        let error = assert_rpc_error(
            client
                .request(
                    "http/request",
                    json!({"method": "GET", "url": url, "requestId": "own"}),
                )
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(error.message.contains("own listener"), "{url}: {error:?}");
    }
    let allowed = client
        .call(
            "http/request",
            json!({"method": "GET", "url": format!("http://{}/readyz", server.addr()),
                   "requestId": "own", "allowOwnListeners": true}),
        )
        .await;
    assert_eq!(allowed["status"], json!(200));
    assert_eq!(unb64(allowed["bodyBase64"].as_str().unwrap()), b"ok");

    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/",
        "http://[::ffff:169.254.169.254]/",
    ] {
        let error = assert_rpc_error(
            client
                .request(
                    "http/request",
                    json!({"method": "GET", "url": url, "requestId": "meta", "timeoutMs": 2000}),
                )
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(error.message.contains("link-local"), "{url}: {error:?}");
    }

    // Loopback stays reachable for ordinary local services, also by name.
    let by_name = client
        .call(
            "http/request",
            json!({"method": "GET", "requestId": "local",
                   "url": format!("http://localhost:{}/echo", upstream.addr.port())}),
        )
        .await;
    assert_eq!(by_name["status"], json!(200));
}

#[tokio::test]
async fn a_sandbox_with_the_network_off_refuses_http_request() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let request = |sandbox: Value| {
        json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "s",
               "sandbox": sandbox})
    };
    for sandbox in [
        json!({"profile": "read-only"}),
        json!({"type": "read-only", "network_access": false}),
    ] {
        let error = assert_rpc_error(
            client
                .request("http/request", request(sandbox.clone()))
                .await,
            -32600,
            "sandboxDenied",
        );
        assert!(
            error.message.contains("network off"),
            "{sandbox}: {error:?}"
        );
    }
    let on = client
        .call(
            "http/request",
            request(json!({"profile": "read-only", "networkAccess": true})),
        )
        .await;
    assert_eq!(on["status"], json!(200));
    let unknown = client
        .request(
            "http/request",
            request(json!({"profile": "read-only", "bogus": 1})),
        )
        .await;
    assert_rpc_error(unknown, -32602, "invalidParams");
}

/// An HTTPS server on 127.0.0.1:0 for `localhost`, with a certificate from a fresh test CA
/// written to `dir/ca.pem`. Answers every request with `hello over tls`.
async fn tls_upstream(dir: &Path) -> SocketAddr {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &*ca)
        .unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(leaf_key.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key.into())
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tls.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = b"hello over tls";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.write_all(body).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_requests_verify_the_server_against_the_trust_roots() {
    let dir = tempfile::tempdir().unwrap();
    let addr = tls_upstream(dir.path()).await;
    let url = format!("https://localhost:{}/", addr.port());
    let request = json!({"method": "GET", "url": url, "requestId": "tls"});

    let trusting = ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env("SSL_CERT_FILE", dir.path().join("ca.pem"));
    });
    let mut client = trusting.client().await;
    let answer = client.call("http/request", request.clone()).await;
    assert_eq!(answer["status"], json!(200));
    assert_eq!(
        unb64(answer["bodyBase64"].as_str().unwrap()),
        b"hello over tls"
    );

    // A server that does not trust the test CA refuses the certificate.
    let other = tempfile::tempdir().unwrap();
    let elsewhere = tls_upstream(other.path()).await;
    let untrusted = client
        .request(
            "http/request",
            json!({"method": "GET", "requestId": "tls",
                   "url": format!("https://localhost:{}/", elsewhere.port())}),
        )
        .await;
    let error = assert_rpc_error(untrusted, -32603, "io");
    assert!(error.message.contains("certificate"), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// fs: recursive copy with special files, codes the reference client maps
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn recursive_copy_skips_a_fifo_and_copies_the_rest() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("file"), "data").unwrap();
    std::fs::write(source.join("sub/inner"), "inner").unwrap();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    nix::unistd::mkfifo(&source.join("pipe"), mode).unwrap();
    nix::unistd::mkfifo(&source.join("sub/pipe"), mode).unwrap();
    let destination = dir.path().join("copy");
    let result = client
        .call(
            "fs/copy",
            json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination),
                   "recursive": true, "sandbox": null}),
        )
        .await;
    assert_eq!(result, json!({}));
    let names = |path: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&destination), ["file", "sub"]);
    assert_eq!(names(&destination.join("sub")), ["inner"]);
    assert_eq!(
        std::fs::read(destination.join("sub/inner")).unwrap(),
        b"inner"
    );

    // A FIFO as the top-level source is still refused.
    let top = client
        .request(
            "fs/copy",
            json!({"sourcePath": file_uri(source.join("pipe")),
                   "destinationPath": file_uri(dir.path().join("pipe-copy")), "recursive": true}),
        )
        .await;
    assert_rpc_error(top, -32600, "notAFile");
}

#[tokio::test]
async fn codes_the_reference_client_maps_to_invalid_input_are_minus_32600() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let into_itself = client
        .request(
            "fs/copy",
            json!({"sourcePath": file_uri(&source),
                   "destinationPath": file_uri(source.join("sub/copy")), "recursive": true}),
        )
        .await;
    assert_rpc_error(into_itself, -32600, "invalidRequest");
    assert!(!source.join("sub/copy").exists());

    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let long_id = "h".repeat(33);
    let open = client
        .request(
            "fs/open",
            json!({"handleId": long_id, "path": file_uri(&file), "sandbox": null}),
        )
        .await;
    let error = assert_rpc_error(open, -32600, "limitExceeded");
    assert!(error.message.contains("MAX_HANDLE_ID_BYTES"), "{error:?}");
    let ok = client
        .call(
            "fs/open",
            json!({"handleId": "h".repeat(32), "path": file_uri(&file)}),
        )
        .await;
    assert_eq!(ok, json!({"handleId": "h".repeat(32)}));
}

// ---------------------------------------------------------------------------------------------
// The library client
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn library_client_environment_info_matches_the_wire_answer() {
    let server = server();
    let client = library_client(server.url()).await;
    let info = client.environment_info().await.unwrap();
    let mut raw = server.client().await;
    let wire: proto::methods::environment::EnvironmentInfo =
        serde_json::from_value(raw.call("environment/info", Value::Null).await).unwrap();
    assert_eq!(info, wire);
    assert!(info.sandbox.is_some_and(|sandbox| sandbox.available));
}

#[tokio::test]
async fn library_client_http_request_buffered_and_streamed() {
    let upstream = Upstream::start().await;
    let server = server();
    let client = library_client(server.url()).await;
    let response = client
        .http_request(
            supervisor::HttpRequest::new("PUT", upstream.url("/echo"))
                .header("x-a", "1")
                .header("x-a", "2")
                .body(b"bytes".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    let echoed: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(echoed["method"], "PUT");
    assert_eq!(unb64(echoed["bodyBase64"].as_str().unwrap()), b"bytes");
    assert!(
        echoed["headers"]
            .as_array()
            .unwrap()
            .contains(&json!(["x-a", "2"]))
    );

    let mut stream = client
        .http_request_stream(supervisor::HttpRequest::new("GET", upstream.url("/gated")))
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let first = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .expect("the first chunk while the upstream still holds the rest")
        .unwrap()
        .unwrap();
    assert_eq!(first, b"part-1\n");
    upstream.open_gate();
    let rest = tokio::time::timeout(DEADLINE, stream.body.read_to_end())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, b"part-2\npart-3\npart-4\npart-5\n");

    let refused = client
        .http_request(supervisor::HttpRequest::new(
            "GET",
            "http://169.254.169.254/",
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.rpc_code(), Some(-32600));
    assert_eq!(
        refused.rpc_kind(),
        Some(proto::error::ErrorKind::SandboxDenied)
    );

    let timed_out = client
        .http_request(
            supervisor::HttpRequest::new("GET", upstream.url("/hang"))
                .timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        timed_out.rpc_kind(),
        Some(proto::error::ErrorKind::TimedOut)
    );
}

#[tokio::test]
async fn library_client_body_stream_fails_when_its_connection_is_lost() {
    let upstream = Upstream::start().await;
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let mut stream = client
        .http_request_stream(supervisor::HttpRequest::new("GET", upstream.url("/gated")))
        .await
        .unwrap();
    let first = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, b"part-1\n");
    proxy.cut();
    let end = tokio::time::timeout(DEADLINE, stream.body.next())
        .await
        .expect("the body ends when its connection is lost")
        .expect("an error, not a clean end");
    assert!(
        matches!(
            end,
            Err(supervisor::ExecServerError::StreamInterrupted { .. })
        ),
        "{end:?}"
    );
    assert!(stream.body.next().await.is_none());
    // The client recovered; the next request works on the new connection.
    upstream.open_gate();
    let again = client
        .http_request(supervisor::HttpRequest::new("GET", upstream.url("/echo")))
        .await
        .unwrap();
    assert_eq!(again.status, 200);
}

#[tokio::test]
async fn library_client_write_reports_a_closed_stdin() {
    let server = server();
    let client = library_client(server.url()).await;
    let handle = client
        .start_process(tests::start_params("sleeper", &["/bin/sleep", "30"]))
        .await
        .unwrap();
    let error = handle.process().write(b"x").await.unwrap_err();
    assert_eq!(
        error,
        supervisor::ExecServerError::WriteNotAccepted {
            process_id: "sleeper".into(),
            status: proto::methods::process::WriteStatus::StdinClosed,
        }
    );
    handle.process().terminate().await.unwrap();
}

#[tokio::test]
async fn a_request_body_of_max_http_request_body_bytes_is_sent_and_one_more_byte_is_refused() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let at_limit = client
        .call(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/length"), "requestId": "at",
                   "bodyBase64": b64(vec![b'b'; MAX_HTTP_REQUEST_BODY_BYTES])}),
        )
        .await;
    assert_eq!(at_limit["status"], json!(200), "{at_limit}");
    assert_eq!(
        unb64(at_limit["bodyBase64"].as_str().unwrap()),
        MAX_HTTP_REQUEST_BODY_BYTES.to_string().as_bytes()
    );
    let over = client
        .request(
            "http/request",
            json!({"method": "POST", "url": upstream.url("/length"), "requestId": "over",
                   "bodyBase64": b64(vec![b'b'; MAX_HTTP_REQUEST_BODY_BYTES + 1])}),
        )
        .await;
    let error = assert_rpc_error(over, -32600, "limitExceeded");
    assert!(
        error.message.contains("request body")
            && error.message.contains("MAX_HTTP_REQUEST_BODY_BYTES"),
        "{error:?}"
    );
    // The connection keeps serving.
    client
        .call(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/echo"), "requestId": "after"}),
        )
        .await;
}

#[tokio::test]
async fn streamed_deltas_carry_at_most_http_body_delta_bytes_each() {
    let upstream = Upstream::start().await;
    let server = server();
    let mut client = server.client().await;
    let id = client
        .send_request(
            "http/request",
            json!({"method": "GET", "url": upstream.url("/megabyte"), "requestId": "mb",
                   "streamResponse": true}),
        )
        .await;
    let messages = response_and_deltas(&mut client, &id, "mb").await;
    let mut body = Vec::new();
    let mut largest = 0;
    for delta in messages
        .iter()
        .filter(|m| m["method"] == "http/request/bodyDelta")
    {
        let bytes = unb64(delta["params"]["deltaBase64"].as_str().unwrap());
        assert!(
            bytes.len() <= HTTP_BODY_DELTA_BYTES,
            "a delta of {} bytes (seq {})",
            bytes.len(),
            delta["params"]["seq"]
        );
        largest = largest.max(bytes.len());
        body.extend(bytes);
    }
    assert_eq!(body, megabyte().await, "the deltas reassemble the body");
    assert!(largest > 0, "no delta carried any body");
}
