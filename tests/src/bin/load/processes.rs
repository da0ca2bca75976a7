//! Scenario: many live processes in one session, and the cost of containment (a cgroup v2 leaf
//! per process against process groups only).

use std::time::{Duration, Instant};

use serde_json::json;
use tests::{ExecServer, fd_count, rss_kib};

use crate::report::{Report, mib};
use crate::{server, wait_closed};

pub(crate) async fn live_processes(report: &mut Report, count: usize) {
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
pub(crate) async fn contained_processes(report: &mut Report, count: usize) {
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
