//! exec-server exposes the sandbox's denial audit for processes started with `auditDenials`:
//! `process/denied` notifications and `denials` in `process/read`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tests::{ExecServer, assert_rpc_error, file_uri, sh};

#[tokio::test]
async fn audited_sandboxed_process_reports_its_denials() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the denial audit reads the kernel audit log: run as root"
    );
    let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
    let target = outside.path().join("denied.txt");
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let script = format!(
        "echo x > {} 2>/dev/null; echo inside > ok.txt; exit 0",
        target.display()
    );
    let extra = json!({
        "sandbox": {"profile": "workspace-write", "cwd": file_uri(workspace.path())},
        "cwd": file_uri(workspace.path()),
        "auditDenials": true,
    });
    client.start("audited", &sh(&script), extra).await.unwrap();
    let denied = client
        .wait_for_notification(
            "a process/denied notification",
            Duration::from_secs(20),
            |n| n["method"] == "process/denied" && n["params"]["denial"]["kind"] == "denial",
        )
        .await;
    let denial = &denied["params"]["denial"];
    assert_eq!(denied["params"]["processId"], json!("audited"));
    // Numbered as `afterDenial` counts, so a resuming client reads exactly what it missed.
    assert!(
        denied["params"]["number"].as_u64().is_some_and(|n| n >= 1),
        "{denied}"
    );
    // Creating a file is denied on its directory (fs.make_reg), as the kernel records it.
    let outside_dir = outside.path().to_str().unwrap().to_owned();
    assert!(
        denial["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&outside_dir)),
        "the denial names the outside path: {denial}"
    );
    assert!(
        denial["operation"]
            .as_str()
            .is_some_and(|op| op.starts_with("fs.")),
        "{denial}"
    );
    let out = client.collect("audited").await;
    assert_eq!(out.exit_code, Some(0));
    assert!(!target.exists(), "the denied write did not land");
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("ok.txt")).unwrap(),
        "inside\n"
    );
    let read = client
        .call(
            "process/read",
            json!({"processId": "audited", "afterSeq": 0}),
        )
        .await;
    let denials: &Vec<Value> = read["denials"]
        .as_array()
        .expect("process/read carries the denials");
    assert!(
        denials.iter().any(|d| d["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&outside_dir))),
        "{read}"
    );
    // The allowed write inside the workspace is not reported.
    let workspace_dir = workspace.path().to_str().unwrap().to_owned();
    assert!(
        !denials.iter().any(|d| d["path"]
            .as_str()
            .is_some_and(|p| p.starts_with(&workspace_dir))),
        "{read}"
    );
}

#[tokio::test]
async fn audit_without_a_restricting_sandbox_is_refused() {
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let r = client
        .start("a", &["/bin/true"], json!({"auditDenials": true}))
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let r = client
        .start(
            "b",
            &["/bin/true"],
            json!({"auditDenials": true, "sandbox": {"profile": "danger-full-access"}}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
}

/// The library client delivers the records as `ProcessEvent::Denied` (each once, numbered from
/// 1 without a hole) and `wait()` collects them; `exec --audit` prints them as they happen.
#[tokio::test]
async fn the_library_client_and_exec_report_denials_as_they_happen() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the denial audit reads the kernel audit log: run as root"
    );
    let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
    let target = outside.path().join("denied.txt");
    let server = ExecServer::start(&[]);
    let client = tests::library_client(server.url()).await;
    let script = format!("echo x > {} 2>/dev/null; exit 0", target.display());
    let workspace_uri = supervisor::FileUri::from_path(workspace.path()).unwrap();
    let start = |id: &str| {
        proto::methods::process::StartParams::new(id, sh(&script), workspace_uri.clone())
            .with_env_var("PATH", "/usr/bin:/bin")
    };
    let params = start("lib-audited")
        .with_sandbox(json!({"profile": "workspace-write", "cwd": file_uri(workspace.path())}))
        .with_audit_denials(true);
    let mut handle = client.start_process(params).await.unwrap();
    let mut numbers = Vec::new();
    let mut records = Vec::new();
    loop {
        match tests::next_event(&mut handle, Duration::from_secs(30)).await {
            supervisor::ProcessEvent::Denied { number, record } => {
                numbers.push(number);
                records.push(record);
            }
            supervisor::ProcessEvent::Closed { .. } => break,
            supervisor::ProcessEvent::Failed { error } => panic!("{error}"),
            _ => {}
        }
    }
    assert!(!target.exists(), "the denied write did not land");
    let expected: Vec<u64> = (1..=numbers.len() as u64).collect();
    assert_eq!(numbers, expected, "each record once, in order");
    let outside_dir = outside.path().to_str().unwrap().to_owned();
    assert!(
        records.iter().any(|r| r["kind"] == "denial"
            && r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&outside_dir))),
        "{records:?}"
    );
    assert_eq!(
        records.last().map(|r| r["kind"].clone()),
        Some(json!("coverage")),
        "the coverage record comes last: {records:?}"
    );
    // `wait()` collects the same records.
    let params = start("lib-audited-2")
        .with_sandbox(json!({"profile": "workspace-write", "cwd": file_uri(workspace.path())}))
        .with_audit_denials(true);
    let output = client
        .start_process(params)
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    // And what the tree used (sandboxed through the launcher: no rusage of its own child).
    let usage = output.usage.expect("process/exited carries usage");
    assert!(usage.wall_millis > 0, "{usage:?}");
    assert!(
        output.denials.iter().any(|r| r["kind"] == "denial"
            && r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&outside_dir))),
        "{:?}",
        output.denials
    );
    // exec --audit prints each denial with its path and a summary line.
    let mut cmd = std::process::Command::new(tests::exec_server_binary());
    cmd.args(["exec", "--connect", server.url(), "--cwd"])
        .arg(workspace.path())
        .args(["--sandbox", "workspace-write", "--audit", "--"])
        .args(sh(&script));
    let (status, stdout, stderr) = tests::output_within(&mut cmd, b"");
    assert_eq!(
        status.code(),
        Some(0),
        "{status:?}; stdout {stdout:?}; stderr {stderr}"
    );
    assert!(!target.exists(), "the denied write did not land");
    assert!(
        stderr
            .lines()
            .any(|line| line.starts_with("exec-server exec: denied fs.")
                && line.contains(&outside_dir)),
        "{stderr}"
    );
    assert!(stderr.contains("exec-server exec: audit: "), "{stderr}");
    // Control: without --audit, exec says nothing about denials.
    let mut cmd = std::process::Command::new(tests::exec_server_binary());
    cmd.args(["exec", "--connect", server.url(), "--cwd"])
        .arg(workspace.path())
        .args(["--sandbox", "workspace-write", "--"])
        .args(sh(&script));
    let (status, _, stderr) = tests::output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("exec-server exec: denied") && !stderr.contains("exec-server exec: audit"),
        "{stderr}"
    );
}
