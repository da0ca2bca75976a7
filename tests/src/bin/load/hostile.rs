//! Scenario: hostile clients (silent sockets, oversized writeIds) beside a neighbour session.

use std::time::{Duration, Instant};

use serde_json::json;
use tests::ExecServer;
use tests::siege::{Siege, SiegeReport, p99_bound};

use crate::report::{Report, mib};

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
pub(crate) async fn hostile_clients(report: &mut Report, silent_sockets: usize) {
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
