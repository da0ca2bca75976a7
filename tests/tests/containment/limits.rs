//! Limits: processes, memory, CPU and wall time, rlimits, defaults and best effort, what
//! `environment/info` says; and `sandbox-run`'s own limit flags.

use super::*;

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
