//! `fs/*` requests that only read run under the read-only form of their sandbox (nothing
//! writable, the workspace not searched for protected names): the same reads as the full
//! policy, beside writes that still get the full one.

use super::*;

#[tokio::test]
async fn reads_and_writes_under_one_workspace_write_sandbox_get_what_the_full_policy_grants() {
    // In /dev/shm: every helper gets a private one, into which the workspace must be carried
    // (writable for writes, read-only for reads) to be seen at all.
    let workspace = tempfile::tempdir_in("/dev/shm").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let ws = |name: &str| workspace.path().join(name);
    std::fs::create_dir_all(ws(".git/hooks")).unwrap();
    std::fs::write(ws(".git/HEAD"), b"ref: refs/heads/main\n").unwrap();
    std::fs::write(ws("in.txt"), b"inside").unwrap();
    std::fs::write(outside.path().join("secret"), b"s").unwrap();
    let sandbox = json!({
        "profile": "workspace-write",
        "cwd": file_uri(workspace.path()),
        "denyPaths": [file_uri(outside.path())],
    });
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let mut call = async |method: &str, params: Value| {
        fs_call(&mut client, method, params, sandbox.clone()).await
    };
    let read = call("fs/readFile", json!({"path": file_uri(ws("in.txt"))})).await;
    assert_eq!(
        unb64(read.unwrap()["dataBase64"].as_str().unwrap()),
        b"inside"
    );
    let head = call("fs/readFile", json!({"path": file_uri(ws(".git/HEAD"))})).await;
    assert_eq!(
        unb64(head.unwrap()["dataBase64"].as_str().unwrap()),
        b"ref: refs/heads/main\n"
    );
    let listing = call(
        "fs/readDirectory",
        json!({"path": file_uri(workspace.path())}),
    )
    .await;
    let listed = listing.unwrap().to_string();
    assert!(
        listed.contains("in.txt") && listed.contains(".git"),
        "{listed}"
    );
    let denied = call(
        "fs/readFile",
        json!({"path": file_uri(outside.path().join("secret"))}),
    );
    assert_denied(denied.await, "fs/readFile", &outside.path().join("secret"));

    // Writes get the full policy: the workspace writable, its .git not.
    let new = ws("new.txt");
    let wrote = call(
        "fs/writeFile",
        json!({"path": file_uri(&new), "dataBase64": b64("new")}),
    );
    wrote.await.unwrap();
    assert_eq!(std::fs::read(&new).unwrap(), b"new");
    let hook = ws(".git/hooks/pre-commit");
    let refused = call(
        "fs/writeFile",
        json!({"path": file_uri(&hook), "dataBase64": b64("x")}),
    );
    assert_denied(refused.await, "fs/writeFile", &hook);
    assert!(!hook.exists(), "the refused write landed");

    // The pooled reader sees what the writer wrote: the host directory, not a copy.
    let again = call("fs/readFile", json!({"path": file_uri(&new)})).await;
    assert_eq!(
        unb64(again.unwrap()["dataBase64"].as_str().unwrap()),
        b"new"
    );
}
