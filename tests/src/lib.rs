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
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

pub use proto::RpcError;

pub mod relay;
pub mod scratch;
pub mod siege;

/// The default deadline for any single wait (a response, a notification, the URL line).
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Name of the server binary built by the `supervisor` crate.
pub const SERVER_BINARY: &str = "exec-server";

// ---------------------------------------------------------------------------------------------
// Encoding helpers
// ---------------------------------------------------------------------------------------------

/// Standard base64 of `bytes`.
pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decode standard base64, panicking with the input on failure.
pub fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("server sent invalid base64 {text:?}: {e}"))
}

/// The `file:` URI of an absolute path, as the wire expects it.
pub fn file_uri(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    proto::FileUri::from_path(path)
        .unwrap_or_else(|e| panic!("{} has no file: URI: {e}", path.display()))
        .to_uri_string()
}

/// Assert that `result` is an error with `code` and `data.kind`, returning the error.
#[track_caller]
pub fn assert_rpc_error(result: Result<Value, RpcError>, code: i64, kind: &str) -> RpcError {
    let error = match result {
        Ok(value) => panic!("expected error {code} {kind}, got result {value}"),
        Err(error) => error,
    };
    let actual_kind = error
        .data
        .as_ref()
        .map(|d| serde_json::to_value(d.kind).unwrap());
    assert_eq!(
        (error.code, actual_kind),
        (code, Some(Value::String(kind.to_owned()))),
        "unexpected error code/kind; full error: {error:?}"
    );
    error
}

/// The `data.kind` of an error as a string (empty when absent).
pub fn error_kind(error: &RpcError) -> String {
    error
        .data
        .as_ref()
        .and_then(|d| serde_json::to_value(d.kind).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------------------------

/// Path of `exec-server` in the cargo target directory of the running test executable.
///
/// `current_exe()` is `target/<profile>/deps/<test>-<hash>`; binaries live in `target/<profile>`.
pub fn exec_server_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("test executable has a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let binary = dir.join(SERVER_BINARY);
    assert!(
        binary.is_file(),
        "{} not found; run `cargo build --workspace --bins` before the integration tests",
        binary.display()
    );
    binary
}

/// A running `exec-server`. Dropping it kills the server with SIGKILL and reaps it.
pub struct ExecServer {
    child: Child,
    url: String,
    stderr: Arc<Mutex<Vec<u8>>>,
    exit: Option<ExitStatus>,
}

/// How a server that was expected to refuse to start ended.
#[derive(Debug)]
pub struct RefusedStart {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

fn capture(mut reader: impl Read + Send + 'static, buffer: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buffer.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    });
}

impl ExecServer {
    /// Start `exec-server` with `args` (e.g. `["--listen", "ws://127.0.0.1:0"]`; with no args the
    /// server uses its default) and wait for the URL it prints.
    pub fn start(args: &[&str]) -> ExecServer {
        Self::start_with(args, |_| {})
    }

    fn start_command(mut command: Command, args: &[&str]) -> ExecServer {
        let mut child = command.spawn().expect("spawn exec-server");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        capture(child.stderr.take().unwrap(), stderr.clone());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let first = reader.read_line(&mut line).map(|_| line.clone());
            let _ = tx.send(first);
            // Keep draining so the server never blocks on a full stdout pipe.
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        let line = match rx.recv_timeout(DEADLINE) {
            Ok(Ok(line)) if !line.trim().is_empty() => line.trim().to_owned(),
            other => {
                let _ = child.kill();
                let status = child.wait().ok();
                panic!(
                    "exec-server {args:?} did not print its URL as the first stdout line within \
                     {DEADLINE:?} (got {other:?}, exit {status:?}); stderr:\n{}",
                    String::from_utf8_lossy(&stderr.lock().unwrap())
                );
            }
        };
        ExecServer {
            child,
            url: line,
            stderr,
            exit: None,
        }
    }

    /// Run `exec-server` with `args` expecting it to exit by itself within [`DEADLINE`].
    pub fn run_expecting_exit(args: &[&str]) -> RefusedStart {
        let mut child = Command::new(exec_server_binary())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn exec-server");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        capture(child.stdout.take().unwrap(), stdout.clone());
        capture(child.stderr.take().unwrap(), stderr.clone());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if started.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "exec-server {args:?} was expected to exit by itself but still ran after \
                     {DEADLINE:?}; stdout: {:?}",
                    String::from_utf8_lossy(&stdout.lock().unwrap())
                );
            }
            std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
        };
        // The pipes close when the process exits; give the reader threads a bounded moment.
        let drained = Instant::now();
        while Arc::strong_count(&stderr) > 1 && drained.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = |b: &Arc<Mutex<Vec<u8>>>| String::from_utf8_lossy(&b.lock().unwrap()).into();
        RefusedStart {
            status,
            stdout: text(&stdout),
            stderr: text(&stderr),
        }
    }

    /// The URL printed on the first stdout line (`ws://127.0.0.1:N` or `unix:/path`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `host:port` of a `ws://` listener.
    pub fn addr(&self) -> &str {
        self.url
            .strip_prefix("ws://")
            .unwrap_or_else(|| panic!("{} is not a ws:// URL", self.url))
            .trim_end_matches('/')
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Send `signal` to the server process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal exec-server");
    }

    /// Wait until the server exits, at most `deadline`.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exit = Some(status);
                return status;
            }
            assert!(
                started.elapsed() < deadline,
                "exec-server did not exit within {deadline:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
        }
    }

    /// Connect a websocket client.
    pub async fn connect(&self) -> Client {
        Client::connect(&self.url).await.unwrap_or_else(|e| {
            panic!(
                "connect to {}: {e}; server stderr:\n{}",
                self.url,
                self.stderr()
            )
        })
    }

    /// Connect and `initialize`.
    pub async fn client(&self) -> Client {
        let mut client = self.connect().await;
        client.initialize().await;
        client
    }
}

impl Drop for ExecServer {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- exec-server stderr ---\n{}", self.stderr());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// /proc helpers
// ---------------------------------------------------------------------------------------------

/// True when `/proc/<pid>` is gone or the process is a zombie (dead, not yet reaped).
pub fn process_is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat_field(&stat, 3).is_none_or(|state| state == "Z" || state == "X"),
    }
}

/// The live processes whose parent is `parent`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat_field(&stat, 4))
                .and_then(|ppid| ppid.parse::<i32>().ok())
                == Some(parent)
        })
        .collect()
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/<pid>/stat` line.
pub fn stat_field(stat: &str, n: usize) -> Option<String> {
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm
        .split_whitespace()
        .nth(n.checked_sub(3)?)
        .map(str::to_owned)
}

/// Poll until `pid` is dead, panicking after `deadline`.
pub fn wait_process_dead(pid: i32, deadline: Duration, what: &str) {
    let started = Instant::now();
    while !process_is_dead(pid) {
        assert!(
            started.elapsed() < deadline,
            "{what} (pid {pid}) still alive after {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// Byte stream a websocket can run over (TCP or unix socket).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One websocket connection speaking JSON-RPC.
pub struct Client {
    ws: WebSocketStream<Box<dyn Io>>,
    next_id: i64,
    notifications: VecDeque<Value>,
    responses: HashMap<String, Value>,
    /// Every message received, in order (responses and notifications).
    pub log: Vec<Value>,
}

/// Output of a process collected until `process/closed`.
#[derive(Debug, Clone, Default)]
pub struct ProcessOutput {
    /// Every event (output, exited, closed) in arrival order.
    pub events: Vec<Value>,
    /// Decoded bytes of stream `stdout`.
    pub stdout: Vec<u8>,
    /// Decoded bytes of stream `stderr`.
    pub stderr: Vec<u8>,
    /// Decoded bytes of stream `pty`.
    pub pty: Vec<u8>,
    /// `exitCode` from `process/exited`.
    pub exit_code: Option<i64>,
    /// `signal` from `process/exited`.
    pub signal: Option<i64>,
}

impl ProcessOutput {
    /// stdout as text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// stderr as text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// pty output as text.
    pub fn pty_text(&self) -> String {
        String::from_utf8_lossy(&self.pty).into_owned()
    }
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Client {
    /// Connect to `ws://HOST:PORT` or `unix:/path`.
    ///
    /// # Errors
    /// The handshake error (e.g. an HTTP 401/403 response).
    pub async fn connect(url: &str) -> Result<Client, tungstenite::Error> {
        Self::connect_with_headers(url, &[]).await
    }

    /// Connect sending extra upgrade headers (`Origin`, `Authorization`).
    ///
    /// # Errors
    /// The handshake error (e.g. an HTTP 401/403 response).
    pub async fn connect_with_headers(
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Client, tungstenite::Error> {
        let (stream, request_url): (Box<dyn Io>, String) =
            if let Some(path) = url.strip_prefix("unix:") {
                let stream = tokio::net::UnixStream::connect(path).await?;
                (Box::new(stream), "ws://localhost/".to_owned())
            } else {
                let addr = url
                    .strip_prefix("ws://")
                    .unwrap_or_else(|| panic!("unsupported URL {url}"))
                    .trim_end_matches('/');
                let stream = tokio::net::TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                (Box::new(stream), url.to_owned())
            };
        let mut request = request_url.into_client_request()?;
        for (name, value) in headers {
            request.headers_mut().insert(
                tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let connecting = tokio_tungstenite::client_async(request, stream);
        let (ws, _response) = tokio::time::timeout(DEADLINE, connecting)
            .await
            .unwrap_or_else(|_| panic!("websocket handshake with {url} took over {DEADLINE:?}"))?;
        Ok(Client {
            ws,
            next_id: 1,
            notifications: VecDeque::new(),
            responses: HashMap::new(),
            log: Vec::new(),
        })
    }

    /// `initialize {clientName: "tests"}`, then the `initialized` notification. Returns the
    /// session id.
    pub async fn initialize(&mut self) -> String {
        let result = self
            .request("initialize", json!({"clientName": "tests"}))
            .await
            .unwrap_or_else(|e| panic!("initialize failed: {e:?}"));
        self.notify("initialized", json!({})).await;
        result["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("initialize result has no sessionId: {result}"))
            .to_owned()
    }

    /// Send a text frame as is.
    pub async fn send_text(&mut self, text: impl Into<String>) {
        let text: String = text.into();
        self.ws
            .send(Message::text(text))
            .await
            .expect("send text frame");
    }

    /// Send a binary frame as is.
    pub async fn send_binary(&mut self, bytes: impl Into<Vec<u8>>) {
        let bytes: Vec<u8> = bytes.into();
        self.ws
            .send(Message::binary(bytes))
            .await
            .expect("send binary frame");
    }

    /// Send a JSON value as one text frame.
    pub async fn send_json(&mut self, value: &Value) {
        self.send_text(value.to_string()).await;
    }

    /// Send a notification.
    pub async fn notify(&mut self, method: &str, params: Value) {
        self.send_json(&json!({"method": method, "params": params}))
            .await;
    }

    /// Send a request without waiting; returns its id.
    pub async fn send_request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.send_json(&json!({"id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// Send a request and wait (up to [`DEADLINE`]) for its response.
    ///
    /// # Errors
    /// The JSON-RPC error the server answered with.
    pub async fn request(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.request_within(method, params, DEADLINE).await
    }

    /// Send a request and wait up to `deadline` for its response.
    ///
    /// # Errors
    /// The JSON-RPC error the server answered with.
    pub async fn request_within(
        &mut self,
        method: &str,
        params: Value,
        deadline: Duration,
    ) -> Result<Value, RpcError> {
        let id = self.send_request(method, params).await;
        self.response_within(&id, deadline, method).await
    }

    /// Send a request that must succeed; panics with the error otherwise.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let shown = params.to_string();
        self.request(method, params)
            .await
            .unwrap_or_else(|e| panic!("{method} {shown} failed: {e:?}"))
    }

    /// Wait up to [`DEADLINE`] for the response with `id`.
    ///
    /// # Errors
    /// The JSON-RPC error the server answered with.
    pub async fn response(&mut self, id: &Value) -> Result<Value, RpcError> {
        self.response_within(id, DEADLINE, "request").await
    }

    /// Wait up to `deadline` for the response with `id`; `what` names it in the panic message.
    ///
    /// # Errors
    /// The JSON-RPC error the server answered with.
    pub async fn response_within(
        &mut self,
        id: &Value,
        deadline: Duration,
        what: &str,
    ) -> Result<Value, RpcError> {
        let raw = self.raw_response_within(id, deadline, what).await;
        if let Some(error) = raw.get("error") {
            return Err(serde_json::from_value(error.clone())
                .unwrap_or_else(|e| panic!("malformed error object {error}: {e}")));
        }
        match raw.get("result") {
            Some(result) => Ok(result.clone()),
            None => panic!("response has neither result nor error: {raw}"),
        }
    }

    /// Wait up to `deadline` for the whole response message with `id`.
    pub async fn raw_response_within(
        &mut self,
        id: &Value,
        deadline: Duration,
        what: &str,
    ) -> Value {
        let until = tokio::time::Instant::now() + deadline;
        let key = id_key(id);
        loop {
            if let Some(message) = self.responses.remove(&key) {
                return message;
            }
            let message = self
                .receive_until(until)
                .await
                .unwrap_or_else(|| panic!("no response to {what} (id {id}) within {deadline:?}"));
            self.stash(message);
        }
    }

    fn stash(&mut self, message: Value) {
        if message.get("method").is_some() && message.get("id").is_none() {
            self.notifications.push_back(message);
        } else if let Some(id) = message.get("id") {
            self.responses.insert(id_key(id), message);
        } else {
            panic!("server sent a message of no known shape: {message}");
        }
    }

    /// Receive the next message from the socket (not the stash), or `None` at `until`.
    /// Panics when the connection closes.
    async fn receive_until(&mut self, until: tokio::time::Instant) -> Option<Value> {
        loop {
            let frame = match tokio::time::timeout_at(until, self.ws.next()).await {
                Err(_) => return None,
                Ok(None) => panic!("server closed the connection"),
                Ok(Some(Err(e))) => panic!("websocket error: {e}"),
                Ok(Some(Ok(frame))) => frame,
            };
            let bytes: Vec<u8> = match frame {
                Message::Text(text) => text.as_bytes().to_vec(),
                Message::Binary(bytes) => bytes.to_vec(),
                Message::Close(close) => panic!("server closed the connection: {close:?}"),
                _ => continue,
            };
            let value: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "server sent a frame that is not JSON ({e}): {:?}",
                    String::from_utf8_lossy(&bytes)
                )
            });
            assert!(
                value.get("jsonrpc").is_none(),
                "server must never send the \"jsonrpc\" member: {value}"
            );
            self.log.push(value.clone());
            return Some(value);
        }
    }

    /// The next message in arrival order (stashed notifications first), or `None` within
    /// `deadline`. Stashed responses are not returned.
    pub async fn next_message(&mut self, deadline: Duration) -> Option<Value> {
        if let Some(n) = self.notifications.pop_front() {
            return Some(n);
        }
        let until = tokio::time::Instant::now() + deadline;
        self.receive_until(until).await
    }

    /// The next frame of any kind, `Err` carrying a description of a close/EOF/error.
    pub async fn next_frame(&mut self, deadline: Duration) -> Result<Message, String> {
        match tokio::time::timeout(deadline, self.ws.next()).await {
            Err(_) => Err(format!("timeout after {deadline:?}")),
            Ok(None) => Err("eof".into()),
            Ok(Some(Err(e))) => Err(format!("error: {e}")),
            Ok(Some(Ok(frame))) => Ok(frame),
        }
    }

    /// The next notification within `deadline`; panics naming `what` otherwise.
    pub async fn next_notification(&mut self, deadline: Duration) -> Value {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(n) = self.notifications.pop_front() {
                return n;
            }
            let message = self
                .receive_until(until)
                .await
                .unwrap_or_else(|| panic!("no notification within {deadline:?}"));
            self.stash(message);
        }
    }

    /// The first notification matching `pred` within `deadline` (others stay stashed in order).
    pub async fn wait_for_notification(
        &mut self,
        what: &str,
        deadline: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let until = tokio::time::Instant::now() + deadline;
        if let Some(pos) = self.notifications.iter().position(&mut pred) {
            return self.notifications.remove(pos).unwrap();
        }
        loop {
            let message = self.receive_until(until).await.unwrap_or_else(|| {
                panic!(
                    "no notification matching {what} within {deadline:?}; stashed: {:?}",
                    self.notifications
                )
            });
            if message.get("id").is_none() && pred(&message) {
                return message;
            }
            self.stash(message);
        }
    }

    /// Remove and return every stashed notification of `process_id`, then keep receiving its
    /// events until `process/closed` (within `deadline`).
    pub async fn events_until_closed(
        &mut self,
        process_id: &str,
        deadline: Duration,
    ) -> Vec<Value> {
        let until = tokio::time::Instant::now() + deadline;
        let mut events = Vec::new();
        let belongs = |n: &Value| n["params"]["processId"] == process_id;
        let mut rest = VecDeque::new();
        while let Some(n) = self.notifications.pop_front() {
            if belongs(&n) {
                events.push(n);
            } else {
                rest.push_back(n);
            }
        }
        self.notifications = rest;
        if events.iter().any(|e| e["method"] == "process/closed") {
            return events;
        }
        loop {
            let message = self.receive_until(until).await.unwrap_or_else(|| {
                panic!(
                    "process {process_id:?} not closed within {deadline:?}; events so far: \
                     {events:?}"
                )
            });
            if message.get("id").is_none() && belongs(&message) {
                let closed = message["method"] == "process/closed";
                events.push(message);
                if closed {
                    return events;
                }
            } else {
                self.stash(message);
            }
        }
    }

    /// Collect a process's events until `process/closed` and decode them.
    pub async fn collect(&mut self, process_id: &str) -> ProcessOutput {
        self.collect_within(process_id, DEADLINE).await
    }

    /// [`Client::collect`] with an explicit deadline.
    pub async fn collect_within(&mut self, process_id: &str, deadline: Duration) -> ProcessOutput {
        let events = self.events_until_closed(process_id, deadline).await;
        decode_events(events)
    }

    /// Receive output of `process_id` until its decoded text (all streams) contains `needle`.
    /// Other notifications stay stashed; the matching process's output notifications are
    /// consumed. Returns the accumulated text.
    pub async fn wait_for_output(&mut self, process_id: &str, needle: &str) -> String {
        let until = Instant::now() + DEADLINE;
        let mut text = String::new();
        loop {
            let remaining = until.saturating_duration_since(Instant::now());
            let n = self
                .wait_for_notification(
                    &format!("output of {process_id} containing {needle:?} (have {text:?})"),
                    remaining,
                    |n| n["method"] == "process/output" && n["params"]["processId"] == process_id,
                )
                .await;
            text.push_str(&String::from_utf8_lossy(&unb64(
                n["params"]["chunk"].as_str().unwrap(),
            )));
            if text.contains(needle) {
                return text;
            }
        }
    }

    /// `process/start` with `argv`, cwd `/`, env `PATH=/usr/bin:/bin` plus `extra` fields.
    ///
    /// # Errors
    /// The server's error.
    pub async fn start(
        &mut self,
        process_id: &str,
        argv: &[&str],
        extra: Value,
    ) -> Result<Value, RpcError> {
        let mut params = json!({
            "processId": process_id,
            "argv": argv,
            "cwd": "file:///",
            "env": {"PATH": "/usr/bin:/bin"},
        });
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                params[k] = v;
            }
        }
        self.request("process/start", params).await
    }

    /// [`Client::start`] then [`Client::collect`].
    pub async fn run(&mut self, process_id: &str, argv: &[&str], extra: Value) -> ProcessOutput {
        self.start(process_id, argv, extra)
            .await
            .unwrap_or_else(|e| panic!("process/start {argv:?} failed: {e:?}"));
        self.collect(process_id).await
    }

    /// Write `bytes` straight to the socket under the websocket (a partial or malformed frame),
    /// bypassing the websocket layer.
    pub async fn send_raw_bytes(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt as _;
        let stream = self.ws.get_mut();
        stream.write_all(bytes).await.expect("write raw bytes");
        stream.flush().await.expect("flush raw bytes");
    }

    /// Close the websocket (best effort) and drop the connection.
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(None)).await;
    }
}

/// Decode a list of process events.
pub fn decode_events(events: Vec<Value>) -> ProcessOutput {
    let mut out = ProcessOutput::default();
    for e in &events {
        let p = &e["params"];
        match e["method"].as_str() {
            Some("process/output") => {
                let bytes = unb64(p["chunk"].as_str().expect("chunk is a string"));
                match p["stream"].as_str() {
                    Some("stdout") => out.stdout.extend(bytes),
                    Some("stderr") => out.stderr.extend(bytes),
                    Some("pty") => out.pty.extend(bytes),
                    other => panic!("unknown stream {other:?} in {e}"),
                }
            }
            Some("process/exited") => {
                out.exit_code = p["exitCode"].as_i64();
                out.signal = p["signal"].as_i64();
            }
            _ => {}
        }
    }
    out.events = events;
    out
}

/// Seqs of a list of events, in order.
pub fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            e["params"]["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("event without integer seq: {e}"))
        })
        .collect()
}

/// Build a `sh -c` argv.
pub fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
}

// ---------------------------------------------------------------------------------------------
// Resource probes and raw websocket frames (hostile-client, fault and load tests)
// ---------------------------------------------------------------------------------------------

/// `VmRSS` of `pid` in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Number of open descriptors of `pid` (entries of `/proc/<pid>/fd`).
pub fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/fd: {e}"))
        .count()
}

/// Pids of every live (non-zombie) descendant of `pid`, found through `/proc/*/stat` parents.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parents = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        if matches!(stat_field(&stat, 3).as_deref(), Some("Z" | "X")) {
            continue;
        }
        if let Some(parent) = stat_field(&stat, 4).and_then(|p| p.parse::<i32>().ok()) {
            parents.insert(child, parent);
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(current) = frontier.pop() {
        for (&child, &parent) in &parents {
            if parent == current && !found.contains(&child) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found.sort_unstable();
    found
}

/// The command line of `pid` with NULs shown as spaces (empty when it is gone).
pub fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw)
        .replace('\0', " ")
        .trim()
        .to_owned()
}

/// Panic with a clear message unless the tests run as root (mounts, low limits for others).
#[track_caller]
pub fn require_root(what: &str) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{what} needs root (it mounts filesystems); run the test suite as root"
    );
}

/// Websocket opcodes for [`ws_frame`].
pub mod opcode {
    /// Continuation frame.
    pub const CONTINUATION: u8 = 0x0;
    /// Text frame.
    pub const TEXT: u8 = 0x1;
    /// Binary frame.
    pub const BINARY: u8 = 0x2;
}

/// The bytes of one masked client frame (`fin`, `opcode`, `payload`), as RFC 6455 §5.2 lays
/// them out. The mask key is fixed: these frames test the server, not the masking.
pub fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ws_frame_header(fin, opcode, payload.len() as u64);
    let key = [0x12, 0x34, 0x56, 0x78];
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// The header (including the mask key 12 34 56 78) of a masked client frame whose payload is
/// `len` bytes; the payload itself is not included.
pub fn ws_frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut frame = vec![u8::from(fin) << 7 | opcode];
    match len {
        0..=125 => frame.push(0x80 | len as u8),
        126..=0xFFFF => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&len.to_be_bytes());
        }
    }
    frame.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    frame
}

/// A websocket handshake on a plain TCP stream done by hand, so that frames can be written raw.
/// Panics unless the server answers `101` within [`DEADLINE`].
pub async fn raw_websocket(addr: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .expect("write the upgrade request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(DEADLINE, async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream
                .read(&mut byte)
                .await
                .expect("read the upgrade answer");
            assert_eq!(n, 1, "EOF during the handshake after {head:?}");
            head.push(byte[0]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no upgrade answer within {DEADLINE:?}"));
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// How the server ended a raw connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEnd {
    /// A close frame with this code (and then EOF or a reset).
    Close(u16),
    /// EOF or a reset without a close frame.
    Eof,
}

/// Read one (unmasked) server frame from a raw websocket stream: `(opcode, payload)`, or `None`
/// at EOF or a reset. Continuation frames are returned as they come.
pub async fn read_raw_frame(stream: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.ok()?;
    let len = match head[1] & 0x7F {
        126 => {
            let mut ext = [0u8; 2];
            stream.read_exact(&mut ext).await.ok()?;
            u64::from(u16::from_be_bytes(ext))
        }
        127 => {
            let mut ext = [0u8; 8];
            stream.read_exact(&mut ext).await.ok()?;
            u64::from_be_bytes(ext)
        }
        short => u64::from(short),
    };
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[0] & 0x0F, payload))
}

/// Read a raw websocket stream until the server closes it, within `deadline`; returns the close
/// code of the first close frame (frames before it are skipped), or [`RawEnd::Eof`] when the
/// stream ended without one. Panics on timeout.
pub async fn read_until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    deadline: Duration,
) -> RawEnd {
    let read_all = async {
        while let Some((opcode, payload)) = read_raw_frame(stream).await {
            if opcode == 0x8 {
                return match payload.get(..2) {
                    Some(code) => RawEnd::Close(u16::from_be_bytes([code[0], code[1]])),
                    None => RawEnd::Close(1005),
                };
            }
        }
        RawEnd::Eof
    };
    tokio::time::timeout(deadline, read_all)
        .await
        .unwrap_or_else(|_| panic!("the server did not close the connection within {deadline:?}"))
}

/// The binaries an `exec-server` runs with (itself and the helpers it execs from beside itself),
/// plus the in-sandbox `probe`.
pub const INSTALLED_BINARIES: &[&str] = &[
    SERVER_BINARY,
    "exec-guardian",
    "fs-helper",
    "sandbox-run",
    "egress-proxy",
    "probe",
];

/// Copies [`INSTALLED_BINARIES`] from the target directory into `dir` (mode 0755), as an install
/// would, and returns the path of the copied `exec-server`.
pub fn install_binaries(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let from = exec_server_binary()
        .parent()
        .expect("exec-server has a directory")
        .to_path_buf();
    std::fs::create_dir_all(dir).expect("create the install directory");
    for name in INSTALLED_BINARIES {
        let to = dir.join(name);
        std::fs::copy(from.join(name), &to)
            .unwrap_or_else(|e| panic!("copy {name} to {}: {e}", dir.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir.join(SERVER_BINARY)
}

impl ExecServer {
    /// Start `exec-server` with `args` after `configure` adjusted the command (environment,
    /// resource limits through `pre_exec`), and wait for the URL it prints.
    pub fn start_with(args: &[&str], configure: impl FnOnce(&mut Command)) -> ExecServer {
        Self::start_binary(&exec_server_binary(), args, configure)
    }

    /// [`Self::start_with`] for an `exec-server` binary at `binary` (an installed copy).
    pub fn start_binary(
        binary: &Path,
        args: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> ExecServer {
        let mut command = Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        configure(&mut command);
        Self::start_command(command, args)
    }
}
// A TCP proxy that can cut, refuse and hold connections
// ---------------------------------------------------------------------------------------------

/// A TCP proxy on `127.0.0.1:0` in front of a `ws://` server, to break connections on purpose.
///
/// - [`CutProxy::cut`] closes every proxied connection at once (both sides), as a network
///   failure would; new connections are accepted again right away.
/// - [`CutProxy::pause`] cuts and then refuses (accepts and immediately closes) new connections
///   until [`CutProxy::resume`]: an outage.
/// - [`CutProxy::hold_downstream`] stops forwarding server-to-client bytes without closing
///   anything (requests still reach the server, answers are held back).
pub struct CutProxy {
    addr: std::net::SocketAddr,
    shared: Arc<ProxyShared>,
    accept: tokio::task::JoinHandle<()>,
}

struct ProxyShared {
    /// Bumped by every cut; each connection task ends when it changes.
    cuts: tokio::sync::watch::Sender<u64>,
    /// While true, new connections are closed right after accept.
    paused: std::sync::atomic::AtomicBool,
    /// While true, server-to-client bytes are not forwarded.
    hold_down: tokio::sync::watch::Sender<bool>,
    accepted: std::sync::atomic::AtomicU64,
    refused: tokio::sync::watch::Sender<u64>,
}

impl CutProxy {
    /// Start a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared {
            cuts: tokio::sync::watch::channel(0).0,
            paused: std::sync::atomic::AtomicBool::new(false),
            hold_down: tokio::sync::watch::channel(false).0,
            accepted: std::sync::atomic::AtomicU64::new(0),
            refused: tokio::sync::watch::channel(0).0,
        });
        let upstream = upstream.to_owned();
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let shared = accept_shared.clone();
                if shared.paused.load(std::sync::atomic::Ordering::SeqCst) {
                    shared.refused.send_modify(|n| *n += 1);
                    drop(client);
                    continue;
                }
                shared
                    .accepted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let mut cut = shared.cuts.subscribe();
                    cut.borrow_and_update();
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pipe(client_read, server_write, None);
                    let down = pipe(
                        server_read,
                        client_write,
                        Some(shared.hold_down.subscribe()),
                    );
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cut.changed() => {}
                    }
                    // Dropping the halves closes both sockets.
                });
            }
        });
        CutProxy {
            addr,
            shared,
            accept,
        }
    }

    /// `ws://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Close every proxied connection now.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Cut, and refuse new connections until [`CutProxy::resume`].
    pub fn pause(&self) {
        self.shared
            .paused
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
    }

    /// Accept connections again.
    pub fn resume(&self) {
        self.shared
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Hold (true) or release (false) server-to-client bytes.
    pub fn hold_downstream(&self, hold: bool) {
        self.shared.hold_down.send_replace(hold);
    }

    /// Connections accepted and forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared
            .accepted
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Wait until at least `n` connections were refused while paused.
    pub async fn wait_refused(&self, n: u64, deadline: Duration) {
        let mut refused = self.shared.refused.subscribe();
        tokio::time::timeout(deadline, refused.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| panic!("no {n} refused connection attempts within {deadline:?}"))
            .unwrap();
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut hold: Option<tokio::sync::watch::Receiver<bool>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                // Held bytes wait here; a cut drops them.
                if let Some(hold) = &mut hold
                    && hold.wait_for(|held| !*held).await.is_err()
                {
                    return;
                }
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Wait until `path` exists, polling, panicking after `deadline`.
pub fn wait_for_file(path: &Path, deadline: Duration) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < deadline,
            "{} did not appear within {deadline:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// Median of durations (panics on an empty list).
pub fn median(durations: &[Duration]) -> Duration {
    let mut sorted = durations.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

// ---------------------------------------------------------------------------------------------
// ExecServerClient helpers
// ---------------------------------------------------------------------------------------------

/// A workspace under /tmp and an "outside" directory that no restricting policy may write
/// (under [`scratch::scratch_base`]: neither a workspace root, /tmp nor $TMPDIR), holding a
/// sentinel `secret.txt`.
pub struct SandboxDirs {
    /// The workspace (cwd of the policies under test).
    pub workspace: tempfile::TempDir,
    /// Outside every writable root.
    pub outside: tempfile::TempDir,
}

impl SandboxDirs {
    /// Create both directories and `outside/secret.txt`.
    pub fn new() -> SandboxDirs {
        let workspace = tempfile::Builder::new()
            .prefix("ew-ws-")
            .tempdir_in("/tmp")
            .expect("workspace under /tmp");
        let outside = scratch::scratch_dir("ew-out-");
        scratch::assert_outside_writable_roots(outside.path());
        std::fs::write(outside.path().join("secret.txt"), b"outside").expect("secret.txt");
        SandboxDirs { workspace, outside }
    }
}

impl Default for SandboxDirs {
    fn default() -> Self {
        Self::new()
    }
}

/// Wait for `child` to exit, killing it (and failing the test) after `deadline`.
pub fn wait_child(child: &mut Child, deadline: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child process did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// Run `cmd` with `stdin` as its input and collect (status, stdout, stderr), all within
/// [`DEADLINE`].
pub fn output_within(cmd: &mut Command, stdin: &[u8]) -> (ExitStatus, String, String) {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).expect("read output");
            text
        })
    };
    let out = read_all(Box::new(child.stdout.take().expect("stdout")));
    let err = read_all(Box::new(child.stderr.take().expect("stderr")));
    let status = wait_child(&mut child, DEADLINE);
    (
        status,
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    )
}

/// `process/start` params for the library client: cwd `/`, env `PATH=/usr/bin:/bin`.
pub fn start_params(process_id: &str, argv: &[&str]) -> proto::methods::process::StartParams {
    proto::methods::process::StartParams {
        process_id: process_id.to_owned(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: proto::FileUri::from_path(Path::new("/")).unwrap(),
        env: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        tty: false,
        pipe_stdin: false,
        arg0: None,
        cols: None,
        rows: None,
        sandbox: None,
        audit_denials: false,
        env_policy: None,
        enforce_managed_network: false,
        limits: None,
    }
}

/// Connect an `ExecServerClient` to `url`, panicking with context on failure.
pub async fn library_client(url: &str) -> supervisor::ExecServerClient {
    let options = supervisor::ExecServerClientConnectOptions::new(url).with_client_name("tests");
    tokio::time::timeout(DEADLINE, supervisor::ExecServerClient::connect(options))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} took over {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The next event of a process handle, within `deadline`.
pub async fn next_event(
    handle: &mut supervisor::ProcessHandle,
    deadline: Duration,
) -> supervisor::ProcessEvent {
    tokio::time::timeout(deadline, handle.next_event())
        .await
        .unwrap_or_else(|_| panic!("no event of {} within {deadline:?}", handle.id()))
        .unwrap_or_else(|| panic!("the event stream of {} ended", handle.id()))
}

/// Read events until the decoded output of any stream contains `needle`; returns that output.
pub async fn wait_for_event_output(
    handle: &mut supervisor::ProcessHandle,
    needle: &str,
    deadline: Duration,
) -> String {
    let started = Instant::now();
    let mut text = String::new();
    loop {
        let remaining = deadline.saturating_sub(started.elapsed());
        match next_event(handle, remaining).await {
            supervisor::ProcessEvent::Output { data, .. } => {
                text.push_str(&String::from_utf8_lossy(&data));
                if text.contains(needle) {
                    return text;
                }
            }
            other => panic!(
                "waiting for {needle:?} in {}, got {other:?}; so far: {text:?}",
                handle.id()
            ),
        }
    }
}

/// Wait until the client's state satisfies `pred`.
pub async fn wait_for_state(
    client: &supervisor::ExecServerClient,
    deadline: Duration,
    what: &str,
    pred: impl FnMut(&supervisor::ConnectionState) -> bool,
) -> supervisor::ConnectionState {
    let mut state = client.subscribe_state();
    tokio::time::timeout(deadline, state.wait_for(pred))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "client not {what} within {deadline:?}: {:?}",
                client.state()
            )
        })
        .unwrap()
        .clone()
}
