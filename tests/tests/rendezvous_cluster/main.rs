//! The rendezvous as a cluster of nodes on NATS (issue 38): each test starts its own
//! `nats-server -js` on a free loopback port with a temporary store, and real `exec-rendezvous
//! --cluster` nodes, executors and harnesses. They never skip: a missing `nats-server` fails them
//! (`.ci/run` installs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use supervisor::relay::registry::{RegisterRequest, RegistryClient, RegistryError};
use tests::DEADLINE;
use tests::nats::Nats;
use tests::relay::{
    EXECUTOR_TOKEN, Faults, Process, Proxy, RemoteClient, TOKEN, start_executor_with,
    start_rendezvous_with, wait_registered,
};

mod binding;
mod failover;
mod pieces;
mod sockets;
mod tls;

/// A free loopback address (bound, then released for the process about to take it).
fn free_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// An `exec-rendezvous` node of the cluster on `nats`.
fn start_node(nats: &Nats, name: &str, listen: &str, public_url: Option<&str>) -> Process {
    start_rendezvous_with(
        listen,
        public_url,
        &["--cluster", &nats.url(), "--node-name", name],
    )
}

/// Nodes of the cluster on `nats`, one per name, each behind a proxy with `faults` that it
/// hands out as its public URL (so every endpoint link drops, duplicates and delays frames).
async fn nodes_behind_faulty_proxies(
    nats: &Nats,
    names: &[&str],
    faults: Faults,
) -> (Vec<Process>, Vec<Proxy>) {
    let mut nodes = Vec::new();
    let mut proxies = Vec::new();
    for name in names {
        let address = free_address();
        let proxy = Proxy::start(address, faults, false).await;
        nodes.push(start_node(
            nats,
            name,
            &address.to_string(),
            Some(&proxy.url),
        ));
        proxies.push(proxy);
    }
    (nodes, proxies)
}

/// Nodes `a` and `b` on free loopback ports, each started with `args` (which name the cluster:
/// `--cluster URL` and any shared option) and its `--node-name`.
fn two_nodes(args: &[&str]) -> (Process, Process) {
    let node = |name: &str| {
        start_rendezvous_with(
            "127.0.0.1:0",
            None,
            &[args, &["--node-name", name]].concat(),
        )
    };
    (node("a"), node("b"))
}

fn registry(url: &str) -> RegistryClient {
    tests::relay::registry_client(url, None)
}

fn registration(fill: u8) -> RegisterRequest {
    RegisterRequest {
        name: "cluster test".to_owned(),
        public_key: public_key(fill),
    }
}

fn public_key(fill: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([fill; 32])
}

fn status(error: &RegistryError) -> u16 {
    match error {
        RegistryError::Status { status, .. } => *status,
        other => panic!("expected an HTTP status, got {other}"),
    }
}

/// `GET /readyz` of a node: its status code.
fn readyz(url: &str) -> u16 {
    let address = url.trim_start_matches("http://");
    let Ok(mut stream) = TcpStream::connect(address) else {
        return 0;
    };
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    let _ = write!(
        stream,
        "GET /readyz HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    );
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

async fn wait_readyz(url: &str, expected: u16) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let target = url.to_owned();
        let got = tokio::task::spawn_blocking(move || readyz(&target))
            .await
            .unwrap();
        if got == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{url}/readyz stayed {got}, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
