//! `load`: load and soak figures for the real `exec-server`, checked against stated bounds.
//!
//! ```text
//! cargo build --release --workspace
//! cargo run --release -p tests --bin load -- [--quick] [--write docs/load.md]
//! ```
//! Scenarios: many live processes in one session; many concurrent sessions each running a chatty
//! process; thousands of start/stop cycles with the server's descriptors and RSS sampled before
//! and after; a process writing gigabytes that nobody reads (attached client that does not read,
//! and a detached session); hostile clients (silent sockets, 30 MiB writeIds) beside a neighbour
//! session, as in `tests/tests/hostile.rs` but against the release build. Every figure that has
//! a bound is checked; the run exits 1 if one does not hold. `--quick` shrinks every count for a
//! smoke run (well under a minute); `--only SCENARIO` runs one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::siege::{PeakRss, Siege, SiegeReport, p99_bound};
use tests::{Client, ExecServer, fd_count, rss_kib};

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
        }
    }
}

/// One line of the report.
struct Row {
    scenario: &'static str,
    figure: String,
    value: String,
    bound: String,
    holds: Option<bool>,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn figure(
        &mut self,
        scenario: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
    ) {
        self.rows.push(Row {
            scenario,
            figure: figure.into(),
            value: value.into(),
            bound: String::new(),
            holds: None,
        });
    }

    fn check(
        &mut self,
        scenario: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
        bound: impl Into<String>,
        holds: bool,
    ) {
        let row = Row {
            scenario,
            figure: figure.into(),
            value: value.into(),
            bound: bound.into(),
            holds: Some(holds),
        };
        println!(
            "  {} {}: {} (bound {}) {}",
            row.scenario,
            row.figure,
            row.value,
            row.bound,
            if holds { "ok" } else { "EXCEEDED" }
        );
        self.rows.push(row);
    }

    fn all_hold(&self) -> bool {
        self.rows.iter().all(|row| row.holds != Some(false))
    }

    fn table(&self) -> String {
        let mut out =
            String::from("| scenario | figure | value | bound | holds |\n|---|---|---|---|---|\n");
        for row in &self.rows {
            let holds = match row.holds {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                row.scenario, row.figure, row.value, row.bound, holds
            ));
        }
        out
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
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

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

async fn live_processes(report: &mut Report, count: usize) {
    const S: &str = "live processes";
    let server = server();
    let mut client = server.client().await;
    let (rss0, fds0) = (rss_kib(server.pid()), fd_count(server.pid()));
    let started = Instant::now();
    for i in 0..count {
        client
            .start(&format!("p{i}"), &["/bin/sleep", "1000"], json!({}))
            .await
            .unwrap_or_else(|e| panic!("start {i}: {e:?}"));
    }
    let took = started.elapsed();
    let (rss1, fds1) = (rss_kib(server.pid()), fd_count(server.pid()));
    report.figure(
        S,
        format!("start {count} `sleep 1000` in one session"),
        format!(
            "{:.2} s ({:.2} ms each)",
            took.as_secs_f64(),
            took.as_secs_f64() * 1000.0 / count as f64
        ),
    );
    report.figure(
        S,
        "server RSS idle → with all live",
        format!("{} → {}", mib(rss0), mib(rss1)),
    );
    let per_process = (rss1.saturating_sub(rss0)) as f64 / count as f64;
    report.check(
        S,
        "RSS per live process",
        format!("{per_process:.0} KiB"),
        "≤ 64 KiB",
        per_process <= 64.0,
    );
    let fds_per = (fds1 - fds0) as f64 / count as f64;
    report.check(
        S,
        format!("server fds idle → live ({fds0} → {fds1})"),
        format!("{fds_per:.1} per process"),
        "≤ 3 per process (stdout, stderr, pidfd)",
        fds_per <= 3.0,
    );
    let started = Instant::now();
    for i in 0..count {
        client
            .call("process/terminate", json!({"processId": format!("p{i}")}))
            .await;
    }
    wait_closed(&mut client, count).await;
    report.figure(
        S,
        format!("terminate all {count} and see every `closed`"),
        format!("{:.2} s", started.elapsed().as_secs_f64()),
    );
    let fds2 = fd_count(server.pid());
    report.check(
        S,
        "server fds after all closed (retained, not yet forgotten)",
        format!("{fds2}"),
        format!("≤ {} (idle + 2)", fds0 + 2),
        fds2 <= fds0 + 2,
    );
}

/// Start `count` `sleep 1000` on a fresh server started with `args`; the time per start and
/// how many of the sleeps sit in a cgroup of their own.
async fn start_sleeps(args: &[&str], count: usize) -> (Duration, usize) {
    let mut all = vec!["--detached-session-ttl", "300"];
    all.extend_from_slice(args);
    let server = ExecServer::start_with(&all, |command| {
        command.env("RUST_LOG", "warn");
    });
    let mut client = server.client().await;
    let started = Instant::now();
    for i in 0..count {
        client
            .start(&format!("c{i}"), &["/bin/sleep", "1000"], json!({}))
            .await
            .unwrap_or_else(|e| panic!("start {i}: {e:?}"));
    }
    let per_start = started.elapsed() / u32::try_from(count).unwrap();
    let leaves: std::collections::HashSet<String> = tests::descendants(server.pid())
        .into_iter()
        .filter(|pid| tests::cmdline(*pid) == "/bin/sleep 1000")
        .filter_map(|pid| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            let leaf = cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::"))?
                .to_owned();
            leaf.contains("/execward-").then_some(leaf)
        })
        .collect();
    for i in 0..count {
        client
            .call("process/terminate", json!({"processId": format!("c{i}")}))
            .await;
    }
    wait_closed(&mut client, count).await;
    (per_start, leaves.len())
}

/// The cost of containment: the same starts with a cgroup v2 leaf each, and with
/// `--no-cgroups` (process groups only, as before containment).
async fn contained_processes(report: &mut Report, count: usize) {
    const S: &str = "live processes";
    let (plain, _) = start_sleeps(&["--no-cgroups"], count).await;
    let (contained, leaves) = start_sleeps(&[], count).await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    report.check(
        S,
        format!("start {count} `sleep 1000`, each in its own cgroup, vs `--no-cgroups`"),
        format!(
            "{:.2} ms vs {:.2} ms per start ({:+.0}%); {leaves} of {count} in their own cgroup",
            ms(contained),
            ms(plain),
            (ms(contained) / ms(plain) - 1.0) * 100.0
        ),
        "every one contained",
        leaves == count,
    );
}

async fn chatty_sessions(report: &mut Report, sessions: usize, lines: usize) {
    const S: &str = "concurrent sessions";
    let server = Arc::new(server());
    let rss0 = rss_kib(server.pid());
    let peak = PeakRss::start(server.pid());
    let script = format!("i=0; while [ $i -lt {lines} ]; do echo \"line $i\"; i=$((i+1)); done");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..sessions {
        let server = server.clone();
        let script = script.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = server.client().await;
            client
                .start("chatty", &["/bin/sh", "-c", &script], json!({}))
                .await
                .unwrap_or_else(|e| panic!("session {s}: {e:?}"));
            let out = client.collect_within("chatty", PHASE_DEADLINE).await;
            let text = out.stdout_text();
            let complete = text.lines().count() == lines
                && text.lines().last() == Some(&*format!("line {}", lines - 1));
            (out.events.len(), out.stdout.len(), complete)
        }));
    }
    let (mut notifications, mut bytes, mut complete) = (0, 0, 0);
    for task in tasks {
        let (n, b, ok) = task.await.unwrap();
        notifications += n;
        bytes += b;
        complete += usize::from(ok);
    }
    let took = started.elapsed().as_secs_f64();
    let peak = peak.finish();
    report.figure(
        S,
        format!("{sessions} sessions × `echo` ×{lines} (one write per line)"),
        format!("{took:.2} s wall"),
    );
    report.figure(
        S,
        "notifications / output delivered",
        format!(
            "{notifications} ({:.0}/s), {:.1} MiB",
            notifications as f64 / took,
            bytes as f64 / 1048576.0
        ),
    );
    report.check(
        S,
        "sessions that got every line in order",
        format!("{complete} of {sessions}"),
        "all",
        complete == sessions,
    );
    report.check(
        S,
        "server RSS idle → peak",
        format!("{} → {}", mib(rss0), mib(peak)),
        format!("≤ idle + {sessions} × 1 MiB"),
        peak <= rss0 + sessions as u64 * 1024,
    );
}

async fn start_stop_cycles(report: &mut Report, cycles: usize, sessions: usize, soak: bool) {
    const S: &str = "start/stop cycles";
    let server = Arc::new(server());
    let mut clients = Vec::new();
    for _ in 0..sessions {
        clients.push(server.client().await);
    }
    // Warm-up: a few cycles per session so thread pools and allocator arenas exist.
    async fn cycle(client: &mut Client, id: &str) {
        client
            .start(id, &["/bin/sleep", "1000"], json!({}))
            .await
            .unwrap_or_else(|e| panic!("start {id}: {e:?}"));
        client
            .call("process/terminate", json!({"processId": id}))
            .await;
        client.collect_within(id, PHASE_DEADLINE).await;
    }
    for (s, client) in clients.iter_mut().enumerate() {
        for i in 0..10 {
            cycle(client, &format!("warm-{s}-{i}")).await;
        }
    }
    let (rss0, fds0) = (rss_kib(server.pid()), fd_count(server.pid()));
    let per_session = cycles / sessions;
    let total = per_session * sessions;
    // One round: every session runs its share of cycles concurrently.
    async fn round(clients: Vec<Client>, per_session: usize, tag: &'static str) -> Vec<Client> {
        let mut tasks = Vec::new();
        for (s, mut client) in clients.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                for i in 0..per_session {
                    cycle(&mut client, &format!("{tag}-{s}-{i}")).await;
                }
                client
            }));
        }
        let mut clients = Vec::new();
        for task in tasks {
            clients.push(task.await.unwrap());
        }
        clients
    }
    let started = Instant::now();
    let clients = round(clients, per_session, "a").await;
    let took = started.elapsed().as_secs_f64();
    let (rss1, fds1) = (rss_kib(server.pid()), fd_count(server.pid()));
    report.figure(
        S,
        format!("{total} × (start `sleep`, terminate, wait `closed`) over {sessions} sessions"),
        format!("{took:.2} s ({:.0} cycles/s)", total as f64 / took),
    );
    report.check(
        S,
        "server fds before → after",
        format!("{fds0} → {fds1}"),
        "no growth (± 2)",
        fds1 <= fds0 + 2,
    );
    // The closed processes are still retained (readable) for CLOSED_PROCESS_RETENTION: their
    // logs, table entries and sleeping pump tasks. Allowed: 4 KiB each plus 8 MiB.
    let allowed = 8 * 1024 + 4 * total as u64;
    report.check(
        S,
        "server RSS before → after (all still retained)",
        format!(
            "{} → {} ({:.1} KiB per retained process)",
            mib(rss0),
            mib(rss1),
            rss1.saturating_sub(rss0) as f64 / total as f64
        ),
        format!(
            "≤ before + 8 MiB + 4 KiB per retained process ({})",
            mib(allowed)
        ),
        rss1 <= rss0 + allowed,
    );
    if soak {
        // Soak: after the retention the processes are forgotten; a second round of the same
        // size must then fit in the memory the first one left (the allocator keeps freed pages,
        // so RSS need not shrink, but a leak would grow it by the same amount again).
        let retention = CLOSED_PROCESS_RETENTION + Duration::from_secs(2);
        tokio::time::sleep(retention).await;
        let (rss2, fds2) = (rss_kib(server.pid()), fd_count(server.pid()));
        let clients = round(clients, per_session, "b").await;
        tokio::time::sleep(retention).await;
        let (rss3, fds3) = (rss_kib(server.pid()), fd_count(server.pid()));
        report.check(
            S,
            "fds after round 1 forgotten → after round 2 forgotten",
            format!("{fds2} → {fds3}"),
            format!("both ≤ {} (before + 2)", fds0 + 2),
            fds2 <= fds0 + 2 && fds3 <= fds0 + 2,
        );
        report.check(
            S,
            format!("RSS after round 1 forgotten → after a second {total} forgotten"),
            format!("{} → {}", mib(rss2), mib(rss3)),
            "growth ≤ 4 MiB (a leak would add the round's retained size again)",
            rss3 <= rss2 + 4 * 1024,
        );
        drop(clients);
        return;
    }
    drop(clients);
}

/// Bytes the process `pid` has written so far (`wchar` of /proc/PID/io).
fn written(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("wchar: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The writer's pid: the only descendant of the server running `head`.
fn writer_pid(server: &ExecServer) -> i32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = tests::descendants(server.pid())
            .into_iter()
            .find(|&pid| tests::cmdline(pid).starts_with("/usr/bin/head"))
        {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no writer process"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

async fn unread_flood(report: &mut Report, bytes: u64) {
    const S: &str = "writer, no reader";
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let argv = ["/usr/bin/head", "-c", &bytes.to_string(), "/dev/zero"];
    let argv: Vec<&str> = argv.to_vec();

    // Attached but not reading: backpressure must stall the child, not fill server memory.
    {
        let server = server();
        let mut client = server.client().await;
        let rss0 = rss_kib(server.pid());
        let peak = PeakRss::start(server.pid());
        client.start("flood", &argv, json!({})).await.unwrap();
        let pid = writer_pid(&server);
        // Do not read the socket. Watch the child until its writes stop (stalled).
        let mut last = 0;
        let mut stalled_since = Instant::now();
        let started = Instant::now();
        while stalled_since.elapsed() < Duration::from_secs(2)
            && started.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(100)).await; // sampling interval
            let now = written(pid);
            if now != last {
                last = now;
                stalled_since = Instant::now();
            }
        }
        let peak = peak.finish();
        report.figure(
            S,
            format!("attached client not reading, `head -c {gib:.0}G /dev/zero`"),
            format!(
                "child stalled after writing {:.1} MiB",
                last as f64 / 1048576.0
            ),
        );
        // Retention (1 MiB + a chunk) + the outbound queue's byte budget + one message in the
        // writer + kernel socket buffers are not RSS; 16 MiB of slack for the allocator.
        let bound = (OUTPUT_RETENTION_BYTES + OUTPUT_READ_CHUNK_BYTES + 2 * OUTBOUND_QUEUE_BYTES)
            / 1024
            + 16 * 1024;
        report.check(
            S,
            "attached, not reading: server RSS idle → peak",
            format!("{} → {}", mib(rss0), mib(peak)),
            format!(
                "≤ idle + {} (retention + chunk + 2 × OUTBOUND_QUEUE_BYTES + 16 MiB)",
                mib(bound)
            ),
            peak <= rss0 + bound,
        );
        client
            .call("process/terminate", json!({"processId": "flood"}))
            .await;
    }

    // Detached: output is retained (newest 1 MiB) and never sent; the child runs at full speed.
    {
        let server = server();
        let mut client = server.connect().await;
        let session = client.initialize().await;
        let rss0 = rss_kib(server.pid());
        let peak = PeakRss::start(server.pid());
        client.start("flood", &argv, json!({})).await.unwrap();
        let started = Instant::now();
        let pid = writer_pid(&server);
        drop(client); // the connection is gone; the session is detached until the writer is done
        while !tests::process_is_dead(pid) {
            assert!(
                started.elapsed() < PHASE_DEADLINE,
                "the detached flood never finished"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
        }
        let mut back = server.connect().await;
        // Resume (retrying while the old connection is still being torn down); `closed`
        // follows the exit at once.
        let read = loop {
            let resumed = back
                .request(
                    "initialize",
                    json!({"clientName": "load", "resumeSessionId": session}),
                )
                .await;
            if resumed.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await; // retry interval
                continue;
            }
            break back
                .call(
                    "process/read",
                    json!({"processId": "flood", "maxBytes": 1, "afterSeq": u64::MAX - 1,
                           "waitMs": 10_000}),
                )
                .await;
        };
        let took = started.elapsed().as_secs_f64();
        let peak = peak.finish();
        let all = back
            .call("process/read", json!({"processId": "flood"}))
            .await;
        let retained: u64 = all["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["chunk"].as_str().unwrap().len() as u64 / 4 * 3)
            .sum();
        report.figure(
            S,
            format!("detached session, `head -c {gib:.0}G /dev/zero`"),
            format!(
                "{took:.1} s ({:.2} GiB/s), exit {}, outputDropped {}",
                gib / took,
                read["exitCode"],
                all["outputDropped"]
            ),
        );
        report.check(
            S,
            "detached: output retained after it",
            format!("{:.2} MiB", retained as f64 / 1048576.0),
            "≤ OUTPUT_RETENTION_BYTES + one chunk (1.25 MiB)",
            retained <= OUTPUT_RETENTION_BYTES + OUTPUT_READ_CHUNK_BYTES,
        );
        let bound = (OUTPUT_RETENTION_BYTES + 2 * OUTPUT_READ_CHUNK_BYTES) / 1024 + 16 * 1024;
        report.check(
            S,
            "detached: server RSS idle → peak",
            format!("{} → {}", mib(rss0), mib(peak)),
            format!("≤ idle + {} (retention + 2 chunks + 16 MiB)", mib(bound)),
            peak <= rss0 + bound,
        );
    }
}

/// `MAX_INFLIGHT_BYTES_PER_CONNECTION`: request and answer bytes in flight per connection.
const MAX_INFLIGHT_BYTES_PER_CONNECTION: u64 = 160 * 1024 * 1024;
/// Allocator and runtime slack on top of a case's own bound.
const RSS_SLACK: u64 = 64 * 1024 * 1024;
/// How long each hostile case lasts.
const ATTACK_WINDOW: Duration = Duration::from_secs(3);

/// One hostile case's rows: the neighbour's requests and p99, the server's RSS growth (KiB,
/// bounded by `rss_bound`) and its descriptors afterwards.
fn siege_rows(report: &mut Report, case: &'static str, siege: &SiegeReport, rss_bound: u64) {
    let neighbour = &siege.neighbour;
    let bound = p99_bound(neighbour.quiet_p99);
    report.check(
        case,
        "neighbour requests failed",
        format!("{} of {}", neighbour.failures.len(), neighbour.requests),
        "0",
        neighbour.failures.is_empty() && neighbour.requests > 0,
    );
    report.check(
        case,
        "neighbour p99 latency",
        format!(
            "{:.1} ms (quiet {:.1} ms)",
            neighbour.p99.as_secs_f64() * 1000.0,
            neighbour.quiet_p99.as_secs_f64() * 1000.0
        ),
        format!("< {} ms", bound.as_millis()),
        neighbour.p99 < bound,
    );
    let growth = siege.rss_peak.saturating_sub(siege.rss_before);
    report.check(
        case,
        "server RSS growth",
        format!("{} → peak {}", mib(siege.rss_before), mib(siege.rss_peak)),
        format!("≤ +{}", mib(rss_bound)),
        growth <= rss_bound,
    );
    report.check(
        case,
        "server descriptors",
        format!("{} → {}", siege.fds_before, siege.fds_after),
        "back to baseline",
        siege.fds_after <= siege.fds_before,
    );
}

fn hostile_server() -> ExecServer {
    ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env("RUST_LOG", "warn");
        tests::siege::isolate_from_host_load(command);
    })
}

/// Hostile clients beside a neighbour session: far more silent sockets than the admission pool
/// holds, then writeIds of 30 MiB sent again and again.
async fn hostile_clients(report: &mut Report, silent_sockets: usize) {
    let server = hostile_server();
    let siege = Siege::begin(&server, "silent sockets", 512 * 1024 * 1024).await;
    let mut silent = Vec::with_capacity(silent_sockets);
    for _ in 0..silent_sockets {
        silent.push(tokio::net::TcpStream::connect(server.addr()).await.unwrap());
    }
    tokio::time::sleep(ATTACK_WINDOW).await;
    drop(silent);
    let ended = siege.end(&server).await;
    siege_rows(report, "silent sockets", &ended, 64 * 1024);

    let requests = tests::siege::long_write_id_requests("cat");
    let siege = Siege::begin(&server, "long writeIds", 1024 * 1024 * 1024).await;
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    let attack = Instant::now();
    let mut sent = 0;
    while sent < requests.len() || attack.elapsed() < ATTACK_WINDOW {
        let (id, request) = &requests[sent % requests.len()];
        client.send_text(request.clone()).await;
        let refused = client.response(&json!(id)).await.is_err();
        assert!(refused, "a 30 MiB writeId was accepted");
        sent += 1;
    }
    // The cat ends (its stdin closed) before the descriptors are counted.
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    client.collect("cat").await;
    client.close().await;
    let ended = siege.end(&server).await;
    siege_rows(
        report,
        "30 MiB writeIds",
        &ended,
        (MAX_INFLIGHT_BYTES_PER_CONNECTION + RSS_SLACK) / 1024,
    );
}

/// How to read the figures; appended to the written report.
const NOTES: &str = "## Reading the figures\n\n\
- **Live processes**: each running child costs the server three descriptors (stdout, stderr, \
pidfd) and about 11 KiB. Once closed, a process holds none while it stays readable for \
`CLOSED_PROCESS_RETENTION`.\n\
- **Concurrent sessions**: every `echo` is its own write, but the server reads whatever the pipe \
holds (up to `OUTPUT_READ_CHUNK_BYTES`), so there are fewer notifications than lines; every \
session must still receive every line in order.\n\
- **Start/stop cycles**: a closed process is retained (about 2.4 KiB) for 30 s, then forgotten. \
The soak check runs a second round after the first was forgotten: freed memory is reused, so RSS \
does not grow again (it need not shrink: the allocator keeps freed pages).\n\
- **Writer, no reader**: with an attached client that does not read, the outbound queue \
(`OUTBOUND_QUEUE_BYTES`, 8 MiB) fills and the child blocks on its pipe after about 10 MiB; the \
10 GB can only be written if someone reads. With the session detached, output is retained (newest \
`OUTPUT_RETENTION_BYTES`) and never sent, so the child runs at full speed and server memory stays \
flat.\n\
- **Hostile clients**: a neighbour session sends a request every 10 ms throughout; its p99 must \
stay under 50 ms (or twice its own p99 measured for 1 s before the attack, plus 25 ms, on a \
loaded host). Silent sockets are closed oldest first once the pending pool (256) is full; a \
writeId over `MAX_WRITE_ID_BYTES` is refused before any work.\n";

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(String::new(), |kib| {
            format!(", {:.0} GiB RAM", kib as f64 / 1048576.0)
        });
    format!("{cpu}, {cores} cores{memory}, Linux {kernel}")
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
             Generated by `cargo run --release -p tests --bin load --{mode} --write {path}` \
             (build first with `cargo build --release --workspace`) in {took:.0} s on {}.\n\n\
             Each scenario runs against a fresh release `exec-server`. RSS is `VmRSS` of the \
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
