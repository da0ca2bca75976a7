//! The cluster rows of the remote group: two `exec-rendezvous --cluster` nodes on one
//! `nats-server -js`, the executor registered through node A and the harness connected through
//! node B (so every frame crosses NATS), against a single rendezvous node in the same run. Both
//! sides run the same executor binary and library client; the figures differ only in the hop
//! through the second node and NATS.

use tests::nats::Nats;

use crate::Server;
use crate::remote::{
    RemoteSetup, alternating_output, paired_round_trips, relay_client, remote_setup,
    start_registered_executor, start_with_registry_token, write_credentials,
};
use crate::table::{Row, summary_with_p99, throughput_row};

/// The largest added median round trip a cluster may cost over one node (issue 38).
const ADDED_ROUND_TRIP_MS: f64 = 1.0;

/// NATS, two nodes and an executor registered through node A; `harness_url` is node B.
struct ClusterSetup {
    _executor: Server,
    _nodes: [Server; 2],
    _nats: Nats,
    harness_url: String,
    _dir: tempfile::TempDir,
}

async fn cluster_setup() -> ClusterSetup {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let credentials = write_credentials(dir.path());
    let node = |name: &str| {
        start_with_registry_token(
            "exec-rendezvous",
            &[
                "--listen",
                "127.0.0.1:0",
                "--credentials",
                credentials.to_str().unwrap(),
                "--cluster",
                &nats.url(),
                "--node-name",
                name,
            ],
        )
    };
    let nodes = [node("a"), node("b")];
    let executor = start_registered_executor(&nodes[0].url, &nodes[1].url, dir.path()).await;
    ClusterSetup {
        harness_url: nodes[1].url.clone(),
        _executor: executor,
        _nodes: nodes,
        _nats: nats,
        _dir: dir,
    }
}

/// Output throughput through the cluster against one node, alternating which goes first.
async fn cluster_output_throughput(
    rows: &mut Vec<Row>,
    single: &RemoteSetup,
    cluster: &ClusterSetup,
    mib: u64,
    runs: usize,
) {
    let one_node = relay_client(&single.registry, "bench-one-node").await;
    let two_nodes = relay_client(&cluster.harness_url, "bench-cluster").await;
    let (ours, baseline) =
        alternating_output((&two_nodes, "cluster"), (&one_node, "one-node"), mib, runs).await;
    rows.push(throughput_row(
        format!(
            "remote cluster: output throughput, head -c {mib}M /dev/zero, executor on node A, harness on node B ({runs} runs)"
        ),
        (ours, " two nodes + NATS"),
        (baseline, " one node"),
        70.0,
    ));
    one_node.close();
    two_nodes.close();
}

/// `fs/getMetadata` round trips through the cluster against one node: the added median.
async fn cluster_round_trip(
    rows: &mut Vec<Row>,
    single: &RemoteSetup,
    cluster: &ClusterSetup,
    runs: usize,
) {
    let one_node = relay_client(&single.registry, "bench-one-node").await;
    let two_nodes = relay_client(&cluster.harness_url, "bench-cluster").await;
    let (ours, baseline) = paired_round_trips(&two_nodes, &one_node, runs).await;
    let (ours_median, ours_text) = summary_with_p99(ours);
    let (baseline_median, baseline_text) = summary_with_p99(baseline);
    let added = ours_median - baseline_median;
    rows.push(Row {
        figure: format!(
            "remote cluster: fs/getMetadata round trip, harness on node B, executor on node A ({runs} runs)"
        ),
        ours: format!("{ours_text} two nodes + NATS"),
        baseline: format!("{baseline_text} one node"),
        ratio: format!("+{added:.3} ms"),
        target: format!("<= +{ADDED_ROUND_TRIP_MS:.0} ms at the median"),
        holds: Some(added <= ADDED_ROUND_TRIP_MS),
    });
    one_node.close();
    two_nodes.close();
}

/// The cluster rows, each against a single node started in the same run.
pub(crate) async fn cluster_mode(rows: &mut Vec<Row>, quick: bool) {
    let single = remote_setup().await;
    let cluster = cluster_setup().await;
    cluster_output_throughput(
        rows,
        &single,
        &cluster,
        if quick { 256 } else { 1024 },
        if quick { 2 } else { 3 },
    )
    .await;
    cluster_round_trip(rows, &single, &cluster, if quick { 200 } else { 1000 }).await;
}
