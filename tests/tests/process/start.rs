//! `process/start`: what is refused and why, and what the child gets (env, cwd, argv0, no
//! inherited descriptors, its own session).

use super::*;

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
