//! `exec-server exec` as people and scripts use it: the real binary as a client of a real
//! server, with pipes or (for `--tty`) a PTY driving it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use tests::*;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

fn exec(url: &str, extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", url, "--cwd", "/"])
        .args(extra)
        .arg("--")
        .args(command);
    cmd
}

#[test]
fn stdout_and_stderr_land_on_their_streams_and_the_status_is_the_remote_one() {
    let server = server();
    let (status, stdout, stderr) = output_within(
        &mut exec(server.url(), &[], &sh("echo out; echo err >&2; exit 3")),
        b"",
    );
    assert_eq!(status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(stdout, "out\n");
    assert_eq!(stderr, "err\n");
}

#[test]
fn sandbox_workspace_write_uses_the_command_cwd_as_its_workspace() {
    let server = server();
    // Neither directory is under a profile's writable roots (/tmp, $TMPDIR).
    let base = tests::scratch::scratch_dir("exec-sandbox-");
    let workspace = base.path().join("ws");
    let outside = base.path().join("outside");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::create_dir(&outside).unwrap();
    tests::scratch::assert_outside_writable_roots(&outside);
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", server.url(), "--sandbox", "workspace-write"])
        .arg("--cwd")
        .arg(&workspace)
        .arg("--")
        .args(sh(&format!(
            "echo in > inside.txt && echo wrote-inside; echo out > {}/escaped.txt || echo denied-outside",
            outside.display()
        )));
    let (status, stdout, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stdout, "wrote-inside\ndenied-outside\n", "stderr: {stderr}");
    assert_eq!(
        std::fs::read(workspace.join("inside.txt")).unwrap(),
        b"in\n"
    );
    assert!(
        !outside.join("escaped.txt").exists(),
        "the sandboxed write outside the workspace landed"
    );
}

#[test]
fn stdin_is_forwarded_and_its_end_closes_the_remote_stdin() {
    let server = server();
    let (status, stdout, _) =
        output_within(&mut exec(server.url(), &[], &["/bin/cat"]), b"piped in\n");
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "piped in\n");
}

#[test]
fn a_signal_death_is_128_plus_n_and_env_is_passed() {
    let server = server();
    let (status, stdout, _) = output_within(
        &mut exec(
            server.url(),
            &["--clear-env", "--env", "GREETING=hi there"],
            &sh("echo \"$GREETING\"; echo \"${HOME-unset}\"; kill -TERM $$"),
        ),
        b"",
    );
    assert_eq!(stdout, "hi there\nunset\n");
    assert_eq!(status.code(), Some(143));
}

#[test]
fn a_wrong_token_fails_with_255_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "right").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "wrong").unwrap();
    let server = ExecServer::start(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--auth-token-file",
        token.to_str().unwrap(),
    ]);
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--token-file", wrong.to_str().unwrap()],
            &["/bin/true"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(255));
    assert!(
        stderr.contains("401 Unauthorized") && stderr.contains("check that --token-file holds"),
        "{stderr}"
    );
    let (status, _, stderr) = output_within(&mut exec(server.url(), &[], &["/bin/true"]), b"");
    assert_eq!(status.code(), Some(255));
    assert!(
        stderr.contains("none was sent") && stderr.contains("pass --token-file FILE"),
        "{stderr}"
    );
    let (status, _, _) = output_within(
        &mut exec(
            server.url(),
            &["--token-file", token.to_str().unwrap()],
            &["/bin/true"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0));
}

#[test]
fn tty_with_stdin_not_a_terminal_runs_on_pipes_and_says_so() {
    // Before: `--tty -- bash` with stdin from a pipe or /dev/null waited forever.
    let server = server();
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--tty"],
            &sh("if test -t 0; then echo terminal; else echo pipes; fi"),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stdout, "pipes\n");
    assert!(stderr.contains("stdin is not a terminal"), "{stderr}");
    let (status, stdout, _) = output_within(
        &mut exec(server.url(), &["--tty"], &["bash"]),
        b"echo from-stdin\n",
    );
    assert_eq!(status.code(), Some(0));
    assert_eq!(stdout, "from-stdin\n");
}

#[test]
fn exec_closes_its_websocket_with_a_close_handshake() {
    let server = ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env("RUST_LOG", "supervisor::rpc=debug");
    });
    let (status, stdout, _) =
        output_within(&mut exec(server.url(), &[], &["/bin/echo", "hi"]), b"");
    assert_eq!((status.code(), stdout.as_str()), (Some(0), "hi\n"));
    // The server logs how the connection ended: a close frame, or a WARN for a reset.
    let started = Instant::now();
    let log = loop {
        let log = server.stderr();
        if log.contains("the client closed the connection") || log.contains("closing connection") {
            break log;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the server logged no end of the connection within {DEADLINE:?}:\n{log}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10)); // polling interval, not a wait
    };
    assert!(log.contains("the client closed the connection"), "{log}");
    assert!(!log.contains("without closing handshake"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_survives_dropped_connections_without_losing_output() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let script =
        "i=0; while [ $i -lt 60 ]; do echo line$i; i=$((i+1)); /bin/sleep 0.02; done; exit 7";
    let mut child = exec(&proxy.url(), &[], &sh(script))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (lines_tx, lines) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut buffer = [0u8; 4096];
        loop {
            match stdout.read(&mut buffer) {
                Ok(0) | Err(_) => return all,
                Ok(n) => {
                    all.push_str(&String::from_utf8_lossy(&buffer[..n]));
                    let _ = lines_tx.send(all.clone());
                }
            }
        }
    });
    for needle in ["line10\n", "line30\n", "line45\n"] {
        let started = Instant::now();
        loop {
            let seen = lines
                .recv_timeout(DEADLINE.saturating_sub(started.elapsed()))
                .unwrap_or_else(|_| panic!("{needle:?} never printed"));
            if seen.contains(needle) {
                break;
            }
        }
        proxy.cut();
    }
    let status = tokio::task::spawn_blocking(move || wait_child(&mut child, DEADLINE))
        .await
        .unwrap();
    let all = reader.join().unwrap();
    let expected: String = (0..60).map(|i| format!("line{i}\n")).collect();
    assert_eq!(all, expected, "every line exactly once, in order");
    assert_eq!(status.code(), Some(7));
    assert!(proxy.accepted() >= 4, "the connection was really cut");
}

/// `exec-server exec --tty` on the slave side of a fresh PTY; returns the child and the master.
fn exec_on_pty(url: &str, command: &[&str], cols: u16, rows: u16) -> (Child, OwnedFd) {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFD).unwrap();
    nix::fcntl::fcntl(
        &pty.master,
        nix::fcntl::FcntlArg::F_SETFD(
            nix::fcntl::FdFlag::from_bits_truncate(flags) | nix::fcntl::FdFlag::FD_CLOEXEC,
        ),
    )
    .unwrap();
    let slave = pty.slave;
    let child = exec(url, &["--tty"], command)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    (child, pty.master)
}

/// Everything read from the PTY master, sent as it grows.
fn read_master(master: &OwnedFd) -> mpsc::Receiver<String> {
    let mut file = std::fs::File::from(master.try_clone().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = file.read(&mut buffer) {
            if n == 0 {
                return;
            }
            all.push_str(&String::from_utf8_lossy(&buffer[..n]));
            if tx.send(all.clone()).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_text(rx: &mpsc::Receiver<String>, needle: &str, count: usize) -> String {
    let started = Instant::now();
    loop {
        let text = rx
            .recv_timeout(DEADLINE.saturating_sub(started.elapsed()))
            .unwrap_or_else(|_| {
                panic!("{needle:?} x{count} not seen on the terminal within {DEADLINE:?}")
            });
        if text.matches(needle).count() >= count {
            return text;
        }
    }
}

fn type_keys(master: &OwnedFd, bytes: &[u8]) {
    nix::unistd::write(master.as_fd(), bytes).unwrap();
}

#[test]
fn tty_cat_echoes_input_and_ctrl_d_ends_it() {
    let server = server();
    let (mut child, master) = exec_on_pty(server.url(), &["/bin/cat"], 80, 24);
    let screen = read_master(&master);
    type_keys(&master, b"hello\r");
    // Once from the remote terminal's echo, once from cat.
    wait_text(&screen, "hello", 2);
    type_keys(&master, b"\x04");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(0));
}

#[test]
fn tty_ctrl_c_interrupts_the_remote_program() {
    let server = server();
    let (mut child, master) = exec_on_pty(server.url(), &sh("echo ready; exec /bin/cat"), 80, 24);
    let screen = read_master(&master);
    wait_text(&screen, "ready", 1);
    type_keys(&master, b"\x03");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(130), "SIGINT in the remote terminal");
}

#[test]
fn tty_window_size_is_forwarded_at_start_and_on_sigwinch() {
    let server = server();
    let script = "trap 'stty size' WINCH; stty size; echo ready; while :; do /bin/sleep 0.05; done";
    let (mut child, master) = exec_on_pty(server.url(), &sh(script), 100, 30);
    let screen = read_master(&master);
    let started = wait_text(&screen, "ready", 1);
    assert!(
        started.contains("30 100"),
        "initial size not forwarded: {started:?}"
    );
    set_window_size(&master, 120, 40);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    wait_text(&screen, "40 120", 1);
    type_keys(&master, b"\x03");
    let status = wait_child(&mut child, DEADLINE);
    assert_eq!(status.code(), Some(130));
}

fn set_window_size(master: &OwnedFd, cols: u16, rows: u16) {
    use std::os::fd::AsRawFd;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at a live local.
    let status = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(status, 0, "TIOCSWINSZ");
}

#[test]
fn without_cwd_the_remote_command_runs_in_the_local_current_directory() {
    let server = server();
    let dir = tests::scratch::scratch_dir("exec-cwd-");
    let here = std::fs::canonicalize(dir.path()).unwrap();
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", server.url(), "--", "/bin/pwd"])
        .current_dir(&here);
    let (status, stdout, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stdout, format!("{}\n", here.display()), "stderr: {stderr}");
}

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

#[test]
fn exec_says_which_limit_ended_the_command() {
    let server = server();
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--limits", "wallSeconds=1"],
            &["sleep", "30"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("killed: wall-clock limit reached (limit 1 s)"),
        "{stderr}"
    );
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--limits", "memoryBytes=64M"],
            &["python3", "-c", "x = bytearray(512 * 1024 * 1024)"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("killed: out of memory (limit 64 MiB)"),
        "{stderr}"
    );
    // A normal exit says nothing more.
    let (status, _, stderr) = output_within(&mut exec(server.url(), &[], &["true"]), b"");
    assert_eq!(status.code(), Some(0));
    assert_eq!(stderr, "");
}

#[test]
fn sandbox_takes_a_json_object() {
    let server = server();
    let base = tests::scratch::scratch_dir("exec-sandbox-json-");
    let target = base.path().join("written.txt");
    tests::scratch::assert_outside_writable_roots(base.path());
    let script = format!("echo x > {} || echo denied", target.display());
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", r#"{"type":"read-only"}"#],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "denied\n", "{stderr}");
    assert!(!target.exists(), "the read-only sandbox let the write land");
    // Control: unsandboxed, the same write lands.
    let (status, _, stderr) = output_within(&mut exec(server.url(), &[], &sh(&script)), b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(target.exists());
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", "{not json"], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(255));
    assert!(stderr.contains("not valid JSON"), "{stderr}");
}

#[test]
fn a_missing_or_unexecutable_program_exits_127_or_126_as_under_sandbox_run() {
    let server = server();
    for sandbox in [&[][..], &["--sandbox", "read-only"][..]] {
        let (status, _, stderr) = output_within(
            &mut exec(server.url(), sandbox, &["no-such-program-x"]),
            b"",
        );
        assert_eq!(status.code(), Some(127), "{sandbox:?}: {stderr}");
        let (status, _, stderr) =
            output_within(&mut exec(server.url(), sandbox, &["/etc/passwd"]), b"");
        assert_eq!(status.code(), Some(126), "{sandbox:?}: {stderr}");
    }
    // A missing working directory is exec's own failure, not the program's.
    let mut cmd = Command::new(exec_server_binary());
    cmd.args([
        "exec",
        "--connect",
        server.url(),
        "--cwd",
        "/no-such-dir-x",
        "--",
        "true",
    ]);
    let (status, _, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(255), "{stderr}");
}

#[test]
fn a_command_without_the_separator_gets_a_hint() {
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", "ws://127.0.0.1:9", "ls", "-la"]);
    let (status, _, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains("hint: the command goes after `--`"),
        "{stderr}"
    );
}

/// `exec` takes the policy forms and flags `sandbox-run` takes: a profile file, `--writable-root`,
/// `--deny`, `--allow`; each checked by what the command could do with and without it.
#[test]
fn sandbox_takes_a_profile_file_and_the_policy_flags_sandbox_run_takes() {
    let server = server();
    let base = tests::scratch::scratch_dir("exec-sandbox-flags-");
    tests::scratch::assert_outside_writable_roots(base.path());
    let profile = base.path().join("mine.toml");
    std::fs::write(
        &profile,
        "description = \"reads the system\"\n[filesystem]\n\":minimal\" = \"read\"\n",
    )
    .unwrap();
    let secret = base.path().join("secret.txt");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let target = base.path().join("written.txt");
    let script = format!(
        "cat {} 2>/dev/null || echo unreadable; echo x > {} 2>/dev/null || echo denied",
        secret.display(),
        target.display()
    );
    let file = profile.to_str().unwrap();
    let root = base.path().to_str().unwrap();
    let secret_arg = secret.to_str().unwrap();
    // The file's policy: only :minimal is readable, nothing writable.
    let (status, stdout, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", file], &sh(&script)),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "unreadable\ndenied\n", "{stderr}");
    assert!(
        !target.exists(),
        "the profile file's sandbox let the write land"
    );
    // --writable-root makes the scratch directory writable (and readable).
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", file, "--writable-root", root],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "s3cret\n", "{stderr}");
    assert!(
        target.exists(),
        "--writable-root did not make the root writable"
    );
    std::fs::remove_file(&target).unwrap();
    // --deny takes the one file back out of it, and only that file.
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &[
                "--sandbox",
                "workspace-write",
                "--writable-root",
                root,
                "--deny",
                secret_arg,
            ],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "unreadable\n", "{stderr}");
    assert!(
        target.exists(),
        "the write beside the denied file should land"
    );
    // A named allowance the server does not know is an error that names it and the known ones.
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", "read-only", "--allow", "toolchain-cachez"],
            &["true"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(
        stderr.contains("toolchain-cachez") && stderr.contains("toolchain-caches"),
        "{stderr}"
    );
    // A profile file that does not parse is reported before anything is sent.
    std::fs::write(&profile, "[filesystem]\n\"/\" = \"rwx\"\n").unwrap();
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", file], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(stderr.contains("mine.toml"), "{stderr}");
    // The flags need a sandbox to widen or narrow.
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--deny", secret_arg], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
}
