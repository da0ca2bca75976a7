//! The output group: output throughput through the server against a pipe read directly.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::table::{Row, throughput_row};
use crate::{Client, Server, run_to_close};

pub(crate) async fn output_throughput(rows: &mut Vec<Row>, mib: u64, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let count = format!("{}", mib * 1024 * 1024);
    let mut scratch = Vec::new();
    let mut ours = Vec::new();
    let mut pipe = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let bytes = run_to_close(
            &mut client,
            &format!("head-{run}"),
            &["head", "-c", &count, "/dev/zero"],
            None,
            &mut scratch,
        )
        .await;
        assert_eq!(bytes, mib * 1024 * 1024, "every byte must arrive");
        ours.push(mib as f64 / started.elapsed().as_secs_f64());
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
    rows.push(throughput_row(
        format!("output throughput, head -c {mib}M /dev/zero to a Rust client ({runs} runs)"),
        (ours, ""),
        (pipe, " plain pipe"),
        40.0,
    ));
}
