//! The spawn group: the round trip of `/bin/true` through the server against a direct spawn.

use std::process::Command;

use crate::table::{Row, summary_ms};
use crate::{Client, Server, status_ms, true_to_close_ms};

pub(crate) async fn spawn_round_trip(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let mut scratch = Vec::new();
    let mut ours = Vec::new();
    let mut direct = Vec::new();
    for run in 0..runs + 10 {
        let ours_ms =
            true_to_close_ms(&mut client, &format!("true-{run}"), None, &mut scratch).await;
        let direct_ms = status_ms(&mut Command::new("/bin/true"));
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

/// Idle time before each start of [`start_after_idle`]: longer than an RCU grace period, so the
/// kernel has left the state in which a cgroup migration is cheap.
const IDLE_BEFORE_START: std::time::Duration = std::time::Duration::from_millis(50);

/// The same start after [`IDLE_BEFORE_START`] of quiet, as an agent's commands arrive (seconds
/// apart, not back to back): plain and sandboxed through the server against a direct spawn
/// after the same idle. Back-to-back rows hide what the first start after a pause costs: on a
/// cgroup v1 host each join of the command's cgroups waits for an RCU grace period then.
pub(crate) async fn start_after_idle(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let mut scratch = Vec::new();
    let workspace =
        std::env::temp_dir().join(format!("execward-bench-idle-{}", std::process::id()));
    std::fs::create_dir_all(&workspace).unwrap();
    let sandbox = serde_json::json!({"profile": "workspace-write", "cwd": format!("file://{}", workspace.display())});
    let mut bwrap = crate::sandbox::bwrap_true(&workspace.display().to_string());
    let (mut plain, mut sandboxed, mut direct, mut bubblewrap) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs + 2 {
        tokio::time::sleep(IDLE_BEFORE_START).await; // the idle being measured, not a wait
        let plain_ms = true_to_close_ms(&mut client, &format!("p-{run}"), None, &mut scratch).await;
        tokio::time::sleep(IDLE_BEFORE_START).await; // the idle being measured, not a wait
        let sandboxed_ms = true_to_close_ms(
            &mut client,
            &format!("s-{run}"),
            Some(&sandbox),
            &mut scratch,
        )
        .await;
        tokio::time::sleep(IDLE_BEFORE_START).await; // the idle being measured, not a wait
        let direct_ms = status_ms(&mut Command::new("/bin/true"));
        let mut bwrap_ms = None;
        if let Some(bwrap) = bwrap.as_mut() {
            tokio::time::sleep(IDLE_BEFORE_START).await; // the idle being measured, not a wait
            bwrap_ms = Some(status_ms(bwrap));
        }
        // The first sandboxed start of a session creates its launcher.
        if run >= 2 {
            plain.push(plain_ms);
            sandboxed.push(sandboxed_ms);
            direct.push(direct_ms);
            bubblewrap.extend(bwrap_ms);
        }
    }
    let _ = std::fs::remove_dir_all(&workspace);
    let (direct_median, direct_text) = summary_ms(direct);
    let (sandboxed_median, sandboxed_text) = summary_ms(sandboxed.clone());
    for (what, samples) in [
        ("process/start", plain),
        ("sandboxed process/start (workspace-write)", sandboxed),
    ] {
        let (median, text) = summary_ms(samples);
        rows.push(Row {
            figure: format!(
                "{what} of /bin/true after {} ms idle, start to closed ({runs} runs)",
                IDLE_BEFORE_START.as_millis()
            ),
            ours: text,
            baseline: format!("{direct_text} direct spawn+wait after the same idle"),
            ratio: format!("{:.2}x", median / direct_median),
            target: "reported (no target)".into(),
            holds: None,
        });
    }
    let (baseline, ratio) = if bubblewrap.is_empty() {
        ("bwrap not installed".to_owned(), "-".to_owned())
    } else {
        let (bwrap_median, bwrap_text) = summary_ms(bubblewrap);
        (
            format!("{bwrap_text} bwrap"),
            format!("{:.1}x faster", bwrap_median / sandboxed_median),
        )
    };
    rows.push(Row {
        figure: format!(
            "sandboxed process/start vs bwrap --unshare-all /bin/true, both after {} ms idle ({runs} runs)",
            IDLE_BEFORE_START.as_millis()
        ),
        ours: sandboxed_text,
        baseline,
        ratio,
        target: "reported (no target)".into(),
        holds: None,
    });
}
