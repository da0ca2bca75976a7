//! Every process tree is contained and bounded: what a command leaves behind (a double-forked
//! `setsid` daemon) dies with its process, its session and its server; limits bound memory,
//! processes, CPU and wall time and say why a process ended; the server never kills what is
//! not its own.
//!
//! Run as root on this machine (hybrid cgroups: v1 controllers beside an empty v2 hierarchy).
//! A test that needs what the host cannot have prints why and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tests::{
    Client, DEADLINE, ExecServer, ProcessOutput, assert_rpc_error, descendants, process_is_dead,
    sh, wait_process_dead,
};

mod limits;
mod trees;

/// How a process is started.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Plain,
    Pty,
    Sandboxed,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Plain, Mode::Pty, Mode::Sandboxed];

    fn extra(self) -> Value {
        match self {
            Mode::Plain => json!({}),
            Mode::Pty => json!({"tty": true}),
            Mode::Sandboxed => json!({"sandbox": {"profile": "read-only"}}),
        }
    }

    fn id(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Pty => "pty",
            Mode::Sandboxed => "sandboxed",
        }
    }
}

/// A `sleep` duration no other process on the machine runs: finds the daemon in /proc.
fn mark() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!(
        "9{:05}.{:05}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A command that leaves a daemon behind the way agents' dev servers do: a subshell starts
/// `setsid sleep MARK` in the background and exits (a double fork: the daemon is an orphan in
/// a session of its own), then the command itself runs on.
fn daemon_script(mark: &str) -> String {
    format!("( setsid sleep {mark} & ); echo ready; exec sleep 1000")
}

/// The daemon's pid, once it runs.
fn wait_for_daemon(mark: &str) -> i32 {
    let started = Instant::now();
    loop {
        if let [pid] = tests::sleeping(mark)[..] {
            return pid;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the daemon `sleep {mark}` did not appear"
        );
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

/// Start a daemon-leaving command in every mode; their daemons' pids.
async fn start_daemons(client: &mut Client, prefix: &str) -> Vec<(Mode, i32)> {
    let mut daemons = Vec::new();
    for mode in Mode::ALL {
        let mark = mark();
        let id = format!("{prefix}-{}", mode.id());
        client
            .start(&id, &sh(&daemon_script(&mark)), mode.extra())
            .await
            .unwrap_or_else(|e| panic!("start {mode:?}: {e:?}"));
        client.wait_for_output(&id, "ready").await;
        daemons.push((mode, wait_for_daemon(&mark)));
    }
    daemons
}

fn assert_all_dead(daemons: &[(Mode, i32)], after: &str) {
    for (mode, pid) in daemons {
        wait_process_dead(
            *pid,
            DEADLINE,
            &format!("the {mode:?} daemon after {after}"),
        );
    }
}

/// The `reason` of the process's `process/exited`.
fn reason(out: &ProcessOutput) -> Value {
    out.events
        .iter()
        .find(|e| e["method"] == "process/exited")
        .map(|e| e["params"]["reason"].clone())
        .unwrap_or_else(|| panic!("no process/exited in {:?}", out.events))
}

/// `environment/info`'s containment report.
async fn containment(client: &mut Client) -> Value {
    client.call("environment/info", json!({})).await["containment"].clone()
}
