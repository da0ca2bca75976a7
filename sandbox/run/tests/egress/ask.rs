//! `--ask`: a question per unlisted destination, answered per connection or per process, refused
//! on deny, no answer or no terminal; the question socket never reaches the command.

use super::*;

/// What the asking peer (the test, standing where exec-server stands) does with each question
/// in turn: answer with this decision, or never answer.
type Plan = Vec<Option<&'static str>>;

/// Runs `script` under `--ask --ask-fd 3` with the test as the peer on descriptor 3, answering
/// by `plan`: returns the output, the questions received and how long the run took.
fn run_asking(
    ws: &Workspace,
    args: &[&str],
    script: &str,
    plan: Plan,
) -> (Output, Vec<serde_json::Value>, Duration) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let questions = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&questions);
    let peer = std::thread::spawn(move || {
        let mut reader = BufReader::new(ours.try_clone().unwrap());
        let mut writer = ours;
        let mut plan = plan.into_iter();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let question: serde_json::Value = serde_json::from_str(&line).unwrap();
            recorded.lock().unwrap().push(question.clone());
            if let Some(Some(decision)) = plan.next() {
                let answer = serde_json::json!({"id": question["id"], "decision": decision});
                let _ = writeln!(writer, "{answer}");
            }
        }
    });
    let mut all = vec!["--ask", "--ask-fd", "3"];
    all.extend_from_slice(args);
    let mut command = ws.command(&all, &["sh", "-c", script]);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let began = Instant::now();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(theirs);
    let output = wait_output(child, DEADLINE * 3);
    let elapsed = began.elapsed();
    peer.join().unwrap();
    let questions = questions.lock().unwrap().clone();
    (output, questions, elapsed)
}

/// `--ask` with a peer on `--ask-fd` (what exec-server does for `egress/approve`): a name the
/// allowlist refuses is held while the peer is asked, with host, port, method, path and the
/// rule that would allow it. "connection" lets that one connection through (the next one is
/// asked again and "deny" refuses it); "process" covers the process's later connections (one
/// question, two successes); a second process asks again; no answer refuses after
/// --ask-timeout (1 s here), not before; approval does not lift the address checks (the name
/// resolves to loopback, refused unless the address is named); a deny pattern is final, never
/// asked. The control: without --ask nothing is asked and the request is refused at once.
#[test]
fn asking_approves_per_connection_or_process_and_refuses_on_deny_or_no_answer() {
    let origin = Origin::start(None);
    let url = format!("http://other.test:{}/hello", origin.port);
    let fetch = format!("curl -sS -m 10 {url}");
    let loopback = format!("127.0.0.1:{}", origin.port);
    let registry = format!("registry.test:{}", origin.port);
    let args = [
        "--allow-domain",
        registry.as_str(),
        "--allow-domain",
        loopback.as_str(),
        "--ask-timeout",
        "1",
    ];
    for uid in identities() {
        let ws = Workspace::new(uid);
        let hello = |output: &Output| text(&output.stdout).matches("hello from origin").count();
        let asked_by_client =
            |output: &Output| text(&output.stdout).matches("refused when asked").count();

        // Once for this connection, then deny.
        let before = origin.connections();
        let (output, questions, _) = run_asking(
            &ws,
            &args,
            &format!("{fetch}; {fetch}"),
            vec![Some("connection"), Some("deny")],
        );
        assert_eq!(hello(&output), 1, "{uid:?}: {}", describe(&output));
        assert_eq!(
            asked_by_client(&output),
            1,
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
        assert_eq!(questions.len(), 2, "{uid:?}: {questions:?}");
        assert_eq!(questions[0]["host"], "other.test", "{questions:?}");
        assert_eq!(questions[0]["port"], origin.port, "{questions:?}");
        assert_eq!(questions[0]["method"], "GET", "{questions:?}");
        assert_eq!(questions[0]["path"], "/hello", "{questions:?}");
        assert_eq!(
            questions[0]["rule"],
            format!("--allow-domain other.test:{}", origin.port),
            "{questions:?}"
        );

        // For the process: asked once, both connections pass.
        let before = origin.connections();
        let (output, questions, _) = run_asking(
            &ws,
            &args,
            &format!("{fetch} && {fetch}"),
            vec![Some("process")],
        );
        assert_eq!(hello(&output), 2, "{uid:?}: {}", describe(&output));
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(origin.connections() - before, 2, "{uid:?}");

        // A second process is asked again.
        let (output, questions, _) = run_asking(&ws, &args, &fetch, vec![Some("deny")]);
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));

        // No answer: refused after the timeout, not before.
        let before = origin.connections();
        let (output, questions, elapsed) = run_asking(&ws, &args, &fetch, vec![None]);
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("no approval came within 1000 ms"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(elapsed >= Duration::from_secs(1), "{uid:?}: {elapsed:?}");
        assert!(elapsed < Duration::from_secs(8), "{uid:?}: {elapsed:?}");
        assert_eq!(origin.connections(), before, "{uid:?}");

        // Approved, but the name resolves to loopback, which no pattern names: refused.
        let (output, questions, _) = run_asking(
            &ws,
            &["--allow-domain", registry.as_str()],
            &fetch,
            vec![Some("process")],
        );
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("loopback"),
            "{uid:?}: {}",
            describe(&output)
        );

        // A deny pattern is final: never asked.
        let denied = format!("other.test:{}", origin.port);
        let mut with_deny = args.to_vec();
        with_deny.extend(["--deny-domain", denied.as_str()]);
        let (output, questions, _) = run_asking(&ws, &with_deny, &fetch, vec![Some("process")]);
        assert!(questions.is_empty(), "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));

        // Control: without --ask, refused at once, nothing asked.
        let output = ws.run(&args[..4], &["sh", "-c", &fetch]);
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("not in the allowlist"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

/// `--ask` with no controlling terminal (a CI job, a daemon): refused at once, without waiting
/// for the timeout, and the refusal says it was asked of the terminal.
#[test]
fn asking_without_a_terminal_refuses_at_once() {
    let origin = Origin::start(None);
    let url = format!("http://other.test:{}/hello", origin.port);
    let loopback = format!("127.0.0.1:{}", origin.port);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let mut command = ws.command(
            &["--allow-domain", &loopback, "--ask", "--ask-timeout", "20"],
            &["curl", "-sS", "-m", "10", &url],
        );
        // SAFETY: setsid only, between fork and exec: no controlling terminal.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let began = Instant::now();
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = wait_output(child, DEADLINE);
        assert!(began.elapsed() < Duration::from_secs(10), "{uid:?}");
        assert!(
            text(&output.stdout).contains("refused when asked (by the terminal)"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

/// The question socket (`--ask-fd`) is `sandbox-run`'s and the proxy's, never the command's:
/// the command's descriptors hold no socket. The control: the same listing run directly with
/// the socket inherited shows it.
#[test]
fn the_ask_socket_never_reaches_the_command() {
    let listing = "ls -l /proc/self/fd/";
    for uid in identities() {
        let ws = Workspace::new(uid);
        let (output, questions, _) =
            run_asking(&ws, &["--allow-domain", "registry.test"], listing, vec![]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(questions.is_empty(), "{uid:?}: {questions:?}");
        assert!(
            !text(&output.stdout).contains("socket:"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    let mut control = Command::new("sh");
    control.args(["-c", listing]);
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        control.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = control.output().unwrap();
    assert!(
        text(&output.stdout).contains("socket:"),
        "{}",
        describe(&output)
    );
}
