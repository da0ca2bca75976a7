//! A `nats-server -js` for the rendezvous cluster's tests and the bench's cluster rows (the
//! distribution's binary: a missing one fails, never skips).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use crate::DEADLINE;

/// A `nats-server -js` of one test: loopback, a free port, a temporary store; killed on drop.
pub struct Nats {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    /// Arguments besides the port and store (e.g. `--tls --tlscert C --tlskey K`).
    extra: Vec<String>,
    /// Environment variables besides the inherited ones (e.g. the Go runtime's `GOGC`).
    env: Vec<(String, String)>,
}

impl Nats {
    pub fn start() -> Nats {
        Nats::start_with(&[])
    }

    /// [`Nats::start`] with more `nats-server` arguments.
    pub fn start_with(extra: &[&str]) -> Nats {
        Nats::start_with_env(extra, &[])
    }

    /// [`Nats::start_with`] with more environment variables.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Nats {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let store = tempfile::tempdir().unwrap();
        let mut nats = Nats {
            child: None,
            port,
            store,
            extra: extra.iter().map(|arg| (*arg).to_owned()).collect(),
            env: env
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
        };
        nats.spawn();
        nats
    }

    /// The running server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("nats-server is running").id()
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Its `tls://` URL (for a server started with `--tls`).
    pub fn tls_url(&self) -> String {
        format!("tls://127.0.0.1:{}", self.port)
    }

    /// Start the server on its port and store; return once it says it is ready (JetStream
    /// included).
    pub fn spawn(&mut self) {
        let binary = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .expect(
                "nats-server is missing: apt-get install nats-server (the cluster tests never skip)",
            );
        let mut child = Command::new(binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(self.store.path())
            .args(&self.extra)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stderr).lines();
            let mut log = String::new();
            for line in lines.by_ref() {
                let Ok(line) = line else { break };
                log.push_str(&line);
                log.push('\n');
                if line.contains("Server is ready") {
                    let _ = ready_tx.send(Ok(()));
                    // Keep draining so the server never blocks on a full pipe.
                    for _ in lines.by_ref() {}
                    return;
                }
            }
            let _ = ready_tx.send(Err(log));
        });
        match ready.recv_timeout(DEADLINE) {
            Ok(Ok(())) => {}
            Ok(Err(log)) => panic!("nats-server did not start:\n{log}"),
            Err(_) => panic!("nats-server not ready within {DEADLINE:?}"),
        }
        self.child = Some(child);
    }

    /// Kill the server (SIGKILL): every node loses its link.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
