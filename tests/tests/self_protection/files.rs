//! The server's files: its binaries in the workspace and their directory cannot be modified,
//! swapped or moved, an executor's identity file cannot be read, and a working directory an
//! earlier command planted is refused.

use super::*;

#[tokio::test]
async fn the_servers_binaries_inside_the_workspace_cannot_be_modified_or_swapped() {
    for uid in identities() {
        let setup = Setup::new(uid);
        // The install lives inside the workspace the sandbox may write.
        let bin = setup.workspace.join("tools");
        install_binaries(&bin);
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&bin, Some(uid), Some(uid)).unwrap();
            for entry in std::fs::read_dir(&bin).unwrap() {
                std::os::unix::fs::chown(entry.unwrap().path(), Some(uid), Some(uid)).unwrap();
            }
        }
        let server = ExecServer::start_binary(&bin.join("exec-server"), &[], |command| {
            command.env_clear().env("PATH", "/usr/bin:/bin");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        });
        let mut client = server.client().await;
        let sandbox = json!({"profile": "workspace-write", "cwd": file_uri(&setup.workspace)});
        let runner = bin.join("sandbox-run");
        let original = std::fs::read(&runner).unwrap();
        let script = format!(
            "echo evil > {r}; echo rc1=$?; cp /bin/true {d}/new && mv -f {d}/new {r}; echo rc2=$?; \
             rm -f {r}; echo rc3=$?",
            r = runner.display(),
            d = bin.display()
        );
        let out = client
            .run(
                "swap",
                &["/bin/sh", "-c", &script],
                json!({"sandbox": sandbox, "cwd": file_uri(&setup.workspace)}),
            )
            .await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("rc1=0") && !stdout.contains("rc2=0") && !stdout.contains("rc3=0"),
            "a sandboxed command changed the server's binaries (as {uid:?}): {stdout}"
        );
        assert_eq!(
            std::fs::read(&runner).unwrap(),
            original,
            "sandbox-run changed on disk"
        );
        // Replaced on disk all the same (by someone outside any sandbox): the server still
        // executes what it opened at startup.
        let marker = setup.workspace.join("replaced-ran");
        let evil = bin.join("evil");
        std::fs::write(
            &evil,
            format!("#!/bin/sh\ntouch {}\nexec \"$@\"\n", marker.display()),
        )
        .unwrap();
        std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&evil, &runner).unwrap();
        let out = client
            .run(
                "after-swap",
                &["/bin/sh", "-c", "echo still-sandboxed"],
                json!({"sandbox": sandbox, "cwd": file_uri(&setup.workspace)}),
            )
            .await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "still-sandboxed\n",
            "{out:?}"
        );
        assert!(
            !marker.exists(),
            "the replaced sandbox-run ran (as {uid:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandboxed_command_cannot_read_an_executors_identity_file() {
    let setup = Setup::new(None);
    // Inside the workspace, which every policy shape lets a command read: only the hiding
    // keeps it out.
    let identity = setup.workspace.join("executor-identity");
    let rendezvous = tests::relay::start_rendezvous("127.0.0.1:0", None);
    let executor =
        tests::relay::start_executor_with(&rendezvous.first_line, "env-keys", &identity, &[]);
    tests::relay::wait_registered(&rendezvous.first_line, "env-keys", &executor).await;
    assert!(
        identity.is_file(),
        "the executor created its key file: {}",
        executor.stderr()
    );
    let mut client = tests::Client::connect(&executor.first_line).await.unwrap();
    client.initialize().await;
    let path = identity.to_str().unwrap();
    for (n, (shape, sandbox)) in policy_shapes(&setup.workspace).iter().enumerate() {
        let read = probe_through(
            &mut client,
            &setup,
            &format!("key-{n}"),
            Some(sandbox),
            &["read", path],
        )
        .await;
        assert_refused(&read, &format!("identity file read: {shape}"));
    }
    // Control: unsandboxed, the same probe reads it.
    let control = probe_through(&mut client, &setup, "control", None, &["read", path]).await;
    assert_eq!(control["ok"], true, "control read: {control}");
}

/// Starts `script` with the workspace-write sandbox at `cwd` (the command's cwd too).
async fn start_at(
    client: &mut tests::Client,
    id: &str,
    cwd: &Path,
    script: &str,
) -> Result<Value, tests::RpcError> {
    let extra = json!({
        "sandbox": {"profile": "workspace-write", "cwd": file_uri(cwd)},
        "cwd": file_uri(cwd),
    });
    client.start(id, &["/bin/sh", "-c", script], extra).await
}

/// Issue 31: a workspace-write command at `ws` replaces `ws/task` with a symlink to a directory
/// outside every root; the next start at `cwd = ws/task` is refused (it would have been granted
/// the outside directory as its writable root), on both launch paths and under a root and an
/// unprivileged server. Controls: a real `ws/task` is a working cwd, and an unsandboxed start
/// through the plant writes outside (the plant is real).
#[tokio::test]
async fn a_working_directory_an_earlier_command_planted_is_refused() {
    a_planted_working_directory_is_refused(false).await;
}

/// The same with the workspace in the host's `/tmp` (where CI clones live): every command gets a
/// private `/tmp`, but the workspace is a host directory carried into it, as writable and as
/// plantable as one anywhere else.
#[tokio::test]
async fn a_working_directory_planted_in_a_workspace_under_tmp_is_refused() {
    a_planted_working_directory_is_refused(true).await;
}

async fn a_planted_working_directory_is_refused(workspace_in_tmp: bool) {
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let context =
                format!("as {uid:?} with {args:?}, workspace in /tmp: {workspace_in_tmp}");
            let setup = Setup::new(uid);
            let outside = setup.workspace.parent().unwrap().join("outside");
            std::fs::create_dir(&outside).unwrap();
            if let Some(uid) = uid {
                std::os::unix::fs::chown(&outside, Some(uid), Some(uid)).unwrap();
            }
            let in_tmp = tempfile::Builder::new()
                .prefix("execward-planted-cwd-")
                .tempdir_in("/tmp")
                .unwrap();
            let ws = if workspace_in_tmp {
                let ws = std::fs::canonicalize(in_tmp.path()).unwrap().join("ws");
                std::fs::create_dir(&ws).unwrap();
                if let Some(uid) = uid {
                    for path in [in_tmp.path(), &ws] {
                        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
                    }
                }
                ws
            } else {
                setup.workspace.clone()
            };
            let server = setup.start(uid, args);
            let mut client = server.client().await;
            let ws = &ws;
            let task = ws.join("task");
            // Control: the command makes `task` (on the host); a start there works and writes
            // there.
            start_at(&mut client, "mkdir", ws, "mkdir task")
                .await
                .unwrap();
            assert_eq!(
                client.collect("mkdir").await.exit_code,
                Some(0),
                "{context}"
            );
            assert!(
                task.is_dir(),
                "{context}: the command's mkdir did not reach the host"
            );
            start_at(&mut client, "in-task", &task, "touch made-in-task")
                .await
                .unwrap_or_else(|e| panic!("{context}: the unplanted cwd was refused: {e:?}"));
            assert_eq!(
                client.collect("in-task").await.exit_code,
                Some(0),
                "{context}"
            );
            assert!(task.join("made-in-task").exists(), "{context}");
            // The plant.
            let plant = format!("rm -rf task && ln -s {} task", outside.display());
            start_at(&mut client, "plant", ws, &plant).await.unwrap();
            assert_eq!(
                client.collect("plant").await.exit_code,
                Some(0),
                "{context}"
            );
            assert!(task.symlink_metadata().unwrap().is_symlink(), "{context}");
            // The next start through it is refused with the writable roots' message.
            let refused = start_at(&mut client, "through", &task, "touch pwned").await;
            let error = refused.expect_err(&format!("{context}: a planted cwd was accepted"));
            assert!(
                error.message.contains("resolves through the symlink"),
                "{context}: {error:?}"
            );
            assert!(!outside.join("pwned").exists(), "{context}: wrote outside");
            // Without a sandbox the same start lands outside: the plant redirects.
            client
                .start(
                    "unsandboxed",
                    &["/bin/sh", "-c", "touch redirected"],
                    json!({"cwd": file_uri(&task)}),
                )
                .await
                .unwrap();
            assert_eq!(client.collect("unsandboxed").await.exit_code, Some(0));
            assert!(outside.join("redirected").exists(), "{context}");
        }
    }
}

/// Issue 31: with the server's binaries in `ws/tools/bin` (kept read-only), a sandboxed command
/// cannot rename `ws/tools` (which would carry the read-only bind away and let it plant a
/// `ws/tools/bin/sandbox-run` the user runs next), nor `ws/tools/bin`; on both launch paths,
/// under a root and an unprivileged server. Control: unsandboxed, the rename goes through.
#[tokio::test]
async fn the_servers_binary_directory_cannot_be_moved_by_renaming_its_parent() {
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let context = format!("as {uid:?} with {args:?}");
            let setup = Setup::new(uid);
            let tools = setup.workspace.join("tools");
            let bin = tools.join("bin");
            install_binaries(&bin);
            if let Some(uid) = uid {
                for path in [&tools, &bin] {
                    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
                }
            }
            let server = ExecServer::start_binary(&bin.join("exec-server"), args, |command| {
                command.env_clear().env("PATH", "/usr/bin:/bin");
                if let Some(uid) = uid {
                    command.uid(uid).gid(uid);
                }
            });
            let mut client = server.client().await;
            let ws = file_uri(&setup.workspace);
            let sandboxed =
                json!({"sandbox": {"profile": "workspace-write", "cwd": ws}, "cwd": ws});
            let script = "mv tools moved; echo rc1=$?; mv tools/bin tools/moved; echo rc2=$?";
            let out = client
                .run("rename", &["/bin/sh", "-c", script], sandboxed)
                .await;
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("rc1=1") && stdout.contains("rc2=1"),
                "{context}: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                bin.join("sandbox-run").is_file(),
                "{context}: the binaries moved"
            );
            assert!(!setup.workspace.join("moved").exists(), "{context}");
            let out = client
                .run(
                    "free",
                    &[
                        "/bin/sh",
                        "-c",
                        "mv tools moved && mv moved tools && echo moved-back",
                    ],
                    json!({"cwd": ws}),
                )
                .await;
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "moved-back\n",
                "{context}: the unsandboxed control could not rename: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
