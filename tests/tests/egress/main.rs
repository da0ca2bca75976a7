//! Network allowlists through exec-server: `process/start` with `sandbox.network` an
//! allowlist (the command reaches only what it names, through the egress proxy), refusals as
//! `process/denied` for `auditDenials` starts without root, the server's own listener refused
//! even when a pattern allows it, and `http/request` checked against the same allowlist.
//!
//! This module holds the shared fixtures (the counting origin, the installed server); each
//! submodule is one group of cases, with the servers only it uses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tests::{ExecServer, assert_rpc_error, file_uri, install_binaries, scratch};

mod allowlist;
mod approve;
mod http_request;
mod tunnels;
mod upstream;

const NOBODY: u32 = 65534;

fn identities() -> Vec<Option<u32>> {
    if nix::unistd::geteuid().is_root() {
        vec![None, Some(NOBODY)]
    } else {
        vec![None]
    }
}

/// An HTTP origin on the host's 127.0.0.1 that answers `hello from origin` and counts
/// connections.
struct Origin {
    port: u16,
    connections: Arc<AtomicUsize>,
}

impl Origin {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || answer(stream));
            }
        });
        Self { port, connections }
    }
}

fn answer(mut stream: TcpStream) {
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let body = b"hello from origin\n";
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(body);
}

/// An install of the binaries and a workspace owned by `uid`, and the server started as `uid`.
struct Setup {
    _base: tempfile::TempDir,
    workspace: PathBuf,
    bin: PathBuf,
}

impl Setup {
    fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("egress-server-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let workspace = root.join("ws");
        std::fs::create_dir(&workspace).unwrap();
        let bin = root.join("bin");
        install_binaries(&bin);
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&workspace, Some(uid), Some(uid)).unwrap();
        }
        Self {
            _base: base,
            workspace,
            bin,
        }
    }

    fn start(&self, uid: Option<u32>) -> ExecServer {
        self.start_with(uid, &[])
    }

    fn start_with(&self, uid: Option<u32>, args: &[&str]) -> ExecServer {
        ExecServer::start_binary(&self.bin.join("exec-server"), args, |command| {
            command.env_clear().env("PATH", "/usr/bin:/bin");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    fn sandbox(&self, allow: &[String]) -> Value {
        json!({
            "profile": "workspace-write",
            "cwd": file_uri(&self.workspace),
            "network": {"allow": allow},
        })
    }
}
