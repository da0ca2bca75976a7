//! Whole trees: nothing a command leaves behind survives its end, the server never kills what
//! is not its own (a recycled pid), and without cgroups orphans come back to the server.

use super::*;

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

/// The v1 `cpu` cgroup of `pid` (`None` where the cpu controller is not a v1 hierarchy, or the
/// process is gone).
fn v1_cpu_cgroup(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|controller| controller == "cpu")
            .then(|| path.to_owned())
    })
}

/// Every process of a tree weighs in the server's one CPU group (v1 `cpu` hosts), children the
/// command forked at once included: a plain start joins the group just after its start (off
/// the reply's path, see `containment::Tree::join_cpu_group`), so what the command forked
/// before it moved must be moved too. Plain, PTY and sandboxed (the launcher's PID 1 joins it
/// ahead) starts.
#[tokio::test]
async fn every_process_of_a_tree_ends_in_the_servers_cpu_group_children_forked_at_once_included() {
    let server = ExecServer::start(&[]);
    let Some(own) = v1_cpu_cgroup(server.pid()) else {
        tests::skip_unless_ci("the cpu controller is not a cgroup v1 hierarchy here");
        return;
    };
    let mut client = server.client().await;
    let mark = mark();
    for mode in Mode::ALL {
        let id = format!("cpu-{}", mode.id());
        // Three children forked at once, likely before the command was moved; they sleep, so
        // they are alive while checked.
        let script = format!("sleep {mark} & sleep {mark} & sleep {mark} & wait");
        let mut params = json!({
            "processId": id, "argv": ["/bin/sh", "-c", script],
            "cwd": "/tmp", "env": {"PATH": "/usr/bin:/bin"},
        });
        for (key, value) in mode.extra().as_object().unwrap() {
            params[key] = value.clone();
        }
        client.call("process/start", params).await;
        let started = Instant::now();
        loop {
            let sleepers: Vec<i32> = descendants(server.pid())
                .into_iter()
                .filter(|pid| tests::cmdline(*pid).contains(&format!("sleep {mark}")))
                .collect();
            let groups: Vec<Option<String>> =
                sleepers.iter().map(|pid| v1_cpu_cgroup(*pid)).collect();
            let all_in_one_group = sleepers.len() >= 3
                && groups.iter().all(|group| {
                    group.as_ref().is_some_and(|group| {
                        group != &own
                            && group.starts_with(&format!("{own}/execward-").replace("//", "/"))
                    })
                });
            if all_in_one_group {
                break;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "{mode:?}: the tree's processes {sleepers:?} are in cpu cgroups {groups:?}, not \
                 the server's group below {own}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
        }
        client
            .call("process/terminate", json!({"processId": id}))
            .await;
        client.collect(&id).await;
    }
}
