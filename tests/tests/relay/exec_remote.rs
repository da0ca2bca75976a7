//! `exec --remote`: output, status and the failures that exit 255.

use super::*;

/// Run `exec-server exec --remote ...` to completion (killed after the deadline): status,
/// stdout, stderr.
fn exec_remote(
    registry_url: &str,
    environment_id: &str,
    token: Option<&str>,
    command: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let mut cmd = std::process::Command::new(tests::exec_server_binary());
    cmd.args([
        "exec",
        "--remote",
        registry_url,
        "--environment-id",
        environment_id,
        "--cwd",
        "/",
        "--",
    ])
    .args(command)
    .env_remove(supervisor::relay::REGISTRY_TOKEN_ENV);
    if let Some(token) = token {
        cmd.env(supervisor::relay::REGISTRY_TOKEN_ENV, token);
    }
    tests::output_within(&mut cmd, b"")
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_streams_stdout_and_stderr_and_passes_the_status_through() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let executor = start_executor(&rendezvous.first_line, "env-exec").await;
    let registry = rendezvous.first_line.clone();
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        exec_remote(
            &registry,
            "env-exec",
            Some(tests::relay::TOKEN),
            &tests::sh("echo out; echo err >&2; exit 3"),
        )
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(stdout, "out\n");
    assert_eq!(stderr, "err\n");
    // exec closed its stream on the way out, so the executor freed it at once (not after the
    // 45 s liveness timeout).
    let until = tokio::time::Instant::now() + tests::DEADLINE;
    while !executor.stderr().contains("relay stream ended") {
        assert!(
            tokio::time::Instant::now() < until,
            "the executor still holds the stream of an exited exec:\n{}",
            executor.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_without_a_token_or_with_a_wrong_one_fails_with_255() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-exec-auth").await;
    let registry = rendezvous.first_line.clone();
    let (missing, wrong) = tokio::task::spawn_blocking(move || {
        (
            exec_remote(&registry, "env-exec-auth", None, &["/bin/true"]),
            exec_remote(&registry, "env-exec-auth", Some("wrong"), &["/bin/true"]),
        )
    })
    .await
    .unwrap();
    assert_eq!(missing.0.code(), Some(255));
    assert!(
        missing.2.contains("EXECWARD_REGISTRY_TOKEN"),
        "{}",
        missing.2
    );
    assert_eq!(wrong.0.code(), Some(255));
    assert!(wrong.2.contains("401"), "{}", wrong.2);
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_to_an_unknown_environment_fails_with_255_after_the_registration_wait() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    // A registered executor under another id: the registry works, the id is just unknown.
    let _executor = start_executor(&rendezvous.first_line, "env-known").await;
    let registry = rendezvous.first_line.clone();
    let started = std::time::Instant::now();
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(tests::exec_server_binary());
        cmd.args([
            "exec",
            "--remote",
            &registry,
            "--environment-id",
            "env-nobody-registered",
            "--registration-wait",
            "1",
            "--cwd",
            "/",
            "--",
            "/bin/true",
        ])
        .env(supervisor::relay::REGISTRY_TOKEN_ENV, tests::relay::TOKEN);
        tests::output_within(&mut cmd, b"")
    })
    .await
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(status.code(), Some(255), "stderr: {stderr}");
    assert_eq!(stdout, "", "nothing ran");
    assert!(
        stderr.contains("env-nobody-registered"),
        "the error names the environment: {stderr}"
    );
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "waited {waited:?} for a 1 s registration wait"
    );
}
