//! Bad payloads and paths: invalid base64, path traversal, non-UTF-8 paths.

use super::*;

/// Strings that are not standard padded base64, each with what is wrong with it.
fn invalid_base64() -> Vec<(&'static str, String)> {
    vec![
        ("punctuation", "not base64!".into()),
        ("missing padding", "aGk".into()),
        ("padding in the middle", "aG==aGk=".into()),
        ("embedded whitespace", "aGVs bG8=".into()),
        ("a newline", "aGVs\nbG8=".into()),
        ("the URL-safe alphabet", "-_-_".into()),
        ("non-ASCII", "aGVsbG8é".into()),
        ("4 MiB of '*'", "*".repeat(4 * 1024 * 1024)),
    ]
}

#[tokio::test]
async fn invalid_base64_is_refused_and_never_truncates_the_target() {
    let _turn = tests::siege::beside_sieges().await;
    let workspace = tempfile::Builder::new()
        .prefix("ew-hostile-")
        .tempdir_in("/tmp")
        .unwrap();
    let target = workspace.path().join("target.txt");
    std::fs::write(&target, b"original").unwrap();
    let server = server();
    let mut client = server.client().await;
    start_echo(&mut client, "cat").await;
    let sandbox = json!({"profile": "workspace-write", "cwd": file_uri(workspace.path())});
    for (what, text) in invalid_base64() {
        for (how, sandbox) in [("unsandboxed", Value::Null), ("sandboxed", sandbox.clone())] {
            let r = client
                .request(
                    "fs/writeFile",
                    json!({"path": file_uri(&target), "dataBase64": text, "sandbox": sandbox}),
                )
                .await;
            let error = assert_rpc_error(r, -32602, "invalidBase64");
            assert!(error.message.contains("base64"), "{how} {what}: {error:?}");
            assert_eq!(std::fs::read(&target).unwrap(), b"original", "{how} {what}");
        }
        let r = client
            .request("process/write", json!({"processId": "cat", "chunk": text}))
            .await;
        let error = assert_rpc_error(r, -32602, "invalidBase64");
        assert!(
            error.message.contains("base64"),
            "process/write {what}: {error:?}"
        );
    }
    // Nothing half-decoded reached the process; a valid write still does.
    assert_echoes(&mut client, "cat", "valid\n").await;
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(
        out.stdout_text(),
        "",
        "only the valid write reached cat: {out:?}"
    );
}

/// A workspace under /tmp and a sentinel file outside every writable root.
struct Traversal {
    workspace: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Traversal {
    fn new() -> Traversal {
        let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
        Traversal { workspace, outside }
    }

    /// `file://<workspace>/../../<rest>`: a URI that starts inside the workspace and climbs out.
    fn climbing(&self, rest: &Path, dots: &str) -> String {
        let ws = file_uri(self.workspace.path());
        let rest = file_uri(rest);
        format!("{ws}/{dots}/{dots}{}", rest.trim_start_matches("file://"))
    }

    fn secret(&self) -> PathBuf {
        self.outside.path().join("secret.txt")
    }
}

#[tokio::test]
async fn path_traversal_under_a_sandbox_cannot_write_outside() {
    let _turn = tests::siege::beside_sieges().await;
    let t = Traversal::new();
    // Probes in /etc are new names, never /etc/passwd itself: if the sandbox failed, the test
    // must not damage the machine it runs on. Removed below if they ever appear.
    let etc_probe = PathBuf::from(format!("/etc/ew-hostile-probe-{}", std::process::id()));
    let server = server();
    let mut client = server.client().await;
    let policies = [
        ("read-only", json!({"profile": "read-only"})),
        (
            "workspace-write",
            json!({"profile": "workspace-write", "cwd": file_uri(t.workspace.path())}),
        ),
    ];
    let mut attempts: Vec<(String, &str, Value)> = Vec::new();
    for dots in ["..", "%2E%2E", "%2e."] {
        let secret = t.climbing(&t.secret(), dots);
        let probe = t.climbing(&etc_probe, dots);
        attempts.extend([
            (
                format!("writeFile {secret}"),
                "fs/writeFile",
                json!({"path": secret, "dataBase64": b64("pwned")}),
            ),
            (
                format!("atomic writeFile {secret}"),
                "fs/writeFile",
                json!({"path": secret, "dataBase64": b64("pwned"), "atomic": true}),
            ),
            (
                format!("remove {secret}"),
                "fs/remove",
                json!({"path": secret}),
            ),
            (
                format!("copy onto {secret}"),
                "fs/copy",
                json!({"sourcePath": file_uri(t.workspace.path().join("..")), "destinationPath": secret, "recursive": true}),
            ),
            (
                format!("writeFile {probe}"),
                "fs/writeFile",
                json!({"path": probe, "dataBase64": b64("pwned")}),
            ),
            (
                format!("createDirectory {probe}"),
                "fs/createDirectory",
                json!({"path": probe}),
            ),
        ]);
    }
    attempts.push((
        "writeFile file:///tmp/../etc/<probe>".into(),
        "fs/writeFile",
        json!({"path": format!("file:///tmp/..{}", etc_probe.display()), "dataBase64": b64("x")}),
    ));
    let mut escaped = Vec::new();
    for (policy_name, policy) in &policies {
        for (what, method, params) in &attempts {
            let mut params = params.clone();
            params["sandbox"] = policy.clone();
            let r = client.request(method, params).await;
            match &r {
                Err(error) if tests::error_kind(error) == "sandboxDenied" => {}
                // A copy of /tmp fails on something it cannot read before reaching its
                // destination; that is a refusal too, as long as nothing was written.
                Err(error) if *method == "fs/copy" && error.code != 0 => {}
                other => escaped.push(format!("{policy_name}: {what} -> {other:?}")),
            }
        }
    }
    // A sandboxed process climbing out with `..` is stopped the same way.
    let script = format!(
        "echo pwned > {ws}/../..{secret}; echo pwned > /tmp/..{probe}; echo done",
        ws = t.workspace.path().display(),
        secret = t.secret().display(),
        probe = etc_probe.display()
    );
    let out = client
        .run(
            "climb",
            &sh(&script),
            json!({"sandbox": policies[1].1.clone()}),
        )
        .await;
    assert_eq!(out.stdout_text(), "done\n", "{out:?}");
    let probe_exists = etc_probe.exists();
    if probe_exists {
        let _ = std::fs::remove_file(&etc_probe);
        let _ = std::fs::remove_dir_all(&etc_probe);
    }
    assert_eq!(std::fs::read(t.secret()).unwrap(), b"outside");
    assert!(!probe_exists, "{} was created", etc_probe.display());
    assert!(escaped.is_empty(), "not denied:\n{}", escaped.join("\n"));
}

#[tokio::test]
async fn non_utf8_paths_are_served_inside_the_sandbox_and_denied_outside() {
    let _turn = tests::siege::beside_sieges().await;
    let t = Traversal::new();
    let ws = file_uri(t.workspace.path());
    let out = file_uri(t.outside.path());
    let server = server();
    let mut client = server.client().await;
    let sandbox = json!({"profile": "workspace-write", "cwd": ws});
    let name = "%FF%FEname%80.txt";
    client
        .call(
            "fs/writeFile",
            json!({"path": format!("{ws}/{name}"), "dataBase64": b64("bytes"), "sandbox": sandbox}),
        )
        .await;
    let listed = client
        .call("fs/readDirectory", json!({"path": ws, "sandbox": sandbox}))
        .await;
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec![format!("{ws}/{name}")], "exact non-UTF-8 path");
    let read = client
        .call("fs/readFile", json!({"path": paths[0], "sandbox": sandbox}))
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"bytes");
    let r = client
        .request(
            "fs/writeFile",
            json!({"path": format!("{out}/{name}"), "dataBase64": b64("x"), "sandbox": sandbox}),
        )
        .await;
    assert_rpc_error(r, -32600, "sandboxDenied");
    // A sandboxed start needs a UTF-8 cwd (sandbox-run takes it as an argument): a clear
    // refusal, never a start in some other directory.
    client
        .call(
            "fs/createDirectory",
            json!({"path": format!("{ws}/dir%FF"), "sandbox": sandbox}),
        )
        .await;
    let r = client
        .request(
            "process/start",
            json!({"processId": "p", "argv": ["/bin/pwd"], "cwd": format!("{ws}/dir%FF"),
                   "env": {}, "sandbox": {"profile": "read-only"}}),
        )
        .await;
    let error = assert_rpc_error(r, -32602, "invalidParams");
    assert!(error.message.contains("UTF-8"), "{error:?}");
    // Unsandboxed, the same directory is a fine cwd.
    let run = client
        .run("q", &["/bin/pwd"], json!({"cwd": format!("{ws}/dir%FF")}))
        .await;
    assert_eq!(
        run.stdout,
        [
            t.workspace.path().as_os_str().as_encoded_bytes(),
            b"/dir\xff\n"
        ]
        .concat()
    );
    // %00 can never name a path.
    let r = client
        .request("fs/getMetadata", json!({"path": format!("{ws}/a%00b")}))
        .await;
    assert_rpc_error(r, -32602, "invalidPath");
}
