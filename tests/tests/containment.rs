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

// ---------------------------------------------------------------------------------------------
// Nothing a command leaves behind survives
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_double_forked_setsid_grandchild_is_gone_after_terminate() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for (mode, daemon) in start_daemons(&mut client, "term").await {
        let id = format!("term-{}", mode.id());
        let answer = client
            .call("process/terminate", json!({"processId": id}))
            .await;
        assert_eq!(answer["running"], true, "{mode:?}");
        let out = client.collect(&id).await;
        assert_eq!(reason(&out), "terminated", "{mode:?}: {:?}", out.events);
        wait_process_dead(
            daemon,
            DEADLINE,
            &format!("the {mode:?} daemon after terminate"),
        );
    }
}

#[tokio::test]
async fn a_double_forked_setsid_grandchild_is_gone_after_session_expiry() {
    let server = ExecServer::start(&["--detached-session-ttl", "1"]);
    let mut client = server.client().await;
    let daemons = start_daemons(&mut client, "expiry").await;
    client.close().await;
    assert_all_dead(&daemons, "the session expired");
}

#[tokio::test]
async fn a_double_forked_setsid_grandchild_is_gone_after_sigterm_to_the_server() {
    let mut server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let daemons = start_daemons(&mut client, "sigterm").await;
    let base = containment(&mut client).await["cgroup"].clone();
    server.signal(Signal::SIGTERM);
    assert!(server.wait_exit(DEADLINE).success(), "{}", server.stderr());
    assert_all_dead(&daemons, "SIGTERM to the server");
    if let Some(base) = base.as_str() {
        assert!(
            !Path::new(base).exists(),
            "the server removed its cgroup {base}"
        );
    }
}

#[tokio::test]
async fn a_double_forked_setsid_grandchild_is_gone_after_sigkill_to_the_server() {
    let mut server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let daemons = start_daemons(&mut client, "sigkill").await;
    let base = containment(&mut client).await["cgroup"].clone();
    server.signal(Signal::SIGKILL);
    server.wait_exit(DEADLINE);
    assert_all_dead(&daemons, "SIGKILL to the server (the guardian's job)");
    if let Some(base) = base.as_str() {
        let started = Instant::now();
        while Path::new(base).exists() {
            assert!(
                started.elapsed() < DEADLINE,
                "the guardian removes the server's cgroup {base}"
            );
            std::thread::sleep(Duration::from_millis(10)); // polling interval
        }
    }
}

#[tokio::test]
async fn a_daemon_left_by_a_finished_command_lives_until_its_session_ends() {
    let server = ExecServer::start(&["--detached-session-ttl", "1"]);
    let mut client = server.client().await;
    let mark = mark();
    // The daemon lets go of the output, so the command closes while it runs on.
    let script = format!("( setsid sleep {mark} > /dev/null 2>&1 & ); echo started");
    let out = client.run("starter", &sh(&script), json!({})).await;
    assert_eq!((out.exit_code, reason(&out)), (Some(0), json!("exit")));
    let daemon = wait_for_daemon(&mark);
    assert!(
        !process_is_dead(daemon),
        "a closed command's daemon keeps running"
    );
    client.close().await;
    wait_process_dead(daemon, DEADLINE, "the daemon after its session expired");
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

/// The cgroup v2 leaf of a running process, from its pid (None without cgroup tracking).
fn leaf_of(pid: i32, base: &str) -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroup.lines().find_map(|line| line.strip_prefix("0::"))?;
    let name = Path::new(path).file_name()?;
    Some(Path::new(base).join(name))
}

fn procs_in(leaf: &Path) -> usize {
    std::fs::read_to_string(leaf.join("cgroup.procs"))
        .map(|procs| procs.lines().count())
        .unwrap_or(0)
}

/// `max` of the tree's `pids.events` (forks refused at `pids.max`), v2 or v1.
fn pids_refused(pid: i32, v2_leaf: &Path) -> Option<u64> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = cgroup
        .lines()
        .find_map(|line| line.split_once(":pids:").map(|(_, path)| path.to_owned()));
    let dir = match v1 {
        Some(path) => PathBuf::from(format!("/sys/fs/cgroup/pids{path}")),
        None => v2_leaf.to_owned(),
    };
    let events = std::fs::read_to_string(dir.join("pids.events")).ok()?;
    events
        .lines()
        .find_map(|line| line.strip_prefix("max ")?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_under_64_processes_ends_without_disturbing_a_neighbour_session() {
    let server = ExecServer::start(&[]);
    let mut neighbour = server.client().await;
    let mut bomber = server.client().await;
    let report = containment(&mut bomber).await;
    let Some(base) = report["cgroup"].as_str().map(str::to_owned) else {
        tests::skip_unless_ci(&format!("no cgroup v2 tracking on this host ({report})"));
        return;
    };
    if report["limits"]["processes"] == "none" {
        tests::skip_unless_ci(&format!("no pids controller on this host ({report})"));
        return;
    }
    // The neighbour ticks every 100 ms, in a session of its own.
    neighbour
        .start(
            "ticks",
            &sh("i=0; while [ $i -lt 70 ]; do echo tick; sleep 0.1; i=$((i+1)); done"),
            json!({}),
        )
        .await
        .unwrap();
    neighbour.wait_for_output("ticks", "tick").await;
    let ticks = tokio::spawn(async move {
        let mut times = Vec::new();
        loop {
            let n = neighbour
                .wait_for_notification("a tick", DEADLINE, |n| n["params"]["processId"] == "ticks")
                .await;
            if n["method"] == "process/exited" {
                return times;
            }
            let chunk = tests::unb64(n["params"]["chunk"].as_str().unwrap_or_default());
            let now = Instant::now();
            times.extend(String::from_utf8_lossy(&chunk).matches("tick").map(|_| now));
        }
    });
    // Every copy starts copies of itself forever; at the limit bash retries each failed fork
    // (silently here) and the copies go on trying until the wall time ends them.
    let started = bomber
        .start(
            "bomb",
            &[
                "/bin/bash",
                "-c",
                "echo leader $$; exec 2>/dev/null; b() { while :; do b & done; }; b",
            ],
            json!({"limits": {"processes": 64, "wallSeconds": 3}}),
        )
        .await
        .unwrap();
    let bomb_began = Instant::now();
    let applied = &started["limits"]["processes"];
    assert_eq!(applied["value"], 64, "{started}");
    assert!(
        ["cgroupV1", "cgroupV2"].contains(&applied["enforcement"].as_str().unwrap()),
        "{started}"
    );
    let text = bomber.wait_for_output("bomb", "leader").await;
    let leader: i32 = text
        .split_whitespace()
        .nth(1)
        .and_then(|pid| pid.parse().ok())
        .unwrap();
    let leaf = leaf_of(leader, &base).expect("the bomb's leaf");
    let refused_at_start = pids_refused(leader, &leaf);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let done = done.clone();
        move || {
            let (mut most, mut refused) = (0, None);
            while !done.load(Ordering::Relaxed) {
                most = most.max(procs_in(&leaf));
                refused = pids_refused(leader, &leaf).or(refused);
                std::thread::sleep(Duration::from_millis(5)); // sampling interval
            }
            (most, refused)
        }
    });
    let out = bomber.collect_within("bomb", Duration::from_secs(30)).await;
    let bomb_ended = Instant::now();
    done.store(true, Ordering::Relaxed);
    assert_eq!(reason(&out), "wallTimeout", "{:?}", out.events);
    let (most, refused) = sampler.join().unwrap();
    assert!(
        (48..=64).contains(&most),
        "the bomb filled its 64 processes and no more (most seen at once: {most})"
    );
    assert!(
        refused > refused_at_start,
        "forks were refused at pids.max ({refused_at_start:?} -> {refused:?})"
    );
    let times = ticks.await.unwrap();
    // Every tick from just before the bomb to just after it, so the gaps cover its whole life.
    let window: Vec<_> = times
        .iter()
        .filter(|t| **t + Duration::from_millis(500) >= bomb_began)
        .filter(|t| **t <= bomb_ended + Duration::from_millis(500))
        .collect();
    let worst = window
        .windows(2)
        .map(|pair| pair[1].duration_since(*pair[0]))
        .max()
        .unwrap_or_default();
    let lasted = bomb_ended - bomb_began;
    println!(
        "bomb lasted {lasted:?}, most {most} processes; neighbour: {} ticks, worst gap {worst:?}",
        window.len()
    );
    assert!(
        window.len() >= 20 && worst < Duration::from_secs(1),
        "the neighbour kept ticking every 100 ms while the bomb ran ({lasted:?}): {} ticks, \
         worst gap {worst:?}",
        window.len()
    );
}

#[tokio::test]
async fn a_memory_hog_under_64_mib_is_killed_and_reported_as_oom() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let report = containment(&mut client).await;
    if report["limits"]["memoryBytes"] == "none" {
        tests::skip_unless_ci(&format!("no memory controller on this host ({report})"));
        return;
    }
    for mode in [Mode::Plain, Mode::Sandboxed] {
        let mut extra = mode.extra();
        extra["limits"] = json!({"memoryBytes": 64 << 20});
        let id = format!("hog-{}", mode.id());
        // The shell keeps 200 MB of command-substitution output in memory.
        let script = "echo before; x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo after";
        let started = client.start(&id, &sh(script), extra).await.unwrap();
        assert_eq!(
            started["limits"]["memoryBytes"]["scope"], "tree",
            "{started}"
        );
        let out = client.collect_within(&id, Duration::from_secs(60)).await;
        assert_eq!(reason(&out), "oom", "{mode:?}: {:?}", out.events);
        assert_eq!(
            out.stdout_text(),
            "before\n",
            "{mode:?}: output before the kill, in full"
        );
    }
}

/// The `usage` of the process's `process/exited`.
fn usage(out: &ProcessOutput) -> Value {
    out.events
        .iter()
        .find(|e| e["method"] == "process/exited")
        .map(|e| e["params"]["usage"].clone())
        .unwrap_or_else(|| panic!("no process/exited in {:?}", out.events))
}

#[tokio::test]
async fn exited_reports_what_the_tree_used_cpu_wall_and_memory() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let memory_limits = containment(&mut client).await["limits"]["memoryBytes"] != "none";
    assert!(
        memory_limits,
        "this host enforces memory limits with cgroups (CI's does)"
    );
    // 100 MiB touched, then about 0.3 s of CPU, in a child of the leader (the tree counts).
    let hog = "python3 -c 'x = bytearray(100 << 20); n = 0\nfor i in range(4000000): n += i'";
    for mode in [Mode::Plain, Mode::Pty, Mode::Sandboxed] {
        let mut extra = mode.extra();
        extra["limits"] = json!({"memoryBytes": 512 << 20});
        let id = format!("usage-{}", mode.id());
        let out = client.run(&id, &sh(&format!("{hog}; true")), extra).await;
        assert_eq!(out.exit_code, Some(0), "{mode:?}: {:?}", out.events);
        let used = usage(&out);
        let cpu = used["cpuMillis"].as_u64().expect("cpuMillis");
        let wall = used["wallMillis"].as_u64().expect("wallMillis");
        assert!(cpu >= 150, "{mode:?}: the loop's CPU is counted: {used}");
        assert!(
            wall >= cpu / 2,
            "{mode:?}: wall time covers the run: {used}"
        );
        let peak = used["peakMemoryBytes"].as_u64().expect("peakMemoryBytes");
        assert!(peak >= 100 << 20, "{mode:?}: the tree's peak: {used}");
        if !matches!(mode, Mode::Sandboxed) {
            // A direct child of the server: its reaped descendants' largest RSS.
            let rss = used["maxRssBytes"].as_u64().expect("maxRssBytes");
            assert!(rss >= 100 << 20, "{mode:?}: {used}");
        }
        // process/read says the same after the fact.
        let read = client
            .call("process/read", json!({"processId": id, "afterSeq": 0}))
            .await;
        assert_eq!(read["exitUsage"], used, "{read}");
        // Control: a process that does nothing uses little.
        let id = format!("idle-{}", mode.id());
        let out = client.run(&id, &["true"], mode.extra()).await;
        let idle = usage(&out);
        assert!(
            idle["cpuMillis"].as_u64().expect("cpuMillis") < cpu,
            "{mode:?}: {idle} against {used}"
        );
        if let Some(rss) = idle["maxRssBytes"].as_u64() {
            assert!(rss < 50 << 20, "{mode:?}: {idle}");
        }
    }
}

#[tokio::test]
async fn a_cpu_loop_under_one_cpu_second_ends_with_cpu_limit() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for mode in [Mode::Plain, Mode::Sandboxed] {
        let mut extra = mode.extra();
        extra["limits"] = json!({"cpuSeconds": 1});
        let id = format!("spin-{}", mode.id());
        let began = Instant::now();
        client
            .start(&id, &sh("echo spinning; while :; do :; done"), extra)
            .await
            .unwrap();
        let out = client.collect_within(&id, Duration::from_secs(30)).await;
        assert_eq!(reason(&out), "cpuLimit", "{mode:?}: {:?}", out.events);
        assert_eq!(out.stdout_text(), "spinning\n", "{mode:?}");
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{mode:?}: {:?}",
            began.elapsed()
        );
    }
}

#[tokio::test]
async fn a_sleep_under_one_wall_second_ends_with_wall_timeout() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for mode in Mode::ALL {
        let mut extra = mode.extra();
        extra["limits"] = json!({"wallSeconds": 1});
        let id = format!("nap-{}", mode.id());
        let began = Instant::now();
        client.start(&id, &["sleep", "30"], extra).await.unwrap();
        let out = client.collect(&id).await;
        let took = began.elapsed();
        assert_eq!(reason(&out), "wallTimeout", "{mode:?}: {:?}", out.events);
        assert_eq!(out.signal, Some(9), "{mode:?}");
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(6),
            "{mode:?}: ended after {took:?}"
        );
    }
}

#[tokio::test]
async fn output_written_before_a_limit_killed_the_process_is_delivered_in_full() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let script = "head -c 300000 /dev/zero | tr '\\0' x; echo; echo written; exec sleep 60";
    let modes = [
        ("plain", json!({})),
        ("pty", json!({"tty": true})),
        ("sandboxed", json!({"sandbox": {"profile": "read-only"}})),
        (
            "sandboxed-pty",
            json!({"tty": true, "sandbox": {"profile": "read-only"}}),
        ),
    ];
    for (id, mut extra) in modes {
        extra["limits"] = json!({"wallSeconds": 2});
        client.start(id, &sh(script), extra).await.unwrap();
        let out = client.collect_within(id, Duration::from_secs(20)).await;
        assert_eq!(reason(&out), "wallTimeout", "{id}: {:?}", out.events);
        let text = String::from_utf8_lossy(if out.pty.is_empty() {
            &out.stdout
        } else {
            &out.pty
        })
        .into_owned();
        assert_eq!(
            text.matches('x').count(),
            300_000,
            "{id}: every byte written arrived"
        );
        assert!(
            text.contains("written"),
            "{id}: {:?}",
            &text[text.len().saturating_sub(40)..]
        );
    }
}

#[tokio::test]
async fn rlimits_bound_file_size_and_open_files_sandboxed_or_not() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let dir = tempfile::Builder::new()
        .prefix("ew-contain-")
        .tempdir_in("/tmp")
        .unwrap();
    let file = dir.path().join("big");
    let script = "ulimit -n; ulimit -t; head -c 5000 /dev/zero > big; echo status $?";
    let cwd = tests::file_uri(dir.path());
    let sandbox = json!({"profile": "workspace-write", "cwd": cwd});
    for (id, mut extra) in [
        ("plain", json!({})),
        ("sandboxed", json!({"sandbox": sandbox})),
    ] {
        extra["cwd"] = json!(cwd);
        extra["limits"] = json!({"fileSizeBytes": 1000, "openFiles": 77, "cpuSeconds": 30});
        let started = client.start(id, &sh(script), extra).await.unwrap();
        assert_eq!(
            started["limits"]["openFiles"]["enforcement"], "rlimit",
            "{started}"
        );
        let out = client.collect(id).await;
        // head dies of SIGXFSZ (25) at the limit: 128 + 25.
        assert_eq!(
            out.stdout_text(),
            "77\n30\nstatus 153\n",
            "{id}: {:?}",
            out.events
        );
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 1000, "{id}");
        std::fs::remove_file(&file).unwrap();
    }
}

#[tokio::test]
async fn limits_that_cannot_be_enforced_fail_the_start_unless_best_effort() {
    let server = ExecServer::start(&["--no-cgroups"]);
    let mut client = server.client().await;
    let report = containment(&mut client).await;
    assert_eq!(report["tracking"], "processGroup", "{report}");
    assert_eq!(report["limits"]["processes"], "none", "{report}");
    let error = assert_rpc_error(
        client
            .start("p", &["true"], json!({"limits": {"processes": 64}}))
            .await,
        -32600,
        "unsupported",
    );
    assert!(
        error.message.contains("limits.processes (64)") && error.message.contains("bestEffort"),
        "{}",
        error.message
    );
    let started = client
        .start(
            "q",
            &sh("ulimit -v"),
            json!({"limits": {"processes": 64, "memoryBytes": 1 << 30, "bestEffort": true}}),
        )
        .await
        .unwrap();
    assert_eq!(
        started["limits"]["processes"]["enforcement"], "none",
        "{started}"
    );
    assert_eq!(
        started["limits"]["memoryBytes"]["enforcement"], "rlimit",
        "{started}"
    );
    let out = client.collect("q").await;
    assert_eq!(out.stdout_text(), "1048576\n", "RLIMIT_AS in KiB");
    // A misspelt limit is refused, not ignored; a zero one too.
    assert_rpc_error(
        client
            .start("r", &["true"], json!({"limits": {"memoryByte": 1}}))
            .await,
        -32602,
        "invalidParams",
    );
    assert_rpc_error(
        client
            .start("s", &["true"], json!({"limits": {"openFiles": 0}}))
            .await,
        -32602,
        "invalidParams",
    );
}

#[tokio::test]
async fn default_limits_apply_to_every_start_and_a_start_overrides_them() {
    let server = ExecServer::start(&["--default-limits", "openFiles=99,wallSeconds=600"]);
    let mut client = server.client().await;
    let report = containment(&mut client).await;
    assert_eq!(
        report["defaultLimits"],
        json!({"openFiles": 99, "wallSeconds": 600}),
        "{report}"
    );
    let started = client
        .start("d", &sh("ulimit -n"), json!({}))
        .await
        .unwrap();
    assert_eq!(started["limits"]["wallSeconds"]["value"], 600, "{started}");
    assert_eq!(client.collect("d").await.stdout_text(), "99\n");
    client
        .start("o", &sh("ulimit -n"), json!({"limits": {"openFiles": 55}}))
        .await
        .unwrap();
    assert_eq!(client.collect("o").await.stdout_text(), "55\n");
    let refused =
        ExecServer::run_expecting_exit(&["--no-cgroups", "--default-limits", "processes=10"]);
    assert!(!refused.status.success());
    assert!(
        refused
            .stderr
            .contains("limits.processes (10) cannot be enforced"),
        "{}",
        refused.stderr
    );
    let bad = ExecServer::run_expecting_exit(&["--default-limits", "memory=1G"]);
    assert!(
        bad.stderr.contains("\"memory=1G\" names no limit"),
        "{}",
        bad.stderr
    );
}

#[tokio::test]
async fn environment_info_says_how_trees_are_contained_here() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let report = containment(&mut client).await;
    // The pool bounds hold in a sandbox only: nothing here enforces them without one.
    for pool in [
        "inotifyInstances",
        "inotifyWatches",
        "pendingSignals",
        "messageQueueBytes",
        "ptys",
    ] {
        assert_eq!(report["limits"][pool], "none", "{pool}: {report}");
    }
    let v2 = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains(" - cgroup2 ");
    if !v2 {
        println!("no cgroup v2 hierarchy here: expecting process groups ({report})");
        assert_eq!(report["tracking"], "processGroup", "{report}");
        return;
    }
    assert_eq!(report["tracking"], "cgroupV2", "{report}");
    let base = report["cgroup"].as_str().unwrap();
    assert!(Path::new(base).join("cgroup.kill").exists(), "{report}");
    assert_eq!(report["limits"]["wallSeconds"], "timer");
    assert_eq!(report["limits"]["cpuSeconds"], "cgroupV2");
    // The server's children are in its cgroup; the server itself is not.
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", server.pid())).unwrap();
    assert!(!own.contains("execward-"), "{own}");
}

// ---------------------------------------------------------------------------------------------
// Never kill what is not ours
// ---------------------------------------------------------------------------------------------

/// Start `setsid sleep MARK` as pid `target` (the kernel hands out the pid after
/// `ns_last_pid`); None when another process took the number first.
fn spawn_with_pid(target: i32, mark: &str) -> Option<std::process::Child> {
    use std::os::unix::process::CommandExt;
    std::fs::write("/proc/sys/kernel/ns_last_pid", (target - 1).to_string()).ok()?;
    let mut command = std::process::Command::new("sleep");
    command.arg(mark);
    // SAFETY: setsid is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = command.spawn().ok()?;
    if i32::try_from(child.id()).ok() == Some(target) {
        return Some(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

async fn a_recycled_leader_pid_survives_the_servers_exit(args: &[&str]) {
    let mut server = ExecServer::start(args);
    let mut client = server.client().await;
    // The leader prints its pid and exits; the daemon it started keeps the output open, so the
    // process is exited but not closed.
    let daemon_mark = mark();
    let script = format!("setsid sleep {daemon_mark} & echo $$");
    client
        .start("leader", &sh(&script), json!({}))
        .await
        .unwrap();
    let text = client.wait_for_output("leader", "\n").await;
    let leader: i32 = text.trim().parse().unwrap();
    client
        .wait_for_notification("the leader's exit", DEADLINE, |n| {
            n["method"] == "process/exited"
        })
        .await;
    assert!(process_is_dead(leader));
    // An unrelated process group takes the reaped leader's number.
    let victim_mark = mark();
    let mut victim = None;
    for _ in 0..50 {
        victim = spawn_with_pid(leader, &victim_mark);
        if victim.is_some() {
            break;
        }
    }
    let _cleanup = KillMarked(daemon_mark.clone());
    let Some(mut victim) = victim else {
        println!("skipped: pid {leader} was taken by another process 50 times in a row");
        return;
    };
    assert_eq!(
        nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(leader)))
            .unwrap()
            .as_raw(),
        leader
    );
    let guardian = descendants(server.pid())
        .into_iter()
        .find(|pid| tests::cmdline(*pid).contains("exec-guardian"))
        .expect("the guardian");
    server.signal(Signal::SIGTERM);
    server.wait_exit(DEADLINE);
    wait_process_dead(guardian, DEADLINE, "the guardian, once it acted");
    let alive = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    for pid in tests::sleeping(&daemon_mark) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(
        alive,
        "the process group that recycled pid {leader} was killed ({args:?})"
    );
}

#[tokio::test]
async fn a_reaped_leaders_recycled_pid_survives_the_servers_exit() {
    a_recycled_leader_pid_survives_the_servers_exit(&[]).await;
}

#[tokio::test]
async fn a_reaped_leaders_recycled_pid_survives_the_servers_exit_without_cgroups() {
    a_recycled_leader_pid_survives_the_servers_exit(&["--no-cgroups"]).await;
}

// ---------------------------------------------------------------------------------------------
// Without cgroups
// ---------------------------------------------------------------------------------------------

/// Kills every `sleep MARK` on drop.
struct KillMarked(String);

impl Drop for KillMarked {
    fn drop(&mut self) {
        for pid in tests::sleeping(&self.0) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[tokio::test]
async fn without_cgroups_orphans_come_back_to_the_server_and_die_at_its_shutdown() {
    let mut server = ExecServer::start(&["--no-cgroups"]);
    let mut client = server.client().await;
    let mark = mark();
    client
        .start("p", &sh(&daemon_script(&mark)), json!({}))
        .await
        .unwrap();
    client.wait_for_output("p", "ready").await;
    let daemon = wait_for_daemon(&mark);
    // Without a cgroup a failed test would leave the daemon behind: kill it then.
    let _cleanup = KillMarked(mark.clone());
    assert!(
        descendants(server.pid()).contains(&daemon),
        "the orphan was re-parented to the server (child subreaper)"
    );
    // Terminate reaches the process group only: the daemon left it (and keeps the output open,
    // so the process exits but does not close).
    client
        .call("process/terminate", json!({"processId": "p"}))
        .await;
    let exited = client
        .wait_for_notification("exited", DEADLINE, |n| n["method"] == "process/exited")
        .await;
    assert_eq!(exited["params"]["reason"], "terminated", "{exited}");
    assert!(
        !process_is_dead(daemon),
        "documented: without a cgroup terminate misses it"
    );
    server.signal(Signal::SIGTERM);
    assert!(server.wait_exit(DEADLINE).success());
    wait_process_dead(daemon, DEADLINE, "the orphan after the server's shutdown");
}

// ---------------------------------------------------------------------------------------------
// sandbox-run's own flags
// ---------------------------------------------------------------------------------------------

fn sandbox_run() -> PathBuf {
    tests::exec_server_binary().with_file_name("sandbox-run")
}

#[test]
fn sandbox_run_sets_rlimits_and_kills_at_its_wall_time() {
    let output = std::process::Command::new(sandbox_run())
        .args([
            "--policy",
            "read-only",
            "--cpu-time",
            "7",
            "--memory",
            "512M",
            "--",
        ])
        .args(["sh", "-c", "ulimit -t; ulimit -v"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "7\n524288\n");

    let began = Instant::now();
    let output = std::process::Command::new(sandbox_run())
        .args([
            "--policy",
            "read-only",
            "--wall-time",
            "1",
            "--",
            "sleep",
            "30",
        ])
        .output()
        .unwrap();
    let took = began.elapsed();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(output.status.signal(), Some(9), "{output:?}");
    assert!(took < Duration::from_secs(6), "{took:?}");

    if nix::unistd::geteuid().is_root() {
        let output = std::process::Command::new(sandbox_run())
            .args(["--policy", "read-only", "--pids", "10", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(125), "{output:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--pids cannot be enforced"),
            "{output:?}"
        );
    }
}
