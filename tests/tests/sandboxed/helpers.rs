//! The helpers themselves: the pool (a killed helper, one-shot answers, never another session's
//! helper), invalid sandbox objects, what the helpers start with, `--helper-dir`.

use super::*;

fn helper_pids(server_pid: i32) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent: i32 = tests::stat_field(&stat, 4)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == server_pid && cmdline.windows(7).any(|w| w == b"--serve") {
            pids.push(pid);
        }
    }
    pids
}

#[tokio::test]
async fn killing_a_pooled_helper_mid_request_fails_that_request_and_the_next_succeeds() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let path = file_uri(dirs.ws("in.txt"));
    fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": path}),
        read_only(),
    )
    .await
    .unwrap();
    let helpers = helper_pids(server.pid());
    assert_eq!(
        helpers.len(),
        1,
        "one pooled helper after one request: {helpers:?}"
    );
    let helper = Pid::from_raw(helpers[0]);
    // Freeze it, send a request it will never answer, then kill it mid-request.
    kill(helper, Signal::SIGSTOP).unwrap();
    let id = client
        .send_request("fs/readFile", json!({"path": path, "sandbox": read_only()}))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    kill(helper, Signal::SIGKILL).unwrap();
    let started = Instant::now();
    let r = client
        .response_within(
            &id,
            Duration::from_secs(10),
            "the response to the killed helper's request",
        )
        .await;
    let error = assert_rpc_error(r, -32603, "helperFailed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the failure must be prompt"
    );
    assert!(error.message.contains("fs-helper"), "{error:?}");
    let read = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": path}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"inside");
}

#[tokio::test]
async fn one_shot_helpers_give_the_same_answers() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&["--one-shot-helpers"]);
    let mut client = server.client().await;
    let read = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"inside");
    let target = dirs.out("x.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&target), "dataBase64": b64("x")}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &target);
    assert!(
        helper_pids(server.pid()).is_empty(),
        "no helper stays around in one-shot mode"
    );
}

#[tokio::test]
async fn invalid_sandbox_objects_are_errors_never_run_unsandboxed() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let target = dirs.out("never.txt");
    for sandbox in [
        json!({"profile": "no-such-profile"}),
        json!({"profile": "workspace-write"}),
        json!({"bogus": 1}),
    ] {
        let r = fs_call(
            &mut client,
            "fs/writeFile",
            json!({"path": file_uri(&target), "dataBase64": b64("x")}),
            sandbox.clone(),
        )
        .await;
        assert_rpc_error(r, -32602, "invalidParams");
        let r = client
            .start("p", &["/bin/true"], json!({"sandbox": sandbox}))
            .await;
        assert_rpc_error(r, -32602, "invalidParams");
    }
    assert!(!target.exists());
}

/// The descriptors `pid` has open, by number.
fn open_fds(pid: i32) -> Vec<i32> {
    let mut fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    fds.sort_unstable();
    fds
}

/// `KEY=value` entries of `pid`'s initial environment.
fn environ(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .map(|entry| String::from_utf8_lossy(entry).into_owned())
        .collect()
}

/// A server started with a secret in its environment and a descriptor (9) it inherited
/// without close-on-exec: neither may reach a helper.
fn leaky_server() -> (ExecServer, std::fs::File) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let leaked = std::fs::File::open("/etc/hostname").unwrap();
    let raw = leaked.as_raw_fd();
    let server = ExecServer::start_with(&[], |command| {
        command
            .env("SECRET_TOKEN", "hunter2")
            .env("LD_LIBRARY_PATH", "/nonexistent");
        // SAFETY: dup2 is async-signal-safe; the closure touches nothing else.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(raw, 9) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    assert!(
        open_fds(server.pid()).contains(&9),
        "the server really inherited descriptor 9"
    );
    assert!(
        environ(server.pid()).contains(&"SECRET_TOKEN=hunter2".to_owned()),
        "the server really has the secret"
    );
    (server, leaked)
}

#[tokio::test]
async fn the_fs_helper_starts_with_a_cleared_environment_and_only_its_own_descriptors() {
    let dirs = Dirs::new();
    let (server, _leaked) = leaky_server();
    let mut client = server.client().await;
    fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await
    .unwrap();
    let helpers = helper_pids(server.pid());
    assert_eq!(helpers.len(), 1, "one pooled helper after one request");
    let helper = helpers[0];
    let env = environ(helper);
    for entry in &env {
        let key = entry.split('=').next().unwrap();
        assert!(
            ["PATH", "TMPDIR", "TMP", "TEMP"].contains(&key),
            "the helper's environment holds {entry}: {env:?}"
        );
    }
    assert_eq!(
        open_fds(helper),
        vec![0, 1, 2],
        "the helper holds only its socket (0, 1) and stderr (2)"
    );
}

#[tokio::test]
async fn sandbox_run_and_its_command_start_with_only_what_the_request_gives() {
    let dirs = Dirs::new();
    let (server, _leaked) = leaky_server();
    let mut client = server.client().await;
    client
        .start(
            "sleeper",
            &sh("ls /proc/self/fd; env; echo READY; exec /bin/sleep 30"),
            json!({
                "sandbox": dirs.write_policy(),
                "cwd": file_uri(dirs.workspace.path()),
                "env": {"PATH": "/usr/bin:/bin", "ASKED": "yes"},
            }),
        )
        .await
        .unwrap();
    // sandbox-run is the server's child; find it once the command is running.
    let deadline = Instant::now() + Duration::from_secs(10);
    let runner = loop {
        let found = tests::children_of(server.pid()).into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .starts_with(b"sandbox-run")
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(Instant::now() < deadline, "no sandbox-run child appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let text = client.wait_for_output("sleeper", "READY").await;
    assert_eq!(
        environ(runner),
        Vec::<String>::new(),
        "sandbox-run's environment"
    );
    let fds = open_fds(runner);
    assert!(
        !fds.contains(&9),
        "sandbox-run inherited the server's descriptor 9: {fds:?}"
    );
    client
        .call("process/terminate", json!({"processId": "sleeper"}))
        .await;
    client.collect("sleeper").await;
    // `ls /proc/self/fd` lists 0, 1, 2 and ls's own directory descriptor (3).
    let fd_lines: Vec<&str> = text
        .lines()
        .take_while(|l| l.parse::<u32>().is_ok())
        .collect();
    assert_eq!(
        fd_lines,
        ["0", "1", "2", "3"],
        "the command's descriptors: {text}"
    );
    assert!(text.contains("ASKED=yes"), "{text}");
    assert!(!text.contains("SECRET_TOKEN"), "{text}");
    assert!(!text.contains("LD_LIBRARY_PATH"), "{text}");
}

#[tokio::test]
async fn the_pool_never_serves_a_request_with_another_sessions_or_policys_helper() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut alice = server.client().await;
    let mut bob = server.client().await;
    let secret = dirs.out("secret.txt");
    let read = json!({"path": file_uri(&secret)});
    let denying = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": dirs.outside.path()}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let mut seen = std::collections::BTreeSet::new();
    let mut helpers_after = |label: &str, expected: usize| {
        seen.extend(helper_pids(server.pid()));
        assert_eq!(
            seen.len(),
            expected,
            "helpers started after {label}: {seen:?}"
        );
    };
    fs_call(&mut alice, "fs/readFile", read.clone(), read_only())
        .await
        .unwrap();
    helpers_after("alice read-only", 1);
    fs_call(&mut alice, "fs/readFile", read.clone(), read_only())
        .await
        .unwrap();
    helpers_after("alice read-only again (reused)", 1);
    fs_call(&mut bob, "fs/readFile", read.clone(), read_only())
        .await
        .unwrap();
    helpers_after("bob read-only (his own)", 2);
    let r = fs_call(&mut alice, "fs/readFile", read.clone(), denying.clone()).await;
    assert_denied(r, "fs/readFile", &secret);
    helpers_after("alice with a deny (a third)", 3);
    // Interleaved, each policy keeps its own answer: the read-only helper still reads, the
    // denying one still denies.
    for _ in 0..3 {
        fs_call(&mut alice, "fs/readFile", read.clone(), read_only())
            .await
            .unwrap();
        let r = fs_call(&mut alice, "fs/readFile", read.clone(), denying.clone()).await;
        assert_denied(r, "fs/readFile", &secret);
        fs_call(&mut bob, "fs/readFile", read.clone(), read_only())
            .await
            .unwrap();
    }
    helpers_after("interleaving", 3);
}

#[tokio::test]
async fn helper_dir_chooses_where_the_helpers_come_from_and_a_missing_one_refuses_the_start() {
    let dirs = Dirs::new();
    let install = tests::scratch::scratch_dir("helpers-");
    let helper_dir = std::fs::canonicalize(install.path()).unwrap().join("bin");
    tests::install_binaries(&helper_dir);
    let server = ExecServer::start(&["--helper-dir", helper_dir.to_str().unwrap()]);
    let mut client = server.client().await;
    fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await
    .unwrap();
    let helper = helper_pids(server.pid())[0];
    assert_eq!(
        std::fs::read_link(format!("/proc/{helper}/exe")).unwrap(),
        helper_dir.join("fs-helper"),
        "the pooled helper runs from --helper-dir"
    );
    let out = client
        .run(
            "p",
            &["/bin/true"],
            json!({"sandbox": dirs.write_policy(), "cwd": file_uri(dirs.workspace.path())}),
        )
        .await;
    assert_eq!(out.exit_code, Some(0));
    drop(client);
    drop(server);

    // A directory without the helpers: the server refuses to start and names what is missing.
    let empty = tests::scratch::scratch_dir("no-helpers-");
    let refused = ExecServer::run_expecting_exit(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--helper-dir",
        empty.path().to_str().unwrap(),
    ]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        refused.stderr.contains(empty.path().to_str().unwrap())
            && (refused.stderr.contains("sandbox-run") || refused.stderr.contains("fs-helper")),
        "the error names the helper and where it was looked for: {}",
        refused.stderr
    );
    assert_eq!(refused.stdout, "", "no URL was printed");
}
