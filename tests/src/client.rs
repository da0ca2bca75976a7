//! The websocket JSON-RPC client: connecting (`ws://` or `unix:`), requests matched by id,
//! stashed notifications, process output collection and decoding.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::{DEADLINE, RpcError, unb64};
use proto::methods::process::binary::{OUTPUT_FRAME_KIND, OutputFrame};

mod events;

pub(crate) use events::output_frame_as_notification;
pub use events::{ProcessOutput, decode_events, seqs};

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
        Self::handshake(stream, request_url, headers).await
    }

    /// Connect to `ws://HOST:PORT` over a TCP socket created with file-system uid `uid` (only
    /// this thread's: `setfsuid`), so the kernel's socket table names `uid` as its owner: to the
    /// server, a client of another user on the same host. Needs root.
    ///
    /// # Errors
    /// The handshake error.
    pub async fn connect_as_uid(url: &str, uid: u32) -> Result<Client, tungstenite::Error> {
        Self::connect_as_uid_with_headers(url, uid, &[]).await
    }

    /// [`Self::connect_as_uid`] sending extra upgrade headers (`Authorization`: a server admits
    /// another user's socket only with its token).
    ///
    /// # Errors
    /// The handshake error.
    pub async fn connect_as_uid_with_headers(
        url: &str,
        uid: u32,
        headers: &[(&str, &str)],
    ) -> Result<Client, tungstenite::Error> {
        let addr = url
            .strip_prefix("ws://")
            .unwrap_or_else(|| panic!("unsupported URL {url}"))
            .trim_end_matches('/')
            .to_owned();
        let stream = std::thread::spawn(move || {
            // This thread's file-system uid only, restored below.
            let previous = crate::sys::set_fsuid(uid);
            let stream = std::net::TcpStream::connect(&addr);
            crate::sys::set_fsuid(previous);
            stream
        })
        .join()
        .expect("connect thread")?;
        stream.set_nonblocking(true)?;
        let stream = tokio::net::TcpStream::from_std(stream)?;
        stream.set_nodelay(true)?;
        Self::handshake(Box::new(stream), url.to_owned(), headers).await
    }

    async fn handshake(
        stream: Box<dyn Io>,
        request_url: String,
        headers: &[(&str, &str)],
    ) -> Result<Client, tungstenite::Error> {
        let url = request_url.clone();
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
                Message::Binary(bytes) if bytes.first() == Some(&OUTPUT_FRAME_KIND) => {
                    let value = output_frame_as_notification(&bytes);
                    self.log.push(value.clone());
                    return Some(value);
                }
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

/// Build a `sh -c` argv.
pub fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
}

/// Runs the in-sandbox `probe` binary with `op` through `client` in `cwd`, under `sandbox` (or
/// unsandboxed), and returns its JSON report, panicking with its output when it printed none.
pub async fn probe_report(
    client: &mut Client,
    probe: &str,
    cwd: &std::path::Path,
    id: &str,
    sandbox: Option<&Value>,
    op: &[&str],
) -> Value {
    let mut argv = vec![probe];
    argv.extend_from_slice(op);
    let mut extra = serde_json::json!({"cwd": crate::file_uri(cwd)});
    if let Some(sandbox) = sandbox {
        extra["sandbox"] = sandbox.clone();
    }
    let out = client.run(id, &argv, extra).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "probe {op:?} printed no report ({e}): stdout {stdout:?} stderr {:?} exit {:?}",
            String::from_utf8_lossy(&out.stderr),
            out.exit_code
        )
    })
}
