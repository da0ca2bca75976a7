//! The cluster rows of the remote group: two `exec-rendezvous --cluster` nodes on one
//! `nats-server -js`, the executor registered through node A and the harness connected through
//! node B (so every frame crosses NATS), against a single rendezvous node in the same run. Both
//! sides run the same executor binary and library client; the figures differ only in the hop
//! through the second node and NATS.

use tests::nats::Nats;

use crate::Server;
use crate::remote::{
    OutputSide, RemoteSetup, alternating_output_cpu, paired_round_trips, relay_client,
    remote_setup, start_registered_executor, start_with_registry_token, write_credentials,
};
use crate::table::{Row, median, summary_with_p99, throughput_row};

/// The largest added median round trip a cluster may cost over one node (issue 38).
const ADDED_ROUND_TRIP_MS: f64 = 1.0;

/// The Go runtime settings docs/remote.md gives a `nats-server` that shares its machine's cores
/// with the nodes and endpoints, as it does here on two cores. Measured with its defaults,
/// `nats-server` spends most of its CPU in Go's garbage collector (a cycle every few MiB of
/// frames, its live heap being small), and its scheduler's spinning threads compete with every
/// other process for the two cores. The row with its defaults is reported beside the target row.
const CO_LOCATED_NATS_ENV: [(&str, &str); 2] = [("GOGC", "400"), ("GOMAXPROCS", "1")];

/// How `nats-server` runs in a setup.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Broker {
    /// The Go runtime's defaults.
    Defaults,
    /// [`CO_LOCATED_NATS_ENV`].
    CoLocated,
}

impl Broker {
    fn label(self) -> String {
        match self {
            Self::Defaults => "nats-server with Go defaults".to_owned(),
            Self::CoLocated => {
                let settings: Vec<String> = CO_LOCATED_NATS_ENV
                    .iter()
                    .map(|(name, value)| format!("{name}={value}"))
                    .collect();
                format!("nats-server {} (docs/remote.md)", settings.join(" "))
            }
        }
    }
}

/// NATS, two nodes and an executor registered through node A; `harness_url` is node B.
struct ClusterSetup {
    executor: Server,
    nodes: [Server; 2],
    nats: Nats,
    harness_url: String,
    _dir: tempfile::TempDir,
}

async fn cluster_setup(broker: Broker) -> ClusterSetup {
    let nats = match broker {
        Broker::Defaults => Nats::start(),
        Broker::CoLocated => Nats::start_with_env(&[], &CO_LOCATED_NATS_ENV),
    };
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
        executor,
        nodes,
        nats,
        _dir: dir,
    }
}

/// Output throughput through the cluster against one node, alternating which goes first; the
/// target applies to the co-located broker's row, the defaults' row is reported.
async fn cluster_output_throughput(
    rows: &mut Vec<Row>,
    single: &RemoteSetup,
    (cluster, broker): (&ClusterSetup, Broker),
    mib: u64,
    runs: usize,
) {
    let one_node = relay_client(&single.registry, "bench-one-node").await;
    let two_nodes = relay_client(&cluster.harness_url, "bench-cluster").await;
    let cluster_pids = [
        cluster.executor.pid(),
        cluster.nodes[0].pid(),
        cluster.nodes[1].pid(),
        cluster.nats.pid(),
    ];
    let [ours, baseline] = alternating_output_cpu(
        [
            (&two_nodes, "cluster", &cluster_pids),
            (&one_node, "one-node", &single.pids()),
        ],
        mib,
        runs,
    )
    .await;
    // Every process of both sides shares the machine's cores. What each side keeps busy (its
    // CPU per byte times its rate) says whether it is bound by the CPU or by waiting; what the
    // cluster would reach with every core busy at its CPU per byte is the most any tuning of
    // its pipeline could give on this machine.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    let (ours_rate, baseline_rate) = (median(&ours.rates), median(&baseline.rates));
    let busy = |side: &OutputSide, rate: f64| side.cpu_per_gib * rate / 1024.0;
    let ceiling = 100.0 * (cores * 1024.0 / ours.cpu_per_gib) / baseline_rate;
    let ours_text = format!(
        " two nodes + NATS, {:.2} CPU-s/GiB, {:.2} cores busy",
        ours.cpu_per_gib,
        busy(&ours, ours_rate)
    );
    let baseline_text = format!(
        " one node, {:.2} CPU-s/GiB, {:.2} cores busy",
        baseline.cpu_per_gib,
        busy(&baseline, baseline_rate)
    );
    let mut row = throughput_row(
        format!(
            "remote cluster: output throughput, head -c {mib}M /dev/zero, executor on node A, harness on node B, {} ({runs} runs)",
            broker.label()
        ),
        (ours.rates, &ours_text),
        (baseline.rates, &baseline_text),
        70.0,
    );
    row.ratio
        .push_str(&format!(" ({ceiling:.0}% with all {cores:.0} cores busy)"));
    if broker == Broker::Defaults {
        row.target = "reported (the target row tunes the co-located broker)".to_owned();
        row.holds = None;
    }
    rows.push(row);
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
    let mib = if quick { 256 } else { 1024 };
    // Five full runs a side: the single node's rate alone varies by a fifth from run to run on
    // a two-core machine, and the median of three was at the mercy of one slow run.
    let runs = if quick { 2 } else { 5 };
    let defaults = cluster_setup(Broker::Defaults).await;
    cluster_output_throughput(rows, &single, (&defaults, Broker::Defaults), mib, runs).await;
    drop(defaults);
    let cluster = cluster_setup(Broker::CoLocated).await;
    cluster_output_throughput(rows, &single, (&cluster, Broker::CoLocated), mib, runs).await;
    cluster_round_trip(rows, &single, &cluster, if quick { 200 } else { 1000 }).await;
}
