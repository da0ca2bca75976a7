//! Scenario: a process writing gigabytes that nobody reads, to an attached client that does
//! not read and to a detached session.

use std::time::{Duration, Instant};

use serde_json::json;
use tests::siege::PeakRss;
use tests::{ExecServer, rss_kib};

use crate::report::{Report, mib};
use crate::{
    OUTBOUND_QUEUE_BYTES, OUTPUT_READ_CHUNK_BYTES, OUTPUT_RETENTION_BYTES, PHASE_DEADLINE, server,
};

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

pub(crate) async fn unread_flood(report: &mut Report, bytes: u64) {
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
