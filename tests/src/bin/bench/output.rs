//! The output group: output throughput through the server against a pipe read directly, with
//! `process/output` as binary frames and as JSON, and the server's CPU time per GiB.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::table::{Row, throughput_row};
use crate::{Client, Server, cpu_seconds, run_to_close};

/// One form's samples: MiB/s per run and server CPU seconds per GiB per run.
#[derive(Default)]
struct Form {
    rates: Vec<f64>,
    cpu_per_gib: Vec<f64>,
}

pub(crate) async fn output_throughput(rows: &mut Vec<Row>, mib: u64, runs: usize) {
    let server = Server::start();
    let mut binary_client = Client::connect_with(&server.url, true).await;
    let mut json_client = Client::connect_with(&server.url, false).await;
    let count = format!("{}", mib * 1024 * 1024);
    let mut scratch = Vec::new();
    let (mut binary, mut json) = (Form::default(), Form::default());
    let mut pipe = Vec::new();
    for run in 0..runs {
        for (client, form) in [
            (&mut binary_client, &mut binary),
            (&mut json_client, &mut json),
        ] {
            let cpu_before = cpu_seconds(server.child.id());
            let started = Instant::now();
            let bytes = run_to_close(
                client,
                &format!("head-{run}"),
                &["head", "-c", &count, "/dev/zero"],
                None,
                &mut scratch,
            )
            .await;
            assert_eq!(bytes, mib * 1024 * 1024, "every byte must arrive");
            form.rates
                .push(mib as f64 / started.elapsed().as_secs_f64());
            let cpu = cpu_seconds(server.child.id()) - cpu_before;
            form.cpu_per_gib.push(cpu * 1024.0 / mib as f64);
        }
        let started = Instant::now();
        let mut child = Command::new("head")
            .args(["-c", &count, "/dev/zero"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = stdout.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        child.wait().unwrap();
        assert_eq!(total, mib * 1024 * 1024);
        pipe.push(mib as f64 / started.elapsed().as_secs_f64());
    }
    let median = |mut samples: Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        samples[samples.len() / 2]
    };
    // Issue 37: binary frames at least 70% of the pipe with at most 0.7 server CPU-seconds per
    // GiB; JSON is reported beside it.
    for (form, name, min_percent, max_cpu) in [
        (binary, "binary frames", 70.0, Some(0.7)),
        (json, "JSON", 40.0, None),
    ] {
        let cpu = median(form.cpu_per_gib);
        let mut row = throughput_row(
            format!(
                "output throughput, head -c {mib}M /dev/zero to a Rust client, {name} \
                 ({runs} runs; server CPU {cpu:.2} s per GiB)"
            ),
            (form.rates, ""),
            (pipe.clone(), " plain pipe"),
            min_percent,
        );
        if let Some(max_cpu) = max_cpu {
            row.target = format!("{}, server CPU <= {max_cpu} s per GiB", row.target);
            row.holds = row.holds.map(|holds| holds && cpu <= max_cpu);
        }
        rows.push(row);
    }
}
