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
