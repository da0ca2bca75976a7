//! `process/start`, `write`, `signal`, `resize`, `terminate`: what the child sees and how it ends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use tests::{Client, ExecServer, assert_rpc_error, b64, file_uri, sh, stat_field};

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Start `sh -c 'echo $$; exec ...'`-style processes and return the pid the shell printed.
async fn first_line_pid(client: &mut Client, process_id: &str) -> i32 {
    let text = client.wait_for_output(process_id, "\n").await;
    text.lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("first line of {process_id} is not a pid ({e}): {text:?}"))
}

#[tokio::test]
async fn empty_argv_is_invalid_params() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client.start("p", &[], json!({})).await,
        -32602,
        "invalidParams",
    );
}

/// `cwd` takes an absolute native path as the reference server does (`fs/*` paths do not).
#[tokio::test]
async fn native_cwd_is_accepted_and_a_relative_cwd_is_invalid_path() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run("p", &["/bin/pwd"], json!({"cwd": "/usr/bin"}))
        .await;
    assert_eq!(out.stdout_text(), "/usr/bin\n");
    assert_rpc_error(
        client
            .start("q", &["/bin/true"], json!({"cwd": "tmp"}))
            .await,
        -32602,
        "invalidPath",
    );
}

#[tokio::test]
async fn missing_cwd_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let cwd = file_uri(dir.path().join("missing"));
    assert_rpc_error(
        client.start("p", &["/bin/true"], json!({"cwd": cwd})).await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn cwd_that_is_a_file_is_not_a_directory() {
    let server = server();
    let mut client = server.client().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    assert_rpc_error(
        client
            .start("p", &["/bin/true"], json!({"cwd": file_uri(file.path())}))
            .await,
        -32600,
        "notADirectory",
    );
}

#[tokio::test]
async fn missing_program_is_not_found_not_a_silent_success() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client
            .start("p", &["/nonexistent/program"], json!({}))
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn non_executable_program_is_permission_denied() {
    let server = server();
    let mut client = server.client().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "#!/bin/sh\necho hi\n").unwrap();
    let program = file.path().to_str().unwrap().to_owned();
    assert_rpc_error(
        client.start("p", &[&program], json!({})).await,
        -32600,
        "permissionDenied",
    );
}

#[tokio::test]
async fn duplicate_process_id_is_already_exists() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("dup", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    assert_rpc_error(
        client.start("dup", &["/bin/true"], json!({})).await,
        -32600,
        "alreadyExists",
    );
    client
        .call("process/terminate", json!({"processId": "dup"}))
        .await;
}

#[tokio::test]
async fn racing_starts_with_one_process_id_exactly_one_succeeds() {
    let server = server();
    let mut client = server.client().await;
    let params = json!({"processId": "race", "argv": ["/bin/sleep", "1000"], "cwd": "file:///"});
    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(client.send_request("process/start", params.clone()).await);
    }
    let mut successes = 0;
    for id in &ids {
        match client.response(id).await {
            Ok(result) => {
                assert_eq!(result["processId"], "race");
                successes += 1;
            }
            Err(error) => {
                assert_rpc_error(Err(error), -32600, "alreadyExists");
            }
        }
    }
    assert_eq!(
        successes, 1,
        "exactly one of the racing starts must succeed"
    );
    client
        .call("process/terminate", json!({"processId": "race"}))
        .await;
}

#[tokio::test]
async fn env_is_exactly_the_childs_environment() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run(
            "env",
            &["/usr/bin/env"],
            json!({"env": {"FOO": "bar baz", "EMPTY": "", "PATH": "/usr/bin:/bin"}}),
        )
        .await;
    let lines: BTreeSet<String> = out.stdout_text().lines().map(str::to_owned).collect();
    let expected: BTreeSet<String> = ["FOO=bar baz", "EMPTY=", "PATH=/usr/bin:/bin"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines, expected, "stdout: {:?}", out.stdout_text());
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn env_defaults_to_empty() {
    let server = server();
    let mut client = server.client().await;
    client
        .request(
            "process/start",
            json!({"processId": "env", "argv": ["/usr/bin/env"], "cwd": "file:///"}),
        )
        .await
        .unwrap();
    let out = client.collect("env").await;
    assert_eq!(out.stdout_text(), "", "nothing is inherited");
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn cwd_is_the_working_directory() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let canonical = dir.path().canonicalize().unwrap();
    let out = client
        .run(
            "pwd",
            &["/bin/pwd", "-P"],
            json!({"cwd": file_uri(dir.path())}),
        )
        .await;
    assert_eq!(out.stdout_text().trim_end(), canonical.to_str().unwrap());
}

#[tokio::test]
async fn arg0_is_what_the_program_sees_as_argv0() {
    let server = server();
    let mut client = server.client().await;
    // `; true` keeps dash from exec'ing cat in place of itself.
    let out = client
        .run(
            "arg0",
            &sh("cat /proc/$$/cmdline; true"),
            json!({"arg0": "custom-name"}),
        )
        .await;
    assert!(
        out.stdout.starts_with(b"custom-name\0-c\0"),
        "cmdline: {:?}",
        out.stdout_text()
    );
}

#[tokio::test]
async fn child_inherits_no_descriptors_beyond_stdio() {
    let server = server();
    let mut client = server.client().await;
    for (id, extra) in [
        ("plain", json!({})),
        ("piped", json!({"pipeStdin": true})),
        ("tty", json!({"tty": true})),
    ] {
        client
            .start(id, &sh("echo $$; exec /bin/sleep 1000"), extra)
            .await
            .unwrap();
        let pid = first_line_pid(&mut client, id).await;
        // The shell printed its pid before it exec'd sleep: read the descriptors of sleep, not
        // of the shell on its way there.
        let until = Instant::now() + tests::DEADLINE;
        while !std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .starts_with(b"/bin/sleep\0")
        {
            assert!(Instant::now() < until, "the {id} child never exec'd sleep");
            tokio::time::sleep(Duration::from_millis(5)).await; // polling interval
        }
        // Right after the exec, the dynamic loader of sleep may still hold the library it is
        // mapping (a descriptor 3 for a moment); an inherited descriptor never goes away.
        let expected: BTreeSet<String> = ["0", "1", "2"].map(String::from).into();
        let fds = loop {
            let fds: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            if fds == expected || Instant::now() >= until {
                break fds;
            }
            tokio::time::sleep(Duration::from_millis(5)).await; // polling interval
        };
        assert_eq!(fds, expected, "descriptors of the {id} child");
        client
            .call("process/terminate", json!({"processId": id}))
            .await;
    }
}

#[tokio::test]
async fn child_is_a_session_and_process_group_leader() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("leader", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid = first_line_pid(&mut client, "leader").await;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let pgrp: i32 = stat_field(&stat, 5).unwrap().parse().unwrap();
    let session: i32 = stat_field(&stat, 6).unwrap().parse().unwrap();
    assert_eq!((pgrp, session), (pid, pid), "stat: {stat}");
    assert_ne!(session, nix::unistd::getsid(None).unwrap().as_raw());
    client
        .call("process/terminate", json!({"processId": "leader"}))
        .await;
}

#[tokio::test]
async fn exit_code_is_reported_without_signal() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("exit7", &sh("exit 7"), json!({})).await;
    assert_eq!((out.exit_code, out.signal), (Some(7), None));
}

#[tokio::test]
async fn death_by_signal_reports_128_plus_n_and_the_signal() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("killed", &sh("kill -KILL $$"), json!({})).await;
    assert_eq!((out.exit_code, out.signal), (Some(137), Some(9)));
}

/// Poll until `/proc/<pid>/comm` is `comm` (the shell has exec'd), so that a signal cannot
/// land in the shell's own handler before the exec.
fn wait_for_comm(pid: i32, comm: &str) {
    let started = Instant::now();
    loop {
        let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if now.trim() == comm {
            return;
        }
        assert!(
            started.elapsed() < tests::DEADLINE,
            "pid {pid} is {now:?}, not {comm:?}, after {:?}",
            tests::DEADLINE
        );
        std::thread::sleep(Duration::from_millis(5)); // polling interval, not a wait
    }
}

#[tokio::test]
async fn signal_interrupt_reports_sigint_exit() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("int", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid = first_line_pid(&mut client, "int").await;
    wait_for_comm(pid, "sleep");
    let result = client
        .call(
            "process/signal",
            json!({"processId": "int", "signal": "interrupt"}),
        )
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("int").await;
    assert_eq!((out.exit_code, out.signal), (Some(130), Some(2)));
}

#[tokio::test]
async fn signal_reaches_the_whole_process_group() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "group",
            &sh("/bin/sleep 1000 & echo $$ $!; exec /bin/sleep 1000"),
            json!({}),
        )
        .await
        .unwrap();
    let text = client.wait_for_output("group", "\n").await;
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    for pid in &pids {
        wait_for_comm(*pid, "sleep");
    }
    client
        .call(
            "process/signal",
            json!({"processId": "group", "signal": "hangup"}),
        )
        .await;
    let out = client.collect("group").await;
    assert_eq!((out.exit_code, out.signal), (Some(129), Some(1)));
    tests::wait_process_dead(pids[1], tests::DEADLINE, "background member of the group");
}

#[tokio::test]
async fn signal_names_map_to_their_signals() {
    let server = server();
    let mut client = server.client().await;
    for (name, number) in [("terminate", 15), ("kill", 9), ("hangup", 1)] {
        client
            .start(name, &["/bin/sleep", "1000"], json!({}))
            .await
            .unwrap();
        client
            .call("process/signal", json!({"processId": name, "signal": name}))
            .await;
        let out = client.collect(name).await;
        assert_eq!(
            (out.exit_code, out.signal),
            (Some(128 + number), Some(number)),
            "{name}"
        );
    }
}

#[tokio::test]
async fn signal_to_exited_process_is_not_running_and_unknown_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    client.run("done", &["/bin/true"], json!({})).await;
    let result = client
        .call(
            "process/signal",
            json!({"processId": "done", "signal": "kill"}),
        )
        .await;
    assert_eq!(result, json!({"running": false}));
    assert_rpc_error(
        client
            .request(
                "process/signal",
                json!({"processId": "nope", "signal": "kill"}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_rpc_error(
        client
            .request(
                "process/signal",
                json!({"processId": "done", "signal": "SIGKILL"}),
            )
            .await,
        -32602,
        "invalidParams",
    );
}

#[tokio::test]
async fn terminate_running_process_reports_running_then_the_real_exit_status() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("t", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    let result = client
        .call("process/terminate", json!({"processId": "t"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("t").await;
    assert_eq!((out.exit_code, out.signal), (Some(143), Some(15)));
}

#[tokio::test]
async fn terminate_unknown_or_exited_process_reports_not_running() {
    let server = server();
    let mut client = server.client().await;
    let result = client
        .call("process/terminate", json!({"processId": "never"}))
        .await;
    assert_eq!(result, json!({"running": false}));
    client.run("gone", &["/bin/true"], json!({})).await;
    let result = client
        .call("process/terminate", json!({"processId": "gone"}))
        .await;
    assert_eq!(result, json!({"running": false}));
}

#[tokio::test]
async fn terminate_kills_a_child_that_ignores_sigterm_after_the_grace() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "stubborn",
            &sh("trap '' TERM; echo ready; exec /bin/sleep 1000"),
            json!({}),
        )
        .await
        .unwrap();
    client.wait_for_output("stubborn", "ready").await;
    let started = Instant::now();
    let result = client
        .call("process/terminate", json!({"processId": "stubborn"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("stubborn").await;
    assert_eq!((out.exit_code, out.signal), (Some(137), Some(9)));
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "SIGKILL came before the grace period: {:?}",
        started.elapsed()
    );
    // TERMINATE_GRACE is 2 s (docs/protocol.md): the kill must not wait much longer than that.
    assert!(
        started.elapsed() < Duration::from_secs(2) + Duration::from_secs(3),
        "SIGKILL came {:?} after terminate, long past the 2 s grace",
        started.elapsed()
    );
}

#[tokio::test]
async fn pipe_stdin_write_and_close_reach_cat() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    let result = client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("hello\n")}),
        )
        .await;
    assert_eq!(result, json!({"status": "accepted"}));
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(out.stdout_text(), "hello\n");
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn stdin_is_dev_null_without_pipe_stdin() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("cat", &["/bin/cat"], json!({})).await;
    assert_eq!((out.stdout_text(), out.exit_code), (String::new(), Some(0)));
}

#[tokio::test]
async fn write_without_pipe_stdin_answers_stdin_closed() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("s", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "s", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "s"}))
        .await;
}

#[tokio::test]
async fn write_after_stdin_closed_or_exit_answers_stdin_closed() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "c",
            &sh("exec /bin/sleep 1000 <&0"),
            json!({"pipeStdin": true}),
        )
        .await
        .unwrap();
    client
        .call(
            "process/write",
            json!({"processId": "c", "chunk": "", "close": true}),
        )
        .await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "c", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "c"}))
        .await;

    client
        .run("exited", &["/bin/true"], json!({"pipeStdin": true}))
        .await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "exited", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "stdinClosed"})
    );
}

#[tokio::test]
async fn write_to_unknown_process_answers_unknown_process() {
    let server = server();
    let mut client = server.client().await;
    assert_eq!(
        client
            .call(
                "process/write",
                json!({"processId": "ghost", "chunk": b64("x")}),
            )
            .await,
        json!({"status": "unknownProcess"})
    );
}

#[tokio::test]
async fn write_with_invalid_base64_is_invalid_base64() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    assert_rpc_error(
        client
            .request(
                "process/write",
                json!({"processId": "cat", "chunk": "not base64!"}),
            )
            .await,
        -32602,
        "invalidBase64",
    );
    client
        .call("process/terminate", json!({"processId": "cat"}))
        .await;
}

#[tokio::test]
async fn write_id_makes_a_retried_write_happen_once() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("cat", &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
    for (chunk, write_id) in [("a\n", "w1"), ("a\n", "w1"), ("b\n", "w2"), ("b\n", "w2")] {
        let result = client
            .call(
                "process/write",
                json!({"processId": "cat", "chunk": b64(chunk), "writeId": write_id}),
            )
            .await;
        assert_eq!(result, json!({"status": "accepted"}));
    }
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("c\n"), "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(out.stdout_text(), "a\nb\nc\n");
}

#[tokio::test]
async fn tty_process_streams_pty_and_sees_a_terminal_of_the_default_size() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run("tty", &sh("tty; stty size"), json!({"tty": true}))
        .await;
    assert!(
        !out.pty.is_empty(),
        "no pty output; events: {:?}",
        out.events
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "{:?}",
        out.events
    );
    let text = out.pty_text();
    assert!(
        text.contains("/dev/"),
        "tty did not report a terminal: {text:?}"
    );
    assert!(!text.contains("not a tty"), "{text:?}");
    assert!(
        text.contains("24 80"),
        "default size should be 24x80: {text:?}"
    );
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn tty_size_comes_from_cols_and_rows() {
    let server = server();
    let mut client = server.client().await;
    let out = client
        .run(
            "tty",
            &["/usr/bin/stty", "size"],
            json!({"tty": true, "cols": 100, "rows": 30}),
        )
        .await;
    assert!(out.pty_text().contains("30 100"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn resize_changes_the_terminal_size() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "resize",
            &sh("stty size; read line; stty size"),
            json!({"tty": true}),
        )
        .await
        .unwrap();
    client.wait_for_output("resize", "24 80").await;
    let result = client
        .call(
            "process/resize",
            json!({"processId": "resize", "cols": 120, "rows": 40}),
        )
        .await;
    assert_eq!(result, json!({}));
    client
        .call(
            "process/write",
            json!({"processId": "resize", "chunk": b64("\n")}),
        )
        .await;
    let out = client.collect("resize").await;
    assert!(out.pty_text().contains("40 120"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn resize_of_non_pty_is_unsupported_and_unknown_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("plain", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    assert_rpc_error(
        client
            .request(
                "process/resize",
                json!({"processId": "plain", "cols": 10, "rows": 10}),
            )
            .await,
        -32600,
        "unsupported",
    );
    assert_rpc_error(
        client
            .request(
                "process/resize",
                json!({"processId": "ghost", "cols": 10, "rows": 10}),
            )
            .await,
        -32004,
        "notFound",
    );
    client
        .call("process/terminate", json!({"processId": "plain"}))
        .await;
}

#[tokio::test]
async fn tty_write_reaches_the_program() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "echo",
            &sh("read line; echo got:$line"),
            json!({"tty": true}),
        )
        .await
        .unwrap();
    client
        .call(
            "process/write",
            json!({"processId": "echo", "chunk": b64("hi\n")}),
        )
        .await;
    let out = client.collect("echo").await;
    assert!(out.pty_text().contains("got:hi"), "{:?}", out.pty_text());
}

#[tokio::test]
async fn restricting_sandbox_is_enforced_never_ignored() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("written");
    let script = format!("echo x > '{}'", target.display());
    let out = client
        .run(
            "sandboxed",
            &sh(&script),
            json!({"sandbox": {"profile": "read-only"}, "cwd": file_uri(dir.path())}),
        )
        .await;
    assert_ne!(
        out.exit_code,
        Some(0),
        "write under read-only sandbox succeeded"
    );
    let stderr = out.stderr_text();
    assert!(
        stderr.contains("Read-only file system") || stderr.contains("Permission denied"),
        "the shell reports the kernel's refusal: {stderr}"
    );
    assert!(
        !target.exists(),
        "a read-only sandbox must not allow the write"
    );
    // The same command without a sandbox writes: the refusal above is the policy's.
    let control = client
        .run(
            "control",
            &sh(&script),
            json!({"cwd": file_uri(dir.path())}),
        )
        .await;
    assert_eq!(control.exit_code, Some(0));
    assert_eq!(std::fs::read(&target).unwrap(), b"x\n");
}

#[tokio::test]
async fn process_read_of_unknown_process_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    assert_rpc_error(
        client
            .request("process/read", json!({"processId": "ghost"}))
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn process_id_longer_than_the_limit_is_refused() {
    let server = server();
    let mut client = server.client().await;
    let long = "x".repeat(129);
    let error = client
        .start(&long, &["/bin/true"], json!({}))
        .await
        .expect_err("a 129-byte processId must be refused");
    assert!(
        [-32600, -32602].contains(&error.code),
        "unexpected code {error:?}"
    );
    client
        .start(&"y".repeat(128), &["/bin/true"], json!({}))
        .await
        .unwrap();
}
