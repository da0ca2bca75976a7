//! The command lines of the development tools `bench` and `load`: `--help` describes them
//! without running anything, and a bad argument is a usage error (exit 2), never a panic or a
//! silently ignored flag.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A usage error or `--help` answers at once; a tool that started its run would not.
const DEADLINE: Duration = Duration::from_secs(20);

fn run(binary: &str, args: &[&str]) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("{binary} {args:?} still running after {DEADLINE:?}: it started its run");
        }
        std::thread::sleep(Duration::from_millis(10)); // polling interval under the deadline
    }
    child.wait_with_output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn bench_help_describes_it_without_running() {
    let output = run(env!("CARGO_BIN_EXE_bench"), &["--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let help = String::from_utf8_lossy(&output.stdout);
    for option in ["--quick", "--only", "--write", "--check", "spawn", "remote"] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

#[test]
fn bench_refuses_bad_arguments_as_usage_errors() {
    let bench = env!("CARGO_BIN_EXE_bench");
    for (args, needle) in [
        (
            &["--only", "bogus"][..],
            "possible values: spawn, output, sandbox, remote, remote-latency, egress",
        ),
        (&["--write"][..], "a value is required for '--write <FILE>'"),
        (&["--frobnicate"][..], "unexpected argument '--frobnicate'"),
    ] {
        let output = run(bench, args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(needle),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    }
}

#[test]
fn load_help_and_bad_arguments() {
    let load = env!("CARGO_BIN_EXE_load");
    let output = run(load, &["--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("--quick") && help.contains("--write"),
        "{help}"
    );
    for (args, needle) in [
        (&["--write"][..], "a value is required for '--write <FILE>'"),
        (&["--quik"][..], "unexpected argument '--quik'"),
    ] {
        let output = run(load, args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(needle),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}
