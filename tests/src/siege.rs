//! A hostile client's case run against a real server beside a neighbour, for the hostile suite
//! (`tests/tests/hostile.rs`); the `load` binary does not use it yet.
//!
//! - [`Neighbour`]: an ordinary session with its own connection and a live `cat`, keeping a
//!   request loop going (`fs/getMetadata`, a small `fs/readFile`, `process/write` and
//!   `process/read`), every latency recorded; [`Neighbour::stop`] reports p50, p99, max and any
//!   failure.
//! - [`PeakRss`]: the server's `VmRSS`, sampled every 20 ms on a thread, keeping the peak.
//! - [`MemoryCgroup`]: a cgroup v1 memory controller group with a hard limit, for running the
//!   server under the bound a test states (when the host allows: root and a memory controller).
//! - [`Siege`]: all of that around one case: begin, attack, end; `end` checks the neighbour
//!   (every request succeeded, p99 under [`NEIGHBOUR_P99_BOUND`]), the RSS bound, and waits until
//!   the server's descriptors are back to their baseline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::{Client, DEADLINE, ExecServer, b64, fd_count, file_uri, rss_kib};

/// The neighbour's p99 latency must stay under this while a hostile client attacks (on a host
/// whose own load already slows the neighbour before the attack, see [`p99_bound`]).
pub const NEIGHBOUR_P99_BOUND: Duration = Duration::from_millis(50);
/// How long the neighbour runs before the attack starts, to measure what the host itself costs.
const QUIET_PERIOD: Duration = Duration::from_secs(1);

/// The p99 bound for a case: [`NEIGHBOUR_P99_BOUND`], unless the neighbour's p99 before the
/// attack (`quiet_p99`, the same server with nothing hostile going on) shows the host is
/// already loaded by other work; then twice that plus 25 ms, so a loaded CI machine measures the
/// attack and not its neighbours. On a quiet host (quiet p99 under 12.5 ms) this is 50 ms.
pub fn p99_bound(quiet_p99: Duration) -> Duration {
    NEIGHBOUR_P99_BOUND.max(quiet_p99 * 2 + Duration::from_millis(25))
}
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
    fn split_at(mut self, attack_started: Instant) -> NeighbourReport {
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
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the child between fork and exec and only makes one
    // async-signal-safe system call; failure (not root) is ignored.
    unsafe {
        command.pre_exec(|| {
            raise_priority();
            Ok(())
        });
    }
}

/// Set the calling thread's nice value to [`ISOLATED_NICE`] when permitted.
fn raise_priority() {
    // SAFETY: setpriority on the calling thread (who 0 means the caller) touches no memory.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, ISOLATED_NICE);
    }
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

/// Samples the server's RSS every 20 ms on a thread and keeps the peak.
pub struct PeakRss {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeakRss {
    /// Start sampling `pid`.
    pub fn start(pid: i32) -> PeakRss {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|status| {
                        status
                            .lines()
                            .find_map(|l| l.strip_prefix("VmRSS:"))
                            .and_then(|v| {
                                v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()
                            })
                    });
                if let Some(kib) = kib {
                    p.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20)); // sampling interval
            }
        });
        PeakRss {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// The peak so far, in KiB.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Stop sampling; the peak in KiB.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak()
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A memory cgroup (v1) with a hard limit.
pub struct MemoryCgroup {
    dir: PathBuf,
}

/// Where the v1 memory controller is mounted.
const MEMORY_CONTROLLER: &str = "/sys/fs/cgroup/memory";

impl MemoryCgroup {
    /// A new group limited to `limit_bytes`, or `None` when the host has no writable v1 memory
    /// controller (not root, or another cgroup layout).
    pub fn try_new(name: &str, limit_bytes: u64) -> Option<MemoryCgroup> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::path::Path::new(MEMORY_CONTROLLER);
        if !root.join("memory.limit_in_bytes").exists() {
            return None;
        }
        let dir = root.join(format!(
            "execward-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).ok()?;
        let group = MemoryCgroup { dir };
        std::fs::write(
            group.dir.join("memory.limit_in_bytes"),
            limit_bytes.to_string(),
        )
        .ok()?;
        Some(group)
    }

    /// Move `pid` (and what it starts from now on) into the group.
    pub fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }

    /// Processes the kernel's OOM killer killed in the group.
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.oom_control"))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("oom_kill "))
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The group's peak usage (resident memory of its processes and the page cache they
    /// caused), in bytes, and how often it hit its limit.
    pub fn peak_and_failures(&self) -> (u64, u64) {
        let read = |name: &str| {
            std::fs::read_to_string(self.dir.join(name))
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0)
        };
        (read("memory.max_usage_in_bytes"), read("memory.failcnt"))
    }

    /// The group's limit, in bytes.
    pub fn limit(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.limit_in_bytes"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Members still alive (a killed server's children are killed by its guardian a moment
        // later) move back to the root group, then the group goes.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = std::fs::write(
                        std::path::Path::new(MEMORY_CONTROLLER).join("cgroup.procs"),
                        pid,
                    );
                }
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20)); // retry interval
        }
    }
}

/// Turns of the tests of one binary: a siege takes all of them (it measures latency, so it
/// runs alone: two attacks, or an ordinary test's load on a 2-core machine, would be measured
/// with it), an ordinary test one ([`beside_sieges`]).
const TURNS: u32 = 1024;
static TURN: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(TURNS as usize);

/// For a test that runs in the same binary as sieges: wait until no siege runs, and keep them
/// from starting while the returned turn is held (ordinary tests still run in parallel).
pub async fn beside_sieges() -> tokio::sync::SemaphorePermit<'static> {
    TURN.acquire()
        .await
        .expect("the siege semaphore is never closed")
}

/// One hostile case around a server: a neighbour, the server's RSS and descriptors watched.
pub struct Siege {
    _turn: tokio::sync::SemaphorePermit<'static>,
    neighbour: Neighbour,
    rss: PeakRss,
    rss_before: u64,
    fds_before: usize,
    cgroup: Option<MemoryCgroup>,
    what: &'static str,
    /// When the quiet period ended.
    attack_started: Instant,
}

/// How a case ended.
#[derive(Debug, Clone)]
pub struct SiegeReport {
    /// What the neighbour saw.
    pub neighbour: NeighbourReport,
    /// Server RSS before the attack, KiB.
    pub rss_before: u64,
    /// Server RSS peak during it, KiB.
    pub rss_peak: u64,
    /// Server descriptors before.
    pub fds_before: usize,
    /// Server descriptors once they were back (or at the deadline).
    pub fds_after: usize,
    /// The memory cgroup's limit, peak usage and limit hits, when the server ran in one.
    pub cgroup: Option<(u64, u64, u64)>,
}

impl Siege {
    /// Put the server in a memory cgroup of `memory_limit_bytes` (when the host allows), start
    /// a neighbour, and take the baselines.
    pub async fn begin(server: &ExecServer, what: &'static str, memory_limit_bytes: u64) -> Siege {
        let turn = TURN
            .acquire_many(TURNS)
            .await
            .expect("the siege semaphore is never closed");
        let cgroup = MemoryCgroup::try_new("hostile", memory_limit_bytes);
        if let Some(group) = &cgroup {
            group.add(server.pid());
        } else {
            eprintln!("{what}: no writable memory cgroup here; checking RSS only");
        }
        let neighbour = Neighbour::start(server).await;
        // What the host costs the neighbour before anything hostile happens.
        tokio::time::sleep(QUIET_PERIOD).await;
        let attack_started = Instant::now();
        let fds_before = fd_count(server.pid());
        let rss_before = rss_kib(server.pid());
        Siege {
            _turn: turn,
            neighbour,
            rss: PeakRss::start(server.pid()),
            rss_before,
            fds_before,
            cgroup,
            what,
            attack_started,
        }
    }

    /// The server's RSS before the attack, KiB.
    pub fn rss_before(&self) -> u64 {
        self.rss_before
    }

    /// End the case after the hostile client is gone: stop the neighbour and measure. Waits (up
    /// to [`DEADLINE`]) for the server's descriptors to come back to their baseline.
    pub async fn end(self, server: &ExecServer) -> SiegeReport {
        let started = Instant::now();
        let mut fds_after = fd_count(server.pid());
        while fds_after > self.fds_before && started.elapsed() < DEADLINE {
            tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
            fds_after = fd_count(server.pid());
        }
        let neighbour = self.neighbour.stop().await.split_at(self.attack_started);
        let rss_peak = self.rss.finish();
        if let Some(group) = &self.cgroup {
            assert_eq!(
                group.oom_kills(),
                0,
                "{}: the OOM killer killed a process in the server's cgroup",
                self.what
            );
        }
        SiegeReport {
            neighbour,
            rss_before: self.rss_before,
            rss_peak,
            fds_before: self.fds_before,
            fds_after,
            cgroup: self.cgroup.as_ref().map(|group| {
                let (peak, failures) = group.peak_and_failures();
                (group.limit(), peak, failures)
            }),
        }
    }
}

impl SiegeReport {
    /// Panic unless the neighbour was served (every request, p99 under the bound), the RSS grew
    /// by at most `rss_growth_bound_kib`, and the descriptors came back to their baseline.
    #[track_caller]
    pub fn assert_held(&self, what: &str, rss_growth_bound_kib: u64) {
        eprintln!("{what}: {self}");
        assert!(
            self.neighbour.failures.is_empty() && self.neighbour.requests > 0,
            "{what}: the neighbour was not served: {}\n{:#?}",
            self.neighbour,
            self.neighbour.failures
        );
        let bound = p99_bound(self.neighbour.quiet_p99);
        assert!(
            self.neighbour.p99 < bound,
            "{what}: the neighbour's p99 latency {:?} is over {bound:?} ({})",
            self.neighbour.p99,
            self.neighbour
        );
        let growth = self.rss_peak.saturating_sub(self.rss_before);
        assert!(
            growth <= rss_growth_bound_kib,
            "{what}: server RSS grew by {growth} KiB (from {} to {} KiB); the bound is {rss_growth_bound_kib} KiB",
            self.rss_before,
            self.rss_peak
        );
        assert!(
            self.fds_after <= self.fds_before,
            "{what}: the server holds {} descriptors, {} before the attack",
            self.fds_after,
            self.fds_before
        );
    }
}

impl std::fmt::Display for SiegeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "neighbour {}; server RSS {:.1} -> peak {:.1} MiB; fds {} -> {}{}",
            self.neighbour,
            self.rss_before as f64 / 1024.0,
            self.rss_peak as f64 / 1024.0,
            self.fds_before,
            self.fds_after,
            self.cgroup
                .map_or(String::new(), |(limit, peak, failures)| format!(
                    "; memory cgroup limit {} MiB, peak {} MiB, {failures} limit hits",
                    limit / 1024 / 1024,
                    peak / 1024 / 1024
                ))
        )
    }
}

/// Ten `process/write` requests to the process `process_id`, each with a 30 MiB `writeId`
/// (ids 1000..1010), serialized before a siege starts so that building them does not slow the
/// neighbour.
pub fn long_write_id_requests(process_id: &str) -> Vec<(i64, String)> {
    let long_id = "i".repeat(30 * 1024 * 1024);
    (0..10)
        .map(|n| {
            let id = 1000 + n;
            let request = json!({"id": id, "method": "process/write", "params":
                {"processId": process_id, "chunk": b64("x\n"), "writeId": format!("{n}{long_id}")}});
            (id, request.to_string())
        })
        .collect()
}

/// How many of `sockets` the peer has closed (EOF or an error within a millisecond).
pub async fn closed_by_peer(sockets: &mut [tokio::net::TcpStream]) -> usize {
    use tokio::io::AsyncReadExt;
    let mut closed = 0;
    for stream in sockets {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    closed
}
