//! `exec --remote` waits for an executor and for a rendezvous started with it.

use super::*;

/// The README walk-through pasted as one block: rendezvous, executor and `exec --remote` start
/// at the same moment, and exec waits for the executor to register.
#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_waits_for_an_executor_started_at_the_same_moment() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_cli(
        remote_args(&registry, "env-late", &[], &["echo", "waited"]),
        Some(TOKEN),
    );
    let executor = start_executor_with(&registry, "env-late", &dir.path().join("identity"), &[]);
    let (status, stdout, stderr) = exec.await;
    assert_eq!(
        (status, stdout.as_str()),
        (Some(0), "waited\n"),
        "{stderr}\nexecutor:\n{}",
        executor.stderr()
    );
    // An environment that never registers fails with 255 after the bound, saying so.
    let started = Instant::now();
    let (status, _, stderr) = exec_cli(
        remote_args(
            &registry,
            "env-never",
            &["--registration-wait", "1"],
            &["/bin/true"],
        ),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, Some(255), "{stderr}");
    assert!(stderr.contains("is not registered"), "{stderr}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

/// The README walk-through where `exec --remote` runs before the rendezvous listens (a shell
/// starts all three at once): connection refused counts as "not yet" within the registration
/// wait, and a registry that never comes up fails with 255 saying it was refused.
#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_waits_for_a_rendezvous_that_is_not_listening_yet() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let registry = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let exec = exec_cli(
        remote_args(&registry, "env-early", &[], &["echo", "waited"]),
        Some(TOKEN),
    );
    let exec = tokio::spawn(exec);
    // exec's first lookups are refused: nothing listens on the port yet.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !exec.is_finished(),
        "exec gave up before the registry came up"
    );
    let rendezvous = start_rendezvous(&format!("127.0.0.1:{port}"), None);
    assert_eq!(rendezvous.first_line, registry);
    let executor = start_executor_with(&registry, "env-early", &dir.path().join("identity"), &[]);
    let (status, stdout, stderr) = exec.await.unwrap();
    assert_eq!(
        (status, stdout.as_str()),
        (Some(0), "waited\n"),
        "{stderr}\nexecutor:\n{}",
        executor.stderr()
    );
    drop(executor);
    drop(rendezvous);
    // Nothing ever listens: refused until the bound, then 255 with the refusal itself.
    let started = Instant::now();
    let (status, _, stderr) = exec_cli(
        remote_args(
            &registry,
            "env-early",
            &["--registration-wait", "1"],
            &["/bin/true"],
        ),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, Some(255), "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}
