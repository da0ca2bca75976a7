//! Harness streams through the rendezvous: a PTY and fs calls, what the rendezvous sees, isolated streams, lossy links and a restart.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn harness_runs_a_pty_process_and_fs_calls_through_the_rendezvous() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-e2e").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&rendezvous.first_line, "env-e2e").await;
    run_pty_and_fs(&mut client, dir.path()).await;
    client.connection.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rendezvous_never_sees_a_method_name_or_file_content() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let upstream = rendezvous
        .first_line
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = Proxy::start(upstream, Faults::default(), true).await;
    drop(rendezvous);
    let rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
    let _executor = start_executor(&rendezvous.first_line, "env-rec").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&rendezvous.first_line, "env-rec").await;
    run_pty_and_fs(&mut client, dir.path()).await;
    let frames = proxy.recorded.lock().unwrap().clone();
    assert!(
        frames.len() > 10,
        "the proxy saw only {} frames",
        frames.len()
    );
    let needles: [&[u8]; 7] = [
        b"process/start",
        b"fs/writeFile",
        b"initialize",
        b"dataBase64",
        b"written through the relay",
        &b64(b"written through the relay\n").into_bytes(),
        b"relay 42",
    ];
    for frame in &frames {
        for needle in needles {
            assert!(
                !frame.windows(needle.len()).any(|w| w == needle),
                "a relay frame contains {:?} in plaintext",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_streams_of_one_executor_are_isolated_and_reset_independently() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-two").await;
    let mut a = RemoteClient::connect(&rendezvous.first_line, "env-two").await;
    let mut b = RemoteClient::connect(&rendezvous.first_line, "env-two").await;
    a.call(
        "process/start",
        json!({"processId": "same", "argv": ["/bin/echo", "from-a"], "cwd": "file:///tmp"}),
    )
    .await
    .unwrap();
    b.call(
        "process/start",
        json!({"processId": "same", "argv": ["/bin/echo", "from-b"], "cwd": "file:///tmp"}),
    )
    .await
    .unwrap();
    a.wait_notification(|n| n["method"] == "process/closed")
        .await;
    b.wait_notification(|n| n["method"] == "process/closed")
        .await;
    assert_eq!(output_of(&a, "same"), b"from-a\n");
    assert_eq!(output_of(&b, "same"), b"from-b\n");
    // Closing (resetting) a leaves b running.
    a.connection.close().await;
    let listed = b
        .call("process/start", json!({"processId": "again", "argv": ["/bin/echo", "still-here"], "cwd": "file:///tmp"}))
        .await;
    assert!(listed.is_ok(), "{listed:?}");
    b.wait_notification(|n| n["method"] == "process/closed" && n["params"]["processId"] == "again")
        .await;
    assert_eq!(output_of(&b, "again"), b"still-here\n");
}

/// 10,000 JSON-RPC messages of mixed sizes (some segmented, several MiB) through a proxy that
/// drops 20%, duplicates 10% and reorders/delays frames on both rendezvous links; then the
/// rendezvous is killed and restarted mid-stream and the same stream carries on.
#[tokio::test(flavor = "multi_thread")]
async fn lossy_links_and_a_rendezvous_restart_deliver_every_message_exactly_once() {
    if let Ok(filter) = std::env::var("RELAY_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    // The rendezvous is restarted on the same port later. A port from outside the kernel's
    // ephemeral range cannot be taken meanwhile by the other tests, which all bind port 0.
    let upstream = port_outside_the_ephemeral_range();
    let faults = Faults {
        drop_percent: std::env::var("F_DROP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
        duplicate_percent: std::env::var("F_DUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
        max_delay_ms: std::env::var("F_DELAY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    };
    let proxy = Proxy::start(upstream, faults, false).await;
    let mut rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
    let registry = rendezvous.first_line.clone();
    let executor = start_executor(&registry, "env-lossy").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&registry, "env-lossy").await;

    // Enough for every kind of loss to hit every kind of message many times over (hundreds of
    // drops, a restart halfway, four multi-MiB messages), at 20% loss still about 40 s: each
    // loss stalls the window for a retransmission timeout (10,000 took 94 s).
    const TOTAL: u64 = 4_000;
    const WINDOW: u64 = 256;
    let big_every = 1_000;
    let mut expected: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let mut outstanding = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut restarted = false;
    while sent < TOTAL || !outstanding.is_empty() {
        while sent < TOTAL && (outstanding.len() as u64) < WINDOW {
            let n = sent;
            let id = if n % big_every == 500 {
                // A multi-MiB message each way: written, then read back.
                let content: Vec<u8> = (0..3 * 1024 * 1024 + n as usize)
                    .map(|i| (i * 7 + n as usize) as u8)
                    .collect();
                let file = dir.path().join(format!("big-{n}"));
                // Answered behind up to WINDOW queued messages on lossy links: the same 60 s
                // as every other reply, not the 10 s of a quiet call.
                let write = client
                    .send(
                        "fs/writeFile",
                        json!({"path": uri(&file), "dataBase64": b64(&content)}),
                    )
                    .await;
                client
                    .response_within(write, Duration::from_secs(60))
                    .await
                    .unwrap();
                let id = client
                    .send("fs/readFile", json!({"path": uri(&file)}))
                    .await;
                expected.insert(id, content);
                id
            } else if n % 10 == 3 {
                // Medium: 1 to 21 KB of padding in an unknown method's params.
                let pad = "x".repeat(((n as usize * 37) % 20_000) + 1_000);
                client.send("no/such-method", json!({"pad": pad})).await
            } else {
                client.send("no/such-method", json!({"n": n})).await
            };
            outstanding.push_back(id);
            sent += 1;
        }
        let id = outstanding.pop_front().unwrap();
        if id % 1000 == 0 {
            eprintln!("progress: {id} answered of {TOTAL}");
        }
        let reply = client.response_within(id, Duration::from_secs(60)).await;
        match expected.remove(&id) {
            Some(content) => {
                let result = reply.unwrap();
                assert!(
                    unb64(result["dataBase64"].as_str().unwrap()) == content,
                    "big file {id} corrupted"
                );
            }
            None => {
                let error: Value = reply.unwrap_err();
                assert_eq!(error["code"], -32601, "{error}");
            }
        }
        if sent >= TOTAL / 2 && !restarted {
            restarted = true;
            drop(rendezvous);
            tokio::time::sleep(Duration::from_millis(300)).await;
            rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
            tests::relay::wait_registered(&registry, "env-lossy", &executor).await;
        }
    }
    assert!(restarted);
    assert!(proxy.dropped.load(std::sync::atomic::Ordering::Relaxed) > 100);
    // The same stream still works after all that.
    let ok = client
        .call(
            "process/start",
            json!({"processId": "after", "argv": ["/bin/true"], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    drop(rendezvous);
}

/// A free loopback address whose port the kernel never hands out for port 0.
fn port_outside_the_ephemeral_range() -> std::net::SocketAddr {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(32768);
    let start = 10_000 + (std::process::id() % 5_000) as u16;
    (start..low)
        .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .find(|address| std::net::TcpListener::bind(address).is_ok())
        .expect("a free port below the ephemeral range")
}
