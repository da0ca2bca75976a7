//! The spawn group: the round trip of `/bin/true` through the server against a direct spawn.

use std::process::Command;
use std::time::Instant;

use crate::table::{Row, summary_ms};
use crate::{Client, Server, run_to_close};

pub(crate) async fn spawn_round_trip(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let mut scratch = Vec::new();
    let mut ours = Vec::new();
    let mut direct = Vec::new();
    for run in 0..runs + 10 {
        let started = Instant::now();
        run_to_close(
            &mut client,
            &format!("true-{run}"),
            &["/bin/true"],
            None,
            &mut scratch,
        )
        .await;
        let ours_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        Command::new("/bin/true").status().unwrap();
        let direct_ms = started.elapsed().as_secs_f64() * 1e3;
        if run >= 10 {
            ours.push(ours_ms);
            direct.push(direct_ms);
        }
    }
    let (ours_median, ours_text) = summary_ms(ours);
    let (direct_median, direct_text) = summary_ms(direct);
    rows.push(Row {
        figure: format!("spawn round trip of /bin/true, start to closed ({runs} runs)"),
        ours: ours_text,
        baseline: format!("{direct_text} direct std::process spawn+wait"),
        ratio: format!("{:.2}x", ours_median / direct_median),
        target: "<= 1.5x".into(),
        holds: Some(ours_median / direct_median <= 1.5),
    });
}
