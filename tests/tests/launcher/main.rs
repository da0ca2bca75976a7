//! Sandboxed `process/start` through the session's pre-confined launcher: commands of one
//! launcher are as separate as commands started one `sandbox-run` at a time, a dead launcher
//! takes only its own commands with it, and `--one-shot-sandbox` turns the launchers off.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::{ExecServer, file_uri, sh};
use tests::{children_of, cmdline};

mod pid1;

/// One test of this file at a time: every server registers its secrets for every other
/// server's sandboxes to hide, so a server another test starts or stops changes the policy of
/// this test's next start, and a launcher is reused only for the same policy. Tests that count
/// launchers would see a second one.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn policy(dirs: &tests::SandboxDirs) -> Value {
    policy_in(dirs.workspace.path())
}

/// workspace-write with `workspace` as the sandbox's workspace and the command's cwd.
fn policy_in(workspace: &std::path::Path) -> Value {
    json!({
        "sandbox": {"profile": "workspace-write", "cwd": file_uri(workspace)},
        "cwd": file_uri(workspace),
    })
}

/// The unprivileged identity the server also runs as.
const NOBODY: u32 = 65534;

/// The server's children running `sandbox-run` with `flag`.
fn helpers_of(server: &ExecServer, flag: &str) -> Vec<i32> {
    children_of(server.pid())
        .into_iter()
        .filter(|pid| cmdline(*pid).starts_with(&format!("sandbox-run {flag}")))
        .collect()
}

/// Waits until `what` holds (the process tables change after the RPCs return).
async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + tests::DEADLINE;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < until, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await; // polling interval
    }
}

/// Terminates `id` and checks it ended by the SIGTERM (143).
async fn terminated_by_sigterm(client: &mut tests::Client, id: &str) {
    client
        .call("process/terminate", json!({"processId": id}))
        .await;
    assert_eq!(client.collect(id).await.exit_code, Some(143), "{id}");
}

/// Connects to its own abstract socket (the control) and to the sibling's (`$N`).
const REACH: &str = r#"
import os, socket
def reach(name):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(name)
        return "connected"
    except OSError as e:
        return e.__class__.__name__
own = socket.socket(socket.AF_UNIX)
own.bind(b"\0execward-own")
own.listen()
print("own=" + reach(b"\0execward-own"))
print("sibling=" + reach(b"\0" + os.environ["N"].encode()))
"#;

#[tokio::test]
async fn commands_of_one_launcher_cannot_see_or_reach_each_other() {
    let _serial = SERIAL.lock().await;
    siblings_cannot_see_or_reach_each_other(None).await;
}

#[tokio::test]
async fn commands_of_one_launcher_cannot_see_or_reach_each_other_under_an_unprivileged_server() {
    let _serial = SERIAL.lock().await;
    tests::require_root("the server runs as uid 65534");
    siblings_cannot_see_or_reach_each_other(Some(NOBODY)).await;
}

/// A server run as root (`None`) or as `uid`, with a workspace and an install of the binaries
/// where that uid can reach them (under the returned scratch directory).
fn server_as(uid: Option<u32>) -> (tempfile::TempDir, std::path::PathBuf, ExecServer) {
    let base = tests::scratch::scratch_dir("launcher-");
    let root = std::fs::canonicalize(base.path()).unwrap();
    let workspace = root.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&workspace, Some(uid), Some(uid)).unwrap();
    }
    let bin = root.join("bin");
    tests::install_binaries(&bin);
    let server = ExecServer::start_binary(&bin.join("exec-server"), &[], |command| {
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(uid);
        }
    });
    (base, workspace, server)
}

/// Two commands of one launcher, with the server run as root (`None`) or as `uid`.
async fn siblings_cannot_see_or_reach_each_other(uid: Option<u32>) {
    let (_base, workspace, server) = server_as(uid);
    let mut client = server.client().await;
    // A leaves traces everywhere a sibling could look: a file in /tmp, a SysV message
    // queue, a listening abstract unix socket, and its own process.
    let first = "echo secret > /tmp/first-file; ipcmk -Q > /dev/null; \
                 exec python3 -c 'import socket,time; s=socket.socket(socket.AF_UNIX); \
                 s.bind(b\"\\0execward-launcher-first\"); s.listen(); print(\"ready\", flush=True); \
                 time.sleep(1000)'";
    client
        .start("first", &sh(first), policy_in(&workspace))
        .await
        .unwrap();
    client.wait_for_output("first", "ready").await;
    let launchers = helpers_of(&server, "--launcher");
    assert_eq!(launchers.len(), 1, "one launcher for the session's policy");
    let host_pid = tests::descendants(launchers[0])
        .into_iter()
        .find(|pid| cmdline(*pid).contains("execward-launcher-first"))
        .expect("the first command runs under the launcher");
    // B's own command lines never contain the name (it is built from parts, and grep's
    // pattern does not match itself).
    let second = format!(
        "echo pid=$$; ls -A /tmp | tr '\\n' ' '; echo; \
         N=execward-launcher-; N=${{N}}first; \
         echo seen=$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'execward-launcher-firs[t]'); \
         echo queues=$(ipcs -q | grep -c '^0x'); \
         kill -0 {host_pid} 2>/dev/null; echo kill_rc=$?; \
         N=$N python3 -c \"$REACH\""
    );
    let mut extra = policy_in(&workspace);
    extra["env"] = json!({"PATH": "/usr/bin:/bin", "REACH": REACH});
    let out = client.run("second", &sh(&second), extra).await;
    let text = out.stdout_text();
    assert_eq!(out.exit_code, Some(0), "{text} {}", out.stderr_text());
    assert_eq!(
        helpers_of(&server, "--launcher"),
        launchers,
        "the second command used the same launcher"
    );
    assert!(text.contains("pid=2\n"), "its own PID namespace: {text}");
    assert!(!text.contains("first-file"), "a private /tmp: {text}");
    assert!(text.contains("seen=0\n"), "no sibling in its /proc: {text}");
    assert!(text.contains("queues=0\n"), "its own IPC namespace: {text}");
    assert!(
        text.contains("kill_rc=") && !text.contains("kill_rc=0"),
        "cannot signal the sibling: {text}"
    );
    assert!(
        text.contains("own=connected"),
        "abstract sockets work: {text}"
    );
    assert!(
        text.contains("sibling=") && !text.contains("sibling=connected"),
        "the sibling's abstract socket is out of reach: {text}"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{host_pid}")).exists(),
        "the first command is untouched"
    );
    terminated_by_sigterm(&mut client, "first").await;
}

#[tokio::test]
async fn a_killed_launcher_ends_its_commands_and_the_next_start_gets_a_new_one() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    client
        .start("sleeper", &["/bin/sleep", "1000"], policy(&dirs))
        .await
        .unwrap();
    let launcher = eventually("a launcher runs", || {
        helpers_of(&server, "--launcher").first().copied()
    })
    .await;
    let sleeper = eventually("the command runs under it", || {
        tests::descendants(launcher)
            .into_iter()
            .find(|pid| cmdline(*pid).starts_with("/bin/sleep"))
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = client.collect("sleeper").await;
    assert_eq!(
        out.exit_code,
        Some(137),
        "the command died with its sandbox"
    );
    tests::wait_process_dead(sleeper, tests::DEADLINE, "the sandboxed sleep");
    let out = client
        .run("after", &["/bin/echo", "still serving"], policy(&dirs))
        .await;
    assert_eq!(
        out.stdout_text(),
        "still serving\n",
        "{}",
        out.stderr_text()
    );
    assert_eq!(out.exit_code, Some(0));
    let replacement = helpers_of(&server, "--launcher");
    assert_eq!(replacement.len(), 1, "a new launcher");
    assert_ne!(replacement[0], launcher);
}

/// The mount namespaces `pid` holds open (`/proc/PID/fd` entries `mnt:[...]`).
fn mount_namespaces_held_by(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| std::fs::read_link(entry.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("mnt:["))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn the_launcher_holds_a_commands_mount_namespace_only_until_its_pid_1_is_gone() {
    let _serial = SERIAL.lock().await;
    launcher_holds_namespaces_of_running_commands_only(None).await;
}

#[tokio::test]
async fn the_launcher_of_an_unprivileged_server_holds_mount_namespaces_the_same_way() {
    let _serial = SERIAL.lock().await;
    launcher_holds_namespaces_of_running_commands_only(Some(NOBODY)).await;
}

/// One namespace held per running command, none once they ended, with the server run as root
/// (`None`) or as `uid`.
async fn launcher_holds_namespaces_of_running_commands_only(uid: Option<u32>) {
    let (_base, workspace, server) = server_as(uid);
    let mut client = server.client().await;
    let out = client
        .run("first", &["/bin/true"], policy_in(&workspace))
        .await;
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr_text());
    let launcher = eventually("a launcher runs", || {
        helpers_of(&server, "--launcher").first().copied()
    })
    .await;
    for id in ["sleeper-1", "sleeper-2"] {
        client
            .start(id, &["/bin/sleep", "1000"], policy_in(&workspace))
            .await
            .unwrap();
    }
    assert_eq!(
        mount_namespaces_held_by(launcher),
        2,
        "one namespace per running command"
    );
    for id in ["sleeper-1", "sleeper-2"] {
        terminated_by_sigterm(&mut client, id).await;
    }
    // Ended commands leave nothing held: a namespace per start would pile up otherwise.
    for run in 0..20 {
        let out = client
            .run(
                &format!("short-{run}"),
                &["/bin/true"],
                policy_in(&workspace),
            )
            .await;
        assert_eq!(out.exit_code, Some(0), "{}", out.stderr_text());
    }
    eventually("every ended command's namespace is let go", || {
        (mount_namespaces_held_by(launcher) == 0).then_some(())
    })
    .await;
    assert_eq!(
        helpers_of(&server, "--launcher"),
        [launcher],
        "one launcher"
    );
}

#[tokio::test]
async fn a_launched_commands_exit_is_reported_once_what_it_left_behind_is_gone() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    // Without the kill, the daemon would die only as PID 1 finishes exiting, a fraction of a
    // millisecond after the status: enough runs catch that in all but freak cases.
    for run in 0..30 {
        // A daemon in a session of its own, holding none of the command's stdio: only the
        // end of the command's PID namespace stops it.
        let mark = format!("{}{run}", 4_000_000 + std::process::id());
        let id = format!("leaves-{run}");
        client
            .start(
                &id,
                &sh(&format!(
                    "( setsid sleep {mark} >/dev/null 2>&1 & ); echo started"
                )),
                policy(&dirs),
            )
            .await
            .unwrap();
        let exited = client
            .wait_for_notification("the exit", tests::DEADLINE, |message| {
                message["method"] == "process/exited" && message["params"]["processId"] == id
            })
            .await;
        // Checked the moment the exit arrives: the daemon was killed and reaped before.
        assert_eq!(tests::sleeping(&mark), Vec::<i32>::new(), "run {run}");
        assert_eq!(exited["params"]["exitCode"], 0, "{exited}");
        let out = client.collect(&id).await;
        assert_eq!(out.stdout_text(), "started\n", "{}", out.stderr_text());
    }
    assert_eq!(
        helpers_of(&server, "--launcher").len(),
        1,
        "through a launcher"
    );
}

#[tokio::test]
async fn one_shot_sandbox_starts_each_command_with_a_sandbox_run_of_its_own() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&["--one-shot-sandbox"]);
    let mut client = server.client().await;
    client
        .start("sleeper", &["/bin/sleep", "1000"], policy(&dirs))
        .await
        .unwrap();
    eventually("the command runs in a sandbox-run of its own", || {
        (!helpers_of(&server, "--launch-fd").is_empty()).then_some(())
    })
    .await;
    assert!(helpers_of(&server, "--launcher").is_empty(), "no launcher");
    let out = client
        .run("echo", &["/bin/echo", "one shot"], policy(&dirs))
        .await;
    assert_eq!(out.stdout_text(), "one shot\n");
    terminated_by_sigterm(&mut client, "sleeper").await;
}

#[tokio::test]
async fn a_workspace_replaced_since_the_launcher_started_is_seen_as_it_is_now() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let workspace = dirs.workspace.path().to_owned();
    std::fs::write(workspace.join("old-marker"), b"old").unwrap();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let out = client
        .run("before", &["/bin/ls", "-A"], policy(&dirs))
        .await;
    assert_eq!(out.stdout_text(), "old-marker\n");
    // On the host, the workspace directory is swapped for a new one at the same path.
    let moved = dirs.outside.path().join("old-workspace");
    std::fs::rename(&workspace, &moved).unwrap();
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("new-marker"), b"new").unwrap();
    let out = client
        .run(
            "after",
            &sh("ls -A; echo written > from-sandbox"),
            policy(&dirs),
        )
        .await;
    assert_eq!(out.stdout_text(), "new-marker\n", "{}", out.stderr_text());
    assert_eq!(
        std::fs::read_to_string(workspace.join("from-sandbox")).unwrap(),
        "written\n",
        "the write landed in the new workspace"
    );
    assert!(!moved.join("from-sandbox").exists(), "not in the old one");
}

#[tokio::test]
async fn past_four_launchers_a_session_starts_one_shot_and_every_command_runs() {
    let _serial = SERIAL.lock().await;
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    // Five working directories: five layouts, one launcher each until the session's bound.
    let workspaces: Vec<tests::SandboxDirs> = (0..5).map(|_| tests::SandboxDirs::new()).collect();
    for (index, dirs) in workspaces.iter().enumerate() {
        client
            .start(
                &format!("sleeper-{index}"),
                &["/bin/sleep", "1000"],
                policy(dirs),
            )
            .await
            .unwrap();
    }
    eventually("four launchers and one one-shot sandbox-run", || {
        (helpers_of(&server, "--launcher").len() == 4
            && helpers_of(&server, "--launch-fd").len() == 1)
            .then_some(())
    })
    .await;
    for index in 0..5 {
        let id = format!("sleeper-{index}");
        terminated_by_sigterm(&mut client, &id).await;
    }
}
