//! A node killed under an executor or a harness, and NATS restarted under the nodes.

use super::*;

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
    let (nodes, proxies) = nodes_behind_faulty_proxies(&nats, &["a", "b", "c"], faults).await;
    let mut nodes: Vec<Option<Process>> = nodes.into_iter().map(Some).collect();
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
