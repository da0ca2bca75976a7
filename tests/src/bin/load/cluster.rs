//! Scenario: the rendezvous as a cluster of three nodes on one `nats-server -js`, carrying many
//! registered executors and as many concurrent harness streams, each harness on another node
//! than its executor (so every frame crosses NATS). The executors are the real executor
//! endpoint (`serve_prepared`) of an in-process server, one per environment, each with its own
//! key: 1,000 `exec-server` processes would measure this machine's memory, not the cluster.
//! Each node's RSS and descriptors are sampled while the streams run and must stay flat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use supervisor::relay::executor::{PreparedEnvironment, RemoteEnvironmentConfig, serve_prepared};
use tests::nats::Nats;
use tests::relay::{EXECUTOR_TOKEN, Process, registry_client, start_rendezvous_with};
use tests::{fd_count, rss_kib};

use crate::PHASE_DEADLINE;
use crate::report::{Report, mib};

const S: &str = "rendezvous cluster";
/// Nodes of the cluster.
const NODES: usize = 3;
/// Sockets one credential may hold across the cluster: above the scenario's executor or harness
/// count (the default, 1,024, is per credential too).
const SOCKETS_PER_CREDENTIAL: &str = "4096";
/// Environments served by one in-process server state (below its MAX_RELAY_STREAMS, 256).
const EXECUTORS_PER_SERVER: usize = 200;
/// How often each harness stream makes a round trip while the run lasts.
const ROUND_TRIP_EVERY: Duration = Duration::from_millis(500);
/// Growth a node may show over the streaming phase and still count as flat: RSS (ratio of the
/// first sample, plus a little allocator slack) and descriptors.
const RSS_GROWTH: f64 = 1.25;
const RSS_SLACK_KIB: u64 = 16 * 1024;
const FD_GROWTH: f64 = 1.05;

/// One sample of every node: (RSS KiB, descriptors).
fn sample(nodes: &[Process]) -> Vec<(u64, usize)> {
    nodes
        .iter()
        .map(|node| {
            let pid = node.pid() as i32;
            (rss_kib(pid), fd_count(pid))
        })
        .collect()
}

fn environment(i: usize) -> String {
    format!("load-{i}")
}

pub(crate) async fn cluster_streams(report: &mut Report, executors: usize, run_for: Duration) {
    let nats = Nats::start();
    let nodes: Vec<Process> = (0..NODES)
        .map(|n| {
            start_rendezvous_with(
                "127.0.0.1:0",
                None,
                &[
                    "--cluster",
                    &nats.url(),
                    "--node-name",
                    &format!("node-{n}"),
                    "--max-sockets-per-credential",
                    SOCKETS_PER_CREDENTIAL,
                ],
            )
        })
        .collect();
    let urls: Vec<String> = nodes.iter().map(|node| node.first_line.clone()).collect();
    let idle = sample(&nodes);

    // The executors: environment i registers through node i % NODES. One server state serves
    // at most MAX_RELAY_STREAMS streams (an executor process's bound), so every
    // EXECUTORS_PER_SERVER environments share one.
    let runtime_paths = supervisor::ExecServerRuntimePaths::find_for_current_exe().unwrap();
    let mut servers = Vec::new();
    for _ in 0..executors.div_ceil(EXECUTORS_PER_SERVER) {
        servers.push(
            supervisor::BoundServer::bind(supervisor::ServerOptions::without_listener(
                runtime_paths.clone(),
            ))
            .await
            .unwrap(),
        );
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..executors {
        let state = servers[i / EXECUTORS_PER_SERVER].state();
        let config = RemoteEnvironmentConfig::with_bearer_token(
            urls[i % NODES].clone(),
            environment(i),
            EXECUTOR_TOKEN,
        );
        let prepared = PreparedEnvironment::new(config).unwrap();
        tasks.push(tokio::spawn(serve_prepared(prepared, state)));
    }
    // Registered once a harness can look the environment up through another node.
    for i in 0..executors {
        let registry = registry_client(&urls[(i + 1) % NODES], None);
        while registry
            .connect(&environment(i), tests::relay::TOKEN)
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < PHASE_DEADLINE,
                "{} did not register",
                environment(i)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let registered_in = started.elapsed();
    let registered = sample(&nodes);
    report.figure(
        S,
        format!(
            "{executors} executors registered through {NODES} nodes (each harness on another node)"
        ),
        format!("{:.1} s", registered_in.as_secs_f64()),
    );

    // The harness streams: one library client per environment, through the next node.
    let started = Instant::now();
    let mut clients = Vec::new();
    for chunk in (0..executors).collect::<Vec<_>>().chunks(50) {
        let connects = chunk.iter().map(|&i| {
            let url = urls[(i + 1) % NODES].clone();
            async move {
                tokio::time::timeout(
                    PHASE_DEADLINE,
                    supervisor::ExecServerClient::connect_remote(tests::relay::remote_client_args(
                        &url,
                        &environment(i),
                    )),
                )
                .await
                .unwrap_or_else(|_| panic!("{} did not connect", environment(i)))
                .unwrap_or_else(|e| panic!("{}: {e}", environment(i)))
            }
        });
        clients.extend(futures_util::future::join_all(connects).await);
    }
    let connected_in = started.elapsed();
    report.figure(
        S,
        format!("{executors} concurrent harness streams connected"),
        format!("{:.1} s", connected_in.as_secs_f64()),
    );

    // Every stream makes round trips for `run_for`; the nodes are sampled meanwhile.
    let clients = Arc::new(clients);
    let deadline = Instant::now() + run_for;
    let workers: Vec<_> = (0..clients.len())
        .map(|i| {
            let clients = Arc::clone(&clients);
            tokio::spawn(async move {
                let path = supervisor::FileUri::from_path(std::path::Path::new("/tmp")).unwrap();
                let mut round_trips = 0u64;
                while Instant::now() < deadline {
                    let metadata = clients[i]
                        .fs_get_metadata(proto::methods::fs::PathParams {
                            path: path.clone(),
                            sandbox: None,
                        })
                        .await
                        .unwrap_or_else(|e| panic!("{}: {e}", environment(i)));
                    assert!(metadata.is_directory);
                    round_trips += 1;
                    tokio::time::sleep(ROUND_TRIP_EVERY).await;
                }
                round_trips
            })
        })
        .collect();
    let mut samples = vec![sample(&nodes)];
    while Instant::now() < deadline {
        tokio::time::sleep(run_for / 10).await;
        samples.push(sample(&nodes));
    }
    let mut round_trips = 0u64;
    for worker in workers {
        round_trips += worker.await.unwrap();
    }
    report.check(
        S,
        format!(
            "round trips of {executors} streams over {} s, every one answered",
            run_for.as_secs()
        ),
        format!("{round_trips}"),
        format!("≥ {executors} (each stream at least once)"),
        round_trips >= executors as u64,
    );
    for (n, url) in urls.iter().enumerate() {
        let first = samples[0][n];
        let peak_rss = samples.iter().map(|s| s[n].0).max().unwrap_or(0);
        let peak_fds = samples.iter().map(|s| s[n].1).max().unwrap_or(0);
        report.figure(
            S,
            format!("node-{n} ({url}) RSS idle → registered → streaming"),
            format!(
                "{} → {} → {}",
                mib(idle[n].0),
                mib(registered[n].0),
                mib(first.0)
            ),
        );
        report.check(
            S,
            format!("node-{n} RSS over the streaming phase (first → peak)"),
            format!("{} → {}", mib(first.0), mib(peak_rss)),
            format!("≤ {RSS_GROWTH}x the first + {} (flat)", mib(RSS_SLACK_KIB)),
            peak_rss as f64 <= first.0 as f64 * RSS_GROWTH + RSS_SLACK_KIB as f64,
        );
        report.check(
            S,
            format!(
                "node-{n} descriptors idle {} → streaming (first → peak)",
                idle[n].1
            ),
            format!("{} → {peak_fds}", first.1),
            format!("≤ {FD_GROWTH}x the first (flat)"),
            peak_fds as f64 <= first.1 as f64 * FD_GROWTH,
        );
    }
    let clients = Arc::try_unwrap(clients).unwrap_or_else(|_| panic!("a worker kept a client"));
    for client in clients {
        client.close();
    }
    for task in tasks {
        task.abort();
    }
}
