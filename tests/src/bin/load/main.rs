//! `load`: load and soak figures for the real `exec-server`, checked against stated bounds.
//!
//! ```text
//! cargo build --release --workspace
//! cargo run --release -p execward-tests --bin load -- [--quick] [--write docs/load.md]
//! ```
//! Scenarios: many live processes in one session; many concurrent sessions each running a chatty
//! process; thousands of start/stop cycles with the server's descriptors and RSS sampled before
//! and after; a process writing gigabytes that nobody reads (attached client that does not read,
//! and a detached session); hostile clients (silent sockets, 30 MiB writeIds) beside a neighbour
//! session, as in `tests/tests/hostile/` but against the release build; a thousand executors
//! and harness streams across a three-node rendezvous cluster on NATS. Every figure that has
//! a bound is checked; the run exits 1 if one does not hold. `--quick` shrinks every count for a
//! smoke run (well under a minute); `--only SCENARIO` runs one.
//!
//! This file holds the command line, the sizes and the bounds the server is configured with;
//! the scenarios have their modules (`processes`: live and contained processes; `sessions`:
//! chatty sessions and start/stop cycles; `flood`: unread output; `hostile`: hostile clients;
//! `cluster`: the rendezvous cluster)
//! and `report` holds the rows, their checks and the rendered table.
#![deny(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod flood;
mod hostile;
mod processes;
mod report;
mod sessions;

use std::time::{Duration, Instant};

use tests::{Client, ExecServer};

use crate::cluster::cluster_streams;
use crate::flood::unread_flood;
use crate::hostile::hostile_clients;
use crate::processes::{contained_processes, live_processes};
use crate::report::{NOTES, Report, machine};
use crate::sessions::{chatty_sessions, start_stop_cycles};

/// `OUTPUT_RETENTION_BYTES`: output kept per process.
const OUTPUT_RETENTION_BYTES: u64 = 1024 * 1024;
/// `OUTPUT_READ_CHUNK_BYTES`: the largest chunk read from a child at once.
const OUTPUT_READ_CHUNK_BYTES: u64 = 256 * 1024;
/// `OUTBOUND_QUEUE_BYTES`: serialized messages queued per connection.
const OUTBOUND_QUEUE_BYTES: u64 = 8 * 1024 * 1024;
/// `CLOSED_PROCESS_RETENTION`: a closed process stays readable this long.
const CLOSED_PROCESS_RETENTION: Duration = Duration::from_secs(30);
/// Generous deadline for one long phase.
const PHASE_DEADLINE: Duration = Duration::from_secs(600);

struct Sizes {
    live_processes: usize,
    sessions: usize,
    lines_per_session: usize,
    cycles: usize,
    cycle_sessions: usize,
    flood_bytes: u64,
    wait_for_retention: bool,
    silent_sockets: usize,
    cluster_executors: usize,
    cluster_run: Duration,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            live_processes: 1000,
            sessions: 100,
            lines_per_session: 5000,
            cycles: 10_000,
            cycle_sessions: 8,
            flood_bytes: 10 * 1024 * 1024 * 1024,
            wait_for_retention: true,
            silent_sockets: 1030,
            cluster_executors: 1000,
            cluster_run: Duration::from_secs(60),
        }
    }

    fn quick() -> Sizes {
        Sizes {
            live_processes: 200,
            sessions: 20,
            lines_per_session: 1000,
            cycles: 1000,
            cycle_sessions: 4,
            flood_bytes: 1024 * 1024 * 1024,
            wait_for_retention: false,
            silent_sockets: 300,
            cluster_executors: 100,
            cluster_run: Duration::from_secs(10),
        }
    }
}

fn server() -> ExecServer {
    ExecServer::start_with(&["--detached-session-ttl", "300"], |command| {
        command.env("RUST_LOG", "warn");
    })
}

/// Wait for `count` `process/closed` notifications on `client`.
async fn wait_closed(client: &mut Client, count: usize) {
    let mut closed = 0;
    while closed < count {
        let n = client.next_notification(PHASE_DEADLINE).await;
        if n["method"] == "process/closed" {
            closed += 1;
        }
    }
}

/// Load and soak figures for the real exec-server (the one next to this executable: build with
/// `cargo build --release --workspace` first), each checked against its bound; exits 1 when one
/// does not hold.
#[derive(Debug, clap::Parser)]
#[command(name = "load")]
struct Cli {
    /// Shrink every count for a smoke run (well under a minute).
    #[arg(long)]
    quick: bool,
    /// Also write the report (Markdown) to FILE, e.g. docs/load.md.
    #[arg(long, value_name = "FILE")]
    write: Option<std::path::PathBuf>,
    /// Run one scenario only.
    #[arg(long, value_enum, value_name = "SCENARIO")]
    only: Option<Scenario>,
}

/// The scenarios, in the order a full run takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Many live processes in one session.
    Live,
    /// The same, each in its own cgroup.
    Contained,
    /// Many concurrent sessions, each running a chatty process.
    Chatty,
    /// Thousands of start/stop cycles.
    Cycles,
    /// A process writing gigabytes that nobody reads.
    Flood,
    /// Hostile clients beside a neighbour session.
    Hostile,
    /// Registered executors and concurrent harness streams across a three-node rendezvous
    /// cluster on NATS.
    Cluster,
}

#[tokio::main]
async fn main() {
    let cli = <Cli as clap::Parser>::parse();
    let quick = cli.quick;
    let write = cli.write.map(|path| path.display().to_string());
    let sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let mut report = Report::default();
    let started = Instant::now();
    let runs = |scenario: Scenario| cli.only.is_none_or(|only| only == scenario);
    if runs(Scenario::Live) {
        println!("live processes...");
        live_processes(&mut report, sizes.live_processes).await;
    }
    if runs(Scenario::Contained) {
        println!("contained processes...");
        contained_processes(&mut report, sizes.live_processes).await;
    }
    if runs(Scenario::Chatty) {
        println!("concurrent chatty sessions...");
        chatty_sessions(&mut report, sizes.sessions, sizes.lines_per_session).await;
    }
    if runs(Scenario::Cycles) {
        println!("start/stop cycles...");
        start_stop_cycles(
            &mut report,
            sizes.cycles,
            sizes.cycle_sessions,
            sizes.wait_for_retention,
        )
        .await;
    }
    if runs(Scenario::Flood) {
        println!("writer with no reader...");
        unread_flood(&mut report, sizes.flood_bytes).await;
    }
    if runs(Scenario::Hostile) {
        println!("hostile clients...");
        hostile_clients(&mut report, sizes.silent_sockets).await;
    }
    if runs(Scenario::Cluster) {
        println!("rendezvous cluster...");
        cluster_streams(&mut report, sizes.cluster_executors, sizes.cluster_run).await;
    }
    let took = started.elapsed().as_secs_f64();
    let table = report.table();
    println!("\n{table}");
    println!(
        "total {took:.0} s; every bound holds: {}",
        report.all_hold()
    );
    if let Some(path) = write {
        let mode = if quick { " --quick" } else { "" };
        let text = format!(
            "# Load and soak figures\n\n\
             Generated by `cargo run --release -p execward-tests --bin load --{mode} --write {path}` \
             (build first with `cargo build --release --workspace`) in {took:.0} s on {}.\n\n\
             Each scenario runs against a fresh release `exec-server` (the cluster scenario \
             against fresh `exec-rendezvous` nodes). RSS is `VmRSS` of the \
             server process from `/proc/PID/status` (peaks sampled every 20 ms); fds count \
             `/proc/PID/fd`. A bound that does not hold makes the run exit 1.\n\n{table}\n{NOTES}",
            machine()
        );
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {path}: {e}"));
        println!("wrote {path}");
    }
    if !report.all_hold() {
        std::process::exit(1);
    }
}
