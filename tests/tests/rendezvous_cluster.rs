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

/// An executor registered through node A serves a harness connected to node B over lossy
/// links; node A is SIGKILLed halfway through 10,000 requests; the executor registers again
/// through node B or C (its `--remote` lists all three) and the harness, still on node B,
/// receives every reply exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn an_executor_moves_when_its_node_is_killed_and_the_harness_gets_every_reply_once() {
    let nats = Nats::start();
    let faults = Faults {
        drop_percent: 10,
        duplicate_percent: 5,
        max_delay_ms: 2,
    };
    let mut nodes = Vec::new();
    let mut proxies = Vec::new();
    for name in ["a", "b", "c"] {
        let address = free_address();
        let proxy = Proxy::start(address, faults, false).await;
        nodes.push(Some(start_node(
            &nats,
            name,
            &address.to_string(),
            Some(&proxy.url),
        )));
        proxies.push(proxy);
    }
    let urls: Vec<String> = nodes
        .iter()
        .flatten()
        .map(|node| node.first_line.clone())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let executor = start_executor_with(&urls.join(","), "env-moving", &identity, &[]);
    // Registered through A (the first URL), visible through B: the registry is the cluster's.
    wait_registered(&urls[1], "env-moving", &executor).await;
    let mut client = RemoteClient::connect(&urls[1], "env-moving").await;
    let node_a = nodes[0].as_ref().unwrap();
    assert!(
        node_a
            .stderr()
            .contains("executor socket open (key proven)"),
        "the executor is not on node A:\n{}",
        node_a.stderr()
    );

    const TOTAL: u64 = 10_000;
    const WINDOW: u64 = 64;
    let mut outstanding = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut answered = 0u64;
    let mut killed = false;
    while sent < TOTAL || !outstanding.is_empty() {
        while sent < TOTAL && (outstanding.len() as u64) < WINDOW {
            let id = client.send("no/such-method", json!({"n": sent})).await;
            outstanding.push_back(id);
            sent += 1;
        }
        let id = outstanding.pop_front().unwrap();
        let error: Value = client
            .response_within(id, Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(error["code"], -32601, "{error}");
        answered += 1;
        if sent >= TOTAL / 2 && !killed {
            killed = true;
            // SIGKILL: no goodbye to NATS, the executor or the harness.
            drop(nodes[0].take());
        }
    }
    assert!(killed);
    assert_eq!(answered, TOTAL);
    assert_eq!(client.unclaimed(), 0, "a reply arrived twice");
    let dropped: u64 = proxies
        .iter()
        .map(|p| p.dropped.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert!(dropped > 10, "the links lost only {dropped} frames");
    // The executor now serves through B or C.
    let moved = nodes[1..]
        .iter()
        .flatten()
        .any(|node| node.stderr().contains("executor socket open (key proven)"));
    assert!(moved, "executor stderr:\n{}", executor.stderr());
    // And the same stream still starts processes.
    let started = client
        .call(
            "process/start",
            json!({"processId": "after", "argv": ["/bin/true"], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
}

/// The key binding is the cluster's: a registration with another key through another node is
/// refused (409), the same key is accepted there, and two nodes racing to bind one id with two
/// keys let exactly one win (compare-and-set). Control: two nodes on two separate NATS servers
/// (no shared registry) accept the other key, so the refusal is the shared registry's doing.
#[tokio::test(flavor = "multi_thread")]
async fn another_key_is_refused_through_every_node_and_racing_registrations_bind_one_key() {
    let nats = Nats::start();
    let a = start_node(&nats, "a", "127.0.0.1:0", None);
    let b = start_node(&nats, "b", "127.0.0.1:0", None);
    let (via_a, via_b) = (registry(&a.first_line), registry(&b.first_line));
    via_a
        .register("env-bound", &registration(1), EXECUTOR_TOKEN)
        .await
        .unwrap();
    via_b
        .register("env-bound", &registration(1), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let refused = via_b
        .register("env-bound", &registration(2), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(status(&refused), 409, "{refused}");
    for node in [&via_a, &via_b] {
        let bound = node.connect("env-bound", TOKEN).await.unwrap();
        assert_eq!(bound.public_key, public_key(1));
    }
    for round in 0..8u8 {
        let id = format!("env-race-{round}");
        let (three, four) = (registration(3), registration(4));
        let (first, second) = tokio::join!(
            via_a.register(&id, &three, EXECUTOR_TOKEN),
            via_b.register(&id, &four, EXECUTOR_TOKEN),
        );
        let winner = match (&first, &second) {
            (Ok(_), Err(error)) => {
                assert_eq!(status(error), 409, "{error}");
                public_key(3)
            }
            (Err(error), Ok(_)) => {
                assert_eq!(status(error), 409, "{error}");
                public_key(4)
            }
            other => panic!("round {round}: expected exactly one winner, got {other:?}"),
        };
        for node in [&via_a, &via_b] {
            assert_eq!(node.connect(&id, TOKEN).await.unwrap().public_key, winner);
        }
    }

    // Control: a node of another cluster has its own registry and takes the other key.
    let elsewhere = Nats::start();
    let c = start_node(&elsewhere, "c", "127.0.0.1:0", None);
    registry(&c.first_line)
        .register("env-bound", &registration(2), EXECUTOR_TOKEN)
        .await
        .unwrap();
}

/// A harness credential registers through no node (403 from each), and nothing it tried is
/// visible through any node afterwards (404). Control: the executor credential registers
/// through the same nodes and the lookup then finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_harness_credential_cannot_register_through_any_node() {
    let nats = Nats::start();
    let nodes: Vec<Process> = ["a", "b", "c"]
        .into_iter()
        .map(|name| start_node(&nats, name, "127.0.0.1:0", None))
        .collect();
    let clients: Vec<RegistryClient> = nodes.iter().map(|n| registry(&n.first_line)).collect();
    for node in &clients {
        let refused = node
            .register("env-harness", &registration(5), TOKEN)
            .await
            .unwrap_err();
        assert_eq!(status(&refused), 403, "{refused}");
    }
    for node in &clients {
        let missing = node.connect("env-harness", TOKEN).await.unwrap_err();
        assert_eq!(status(&missing), 404, "{missing}");
    }
    clients[2]
        .register("env-harness", &registration(5), EXECUTOR_TOKEN)
        .await
        .unwrap();
    for node in &clients {
        assert_eq!(
            node.connect("env-harness", TOKEN).await.unwrap().public_key,
            public_key(5)
        );
    }
}

/// NATS itself is killed and restarted mid-run: the nodes report it on /readyz (503, then 200
/// again), close their sockets while it is gone, and recover without a restart; the harness's
/// stream carries on and the key binding survived (another key is still refused).
#[tokio::test(flavor = "multi_thread")]
async fn a_nats_restart_is_recovered_without_restarting_the_nodes() {
    let mut nats = Nats::start();
    let a = start_node(&nats, "a", "127.0.0.1:0", None);
    let b = start_node(&nats, "b", "127.0.0.1:0", None);
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let registries = format!("{},{}", a.first_line, b.first_line);
    let executor = start_executor_with(&registries, "env-restart", &identity, &[]);
    wait_registered(&b.first_line, "env-restart", &executor).await;
    let mut client = RemoteClient::connect(&b.first_line, "env-restart").await;
    let before = client.call("no/such-method", json!({})).await.unwrap_err();
    assert_eq!(before["code"], -32601);

    nats.kill();
    wait_readyz(&a.first_line, 503).await;
    wait_readyz(&b.first_line, 503).await;
    nats.spawn();
    wait_readyz(&a.first_line, 200).await;
    wait_readyz(&b.first_line, 200).await;

    let id = client.send("no/such-method", json!({"after": true})).await;
    let after = client
        .response_within(id, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(after["code"], -32601, "{after}");
    let refused = registry(&a.first_line)
        .register("env-restart", &registration(9), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(status(&refused), 409, "{refused}");
}

/// A harness whose node dies moves on: connected through node B with `B,C` as its registry
/// URLs, it survives B's SIGKILL by looking the environment up again (through C) and carries
/// on through C, on the same stream, without a reply lost or doubled.
#[tokio::test(flavor = "multi_thread")]
async fn a_harness_moves_to_another_node_when_its_node_is_killed() {
    let nats = Nats::start();
    let a = start_node(&nats, "a", "127.0.0.1:0", None);
    let mut b = Some(start_node(&nats, "b", "127.0.0.1:0", None));
    let c = start_node(&nats, "c", "127.0.0.1:0", None);
    let b_url = b.as_ref().unwrap().first_line.clone();
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let executor = start_executor_with(&a.first_line, "env-harness-moves", &identity, &[]);
    wait_registered(&a.first_line, "env-harness-moves", &executor).await;
    let registries = format!("{b_url},{}", c.first_line);
    let mut client = RemoteClient::connect(&registries, "env-harness-moves").await;
    let before = client.call("no/such-method", json!({})).await.unwrap_err();
    assert_eq!(before["code"], -32601);

    drop(b.take());
    let id = client.send("no/such-method", json!({"after": true})).await;
    let after = client
        .response_within(id, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(after["code"], -32601, "{after}");
    assert_eq!(client.unclaimed(), 0, "a reply arrived twice");
}

/// Open a websocket on `path` of `node` with `token` and keep it: its status (101, or the
/// refusal's) and, when open, the socket.
async fn hold_socket(
    node: &str,
    path: &str,
    token: &str,
) -> (
    u16,
    Option<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStreamAsync>>>,
) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}{path}", node.replacen("http://", "ws://", 1));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    match tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(request))
        .await
        .expect("websocket upgrade deadline")
    {
        Ok((socket, response)) => (response.status().as_u16(), Some(socket)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            (response.status().as_u16(), None)
        }
        Err(other) => panic!("websocket to {path}: {other}"),
    }
}

type TcpStreamAsync = tokio::net::TcpStream;

/// `--max-sockets-per-credential` counts across the cluster: with a share of 2, one harness
/// socket through node A and one through node B fill it, and the third is refused (503 naming
/// the limit) through either node; another credential still gets one; a closed socket frees
/// its place. A count per node would let the third in (each node holds one).
#[tokio::test(flavor = "multi_thread")]
async fn one_credential_holds_at_most_its_share_of_sockets_across_the_cluster() {
    let nats = Nats::start();
    let share = [
        "--cluster",
        &nats.url(),
        "--max-sockets-per-credential",
        "2",
    ];
    let (a, b) = two_nodes(&share);
    registry(&a.first_line)
        .register("env-share", &registration(6), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let harness = "/v1/environments/env-share/harness";
    let (status, first) = hold_socket(&a.first_line, harness, TOKEN).await;
    assert_eq!(status, 101);
    let (status, _second) = hold_socket(&b.first_line, harness, TOKEN).await;
    assert_eq!(status, 101);
    for node in [&a.first_line, &b.first_line] {
        let (status, socket) = hold_socket(node, harness, TOKEN).await;
        assert_eq!(status, 503, "a third socket through {node} was let in");
        assert!(socket.is_none());
    }
    let (status, _other) = hold_socket(&b.first_line, harness, tests::relay::ATTACKER_TOKEN).await;
    assert_eq!(status, 101, "another credential was held back");
    drop(first);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, socket) = hold_socket(&b.first_line, harness, TOKEN).await;
        if status == 101 {
            drop(socket);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed socket never freed its place (still {status})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Concurrent admissions of one credential do not starve each other: 100 harness sockets opened
/// at once, half through node A and half through node B, are all let in (each node changes a
/// credential's count one admission at a time, so only the other node's writes make it retry;
/// before, 50 at once on one node raced their own compare-and-set and were refused with 503
/// "cluster registry unavailable"). The count stays exact: with a share of 100, the 101st is
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_one_credentials_sockets_through_two_nodes_is_admitted_and_counted_exactly() {
    const BURST: usize = 100;
    let nats = Nats::start();
    let share = [
        "--cluster",
        &nats.url(),
        "--max-sockets-per-credential",
        "100",
    ];
    let (a, b) = two_nodes(&share);
    registry(&a.first_line)
        .register("env-burst", &registration(7), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let harness = "/v1/environments/env-burst/harness";
    let opened = futures_util::future::join_all((0..BURST).map(|i| {
        let node = if i % 2 == 0 {
            &a.first_line
        } else {
            &b.first_line
        };
        hold_socket(node, harness, TOKEN)
    }))
    .await;
    let statuses: Vec<u16> = opened.iter().map(|(status, _)| *status).collect();
    assert!(
        statuses.iter().all(|status| *status == 101),
        "refused in a burst of {BURST}: {statuses:?}\nnode a:\n{}\nnode b:\n{}",
        a.stderr(),
        b.stderr()
    );
    let (status, socket) = hold_socket(&b.first_line, harness, TOKEN).await;
    assert_eq!(
        status,
        503,
        "socket {} of a share of {BURST} was let in",
        BURST + 1
    );
    assert!(socket.is_none());
}

/// Run `exec-rendezvous` with `args` (the test credentials) until it exits, within [`DEADLINE`]:
/// its exit code and stderr.
fn rendezvous_that_exits(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.toml");
    std::fs::write(&credentials, tests::relay::credentials_toml()).unwrap();
    let mut child =
        std::process::Command::new(tests::exec_server_binary().with_file_name("exec-rendezvous"))
            .args(["--listen", "127.0.0.1:0", "--credentials"])
            .arg(&credentials)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("exec-rendezvous {args:?} still runs after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// TLS to NATS goes through rustls with the operator's CA: nodes join a `nats-server --tls`
/// with `--cluster tls://...` and `--nats-ca-file`, and a registration through one is seen
/// through the other. Without the CA file (the system roots only) the node does not start: exit
/// 1 (NATS could not be reached) naming the NATS URL and the certificate problem, no fallback to
/// plain text; a `--nats-creds` file that does not exist is exit 2, naming the file.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_reach_nats_over_tls_with_the_operators_ca_and_refuse_without_it() {
    let ca = tests::relay::TestCa::generate();
    let nats = Nats::start_with(&[
        "--tls",
        "--tlscert",
        ca.cert_file.to_str().unwrap(),
        "--tlskey",
        ca.key_file.to_str().unwrap(),
    ]);
    let ca_file = ca.ca_file.to_str().unwrap();
    let tls_url = nats.tls_url();
    let cluster = ["--cluster", &tls_url, "--nats-ca-file", ca_file];
    let (a, b) = two_nodes(&cluster);
    registry(&a.first_line)
        .register("env-tls", &registration(8), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let refused = registry(&b.first_line)
        .register("env-tls", &registration(9), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(
        status(&refused),
        409,
        "node b does not share a's registry: {refused}"
    );

    let (code, stderr) = rendezvous_that_exits(&["--cluster", &tls_url, "--node-name", "c"]);
    assert_eq!(
        code,
        Some(1),
        "NATS not proven is a runtime failure:\n{stderr}"
    );
    assert!(
        stderr.contains(&tls_url) && stderr.to_lowercase().contains("certificate"),
        "the refusal names neither the URL nor the certificate:\n{stderr}"
    );
    let missing = ca.dir.path().join("no-such.creds");
    let (code, stderr) = rendezvous_that_exits(&[
        "--cluster",
        &tls_url,
        "--nats-ca-file",
        ca_file,
        "--node-name",
        "d",
        "--nats-creds",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--nats-creds") && stderr.contains("no-such.creds"),
        "{stderr}"
    );
}

/// `--max-environments` holds cluster-wide: half the ids registered through node A and half
/// through node B fill it, and one more new id is refused through either node (naming the
/// option), while an id already bound still registers again. A count per node would let each
/// node take the bound (twice it in all), and the bindings bucket has no expiry, so an executor
/// credential granted `"*"` could grow it without end. The same option bounds a single node.
#[tokio::test(flavor = "multi_thread")]
async fn the_environment_bound_holds_across_the_cluster() {
    const BOUND: usize = 40;
    let nats = Nats::start();
    let bound = BOUND.to_string();
    let (a, b) = two_nodes(&["--cluster", &nats.url(), "--max-environments", &bound]);
    let (through_a, through_b) = (registry(&a.first_line), registry(&b.first_line));
    for i in 0..BOUND {
        let node = if i % 2 == 0 { &through_a } else { &through_b };
        node.register(&format!("env-many-{i}"), &registration(10), EXECUTOR_TOKEN)
            .await
            .unwrap_or_else(|e| panic!("registration {i} of {BOUND}: {e}"));
    }
    for node in [&through_a, &through_b] {
        let refused = node
            .register("env-one-too-many", &registration(10), EXECUTOR_TOKEN)
            .await
            .unwrap_err();
        assert_eq!(status(&refused), 400, "{refused}");
        assert!(
            refused.to_string().contains("--max-environments"),
            "{refused}"
        );
    }
    through_b
        .register("env-many-0", &registration(10), EXECUTOR_TOKEN)
        .await
        .expect("an id already bound registers again at the bound");

    let single = start_rendezvous_with("127.0.0.1:0", None, &["--max-environments", "2"]);
    let single = registry(&single.first_line);
    for i in 0..2 {
        single
            .register(
                &format!("env-single-{i}"),
                &registration(10),
                EXECUTOR_TOKEN,
            )
            .await
            .unwrap();
    }
    let refused = single
        .register("env-single-2", &registration(10), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(status(&refused), 400, "{refused}");
}
