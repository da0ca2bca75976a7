//! Sandboxed `process/start` through `sandbox-run`: writes inside not outside (pipe and tty),
//! env, cwd and no network, the standalone helper, `TMPDIR` and `LD_PRELOAD`.

use super::*;

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

/// A command leaves a `.git` of a gigabyte in its writable workspace (a `gitdir:` line, then a
/// sparse hole). The server's next resolution of that workspace reads at most a pointer's
/// length of it: its peak RSS grows by far less than the file, and the next start runs. Before,
/// every start in that workspace read the whole file into memory (about 5 s and 1 GiB each).
#[tokio::test]
async fn a_huge_git_file_left_by_a_command_is_not_read_whole_by_the_next_start() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let extra = json!({"sandbox": dirs.write_policy(), "cwd": file_uri(dirs.workspace.path())});
    // In a directory of the workspace (its top has a `.git` directory of its own).
    let plant = "mkdir vendored && printf 'gitdir: elsewhere\\n' > vendored/.git && \
                 truncate -s 1G vendored/.git && echo planted";
    let out = client.run("plant", &sh(plant), extra.clone()).await;
    assert!(
        out.stdout_text().contains("planted"),
        "the command could not write .git: {}",
        out.stderr_text()
    );
    assert_eq!(
        std::fs::metadata(dirs.ws("vendored/.git")).unwrap().len(),
        1 << 30
    );
    let before = tests::peak_rss_kib(server.pid());
    let out = client.run("next", &sh("echo ran"), extra).await;
    assert!(out.stdout_text().contains("ran"), "{}", out.stderr_text());
    let grown = tests::peak_rss_kib(server.pid()).saturating_sub(before);
    assert!(
        grown < 128 * 1024,
        "the server's peak RSS grew by {grown} KiB resolving a workspace with a 1 GiB .git"
    );
}

/// The server examined a sandboxed command's `cwd` with its own view before anything else:
/// under a `deny` entry, "does not exist" (-32004), "is not a directory" and a started command
/// told a sandboxed client whether a path it may not see exists and what it is (inside the
/// sandbox, `stat` of it is refused alike). Now every path the policy hides, and a symlink
/// leading there, is refused alike as `sandboxDenied`, and nothing starts; beside it the
/// answers are as before.
#[tokio::test]
async fn a_cwd_the_policy_hides_is_refused_alike_whatever_is_there() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    std::fs::create_dir(dirs.out("sub")).unwrap();
    std::fs::write(dirs.out("file"), b"x").unwrap();
    std::os::unix::fs::symlink(dirs.out("missing"), dirs.ws("to-missing")).unwrap();
    std::os::unix::fs::symlink(dirs.out("sub"), dirs.ws("to-sub")).unwrap();
    let policy = super::fs::deny_outside(&dirs);
    let start = |n: usize, cwd: &Path| {
        json!({"processId": format!("p{n}"), "argv": ["/bin/true"], "sandbox": policy,
               "cwd": file_uri(cwd)})
    };
    let hidden = [
        dirs.out("sub"),
        dirs.out("file"),
        dirs.out("missing"),
        dirs.out("missing/deeper"),
        dirs.outside.path().to_path_buf(),
        dirs.ws("to-missing"),
        dirs.ws("to-sub"),
    ];
    for (n, cwd) in hidden.iter().enumerate() {
        let refused = client.request("process/start", start(n, cwd)).await;
        let error = assert_rpc_error(refused, -32600, "sandboxDenied");
        let message = error
            .message
            .replace(&format!("{:?}", cwd.display().to_string()), "CWD");
        assert!(
            message.starts_with("cwd CWD is not visible under the sandbox policy"),
            "{cwd:?}: {error:?}"
        );
    }
    let list = client.request("process/list", json!({})).await.unwrap();
    assert_eq!(list["processes"], json!([]), "nothing started");
    // Where the command may look, the answers are the usual ones.
    let missing = client
        .request("process/start", start(10, &dirs.ws("none")))
        .await;
    assert_rpc_error(missing, -32004, "notFound");
    let file = client
        .request("process/start", start(11, &dirs.ws("in.txt")))
        .await;
    assert_rpc_error(file, -32600, "notADirectory");
    let inside = client
        .request("process/start", start(12, dirs.workspace.path()))
        .await;
    assert!(inside.is_ok(), "{inside:?}");
}
