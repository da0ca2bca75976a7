//! Sandboxed operations through helpers: `fs/*` under read-only and workspace-write run in
//! pooled `fs-helper` processes, denials come back as `sandboxDenied` and leave the disk
//! unchanged, and sandboxed `process/start` runs through `sandbox-run`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{Client, ExecServer, assert_rpc_error, b64, file_uri, sh, unb64};

/// [`tests::SandboxDirs`] with a `.git`, a file and an `escape` symlink to the outside.
struct Dirs {
    workspace: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Dirs {
    fn new() -> Dirs {
        let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
        std::fs::create_dir(workspace.path().join(".git")).unwrap();
        std::fs::write(
            workspace.path().join(".git/HEAD"),
            b"ref: refs/heads/main\n",
        )
        .unwrap();
        std::fs::write(workspace.path().join("in.txt"), b"inside").unwrap();
        std::os::unix::fs::symlink(outside.path(), workspace.path().join("escape")).unwrap();
        Dirs { workspace, outside }
    }

    fn ws(&self, name: &str) -> PathBuf {
        self.workspace.path().join(name)
    }

    fn out(&self, name: &str) -> PathBuf {
        self.outside.path().join(name)
    }

    fn write_policy(&self) -> Value {
        json!({"profile": "workspace-write", "cwd": file_uri(self.workspace.path())})
    }
}

fn read_only() -> Value {
    json!({"profile": "read-only"})
}

async fn fs_call(
    client: &mut Client,
    method: &str,
    mut params: Value,
    sandbox: Value,
) -> Result<Value, tests::RpcError> {
    params["sandbox"] = sandbox;
    client.request(method, params).await
}

fn assert_denied(result: Result<Value, tests::RpcError>, operation: &str, path: &Path) {
    let error = assert_rpc_error(result, -32600, "sandboxDenied");
    let data = error.data.clone().expect("denial carries data");
    assert_eq!(
        data.operation.as_deref(),
        Some(operation),
        "operation of {error:?}"
    );
    let reported = data.path.expect("denial names the path");
    let expected = file_uri(path);
    assert!(
        reported == expected || expected.starts_with(&reported) || reported.starts_with(&expected),
        "denial path {reported} should name {expected}"
    );
}

#[tokio::test]
async fn workspace_write_allows_inside_and_denies_outside_for_every_write_operation() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = dirs.write_policy();

    // Allowed inside the workspace.
    let inside = dirs.ws("new.txt");
    fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&inside), "dataBase64": b64("ok")}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(&inside).unwrap(), b"ok");
    fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("d/e"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert!(dirs.ws("d/e").is_dir());
    fs_call(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&inside), "destinationPath": file_uri(dirs.ws("copy.txt"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dirs.ws("copy.txt")).unwrap(), b"ok");
    fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("copy.txt"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert!(!dirs.ws("copy.txt").exists());

    // Denied outside, and nothing changes there.
    let target = dirs.out("new.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&target), "dataBase64": b64("no")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &target);
    assert!(!target.exists());
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(dirs.out("secret.txt")), "dataBase64": b64("no")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &dirs.out("secret.txt"));
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.out("d"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.out("d"));
    assert!(!dirs.out("d").exists());
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.out("secret.txt"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/remove", &dirs.out("secret.txt"));
    let r = fs_call(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&inside), "destinationPath": file_uri(dirs.out("c.txt"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/copy", &dirs.out("c.txt"));
    assert!(!dirs.out("c.txt").exists());
    assert_eq!(
        std::fs::read(dirs.out("secret.txt")).unwrap(),
        b"outside",
        "outside file untouched"
    );
}

#[tokio::test]
async fn symlink_escapes_are_denied_for_writes_directories_and_copies() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = dirs.write_policy();
    let through = dirs.ws("escape/via-link.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&through), "dataBase64": b64("x")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &through);
    assert!(!dirs.out("via-link.txt").exists());
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("escape/dir"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.ws("escape/dir"));
    assert!(!dirs.out("dir").exists());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("in.txt")), "destinationPath": file_uri(dirs.ws("escape/copied.txt"))}), policy.clone()).await;
    assert_denied(r, "fs/copy", &dirs.ws("escape/copied.txt"));
    assert!(!dirs.out("copied.txt").exists());
    // Removing the link removes the link only (allowed, inside); the outside stays.
    fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("escape"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dirs.out("secret.txt")).unwrap(), b"outside");
}

#[tokio::test]
async fn git_inside_the_workspace_stays_read_only() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let head = dirs.ws(".git/HEAD");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&head), "dataBase64": b64("evil")}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &head);
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(dirs.ws(".git/hooks-new")), "dataBase64": b64("evil")}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &dirs.ws(".git/hooks-new"));
    assert!(
        !dirs.ws(".git/hooks-new").exists(),
        "the denied write landed"
    );
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(&head)}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/remove", &head);
    assert_eq!(std::fs::read(&head).unwrap(), b"ref: refs/heads/main\n");
    // Reading it is fine.
    let read = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(&head)}),
        dirs.write_policy(),
    )
    .await
    .unwrap();
    assert_eq!(
        unb64(read["dataBase64"].as_str().unwrap()),
        b"ref: refs/heads/main\n"
    );
}

#[tokio::test]
async fn read_only_reads_everything_and_writes_nothing() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for path in [dirs.ws("in.txt"), dirs.out("secret.txt")] {
        let read = fs_call(
            &mut client,
            "fs/readFile",
            json!({"path": file_uri(&path)}),
            read_only(),
        )
        .await
        .unwrap();
        assert!(!unb64(read["dataBase64"].as_str().unwrap()).is_empty());
    }
    let meta = fs_call(
        &mut client,
        "fs/getMetadata",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(meta["isFile"], json!(true));
    let listing = fs_call(
        &mut client,
        "fs/readDirectory",
        json!({"path": file_uri(dirs.workspace.path())}),
        read_only(),
    )
    .await
    .unwrap();
    assert!(
        listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["fileName"] == "in.txt")
    );
    let canonical = fs_call(
        &mut client,
        "fs/canonicalize",
        json!({"path": file_uri(dirs.ws("escape"))}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(
        canonical["path"],
        json!(file_uri(
            std::fs::canonicalize(dirs.outside.path()).unwrap()
        ))
    );
    let target = dirs.ws("blocked.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&target), "dataBase64": b64("x")}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &target);
    assert!(!target.exists());
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("nd"))}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.ws("nd"));
    assert!(!dirs.ws("nd").exists(), "the denied directory was created");
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/remove", &dirs.ws("in.txt"));
    assert!(dirs.ws("in.txt").exists());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("in.txt")), "destinationPath": file_uri(dirs.ws("c.txt"))}), read_only()).await;
    assert_denied(r, "fs/copy", &dirs.ws("c.txt"));
    assert!(!dirs.ws("c.txt").exists(), "the denied copy landed");
}

#[tokio::test]
async fn deny_entries_block_reads_listing_and_copy_sources_also_through_symlinks() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": dirs.workspace.path()}, "access": "write"},
            {"path": {"type": "path", "path": dirs.outside.path()}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let spec_ok = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        policy.clone(),
    )
    .await;
    if let Err(error) = &spec_ok {
        panic!("the permissions profile shape should be accepted: {error:?}");
    }
    for path in [dirs.out("secret.txt"), dirs.ws("escape/secret.txt")] {
        let r = fs_call(
            &mut client,
            "fs/readFile",
            json!({"path": file_uri(&path)}),
            policy.clone(),
        )
        .await;
        assert_denied(r, "fs/readFile", &path);
    }
    let r = fs_call(
        &mut client,
        "fs/readDirectory",
        json!({"path": file_uri(dirs.outside.path())}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/readDirectory", dirs.outside.path());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("escape/secret.txt")), "destinationPath": file_uri(dirs.ws("stolen.txt"))}), policy.clone()).await;
    assert_denied(r, "fs/copy", &dirs.ws("escape/secret.txt"));
    assert!(!dirs.ws("stolen.txt").exists());
}

#[tokio::test]
async fn walk_under_a_sandbox_leaves_out_the_subtree_the_policy_hides() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let tree = dirs.ws("tree");
    std::fs::create_dir_all(tree.join("hidden/inner")).unwrap();
    std::fs::write(tree.join("hidden/inner/key.pem"), b"secret").unwrap();
    std::fs::create_dir(tree.join("visible")).unwrap();
    std::fs::write(tree.join("visible/b.txt"), b"b").unwrap();
    std::fs::write(tree.join("a.txt"), b"a").unwrap();
    let policy = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": tree.join("hidden")}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let listed = |result: &Value| -> Vec<String> {
        result["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["path"].as_str().expect("path").to_owned())
            .collect()
    };
    let r = fs_call(
        &mut client,
        "fs/walk",
        json!({"path": file_uri(&tree)}),
        policy,
    )
    .await;
    let result = r.expect("the walk succeeds around the hidden subtree");
    assert_eq!(result["truncated"], json!(false));
    assert_eq!(
        listed(&result),
        ["a.txt", "visible", "visible/b.txt"].map(|name| file_uri(tree.join(name)))
    );
    // Without the deny the same walk sees the subtree: its absence above is the policy's.
    let r = fs_call(
        &mut client,
        "fs/walk",
        json!({"path": file_uri(&tree)}),
        read_only(),
    )
    .await;
    let paths = listed(&r.expect("a read-only walk"));
    assert!(
        paths.contains(&file_uri(tree.join("hidden/inner/key.pem"))),
        "{paths:?}"
    );
}

#[tokio::test]
async fn sandboxed_streaming_read_works_through_a_passed_descriptor() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dirs.ws("big.bin"), &big).unwrap();
    fs_call(
        &mut client,
        "fs/open",
        json!({"handleId": "h", "path": file_uri(dirs.ws("big.bin"))}),
        read_only(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    loop {
        let block = client
            .call(
                "fs/readBlock",
                json!({"handleId": "h", "offset": got.len(), "len": 1 << 20}),
            )
            .await;
        got.extend(unb64(block["chunk"].as_str().unwrap()));
        if block["eof"] == json!(true) {
            break;
        }
    }
    assert_eq!(got, big);
    client.call("fs/close", json!({"handleId": "h"})).await;
    // Opening a denied file fails like any denial.
    let policy = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": dirs.outside.path()}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let r = fs_call(
        &mut client,
        "fs/open",
        json!({"handleId": "h2", "path": file_uri(dirs.out("secret.txt"))}),
        policy,
    )
    .await;
    assert_denied(r, "fs/open", &dirs.out("secret.txt"));
    let r = client
        .request(
            "fs/readBlock",
            json!({"handleId": "h2", "offset": 0, "len": 10}),
        )
        .await;
    assert_rpc_error(r, -32004, "notFound");
}

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

async fn sandboxed_write_inside_and_outside(tty: bool) {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let inside = dirs.ws("from-process.txt");
    let outside = dirs.out("from-process.txt");
    let script = format!(
        "echo in > {}; echo rc_in=$?; echo out > {} 2>/dev/null; echo rc_out=$?; exit 7",
        inside.display(),
        outside.display()
    );
    let extra =
        json!({"sandbox": dirs.write_policy(), "cwd": file_uri(dirs.workspace.path()), "tty": tty});
    let out = client.run("w", &sh(&script), extra).await;
    let text = if tty {
        out.pty_text()
    } else {
        out.stdout_text()
    };
    assert!(text.contains("rc_in=0"), "write inside must work: {text}");
    assert!(
        text.contains("rc_out=") && !text.contains("rc_out=0"),
        "write outside must fail: {text}"
    );
    assert_eq!(
        out.exit_code,
        Some(7),
        "the program's exit status comes through"
    );
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "in\n");
    assert!(!outside.exists(), "the outside write must not land");
    // The server keeps serving, and terminate works on a sandboxed process.
    client
        .start(
            "sleeper",
            &["/bin/sleep", "1000"],
            json!({"sandbox": dirs.write_policy(), "tty": tty}),
        )
        .await
        .unwrap();
    assert_eq!(
        client
            .call("process/terminate", json!({"processId": "sleeper"}))
            .await,
        json!({"running": true})
    );
    let out = client.collect("sleeper").await;
    assert_eq!(out.exit_code, Some(143));
    let meta = client
        .call(
            "fs/getMetadata",
            json!({"path": file_uri(dirs.workspace.path())}),
        )
        .await;
    assert_eq!(meta["isDirectory"], json!(true));
}

#[tokio::test]
async fn sandboxed_process_start_in_pipe_mode_writes_inside_not_outside() {
    sandboxed_write_inside_and_outside(false).await;
}

#[tokio::test]
async fn sandboxed_process_start_in_tty_mode_writes_inside_not_outside() {
    sandboxed_write_inside_and_outside(true).await;
}

#[tokio::test]
async fn sandboxed_process_keeps_the_requested_env_and_cwd_and_has_no_network() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    // A live listener on the host's loopback: the control run reaches it, the sandboxed one
    // must not (a dead port would "refuse" with or without a sandbox).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "pwd; echo FOO=$FOO; (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo net=yes || echo net=no"
    );
    let argv = ["/bin/bash", "--noprofile", "--norc", "-c", script.as_str()];
    let env = json!({"PATH": "/usr/bin:/bin", "FOO": "bar"});
    let control = client
        .run(
            "control",
            &argv,
            json!({"cwd": file_uri(dirs.workspace.path()), "env": env}),
        )
        .await;
    assert!(
        control.stdout_text().contains("net=yes"),
        "the control run reaches the listener: {}",
        control.stdout_text()
    );
    let accepted = std::iter::from_fn(|| listener.accept().ok()).count();
    assert_eq!(accepted, 1, "the control run's connection arrived");

    let extra = json!({
        "sandbox": dirs.write_policy(),
        "cwd": file_uri(dirs.workspace.path()),
        "env": env,
    });
    let out = client.run("e", &argv, extra).await;
    let text = out.stdout_text();
    assert!(
        text.starts_with(&format!("{}\n", dirs.workspace.path().display())),
        "{text}"
    );
    assert!(text.contains("FOO=bar"), "{text}");
    assert!(text.contains("net=no"), "{text}");
    assert!(
        listener.accept().is_err(),
        "a connection from the sandbox reached the host's listener"
    );
}

#[test]
fn standalone_helper_answers_json_for_allowed_and_denied_requests() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dirs = Dirs::new();
    let helper = tests::exec_server_binary().with_file_name("fs-helper");
    let run = |request: Value| {
        let mut child = Command::new(&helper)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(request.to_string().as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let allowed = run(
        json!({"operation": "fs/readFile", "params": {"path": file_uri(dirs.ws("in.txt"))}, "sandbox": read_only()}),
    );
    assert_eq!(
        allowed,
        json!({"status": "ok", "payload": {"dataBase64": b64("inside")}})
    );
    let target = dirs.out("helper.txt");
    let denied = run(
        json!({"operation": "fs/writeFile", "params": {"path": file_uri(&target), "dataBase64": b64("x")}, "sandbox": dirs.write_policy()}),
    );
    assert_eq!(denied["status"], json!("error"));
    assert_eq!(denied["payload"]["code"], json!(-32600));
    assert_eq!(denied["payload"]["data"]["kind"], json!("sandboxDenied"));
    assert_eq!(
        denied["payload"]["data"]["operation"],
        json!("fs/writeFile")
    );
    assert!(!target.exists());
    // A policy it cannot understand is a setup failure: non-zero exit, reason on stderr.
    let mut child = Command::new(&helper)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let bad = json!({"operation": "fs/readFile", "params": {"path": file_uri(dirs.ws("in.txt"))}, "sandbox": {"profile": "nope"}});
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bad.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&output.stderr).contains("nope"));
}

#[tokio::test]
async fn the_commands_own_tmpdir_does_not_widen_its_sandbox() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let outside = dirs.outside.path().to_str().unwrap().to_owned();
    let extra = json!({
        "sandbox": dirs.write_policy(),
        "cwd": file_uri(dirs.workspace.path()),
        // The server resolves :tmpdir from its own environment; this only sets a variable.
        "env": {"PATH": "/usr/bin:/bin", "TMPDIR": outside, "TMP": outside, "TEMP": outside},
    });
    let out = client
        .run(
            "tmpdir",
            &sh("echo x > \"$TMPDIR/escaped\"; echo rc=$?; mktemp -p \"$TMPDIR\" >/dev/null 2>&1; echo rc=$?"),
            extra,
        )
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("rc=").count(), 2, "{out:?}");
    assert!(
        !stdout.contains("rc=0"),
        "a write through $TMPDIR landed outside: {stdout}"
    );
    assert!(!dirs.out("escaped").exists());
    assert_eq!(
        std::fs::read_dir(dirs.outside.path()).unwrap().count(),
        1,
        "only secret.txt"
    );
}

#[tokio::test]
async fn ld_preload_in_the_commands_env_runs_only_inside_the_sandbox() {
    let dirs = Dirs::new();
    // A preload library that records where it ran: the Seccomp line of its /proc status, in
    // the workspace (writable inside) and, if it can, outside.
    let source = dirs.ws("evil.c");
    std::fs::write(
        &source,
        format!(
            r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {{
    char line[256], seccomp[64] = "Seccomp: ?", name[512];
    FILE *status = fopen("/proc/self/status", "r");
    while (status && fgets(line, sizeof line, status))
        if (strncmp(line, "Seccomp:", 8) == 0) {{ strncpy(seccomp, line, sizeof seccomp - 1); }}
    if (status) fclose(status);
    const char *dirs[] = {{"{ws}", "{out}"}};
    for (int i = 0; i < 2; i++) {{
        snprintf(name, sizeof name, "%s/preload-ran-%d", dirs[i], (int)getpid());
        FILE *marker = fopen(name, "w");
        if (marker) {{ fputs(seccomp, marker); fclose(marker); }}
    }}
}}
"#,
            ws = dirs.workspace.path().display(),
            out = dirs.outside.path().display()
        ),
    )
    .unwrap();
    let library = dirs.ws("evil.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("cc (the test builds a preload library)");
    assert!(built.success());
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let extra = json!({
        "sandbox": dirs.write_policy(),
        "cwd": file_uri(dirs.workspace.path()),
        "env": {"PATH": "/usr/bin:/bin", "LD_PRELOAD": library.to_str().unwrap()},
    });
    let out = client.run("preload", &["/bin/true"], extra).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let markers: Vec<(PathBuf, String)> = std::fs::read_dir(dirs.workspace.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("preload-ran-"))
        .map(|e| (e.path(), std::fs::read_to_string(e.path()).unwrap()))
        .collect();
    assert!(
        !markers.is_empty(),
        "the preload never ran (the test proves nothing)"
    );
    for (path, seccomp) in &markers {
        assert_eq!(
            seccomp.trim(),
            "Seccomp:\t2",
            "{} ran outside the sandbox's confinement",
            path.display()
        );
    }
    let outside: Vec<_> = std::fs::read_dir(dirs.outside.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("preload-ran-"))
        .collect();
    assert!(
        outside.is_empty(),
        "the preload wrote outside the workspace"
    );
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
