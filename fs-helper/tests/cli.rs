//! The `fs-helper` binary on its own, as a CI job or a test would call it: one-shot requests on
//! stdin, serve mode with framed requests, and the kernel refusing what the policy does not
//! allow (the write must not land).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support functions outside #[test]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const HELPER: &str = env!("CARGO_BIN_EXE_fs-helper");

#[path = "../../tests/src/scratch.rs"]
mod scratch;

/// A workspace and a sibling directory outside it, neither under a profile's writable roots
/// (`/tmp`, `$TMPDIR`), wherever the checkout lives.
fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let base = scratch::scratch_dir("fs-helper-cli-");
    let root = std::fs::canonicalize(base.path()).unwrap();
    let workspace = root.join("workspace");
    let outside = root.join("outside");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::create_dir(&outside).unwrap();
    scratch::assert_outside_writable_roots(&outside);
    (base, workspace, outside)
}

fn uri(path: &Path) -> Value {
    serde_json::to_value(proto::FileUri::from_path(path).unwrap()).unwrap()
}

fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(HELPER)
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// One request, one response; the helper exits 0 whatever the operation's outcome.
fn one_shot(request: &Value) -> Value {
    let output = run(&[], request.to_string().as_bytes());
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn workspace_write(workspace: &Path) -> Value {
    json!({"profile": "workspace-write", "cwd": uri(workspace)})
}

#[test]
fn help_explains_both_modes() {
    let output = Command::new(HELPER).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in ["One-shot", "--serve", "--sandbox", "--deny", "125"] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
}

#[test]
fn one_shot_read_only_reads_and_refuses_to_write() {
    let (_base, workspace, _outside) = dirs();
    let file = workspace.join("notes.txt");
    std::fs::write(&file, b"hello from the workspace").unwrap();
    let sandbox = json!({"profile": "read-only", "cwd": uri(&workspace)});

    let read = one_shot(&json!({
        "operation": "fs/readFile", "params": {"path": uri(&file)}, "sandbox": sandbox,
    }));
    assert_eq!(read["status"], "ok", "{read}");
    assert_eq!(
        read["payload"]["dataBase64"],
        "aGVsbG8gZnJvbSB0aGUgd29ya3NwYWNl"
    );

    let target = workspace.join("new.txt");
    let write = one_shot(&json!({
        "operation": "fs/writeFile",
        "params": {"path": uri(&target), "dataBase64": "aGk="},
        "sandbox": sandbox,
    }));
    assert_eq!(write["status"], "error", "{write}");
    assert_eq!(write["payload"]["data"]["kind"], "sandboxDenied", "{write}");
    assert!(!target.exists(), "the denied write landed");
}

/// `sizeAbove`: a larger file the policy lets the helper open is answered with its size, not
/// read; a denied file is denied whatever its size (the size of a file outside the policy never
/// leaves the sandbox); a file within the threshold is read; no other method takes it.
#[test]
fn size_above_answers_a_size_only_for_a_file_the_policy_opens() {
    let (_base, workspace, outside) = dirs();
    let allowed = workspace.join("five.txt");
    std::fs::write(&allowed, b"12345").unwrap();
    let denied = outside.join("secret.bin");
    std::fs::write(&denied, vec![0u8; 100_000]).unwrap();
    let sandbox = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": outside}, "access": "deny"}
        ]}},
        "cwd": uri(&workspace)
    });
    let read = |path: &Path, size_above: u64| {
        one_shot(&json!({
            "operation": "fs/readFile", "params": {"path": uri(path)}, "sandbox": sandbox,
            "sizeAbove": size_above,
        }))
    };
    assert_eq!(read(&allowed, 2), json!({"status": "size", "payload": 5}));
    let whole = read(&allowed, 5);
    assert_eq!(whole["status"], "ok", "{whole}");
    assert_eq!(whole["payload"]["dataBase64"], "MTIzNDU=");
    for size_above in [0, 1_000_000] {
        let refused = read(&denied, size_above);
        assert_eq!(refused["status"], "error", "{refused}");
        assert_eq!(
            refused["payload"]["data"]["kind"], "sandboxDenied",
            "{refused}"
        );
    }
    let other = one_shot(&json!({
        "operation": "fs/getMetadata", "params": {"path": uri(&allowed)}, "sizeAbove": 1,
    }));
    assert_eq!(other["status"], "error", "{other}");
    assert_eq!(other["payload"]["code"], -32600, "{other}");
}

#[test]
fn one_shot_workspace_write_writes_inside_and_is_denied_outside() {
    let (_base, workspace, outside) = dirs();
    let inside = workspace.join("ok.txt");
    let written = one_shot(&json!({
        "operation": "fs/writeFile",
        "params": {"path": uri(&inside), "dataBase64": "aGk="},
        "sandbox": workspace_write(&workspace),
    }));
    assert_eq!(written["status"], "ok", "{written}");
    assert_eq!(std::fs::read(&inside).unwrap(), b"hi");

    let escaped = outside.join("escaped.txt");
    let denied = one_shot(&json!({
        "operation": "fs/writeFile",
        "params": {"path": uri(&escaped), "dataBase64": "aGk="},
        "sandbox": workspace_write(&workspace),
    }));
    assert_eq!(denied["status"], "error", "{denied}");
    assert_eq!(
        denied["payload"]["data"]["kind"], "sandboxDenied",
        "{denied}"
    );
    assert_eq!(denied["payload"]["data"]["operation"], "fs/writeFile");
    assert!(!escaped.exists(), "the denied write landed");

    // A symlink inside the workspace pointing outside does not get the write out either.
    std::os::unix::fs::symlink(&outside, workspace.join("link")).unwrap();
    let through_link = one_shot(&json!({
        "operation": "fs/writeFile",
        "params": {"path": uri(&workspace.join("link/via-link.txt")), "dataBase64": "aGk="},
        "sandbox": workspace_write(&workspace),
    }));
    assert_eq!(through_link["status"], "error", "{through_link}");
    assert!(
        !outside.join("via-link.txt").exists(),
        "write escaped through a symlink"
    );
}

#[test]
fn bad_requests_get_json_errors_and_bad_policies_exit_125() {
    let malformed = run(&[], b"{\"operation\": \"fs/readFile\"");
    assert_eq!(malformed.status.code(), Some(0));
    let malformed: Value = serde_json::from_slice(&malformed.stdout).unwrap();
    assert_eq!(malformed["status"], "error");
    assert_eq!(malformed["payload"]["code"], -32600, "{malformed}");

    let unknown = one_shot(&json!({"operation": "fs/nope", "params": {}}));
    assert_eq!(unknown["payload"]["code"], -32601, "{unknown}");

    let bad_params =
        one_shot(&json!({"operation": "fs/readFile", "params": {"path": "/etc/hostname"}}));
    assert_eq!(bad_params["payload"]["code"], -32602, "{bad_params}");
    assert!(
        bad_params["payload"]["message"]
            .as_str()
            .unwrap()
            .contains("file:"),
        "the message should show the expected URI form: {bad_params}"
    );

    let setup = run(
        &[],
        json!({"operation": "fs/readFile", "params": {"path": "file:///etc/hostname"},
               "sandbox": {"profile": "no-such-profile"}})
        .to_string()
        .as_bytes(),
    );
    assert_eq!(setup.status.code(), Some(125), "{setup:?}");
    assert!(setup.stdout.is_empty(), "{setup:?}");
    assert!(
        String::from_utf8_lossy(&setup.stderr).contains("no-such-profile"),
        "{setup:?}"
    );
}

fn frame(request: &Value) -> Vec<u8> {
    let body = request.to_string().into_bytes();
    let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn frames(mut bytes: &[u8]) -> Vec<Value> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut len = [0u8; 4];
        bytes.read_exact(&mut len).unwrap();
        let len = u32::from_be_bytes(len) as usize;
        out.push(serde_json::from_slice(&bytes[..len]).unwrap());
        bytes = &bytes[len..];
    }
    out
}

#[test]
fn serve_mode_answers_every_frame_under_one_policy() {
    let (_base, workspace, outside) = dirs();
    std::fs::write(workspace.join("a.txt"), b"A").unwrap();
    let sandbox = workspace_write(&workspace);
    let escaped = outside.join("escaped.txt");
    let mut input = Vec::new();
    input.extend(frame(&json!({
        "operation": "fs/readFile", "params": {"path": uri(&workspace.join("a.txt"))},
        "sandbox": sandbox,
    })));
    input.extend(frame(&json!({
        "operation": "fs/writeFile",
        "params": {"path": uri(&escaped), "dataBase64": "aGk="},
        "sandbox": sandbox,
    })));
    input.extend(frame(&json!({
        "operation": "fs/createDirectory",
        "params": {"path": uri(&workspace.join("sub/dir")), "recursive": true},
        "sandbox": sandbox,
    })));
    // A request under another policy is refused rather than served with the wrong one.
    input.extend(frame(&json!({
        "operation": "fs/readFile", "params": {"path": uri(&workspace.join("a.txt"))},
        "sandbox": {"profile": "read-only", "cwd": uri(&workspace)},
    })));
    let output = run(&["--serve", "--sandbox", &sandbox.to_string()], &input);
    assert!(output.status.success(), "{output:?}");
    let answers = frames(&output.stdout);
    assert_eq!(answers.len(), 4, "{answers:?}");
    assert_eq!(answers[0]["status"], "ok");
    assert_eq!(answers[0]["payload"]["dataBase64"], "QQ==");
    assert_eq!(
        answers[1]["payload"]["data"]["kind"], "sandboxDenied",
        "{}",
        answers[1]
    );
    assert!(!escaped.exists(), "the denied write landed");
    assert_eq!(answers[2]["status"], "ok", "{}", answers[2]);
    assert!(workspace.join("sub/dir").is_dir());
    assert_eq!(answers[3]["status"], "error", "{}", answers[3]);
}

/// The uid the root runs of [`writing_operations_work_unprivileged_and_leave_no_temporary_files`]
/// drop to.
const NOBODY: u32 = 65534;

/// One-shot request as an unprivileged user: uid 65534 when the test runs as root, the
/// test's own uid otherwise.
fn one_shot_unprivileged(request: &Value) -> Value {
    use std::os::unix::process::CommandExt;
    // uid 65534 must be able to reach the binary, wherever the checkout lives (a 0700 home).
    // So must its working directory: cargo runs tests in the package directory.
    let mut command = Command::new(scratch::traversable(std::path::Path::new(HELPER)));
    command
        .current_dir("/")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if nix::unistd::geteuid().is_root() {
        // std drops the supplementary groups too when root sets a uid.
        command.uid(NOBODY).gid(NOBODY);
    }
    let mut child = command.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn writing_operations_work_unprivileged_and_leave_no_temporary_files() {
    let base = tempfile::Builder::new()
        .prefix("fs-helper-nobody-")
        .tempdir_in("/tmp")
        .unwrap();
    let root = std::fs::canonicalize(base.path()).unwrap();
    if nix::unistd::geteuid().is_root() {
        let nobody = Some(nix::unistd::Uid::from_raw(NOBODY));
        nix::unistd::chown(&root, nobody, Some(nix::unistd::Gid::from_raw(NOBODY))).unwrap();
    }
    let ok = |request: Value| {
        let response = one_shot_unprivileged(&request);
        assert_eq!(response["status"], "ok", "{request} -> {response}");
    };
    // A temporary file of a writer that died (nobody holds its lock), made by the same user.
    let stale = root.join(".execward-write-dead-writer");
    ok(json!({"operation": "fs/writeFile",
              "params": {"path": uri(&stale), "dataBase64": "c3RhbGU="}}));
    for (mode, sandbox) in [
        ("none", Value::Null),
        ("workspace-write", workspace_write(&root)),
    ] {
        let dir = root.join(mode);
        let target = dir.join("tree/file");
        let requests = [
            json!({"operation": "fs/createDirectory",
                   "params": {"path": uri(&dir.join("tree/sub")), "recursive": true}}),
            json!({"operation": "fs/writeFile",
                   "params": {"path": uri(&target), "dataBase64": "b25l", "atomic": true}}),
            json!({"operation": "fs/writeFile",
                   "params": {"path": uri(&target), "dataBase64": "dHdv", "atomic": true}}),
            json!({"operation": "fs/writeFile",
                   "params": {"path": uri(&dir.join("tree/sub/in-place")), "dataBase64": "eA=="}}),
            json!({"operation": "fs/copy",
                   "params": {"sourcePath": uri(&dir.join("tree")),
                              "destinationPath": uri(&dir.join("copy")), "recursive": true}}),
            json!({"operation": "fs/remove",
                   "params": {"path": uri(&dir.join("tree/sub")), "recursive": true}}),
        ];
        for mut request in requests {
            request["sandbox"] = sandbox.clone();
            ok(request);
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"two", "{mode}");
        assert_eq!(
            std::fs::read(dir.join("copy/sub/in-place")).unwrap(),
            b"x",
            "{mode}"
        );
        assert!(!dir.join("tree/sub").exists(), "{mode}");
        let mut names: Vec<_> = std::fs::read_dir(dir.join("tree"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["file"], "{mode}: a temporary file was left behind");
    }
    // The first atomic write in the root swept the dead writer's file; nothing else is there.
    ok(json!({"operation": "fs/writeFile",
              "params": {"path": uri(&root.join("last")), "dataBase64": "eA==", "atomic": true}}));
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["last", "none", "workspace-write"]);
}
