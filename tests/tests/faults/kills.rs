//! SIGKILL of helpers, children and the server.

use super::*;

#[tokio::test]
async fn helper_killed_in_the_middle_of_an_atomic_write_leaves_the_target_whole() {
    let dir = workspace();
    let target = dir.path().join("target.bin");
    std::fs::write(&target, b"old content").unwrap();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = write_policy(dir.path());
    // Warm the pool: one writing helper for this (session, policy). A write, since a request
    // that only reads gets a helper of its own (the policy's read-only form).
    write_file(&mut client, &target, b"old content", false, policy.clone())
        .await
        .unwrap();
    let data = vec![0x5a_u8; 8 * 1024 * 1024];
    // Kill the helper the moment it holds its temporary file open: it is writing the new
    // content. The file is anonymous (O_TMPFILE, shown as "DIR/#INODE (deleted)" in
    // /proc/PID/fd) or, where that is not available, a named `.execward-write-*` file. A tight
    // race, so a lost one (the write finished first) is retried.
    let mut killed_mid_write = false;
    for _attempt in 0..5 {
        let helpers = helper_pids(&server);
        assert_eq!(helpers.len(), 1, "one pooled helper: {helpers:?}");
        let helper = helpers[0];
        let watched = dir.path().to_path_buf();
        let watcher = std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if holds_temp_file(helper, &watched) {
                    let _ = kill(Pid::from_raw(helper), Signal::SIGKILL);
                    return true;
                }
                if process_is_dead(helper) {
                    return false;
                }
            }
            false
        });
        let result = write_file(&mut client, &target, &data, true, policy.clone()).await;
        let fired = watcher.join().unwrap();
        match result {
            Err(error) if fired => {
                assert_eq!(error_kind(&error), "helperFailed", "{error:?}");
                assert!(error.message.contains("fs-helper"), "{error:?}");
                killed_mid_write = true;
                eprintln!("killed the helper mid-write on attempt {}", _attempt + 1);
                break;
            }
            Ok(_) => {
                // The write won the race; put the old content back and try again.
                wait_process_dead(helper, DEADLINE, "the helper killed after its write");
                // The next writing helper, which also puts the old content back.
                write_file(&mut client, &target, b"old content", false, policy.clone())
                    .await
                    .unwrap();
            }
            Err(error) => panic!("the write failed without the helper being killed: {error:?}"),
        }
    }
    assert!(
        killed_mid_write,
        "never caught the helper mid-write in 5 attempts"
    );
    // The target is whole: the old file, or (killed after the rename) the new one.
    let content = std::fs::read(&target).unwrap();
    assert!(
        content == b"old content" || content == data,
        "target is neither the old nor the new content ({} bytes)",
        content.len()
    );
    for name in names(dir.path()) {
        assert!(
            name == "target.bin" || name.starts_with(ATOMIC_TEMP_PREFIX),
            "unexpected entry {name}"
        );
    }
    // The pool replaces the helper: the same write now succeeds, and no temporary file of the
    // dead helper is left once it did (anonymous files vanish with their writer; a named one
    // is swept by the next atomic write in the directory).
    write_file(&mut client, &target, b"new content", true, policy)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"new content");
    assert_eq!(names(dir.path()), ["target.bin"]);
}

/// Whether process `pid` has a temporary file of an atomic write in `dir` open: an anonymous
/// O_TMPFILE file ("DIR/#INODE (deleted)") or a named `.execward-write-*` one.
fn holds_temp_file(pid: i32, dir: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target.parent() == Some(dir)
                && target.file_name().is_some_and(|name| {
                    let name = name.to_string_lossy();
                    name.starts_with('#') || name.starts_with(ATOMIC_TEMP_PREFIX)
                })
        })
    })
}

#[tokio::test]
async fn sandboxed_child_killed_with_sigkill_is_reported_and_reaped() {
    let dir = workspace();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let sandbox = json!({"sandbox": write_policy(dir.path()), "cwd": file_uri(dir.path())});
    client
        .start(
            "victim",
            &sh("echo ready; exec /bin/sleep 1000"),
            sandbox.clone(),
        )
        .await
        .unwrap();
    client.wait_for_output("victim", "ready").await;
    // "ready" is printed just before `exec` replaces the shell: poll until the sleep exists.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let sleeper = loop {
        if let Some(pid) = descendants(server.pid())
            .into_iter()
            .find(|&pid| cmdline(pid) == "/bin/sleep 1000")
        {
            break pid;
        }
        assert!(
            std::time::Instant::now() < until,
            "the sandboxed sleep among the server's descendants within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    kill(Pid::from_raw(sleeper), Signal::SIGKILL).unwrap();
    let out = client.collect("victim").await;
    assert_eq!(
        (out.exit_code, out.signal),
        (Some(137), Some(9)),
        "{:?}",
        out.events
    );
    wait_process_dead(sleeper, DEADLINE, "the killed sandboxed child");
    assert!(
        !descendants(server.pid())
            .iter()
            .any(|&pid| cmdline(pid).contains("sleep")),
        "nothing of the killed child is left"
    );
    // The server carries on, sandboxed starts included.
    let out = client
        .run(
            "next",
            &sh("echo again > again.txt; cat again.txt"),
            sandbox,
        )
        .await;
    assert_eq!(out.stdout_text(), "again\n");
}

#[tokio::test]
async fn server_killed_with_sigkill_takes_children_grandchildren_and_helpers_along() {
    let dir = workspace();
    let mut server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let starts = [
        ("plain", sh("echo ready; exec /bin/sleep 1000"), json!({})),
        (
            "tty",
            sh("echo ready; exec /bin/sleep 1000"),
            json!({"tty": true}),
        ),
        (
            "family",
            sh("/bin/sleep 1000 & /bin/sleep 1000 & echo ready; wait"),
            json!({}),
        ),
        (
            "sandboxed",
            sh("echo ready; exec /bin/sleep 1000"),
            json!({"sandbox": write_policy(dir.path())}),
        ),
        (
            "ignores-term",
            sh("trap '' TERM HUP; echo ready; /bin/sleep 1000; echo"),
            json!({}),
        ),
    ];
    for (id, argv, extra) in &starts {
        let argv: Vec<&str> = argv.clone();
        client.start(id, &argv, extra.clone()).await.unwrap();
        client.wait_for_output(id, "ready").await;
    }
    // A pooled fs-helper too.
    client
        .call(
            "fs/readDirectory",
            json!({"path": file_uri(dir.path()), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    // Six sleeps: one each, two in the family, one behind the trap (forked after its echo).
    let started = Instant::now();
    let everything = loop {
        let everything = descendants(server.pid());
        let sleeps = everything
            .iter()
            .filter(|&&pid| cmdline(pid) == "/bin/sleep 1000")
            .count();
        if sleeps == 6 {
            break everything;
        }
        assert!(started.elapsed() < DEADLINE, "{sleeps} of 6 sleeps running");
        std::thread::sleep(Duration::from_millis(10)); // polling interval
    };
    assert!(!helper_pids(&server).is_empty(), "a pooled helper exists");
    server.signal(Signal::SIGKILL);
    server.wait_exit(DEADLINE);
    // Everything the server started (the guardian, which acts and exits, included) is gone.
    let started = Instant::now();
    loop {
        let alive: Vec<(i32, String)> = everything
            .iter()
            .filter(|&&pid| !process_is_dead(pid))
            .map(|&pid| (pid, cmdline(pid)))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "still alive {DEADLINE:?} after the server was killed: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20)); // polling interval
    }
}
