//! The `exec-server` command line: help text and startup refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// Runs a binary this test has just written. Another test thread forking at that moment holds
/// the copy's write descriptor until its child execs, and `execve` of a file open for writing
/// fails with ETXTBSY: the window is that short, so a few tries get past it.
fn run_fresh_copy(command: &mut Command) -> std::process::Output {
    for _ in 0..50 {
        match command.output() {
            Err(error) if error.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(std::time::Duration::from_millis(10)); // the sibling's exec
            }
            result => return result.unwrap(),
        }
    }
    panic!("the copied binary stayed busy (ETXTBSY) for 0.5 s");
}

#[test]
fn a_missing_helper_is_a_startup_error_naming_what_is_missing_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let lonely = dir.path().join("exec-server");
    std::fs::copy(env!("CARGO_BIN_EXE_exec-server"), &lonely).unwrap();
    let output = run_fresh_copy(&mut Command::new(&lonely));
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "no URL may be printed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lacks = format!(
        "{} lacks fs-helper, sandbox-run, exec-guardian",
        dir.path().display()
    );
    for needle in [
        lacks.as_str(),
        "libexec/execward lacks",
        "./install.sh",
        "--helper-dir DIR",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    let output = exec_server()
        .args(["--helper-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("lacks fs-helper"), "{stderr}");
}

#[test]
fn an_address_in_use_is_reported_once_and_exits_as_a_runtime_failure() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("ws://{}", taken.local_addr().unwrap());
    let output = exec_server().args(["--listen", &url]).output().unwrap();
    // Not 2, the status of a usage or configuration mistake: the command line was right.
    assert_eq!(
        output.status.code(),
        Some(i32::from(supervisor::cli::RUNTIME_FAILURE_STATUS))
    );
    assert_eq!(supervisor::cli::RUNTIME_FAILURE_STATUS, 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn an_out_of_range_port_is_named_as_the_port() {
    let output = exec_server()
        .args(["--listen", "ws://127.0.0.1:99999"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the port 99999 is out of range"),
        "{stderr}"
    );
    assert!(!stderr.contains("host"), "{stderr}");
}

/// Starts exec-server with `args` and stderr piped, returns its log up to and including the first
/// line that contains `needle` (the startup lines before it, e.g. containment, included), kills it.
fn log_until(args: &[&str], needle: &'static str) -> String {
    use std::io::BufRead;
    let mut child = exec_server()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            log.push_str(&line);
            log.push('\n');
            if line.contains(needle) {
                break;
            }
        }
        let _ = tx.send(log);
    });
    let log = rx.recv_timeout(std::time::Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    log.expect("exec-server logged nothing within 10 s")
}

#[test]
fn logs_carry_no_colour_off_a_terminal_and_are_json_on_request() {
    let text = log_until(&["--listen", "ws://127.0.0.1:0"], "listening");
    assert!(text.contains("listening"), "{text:?}");
    assert!(!text.contains('\u{1b}'), "ANSI escapes in a pipe: {text:?}");
    let json = log_until(
        &["--listen", "ws://127.0.0.1:0", "--log-format", "json"],
        "listening",
    );
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    let listening = lines
        .iter()
        .find(|line| line["fields"]["message"] == "listening")
        .unwrap_or_else(|| panic!("no listening line: {json}"));
    assert_eq!(listening["level"], "INFO", "{json}");
    let bad = exec_server()
        .args(["--log-format", "xml"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("possible values: text, json"));
}

#[test]
fn the_rendezvous_exits_1_when_its_address_is_taken_and_2_when_its_files_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("rendezvous.toml");
    std::fs::write(
        &credentials,
        "[[harness]]\ntoken = \"0123456789abcdef-harness\"\nenvironments = [\"laptop\"]\n",
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let rendezvous = || Command::new(env!("CARGO_BIN_EXE_exec-rendezvous"));
    let output = rendezvous()
        .args(["--listen", &address, "--credentials"])
        .arg(&credentials)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Address already in use"), "{stderr}");
    let output = rendezvous()
        .args(["--listen", "127.0.0.1:0", "--credentials"])
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("missing.toml"), "{stderr}");
}
