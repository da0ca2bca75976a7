//! The `exec-server` process: locating the binary, starting it (from the target directory or an
//! installed copy) and waiting for its URL, signalling and reaping it, and runs expected to exit.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::{Client, DEADLINE, SERVER_BINARY};

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

    fn start_command(mut command: Command, args: &[&str]) -> ExecServer {
        let mut child = spawn_retrying_busy(&mut command);
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

    /// `GET path` on a `ws://` listener as the test's user: status, head, body.
    pub async fn get(&self, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
            .await
            .expect("the page within the deadline")
            .unwrap();
        let answer = String::from_utf8(answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, head.to_owned(), body.to_owned())
    }

    /// The server-wide budget `name` as `GET /status` shows it (`{name, unit, limit, inUse}`).
    pub async fn budget(&self, name: &str) -> serde_json::Value {
        let (code, head, body) = self.get("/status").await;
        assert_eq!(code, 200, "{head}\n{body}");
        budget_in(&serde_json::from_str(&body).unwrap(), name)
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

/// Spawns `command`, whose binary may be a copy just written ([`install_binaries`]): another
/// test thread forking at that moment holds the copy's write descriptor until its child execs,
/// and `execve` of a file open for writing fails with ETXTBSY. The window is that short, so a
/// few tries get past it.
fn spawn_retrying_busy(command: &mut Command) -> std::process::Child {
    for _ in 0..50 {
        match command.spawn() {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10)); // the sibling's exec
            }
            result => return result.expect("spawn exec-server"),
        }
    }
    panic!("the exec-server binary stayed busy (ETXTBSY) for 0.5 s");
}

/// Copies [`INSTALLED_BINARIES`] from the target directory into `dir` (mode 0755), as an install
/// would, and returns the path of the copied `exec-server`.
pub fn install_binaries(dir: &Path) -> PathBuf {
    let from = exec_server_binary()
        .parent()
        .expect("exec-server has a directory")
        .to_path_buf();
    std::fs::create_dir_all(dir).expect("create the install directory");
    for name in INSTALLED_BINARIES {
        crate::scratch::copy_executable(&from.join(name), &dir.join(name));
    }
    dir.join(SERVER_BINARY)
}

/// The server-wide budget `name` in a `GET /status` page (`{name, unit, limit, inUse}`).
pub fn budget_in(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|budget| budget["name"] == name)
        .unwrap_or_else(|| panic!("no budget {name} in {status}"))
        .clone()
}
