//! The `exec-server` command line: help text and startup refusals.

use std::process::Command;

fn exec_server() -> Command {
    Command::new(env!("CARGO_BIN_EXE_exec-server"))
}

#[test]
fn help_explains_listen_token_and_protocol() {
    let output = exec_server().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "--listen",
        "ws://127.0.0.1:0",
        "unix:",
        "--auth-token-file",
        "SIGTERM",
        "docs/protocol.md",
    ] {
        assert!(
            help.contains(needle),
            "--help should mention {needle}:\n{help}"
        );
    }
}

#[test]
fn non_loopback_listen_without_token_is_refused_at_startup() {
    let output = exec_server()
        .args(["--listen", "ws://0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        output.stdout.is_empty(),
        "nothing may be printed on stdout when not listening"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("without a bearer token") && stderr.contains("--auth-token-file"),
        "{stderr}"
    );
}

#[test]
fn unparsable_listen_url_names_the_expected_form() {
    let output = exec_server()
        .args(["--listen", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("expected ws://IP:PORT"), "{stderr}");
}

#[test]
fn empty_token_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "  \n").unwrap();
    let output = exec_server()
        .args(["--auth-token-file"])
        .arg(&token)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("empty"));
}
