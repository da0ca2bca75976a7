//! Remote-mode test support: the real `exec-rendezvous` and `exec-server --remote` processes, a
//! JSON-RPC client over a relay stream, and a websocket proxy that records frames and injects
//! faults (drop, duplicate, reorder, delay) on the links to the rendezvous.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use supervisor::relay::registry::RegistryClient;
use supervisor::relay::{RelayHarnessConnection, RemoteConnectArgs};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use crate::{DEADLINE, exec_server_binary};

/// The harness credential every remote test uses (granted every environment).
pub const TOKEN: &str = "relay-test-harness-token";
/// The executor credential every remote test uses (granted every environment).
pub const EXECUTOR_TOKEN: &str = "relay-test-executor-token";
/// The admin credential (releases key bindings).
pub const ADMIN_TOKEN: &str = "relay-test-admin-token";
/// An executor credential granted only `env-narrow` (403 elsewhere).
pub const NARROW_EXECUTOR_TOKEN: &str = "relay-test-narrow-executor";

/// The credentials file of every test rendezvous.
pub fn credentials_toml() -> String {
    format!(
        r#"[[executor]]
token = "{EXECUTOR_TOKEN}"
environments = ["*"]

[[executor]]
token = "{NARROW_EXECUTOR_TOKEN}"
environments = ["env-narrow"]

[[harness]]
token = "{TOKEN}"
environments = ["*"]

[[admin]]
token = "{ADMIN_TOKEN}"
"#
    )
}

fn binary(name: &str) -> std::path::PathBuf {
    exec_server_binary().with_file_name(name)
}

/// The TLS client settings of the test registries: system roots plus `ca_file`.
pub fn client_tls(
    registry_url: &str,
    ca_file: Option<&std::path::Path>,
) -> std::sync::Arc<rustls::ClientConfig> {
    supervisor::relay::tls::client_config_for(registry_url, ca_file).unwrap()
}

/// A registry client for a test registry (plain loopback, or TLS trusting `ca_file`).
pub fn registry_client(registry_url: &str, ca_file: Option<&std::path::Path>) -> RegistryClient {
    RegistryClient::new(registry_url, &client_tls(registry_url, ca_file)).unwrap()
}

/// A child process killed on drop, its first stdout line captured.
pub struct Process {
    child: Child,
    /// First stdout line.
    pub first_line: String,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Files the process uses (credentials, identity), removed after it.
    pub dir: Option<tempfile::TempDir>,
}

impl Process {
    /// Start `program` (next to exec-server) with the test credentials in its environment.
    pub fn start(program: &str, args: &[&str]) -> Process {
        let mut child = Command::new(binary(program))
            .args(args)
            .env(supervisor::relay::REGISTRY_TOKEN_ENV, TOKEN)
            .env(supervisor::relay::EXECUTOR_TOKEN_ENV, EXECUTOR_TOKEN)
            .env(
                "RUST_LOG",
                std::env::var("RELAY_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match std::env::var("RELAY_TEST_LOG_DIR") {
                // Appended: a restarted rendezvous keeps the first one's log.
                Ok(dir) => Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(format!("{dir}/{program}-{}.log", std::process::id()))
                        .unwrap(),
                ),
                Err(_) => Stdio::piped(),
            })
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take();
        let buffer = stderr.clone();
        std::thread::spawn(move || {
            let Some(mut err) = err else { return };
            let mut chunk = [0u8; 4096];
            while let Ok(n) = err.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buffer.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = tx.send(reader.read_line(&mut line).map(|_| line.clone()));
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
        });
        let first_line = match rx.recv_timeout(DEADLINE) {
            Ok(Ok(line)) if !line.trim().is_empty() => line.trim().to_owned(),
            other => panic!(
                "{program} printed no URL within {DEADLINE:?}: {other:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr.lock().unwrap())
            ),
        };
        Process {
            child,
            first_line,
            stderr,
            dir: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed on stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let bytes = self.stderr.lock().map(|b| b.clone()).unwrap_or_default();
            let tail = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(6000)..]);
            eprintln!("--- stderr of {} (tail) ---\n{tail}", self.first_line);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `exec-rendezvous` (`listen` e.g. `127.0.0.1:0`; `public_url` for a proxy) with the
/// test credentials.
pub fn start_rendezvous(listen: &str, public_url: Option<&str>) -> Process {
    start_rendezvous_with(listen, public_url, &[])
}

/// [`start_rendezvous`] with extra arguments (`--tls-cert`, ...).
pub fn start_rendezvous_with(listen: &str, public_url: Option<&str>, extra: &[&str]) -> Process {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.toml");
    std::fs::write(&credentials, credentials_toml()).unwrap();
    let mut args = vec![
        "--listen",
        listen,
        "--credentials",
        credentials.to_str().unwrap(),
    ];
    if let Some(url) = public_url {
        args.extend(["--public-url", url]);
    }
    args.extend_from_slice(extra);
    let mut process = Process::start("exec-rendezvous", &args);
    process.dir = Some(dir);
    process
}

/// Start `exec-server --remote` (identity in a fresh directory) and wait until the registry
/// knows it.
pub async fn start_executor(registry_url: &str, environment_id: &str) -> Process {
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let process = start_executor_with(registry_url, environment_id, &identity, &[]);
    wait_registered(registry_url, environment_id, &process).await;
    let mut process = process;
    process.dir = Some(dir);
    process
}

/// Start `exec-server --remote` with this identity file and extra arguments; does not wait.
pub fn start_executor_with(
    registry_url: &str,
    environment_id: &str,
    identity: &std::path::Path,
    extra: &[&str],
) -> Process {
    let mut args = vec![
        "--listen",
        "ws://127.0.0.1:0",
        "--remote",
        registry_url,
        "--environment-id",
        environment_id,
        "--name",
        "test environment",
        "--identity-file",
        identity.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Process::start("exec-server", &args)
}

/// Wait (within [`DEADLINE`]) until the registry has `environment_id`.
pub async fn wait_registered(registry_url: &str, environment_id: &str, process: &Process) {
    wait_registered_with(
        &registry_client(registry_url, None),
        environment_id,
        process,
    )
    .await;
}

/// [`wait_registered`] through a given registry client (TLS).
pub async fn wait_registered_with(
    registry: &RegistryClient,
    environment_id: &str,
    process: &Process,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if registry.connect(environment_id, TOKEN).await.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "environment {environment_id} never registered; executor stderr:\n{}",
            process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connection arguments for the test token.
pub fn connect_args(registry_url: &str, environment_id: &str) -> RemoteConnectArgs {
    RemoteConnectArgs::new(registry_url, environment_id, TOKEN)
}

/// A JSON-RPC client over one relay stream.
pub struct RemoteClient {
    /// The stream.
    pub connection: RelayHarnessConnection,
    next_id: u64,
    /// Responses that arrived while waiting for another.
    pending: HashMap<u64, Value>,
    /// Notifications, in arrival order.
    pub notifications: Vec<Value>,
}

impl RemoteClient {
    /// Connect and initialize.
    pub async fn connect(registry_url: &str, environment_id: &str) -> RemoteClient {
        Self::connect_with(&connect_args(registry_url, environment_id)).await
    }

    /// Connect with these arguments and initialize.
    pub async fn connect_with(args: &RemoteConnectArgs) -> RemoteClient {
        let connection = tokio::time::timeout(DEADLINE, RelayHarnessConnection::connect(args))
            .await
            .expect("relay connect deadline")
            .expect("relay connect");
        let mut client = RemoteClient {
            connection,
            next_id: 1,
            pending: HashMap::new(),
            notifications: Vec::new(),
        };
        client
            .call("initialize", json!({"clientName": "relay-test"}))
            .await
            .expect("initialize");
        client.notify("initialized", json!({})).await;
        client
    }

    /// Send a notification.
    pub async fn notify(&mut self, method: &str, params: Value) {
        let text = json!({"method": method, "params": params}).to_string();
        self.send_text(text).await;
    }

    /// Send a request; returns its id.
    pub async fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let text = json!({"id": id, "method": method, "params": params}).to_string();
        self.send_text(text).await;
        id
    }

    /// Send, filing whatever arrives meanwhile: like any real client, keep reading while a send
    /// waits for room (otherwise full windows on both sides wait on each other).
    async fn send_text(&mut self, text: String) {
        let sender = self.connection.sender();
        let send = sender.send(text);
        tokio::pin!(send);
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            tokio::select! {
                sent = &mut send => {
                    sent.expect("send");
                    return;
                }
                message = self.connection.recv() => {
                    let bytes = message.expect("relay stream ended while sending");
                    self.file(serde_json::from_slice(&bytes).expect("JSON-RPC message"));
                }
                () = tokio::time::sleep_until(until) => panic!("send did not complete within 60 s"),
            }
        }
    }

    /// Wait for the response to `id`: `Ok(result)` or `Err(error)`.
    pub async fn response(&mut self, id: u64) -> Result<Value, Value> {
        self.response_within(id, DEADLINE).await
    }

    /// [`Self::response`] with an explicit deadline.
    pub async fn response_within(&mut self, id: u64, deadline: Duration) -> Result<Value, Value> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if let Some(message) = self.pending.remove(&id) {
                return match message.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(message["result"].clone()),
                };
            }
            let message = self.next_within(until).await;
            self.file(message);
        }
    }

    /// The next message of any kind, filed; panics at the deadline.
    async fn next_within(&mut self, until: tokio::time::Instant) -> Value {
        let bytes = tokio::time::timeout_at(until, self.connection.recv())
            .await
            .expect("relay message deadline")
            .expect("relay stream ended");
        serde_json::from_slice(&bytes).expect("JSON-RPC message")
    }

    fn file(&mut self, message: Value) {
        match message.get("id").and_then(Value::as_u64) {
            Some(id) => {
                assert!(
                    self.pending.insert(id, message).is_none(),
                    "two responses for id {id}"
                );
            }
            None => self.notifications.push(message),
        }
    }

    /// Request and wait.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.send(method, params).await;
        self.response(id).await
    }

    /// Wait for a notification matching `pred` (already received ones count).
    pub async fn wait_notification(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        let until = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(found) = self.notifications.iter().find(|n| pred(n)) {
                return found.clone();
            }
            let message = self.next_within(until).await;
            self.file(message);
        }
    }
}

/// What the proxy does to each binary frame, per direction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Percent of frames dropped.
    pub drop_percent: u64,
    /// Percent of frames sent twice.
    pub duplicate_percent: u64,
    /// Each frame is delayed by a random 0..=this many ms (reorders within that window).
    pub max_delay_ms: u64,
}

/// A websocket proxy in front of the rendezvous's websocket endpoints.
pub struct Proxy {
    /// `ws://127.0.0.1:PORT`, to pass as the rendezvous's `--public-url`.
    pub url: String,
    /// Every binary frame seen, when recording.
    pub recorded: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Frames dropped by fault injection.
    pub dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

impl Proxy {
    /// Start a proxy forwarding to the rendezvous at `upstream` (`IP:PORT`).
    pub async fn start(upstream: SocketAddr, faults: Faults, record: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicU64::new(0));
        let (rec, drops) = (recorded.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            while let Ok((stream, _)) = listener.accept().await {
                seed = seed.wrapping_add(0x1234_5678_9abc_def1);
                let rec = record.then(|| rec.clone());
                tokio::spawn(proxy_connection(
                    stream,
                    upstream,
                    faults,
                    rec,
                    drops.clone(),
                    seed,
                ));
            }
        });
        Proxy {
            url,
            recorded,
            dropped,
            task,
        }
    }
}

#[allow(clippy::result_large_err)] // tungstenite's callback signature
async fn proxy_connection(
    stream: tokio::net::TcpStream,
    upstream: SocketAddr,
    faults: Faults,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    dropped: Arc<AtomicU64>,
    seed: u64,
) {
    let head: Arc<Mutex<Option<(String, String)>>> = Arc::default();
    let captured = head.clone();
    let callback = move |request: &Request, response: Response| {
        let auth = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        *captured.lock().unwrap() = Some((request.uri().path().to_owned(), auth));
        Ok(response)
    };
    let config = supervisor::relay::driver::relay_websocket_config();
    let Ok(downstream) =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await
    else {
        return;
    };
    let Some((path, auth)) = head.lock().unwrap().clone() else {
        return;
    };
    let token = auth.strip_prefix("Bearer ").unwrap_or_default().to_owned();
    let tls = client_tls("http://127.0.0.1:1", None);
    let Ok(upstream) =
        supervisor::relay::driver::connect_socket(&format!("ws://{upstream}{path}"), &token, &tls)
            .await
    else {
        return;
    };
    let (down_sink, down_stream) = downstream.split();
    let (up_sink, up_stream) = upstream.split();
    let a = pipe(
        down_stream,
        up_sink,
        faults,
        record.clone(),
        dropped.clone(),
        seed,
    );
    let b = pipe(
        up_stream,
        down_sink,
        faults,
        record,
        dropped,
        seed ^ 0xdead_beef,
    );
    // When either side ends, drop both.
    tokio::select! {
        () = a => {}
        () = b => {}
    }
}

async fn pipe<R, W>(
    mut from: R,
    mut to: W,
    faults: Faults,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    dropped: Arc<AtomicU64>,
    seed: u64,
) where
    R: futures_util::Stream<Item = Result<WsMessage, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
    W: futures_util::Sink<WsMessage> + Unpin + Send + 'static,
{
    let mut rng = Rng(seed | 1);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if to.send(WsMessage::binary(frame)).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(message)) = from.next().await {
        let WsMessage::Binary(bytes) = message else {
            if matches!(message, WsMessage::Close(_)) {
                break;
            }
            continue;
        };
        if let Some(record) = &record {
            record.lock().unwrap().push(bytes.to_vec());
        }
        if rng.next() % 100 < faults.drop_percent {
            dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let copies = if rng.next() % 100 < faults.duplicate_percent {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = if faults.max_delay_ms == 0 {
                0
            } else {
                rng.next() % (faults.max_delay_ms + 1)
            };
            let tx = tx.clone();
            let frame = bytes.to_vec();
            if delay == 0 {
                let _ = tx.send(frame);
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let _ = tx.send(frame);
                });
            }
        }
    }
    writer.abort();
}

/// [`supervisor::ExecServerClient`] connection arguments for the test token.
pub fn remote_client_args(
    registry_url: &str,
    environment_id: &str,
) -> supervisor::RemoteExecServerConnectArgs {
    supervisor::RemoteExecServerConnectArgs::new(registry_url, environment_id, TOKEN)
        .with_client_name("relay-tests")
}

/// The library client through the rendezvous (connected and initialized within [`DEADLINE`]).
pub async fn remote_library_client(
    registry_url: &str,
    environment_id: &str,
) -> supervisor::ExecServerClient {
    tokio::time::timeout(
        DEADLINE,
        supervisor::ExecServerClient::connect_remote(remote_client_args(
            registry_url,
            environment_id,
        )),
    )
    .await
    .unwrap_or_else(|_| panic!("connecting to {environment_id} took over {DEADLINE:?}"))
    .unwrap_or_else(|e| panic!("connect to {environment_id}: {e}"))
}

/// A throwaway CA and a server certificate it signed for `localhost` and `127.0.0.1`, as PEM
/// files in a temporary directory (generated with rcgen for each test).
pub struct TestCa {
    /// The directory holding the files.
    pub dir: tempfile::TempDir,
    /// The CA certificate (what clients pass as --ca-file).
    pub ca_file: std::path::PathBuf,
    /// The server's certificate chain.
    pub cert_file: std::path::PathBuf,
    /// The server's private key.
    pub key_file: std::path::PathBuf,
}

impl TestCa {
    /// Generate the CA and the server certificate.
    pub fn generate() -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "execward test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "execward test rendezvous");
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        let cert_file = dir.path().join("rendezvous.pem");
        let key_file = dir.path().join("rendezvous-key.pem");
        std::fs::write(&ca_file, ca_cert.pem()).unwrap();
        std::fs::write(&cert_file, server_cert.pem()).unwrap();
        std::fs::write(&key_file, server_key.serialize_pem()).unwrap();
        TestCa {
            dir,
            ca_file,
            cert_file,
            key_file,
        }
    }
}
