//! The sandbox group: requests and spawns inside a sandbox against the same without one, and
//! the `sandbox-run` startup table.

use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use crate::table::{Row, summary_ms, summary_with_p99};
use crate::{Client, Server, bin_dir, status_ms, true_to_close_ms};

async fn timed_requests(
    client: &mut Client,
    method: &str,
    params: &Value,
    runs: usize,
) -> Vec<f64> {
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs + 5 {
        let started = Instant::now();
        client.request(method, params.clone()).await;
        if run >= 5 {
            samples.push(started.elapsed().as_secs_f64() * 1e3);
        }
    }
    samples
}

pub(crate) async fn sandboxed_read_file(rows: &mut Vec<Row>, runs: usize) {
    let dir = std::env::temp_dir().join(format!("execward-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("4k.bin");
    std::fs::write(&file, vec![7u8; 4096]).unwrap();
    let uri = format!("file://{}", file.display());
    let plain = json!({"path": uri});
    let sandboxed = json!({"path": uri, "sandbox": {"profile": "read-only"}});
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let (unsandboxed_median, unsandboxed_text) =
        summary_with_p99(timed_requests(&mut client, "fs/readFile", &plain, runs).await);
    let (pooled_median, pooled_text) =
        summary_with_p99(timed_requests(&mut client, "fs/readFile", &sandboxed, runs).await);
    let large = large_workspace(&dir);
    let in_large = |params: &Value| {
        let mut params = params.clone();
        params["sandbox"] =
            json!({"profile": "workspace-write", "cwd": large.display().to_string()});
        params
    };
    let (large_read_median, large_read_text) = summary_with_p99(
        timed_requests(&mut client, "fs/readFile", &in_large(&plain), runs / 5).await,
    );
    let written = format!("file://{}", large.join("written.bin").display());
    // 4,096 zero bytes in base64: 1,365 groups of "AAAA" and one byte left over.
    let zeros = format!("{}AA==", "A".repeat(1365 * 4));
    let write = json!({"path": written, "dataBase64": zeros});
    let (large_write_median, large_write_text) = summary_with_p99(
        timed_requests(&mut client, "fs/writeFile", &in_large(&write), runs / 50).await,
    );
    let one_shot_server = Server::start_with(&["--one-shot-helpers"]);
    let mut one_shot_client = Client::connect(&one_shot_server.url).await;
    let (one_shot_median, one_shot_text) = summary_with_p99(
        timed_requests(&mut one_shot_client, "fs/readFile", &sandboxed, runs / 5).await,
    );
    let _ = std::fs::remove_dir_all(&dir);
    rows.push(Row {
        figure: format!("sandboxed fs/readFile 4 KiB, pooled helpers ({runs} runs)"),
        ours: pooled_text.clone(),
        baseline: format!("{unsandboxed_text} unsandboxed"),
        ratio: format!("{:.2}x", pooled_median / unsandboxed_median),
        // Issue 37: at most 1.5x the unsandboxed read.
        target: "<= 1.5x".into(),
        holds: Some(pooled_median / unsandboxed_median <= 1.5),
    });
    for (verb, runs, median, text) in [
        ("fs/readFile", runs / 5, large_read_median, large_read_text),
        (
            "fs/writeFile",
            runs / 50,
            large_write_median,
            large_write_text,
        ),
    ] {
        rows.push(Row {
            figure: format!(
                "sandboxed {verb} 4 KiB, workspace-write over a workspace of \
                 {LARGE_WORKSPACE_ENTRIES} entries with a .git, pooled helpers ({runs} runs)"
            ),
            ours: text,
            baseline: format!("{unsandboxed_text} unsandboxed read"),
            ratio: format!("{:.2}x", median / unsandboxed_median),
            target: "reported (no target)".into(),
            holds: None,
        });
    }
    rows.push(Row {
        figure: format!(
            "sandboxed fs/readFile 4 KiB, one helper per request ({} runs)",
            runs / 5
        ),
        ours: one_shot_text,
        baseline: format!("{pooled_text} pooled"),
        ratio: format!("pooled {:.1}x faster", one_shot_median / pooled_median),
        target: "pooled >= 10x faster".into(),
        holds: Some(one_shot_median / pooled_median >= 10.0),
    });
}

/// Entries of [`large_workspace`]: a writable root's search for protected names reads up to
/// `PROTECTED_SCAN_MAX_ENTRIES` (10,000) of them.
const LARGE_WORKSPACE_ENTRIES: usize = 10_100;

/// A workspace under `dir` as large as a writable root's search reads: a `.git` and 100
/// directories of 100 files.
fn large_workspace(dir: &std::path::Path) -> std::path::PathBuf {
    let root = dir.join("large");
    std::fs::create_dir_all(root.join(".git")).unwrap();
    for d in 0..100 {
        let sub = root.join(format!("d{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..100 {
            std::fs::write(sub.join(format!("f{f:03}")), b"").unwrap();
        }
    }
    root
}

/// bubblewrap with the same shape as a workspace-write sandbox (its own user, PID, IPC and
/// network namespaces, `/` read-only, the workspace writable, a fresh /proc and /dev), when
/// installed.
pub(crate) fn bwrap_true(workspace: &str) -> Option<Command> {
    let bwrap = std::path::Path::new("/usr/bin/bwrap");
    bwrap.exists().then(|| {
        let mut command = Command::new(bwrap);
        command
            .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
            .args(["--tmpfs", "/tmp", "--bind", workspace, workspace])
            .args(["--unshare-all", "--die-with-parent", "--", "/bin/true"]);
        command
    })
}

pub(crate) async fn sandboxed_spawn(rows: &mut Vec<Row>, runs: usize) {
    let server = Server::start();
    let mut client = Client::connect(&server.url).await;
    let one_shot_server = Server::start_with(&["--one-shot-sandbox"]);
    let mut one_shot_client = Client::connect(&one_shot_server.url).await;
    let mut scratch = Vec::new();
    let workspace = std::env::temp_dir().join(format!("execward-bench-ws-{}", std::process::id()));
    std::fs::create_dir_all(&workspace).unwrap();
    let workspace_uri = format!("file://{}", workspace.display());
    let sandbox = json!({"profile": "workspace-write", "cwd": workspace_uri});
    let mut bwrap = bwrap_true(&workspace.display().to_string());
    let (mut plain, mut sandboxed, mut one_shot, mut direct, mut bubblewrap) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs + 5 {
        let plain_ms = true_to_close_ms(&mut client, &format!("p-{run}"), None, &mut scratch).await;
        let sandboxed_ms = true_to_close_ms(
            &mut client,
            &format!("s-{run}"),
            Some(&sandbox),
            &mut scratch,
        )
        .await;
        let one_shot_ms = true_to_close_ms(
            &mut one_shot_client,
            &format!("o-{run}"),
            Some(&sandbox),
            &mut scratch,
        )
        .await;
        let direct_ms = status_ms(&mut Command::new("/bin/true"));
        let bwrap_ms = bwrap.as_mut().map(status_ms);
        if run >= 5 {
            plain.push(plain_ms);
            sandboxed.push(sandboxed_ms);
            one_shot.push(one_shot_ms);
            direct.push(direct_ms);
            bubblewrap.extend(bwrap_ms);
        }
    }
    let _ = std::fs::remove_dir_all(&workspace);
    let (sandboxed_median, sandboxed_text) = summary_ms(sandboxed);
    let (plain_median, plain_text) = summary_ms(plain);
    let (direct_median, direct_text) = summary_ms(direct);
    let (one_shot_median, one_shot_text) = summary_ms(one_shot);
    rows.push(Row {
        figure: format!(
            "sandboxed process/start of /bin/true (workspace-write) through the session's \
             launcher, start to closed ({runs} runs)"
        ),
        ours: sandboxed_text.clone(),
        baseline: format!(
            "{direct_text} direct spawn; {plain_text} unsandboxed start (the floor of any \
             start through the server)"
        ),
        ratio: format!(
            "{:.2}x direct, {:.2}x unsandboxed",
            sandboxed_median / direct_median,
            sandboxed_median / plain_median
        ),
        // Issue 37: at most 1.15x the unsandboxed start (and the older 1.5x direct).
        target: "<= 1.5x direct, <= 1.15x unsandboxed".into(),
        holds: Some(
            sandboxed_median / direct_median <= 1.5 && sandboxed_median / plain_median <= 1.15,
        ),
    });
    rows.push(Row {
        figure: format!(
            "sandboxed process/start of /bin/true, one sandbox-run per start \
             (--one-shot-sandbox) ({runs} runs)"
        ),
        ours: sandboxed_text.clone(),
        baseline: format!("{one_shot_text} one-shot"),
        ratio: format!("launcher {:.1}x faster", one_shot_median / sandboxed_median),
        target: "reported".into(),
        holds: None,
    });
    rows.push(match bubblewrap.is_empty() {
        true => Row {
            figure: "sandboxed process/start vs bubblewrap".into(),
            ours: sandboxed_text,
            baseline: "bwrap not installed (/usr/bin/bwrap)".into(),
            ratio: "-".into(),
            target: ">= 3x faster than bwrap".into(),
            holds: None,
        },
        false => {
            let (bwrap_median, bwrap_text) = summary_ms(bubblewrap);
            Row {
                figure: format!(
                    "sandboxed process/start vs bwrap --unshare-all /bin/true, spawn+wait \
                     ({runs} runs)"
                ),
                ours: sandboxed_text,
                baseline: format!("{bwrap_text} bwrap"),
                ratio: format!("{:.1}x faster", bwrap_median / sandboxed_median),
                target: ">= 3x faster than bwrap".into(),
                holds: Some(bwrap_median / sandboxed_median >= 3.0),
            }
        }
    });
}

/// The `sandbox-run` startup benchmark (`sandbox-bench`, next to this binary): /bin/true
/// directly, through sandbox-run with namespaces on and off, and through bwrap when installed.
pub(crate) fn sandbox_run_table(runs: usize) -> String {
    let output = Command::new(bin_dir().join("sandbox-bench"))
        .arg(runs.to_string())
        .output();
    match output {
        Ok(output) if output.status.success() => format!(
            "\n## sandbox-run startup (sandbox-bench, target: within 2x of direct)\n\n```text\n{}```\n",
            String::from_utf8_lossy(&output.stdout)
        ),
        Ok(output) => format!(
            "\n## sandbox-run startup\n\nsandbox-bench failed: {}\n",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => format!("\n## sandbox-run startup\n\nsandbox-bench could not run: {error}\n"),
    }
}
