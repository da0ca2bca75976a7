//! Signals without a terminal, repeated interrupts, a killed exec and background children.

use super::*;

#[test]
fn sigint_sigterm_and_sighup_are_forwarded_to_the_remote_process_group_without_tty() {
    use nix::sys::signal::Signal;
    let server = server();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        let name = signal.as_str().trim_start_matches("SIG");
        // The child in the remote group (sleep) dies of the signal; the shell's trap reports it.
        let script = format!(
            "trap 'echo got-{name}; exit 7' {name}; echo ready; while :; do sleep 0.1; done"
        );
        let mut child = exec(server.url(), &[], &sh(&script))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            while stdout.read(&mut byte).unwrap_or(0) == 1 {
                seen.push(byte[0]);
                let _ = tx.send(String::from_utf8_lossy(&seen).into_owned());
            }
        });
        let wait_for = |needle: &str| {
            let deadline = Instant::now() + DEADLINE;
            loop {
                let remaining = deadline.saturating_duration_since(Instant::now());
                let seen = rx
                    .recv_timeout(remaining)
                    .unwrap_or_else(|_| panic!("{name}: no {needle:?} within {DEADLINE:?}"));
                if seen.contains(needle) {
                    return;
                }
            }
        };
        wait_for("ready\n");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        wait_for(&format!("got-{name}\n"));
        let status = wait_child(&mut child, DEADLINE);
        assert_eq!(
            status.code(),
            Some(7),
            "{name}: the remote shell's exit status"
        );
    }
}

/// Spawns exec with piped stdout/stderr and returns it once the remote command printed `ready`.
fn exec_until_ready(cmd: &mut Command) -> (Child, std::thread::JoinHandle<String>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !seen.ends_with(b"ready\n") {
        assert_eq!(
            stdout.read(&mut byte).unwrap(),
            1,
            "exec ended before ready"
        );
        seen.push(byte[0]);
    }
    (child, stderr)
}

fn wait_running(mark: &str) {
    let deadline = Instant::now() + DEADLINE;
    while sleeping(mark).is_empty() {
        assert!(Instant::now() < deadline, "sleep {mark} never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn wait_gone(mark: &str) {
    let deadline = Instant::now() + DEADLINE;
    while !sleeping(mark).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sleep {mark} still runs {DEADLINE:?} later: {:?}",
            sleeping(mark)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn three_interrupts_stop_a_command_that_ignores_them_and_leave_no_process() {
    use nix::sys::signal::Signal;
    let server = server();
    let mark = "307.25";
    let script = format!("trap '' INT TERM; echo ready; sleep {mark}; echo survived");
    let (mut child, stderr) = exec_until_ready(&mut exec(server.url(), &[], &sh(&script)));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    wait_running(mark);
    let started = Instant::now();
    for signal in [Signal::SIGINT, Signal::SIGINT, Signal::SIGTERM] {
        // The command ignores each one; exec must not.
        std::thread::sleep(std::time::Duration::from_millis(200));
        nix::sys::signal::kill(pid, signal).unwrap();
    }
    let status = wait_child(&mut child, DEADLINE);
    let stderr = stderr.join().unwrap();
    assert_eq!(status.code(), Some(137), "killed by SIGKILL: {stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "three interrupts took {:?}, longer than the termination grace",
        started.elapsed()
    );
    for said in [
        "forwarded to the command; interrupt again to terminate it",
        "terminating the command",
        "killing the command (SIGKILL)",
    ] {
        assert!(stderr.contains(said), "stderr lacks {said:?}: {stderr}");
    }
    wait_gone(mark);
}

#[test]
fn a_killed_exec_takes_its_remote_command_with_it() {
    let server = server();
    let mark = "308.25";
    let (mut child, _stderr) = exec_until_ready(&mut exec(
        server.url(),
        &[],
        &sh(&format!("echo ready; sleep {mark}")),
    ));
    wait_running(mark);
    child.kill().unwrap(); // SIGKILL: exec can do nothing about it
    child.wait().unwrap();
    let killed = Instant::now();
    wait_gone(mark);
    // exec asked for a 3 s detached TTL (enough to resume after a dropped connection); the
    // server's own is 30 s.
    assert!(
        killed.elapsed() < std::time::Duration::from_secs(8),
        "the command outlived exec by {:?}",
        killed.elapsed()
    );
}

#[test]
fn exec_returns_when_the_command_exits_even_if_a_background_child_holds_stdout() {
    let server = server();
    let mark = "309.25";
    let started = Instant::now();
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &[],
            &sh(&format!("(sleep {mark} &); echo done")),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stdout, "done\n");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "exec waited {:?} for a background holder of stdout",
        started.elapsed()
    );
    assert!(stderr.contains("stops waiting"), "{stderr}");
    // exec gone, its session gone: the background child too.
    wait_gone(mark);
}
