//! Scenarios: many concurrent sessions each running a chatty process, and thousands of
//! start/stop cycles with the server's descriptors and RSS sampled before and after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::siege::PeakRss;
use tests::{Client, fd_count, rss_kib};

use crate::report::{Report, mib};
use crate::{CLOSED_PROCESS_RETENTION, PHASE_DEADLINE, server};

pub(crate) async fn chatty_sessions(report: &mut Report, sessions: usize, lines: usize) {
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

pub(crate) async fn start_stop_cycles(
    report: &mut Report,
    cycles: usize,
    sessions: usize,
    soak: bool,
) {
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
