//! A hostile client's case run against a real server beside a neighbour, for the hostile suite
//! (`tests/tests/hostile/`) and the `load` binary's hostile clients.
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
//!
//! Split by concern: `neighbour` ([`Neighbour`], [`NeighbourReport`], [`isolate_from_host_load`])
//! and `memory` ([`PeakRss`], [`MemoryCgroup`]); their items are re-exported here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod memory;
mod neighbour;

pub use memory::{MemoryCgroup, PeakRss};
pub use neighbour::{ISOLATED_NICE, Neighbour, NeighbourReport, isolate_from_host_load};

use std::time::{Duration, Instant};

use serde_json::json;

use crate::{DEADLINE, ExecServer, b64, fd_count, fd_targets, rss_kib};

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
    /// The descriptors themselves, to name the ones still open at the end.
    fd_targets_before: Vec<(i32, String)>,
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
    /// The descriptors open at the end that were not open before (`fd -> target`).
    pub fds_added: Vec<(i32, String)>,
    /// How long `end` waited for the descriptors to come back.
    pub fds_settled_in: Duration,
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
        let fd_targets_before = fd_targets(server.pid());
        let fds_before = fd_count(server.pid());
        let rss_before = rss_kib(server.pid());
        Siege {
            _turn: turn,
            neighbour,
            rss: PeakRss::start(server.pid()),
            rss_before,
            fds_before,
            fd_targets_before,
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
        let fds_added = fd_targets(server.pid())
            .into_iter()
            .filter(|fd| !self.fd_targets_before.contains(fd))
            .collect();
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
            fds_added,
            fds_settled_in: started.elapsed(),
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
            "{what}: the server holds {} descriptors, {} before the attack; new since: {:?}",
            self.fds_after,
            self.fds_before,
            self.fds_added
        );
    }
}

impl std::fmt::Display for SiegeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "neighbour {}; server RSS {:.1} -> peak {:.1} MiB; fds {} -> {} (settled in {:?}){}",
            self.neighbour,
            self.rss_before as f64 / 1024.0,
            self.rss_peak as f64 / 1024.0,
            self.fds_before,
            self.fds_after,
            self.fds_settled_in,
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
