//! `--sandbox` (a JSON object, a profile file, the policy flags), the limit that ended a
//! command, exit statuses 126 and 127, and the separator hint.

use super::*;

#[test]
fn exec_says_which_limit_ended_the_command() {
    let server = server();
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--limits", "wallSeconds=1"],
            &["sleep", "30"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("killed: wall-clock limit reached (limit 1 s)"),
        "{stderr}"
    );
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--limits", "memoryBytes=64M"],
            &["python3", "-c", "x = bytearray(512 * 1024 * 1024)"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("killed: out of memory (limit 64 MiB)"),
        "{stderr}"
    );
    // A normal exit says nothing more.
    let (status, _, stderr) = output_within(&mut exec(server.url(), &[], &["true"]), b"");
    assert_eq!(status.code(), Some(0));
    assert_eq!(stderr, "");
}

#[test]
fn sandbox_takes_a_json_object() {
    let server = server();
    let base = tests::scratch::scratch_dir("exec-sandbox-json-");
    let target = base.path().join("written.txt");
    tests::scratch::assert_outside_writable_roots(base.path());
    let script = format!("echo x > {} || echo denied", target.display());
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", r#"{"type":"read-only"}"#],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "denied\n", "{stderr}");
    assert!(!target.exists(), "the read-only sandbox let the write land");
    // Control: unsandboxed, the same write lands.
    let (status, _, stderr) = output_within(&mut exec(server.url(), &[], &sh(&script)), b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(target.exists());
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", "{not json"], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(255));
    assert!(stderr.contains("not valid JSON"), "{stderr}");
}

#[test]
fn a_missing_or_unexecutable_program_exits_127_or_126_as_under_sandbox_run() {
    let server = server();
    for sandbox in [&[][..], &["--sandbox", "read-only"][..]] {
        let (status, _, stderr) = output_within(
            &mut exec(server.url(), sandbox, &["no-such-program-x"]),
            b"",
        );
        assert_eq!(status.code(), Some(127), "{sandbox:?}: {stderr}");
        let (status, _, stderr) =
            output_within(&mut exec(server.url(), sandbox, &["/etc/passwd"]), b"");
        assert_eq!(status.code(), Some(126), "{sandbox:?}: {stderr}");
    }
    // A missing working directory is exec's own failure, not the program's.
    let mut cmd = Command::new(exec_server_binary());
    cmd.args([
        "exec",
        "--connect",
        server.url(),
        "--cwd",
        "/no-such-dir-x",
        "--",
        "true",
    ]);
    let (status, _, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(255), "{stderr}");
}

#[test]
fn a_command_without_the_separator_gets_a_hint() {
    let mut cmd = Command::new(exec_server_binary());
    cmd.args(["exec", "--connect", "ws://127.0.0.1:9", "ls", "-la"]);
    let (status, _, stderr) = output_within(&mut cmd, b"");
    assert_eq!(status.code(), Some(2));
    assert!(
        stderr.contains("hint: the command goes after `--`"),
        "{stderr}"
    );
}

/// `exec` takes the policy forms and flags `sandbox-run` takes: a profile file, `--writable-root`,
/// `--deny`, `--allow`; each checked by what the command could do with and without it.
#[test]
fn sandbox_takes_a_profile_file_and_the_policy_flags_sandbox_run_takes() {
    let server = server();
    let base = tests::scratch::scratch_dir("exec-sandbox-flags-");
    tests::scratch::assert_outside_writable_roots(base.path());
    let profile = base.path().join("mine.toml");
    std::fs::write(
        &profile,
        "description = \"reads the system\"\n[filesystem]\n\":minimal\" = \"read\"\n",
    )
    .unwrap();
    let secret = base.path().join("secret.txt");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let target = base.path().join("written.txt");
    let script = format!(
        "cat {} 2>/dev/null || echo unreadable; echo x > {} 2>/dev/null || echo denied",
        secret.display(),
        target.display()
    );
    let file = profile.to_str().unwrap();
    let root = base.path().to_str().unwrap();
    let secret_arg = secret.to_str().unwrap();
    // The file's policy: only :minimal is readable, nothing writable.
    let (status, stdout, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", file], &sh(&script)),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "unreadable\ndenied\n", "{stderr}");
    assert!(
        !target.exists(),
        "the profile file's sandbox let the write land"
    );
    // --writable-root makes the scratch directory writable (and readable).
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", file, "--writable-root", root],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "s3cret\n", "{stderr}");
    assert!(
        target.exists(),
        "--writable-root did not make the root writable"
    );
    std::fs::remove_file(&target).unwrap();
    // --deny takes the one file back out of it, and only that file.
    let (status, stdout, stderr) = output_within(
        &mut exec(
            server.url(),
            &[
                "--sandbox",
                "workspace-write",
                "--writable-root",
                root,
                "--deny",
                secret_arg,
            ],
            &sh(&script),
        ),
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "unreadable\n", "{stderr}");
    assert!(
        target.exists(),
        "the write beside the denied file should land"
    );
    // A named allowance the server does not know is an error that names it and the known ones.
    let (status, _, stderr) = output_within(
        &mut exec(
            server.url(),
            &["--sandbox", "read-only", "--allow", "toolchain-cachez"],
            &["true"],
        ),
        b"",
    );
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(
        stderr.contains("toolchain-cachez") && stderr.contains("toolchain-caches"),
        "{stderr}"
    );
    // A profile file that does not parse is reported before anything is sent.
    std::fs::write(&profile, "[filesystem]\n\"/\" = \"rwx\"\n").unwrap();
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--sandbox", file], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(stderr.contains("mine.toml"), "{stderr}");
    // The flags need a sandbox to widen or narrow.
    let (status, _, stderr) = output_within(
        &mut exec(server.url(), &["--deny", secret_arg], &["true"]),
        b"",
    );
    assert_eq!(status.code(), Some(2), "{stderr}");
}
