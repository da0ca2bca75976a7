//! The real `exec-rendezvous` and `exec-server --remote` processes: started, killed on drop,
//! and waited for until the executor is registered.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use supervisor::relay::RemoteConnectArgs;
use supervisor::relay::registry::RegistryClient;

use super::{EXECUTOR_TOKEN, TOKEN, binary, credentials_toml, registry_client};
use crate::DEADLINE;

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
