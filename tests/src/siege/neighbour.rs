//! The neighbour: an ordinary session keeping a request loop going beside a hostile client,
//! every latency recorded, and the scheduling priority that isolates it from the host's load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::{Client, DEADLINE, ExecServer, b64, file_uri};

/// Time between two of the neighbour's requests.
const NEIGHBOUR_PACING: Duration = Duration::from_millis(10);
/// How long one neighbour request may take before it counts as failed.
const NEIGHBOUR_REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// What the neighbour saw.
#[derive(Debug, Clone)]
pub struct NeighbourReport {
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed or took longer than their deadline, with what happened.
    pub failures: Vec<String>,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Slowest request.
    pub max: Duration,
    /// 99th percentile latency before the attack started.
    pub quiet_p99: Duration,
    /// When each request was sent and how long it took.
    samples: Vec<(Instant, Duration)>,
}

impl NeighbourReport {
    /// Split the samples at `attack_started`: p50/p99/max of the attack, p99 of before it.
    pub(super) fn split_at(mut self, attack_started: Instant) -> NeighbourReport {
        let (quiet, attack): (Vec<_>, Vec<_>) = self
            .samples
            .iter()
            .partition(|(sent, _)| *sent < attack_started);
        let quiet: Vec<Duration> = quiet.into_iter().map(|(_, took)| took).collect();
        let attack: Vec<Duration> = attack.into_iter().map(|(_, took)| took).collect();
        let (p50, p99, max) = percentiles(attack);
        let (_, quiet_p99, _) = percentiles(quiet);
        self.p50 = p50;
        self.p99 = p99;
        self.max = max;
        self.quiet_p99 = quiet_p99;
        self
    }
}

/// p50, p99 and max of `latencies`.
fn percentiles(mut latencies: Vec<Duration>) -> (Duration, Duration, Duration) {
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (
        at(0.5),
        at(0.99),
        latencies.last().copied().unwrap_or_default(),
    )
}

impl std::fmt::Display for NeighbourReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {} failed (p99 before the \
             attack {:.1} ms)",
            self.requests,
            self.p50.as_secs_f64() * 1000.0,
            self.p99.as_secs_f64() * 1000.0,
            self.max.as_secs_f64() * 1000.0,
            self.failures.len(),
            self.quiet_p99.as_secs_f64() * 1000.0
        )
    }
}

/// An ordinary session keeping a request loop going, on a thread and runtime of its own so
/// the test's attack (in the test's runtime) does not delay it on the client side.
pub struct Neighbour {
    stop: Arc<AtomicBool>,
    report: tokio::sync::oneshot::Receiver<NeighbourReport>,
    _dir: tempfile::TempDir,
}

/// Scheduling priority (nice) of the neighbour's thread and of servers started with
/// [`isolate_from_host_load`]: above the host's other work, so that on a shared machine the
/// neighbour's latency measures what the server does to it, not what other processes do. The
/// server's own low-priority CPU pool (nice 10) stays below everything.
pub const ISOLATED_NICE: i32 = -10;

/// Start the server at [`ISOLATED_NICE`] (as root; otherwise it keeps its priority).
pub fn isolate_from_host_load(command: &mut std::process::Command) {
    crate::sys::set_nice_in_child(command, ISOLATED_NICE);
}

/// Set the calling thread's nice value to [`ISOLATED_NICE`] when permitted.
fn raise_priority() {
    // Failure (not root) is ignored: the thread keeps its priority.
    let _ = crate::sys::set_nice(ISOLATED_NICE);
}

impl Neighbour {
    /// Connect to `server`, start a `cat` and begin the loop; returns once the loop runs.
    pub async fn start(server: &ExecServer) -> Neighbour {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("small");
        std::fs::write(&file, vec![b'n'; 4096]).unwrap();
        let url = server.url().to_owned();
        let file = file_uri(&file);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, running) = tokio::sync::oneshot::channel();
        let (report_tx, report) = tokio::sync::oneshot::channel();
        let stopping = stop.clone();
        std::thread::spawn(move || {
            raise_priority();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let report = runtime.block_on(async move {
                let mut client = Client::connect(&url).await.unwrap();
                client.initialize().await;
                client
                    .start("neighbour-cat", &["/bin/cat"], json!({"pipeStdin": true}))
                    .await
                    .unwrap();
                neighbour_loop(client, file, stopping, ready).await
            });
            let _ = report_tx.send(report);
        });
        tokio::time::timeout(DEADLINE, running)
            .await
            .expect("the neighbour's first request")
            .expect("the neighbour loop runs");
        Neighbour {
            stop,
            report,
            _dir: dir,
        }
    }

    /// Stop the loop and report.
    pub async fn stop(self) -> NeighbourReport {
        self.stop.store(true, Ordering::Relaxed);
        match tokio::time::timeout(DEADLINE * 2, self.report).await {
            Ok(Ok(report)) => report,
            Ok(Err(_)) => NeighbourReport {
                requests: 0,
                failures: vec!["the neighbour's loop panicked (see its message above)".into()],
                p50: Duration::ZERO,
                p99: Duration::ZERO,
                max: Duration::ZERO,
                quiet_p99: Duration::ZERO,
                samples: Vec::new(),
            },
            Err(_) => panic!("the neighbour loop did not stop within {:?}", DEADLINE * 2),
        }
    }
}

async fn neighbour_loop(
    mut client: Client,
    file: String,
    stop: Arc<AtomicBool>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> NeighbourReport {
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let mut ready = Some(ready);
    let mut round = 0u64;
    let mut after_seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (method, params) = match round % 4 {
            0 => ("fs/getMetadata", json!({"path": "file:///"})),
            1 => ("fs/readFile", json!({"path": file})),
            2 => (
                "process/write",
                json!({"processId": "neighbour-cat", "chunk": b64(format!("ping {round}\n"))}),
            ),
            _ => (
                "process/read",
                json!({"processId": "neighbour-cat", "afterSeq": after_seq}),
            ),
        };
        let started = Instant::now();
        let answer = client
            .request_within(method, params, NEIGHBOUR_REQUEST_DEADLINE)
            .await;
        let took = started.elapsed();
        latencies.push((started, took));
        if took > Duration::from_millis(30) {
            eprintln!("neighbour: {method} took {took:?}");
        }
        match answer {
            Ok(result) => {
                if method == "process/read"
                    && let Some(next) = result["nextSeq"].as_u64()
                {
                    after_seq = next.saturating_sub(1);
                }
                if method == "fs/readFile"
                    && result["dataBase64"].as_str().map(str::len) != Some(5464)
                {
                    failures.push(format!("fs/readFile returned {result}"));
                }
            }
            Err(error) => failures.push(format!("{method}: {error:?}")),
        }
        // Notifications of the cat's echo pile up unread otherwise.
        while client.next_message(Duration::ZERO).await.is_some() {}
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        round += 1;
        tokio::time::sleep(NEIGHBOUR_PACING).await; // pacing of the loop, not a wait
    }
    let (p50, p99, max) = percentiles(latencies.iter().map(|(_, took)| *took).collect());
    NeighbourReport {
        requests: latencies.len(),
        failures,
        p50,
        p99,
        max,
        quiet_p99: Duration::ZERO,
        samples: latencies,
    }
}
