//! One command over one connection: streams and status, stdin, env, cwd, the token, the close
//! handshake and dropped connections.

use super::*;

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
    // Without a token, another user than the server's (the server's own needs none).
    tests::require_root("exec runs as uid 65534 against a root server");
    let base = tests::scratch::scratch_dir("exec-token-");
    let bin = base.path().join("bin");
    tests::install_binaries(&bin);
    let mut as_nobody = Command::new(bin.join("exec-server"));
    as_nobody
        .args([
            "exec",
            "--connect",
            server.url(),
            "--cwd",
            "/",
            "--",
            "/bin/true",
        ])
        .current_dir("/");
    {
        use std::os::unix::process::CommandExt;
        as_nobody.uid(65534).gid(65534);
    }
    let (status, _, stderr) = output_within(&mut as_nobody, b"");
    assert_eq!(status.code(), Some(255));
    assert!(
        stderr.contains("none was sent")
            && stderr.contains("uid 65534")
            && stderr.contains("pass --token-file FILE"),
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
