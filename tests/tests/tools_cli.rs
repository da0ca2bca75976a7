//! The command lines of the development tools `bench` and `load`: `--help` describes them
//! without running anything, and a bad argument is a usage error (exit 2), never a panic or a
//! silently ignored flag. And the operator files: the systemd units in `packaging/systemd/`
//! pass `systemd-analyze verify` without a single warning.
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
            "possible values: spawn, output, sandbox, remote, remote-latency, cluster, egress",
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

/// The workspace's `packaging/systemd/NAME` with the installed paths (`./install.sh --prefix
/// /usr/local`) replaced by this build's binaries, so verify checks the real executables.
fn unit_for_this_build(name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/systemd")
        .join(name);
    let text = std::fs::read_to_string(&source).unwrap();
    assert!(
        text.contains("ExecStart=/usr/local/bin/"),
        "{name}: ExecStart names the installed path"
    );
    let built = tests::exec_server_binary();
    let bin_dir = built.parent().unwrap().to_str().unwrap().to_owned();
    let text = text
        .replace("/usr/local/libexec/execward", &bin_dir)
        .replace("/usr/local/bin/", &format!("{bin_dir}/"));
    let unit = dir.join(name);
    std::fs::write(&unit, text).unwrap();
    unit
}

/// `systemd-analyze verify` of `unit`: its status and everything it printed.
fn verify(unit: &std::path::Path) -> (Option<i32>, String) {
    let output = run(
        "/usr/bin/systemd-analyze",
        &["verify", "--man=no", unit.to_str().unwrap()],
    );
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
    (output.status.code(), printed)
}

#[test]
fn systemd_units_verify_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["exec-server.service", "exec-rendezvous.service"] {
        let unit = unit_for_this_build(name, dir.path());
        let (code, printed) = verify(&unit);
        assert_eq!(
            (code, printed.as_str()),
            (Some(0), ""),
            "{name}: systemd-analyze verify"
        );
        // Control: the check sees a warning (an unknown key) and a missing binary.
        let text = std::fs::read_to_string(&unit).unwrap();
        let typo = dir.path().join(format!("typo-{name}"));
        std::fs::write(&typo, text.replace("Restart=", "Restrat=")).unwrap();
        let (_, printed) = verify(&typo);
        assert!(printed.contains("Unknown key"), "{name}: {printed}");
    }
    let missing = dir.path().join("exec-server.service");
    let text = std::fs::read_to_string(&missing).unwrap();
    let exe = tests::exec_server_binary();
    std::fs::write(
        &missing,
        text.replace(exe.to_str().unwrap(), "/nonexistent/exec-server"),
    )
    .unwrap();
    let (code, printed) = verify(&missing);
    assert_ne!(code, Some(0), "{printed}");
}

#[test]
fn the_exec_server_unit_keeps_what_the_sandbox_needs() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/systemd/exec-server.service"),
    )
    .unwrap();
    let settings: Vec<&str> = unit
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .collect();
    // Its own cgroup subtree to contain and limit each tree.
    assert!(settings.contains(&"Delegate=yes"), "{unit}");
    // User namespaces and, in them, the namespaces sandbox-run creates.
    let namespaces = settings
        .iter()
        .find_map(|l| l.strip_prefix("RestrictNamespaces="))
        .unwrap();
    for ns in ["user", "mnt", "pid", "ipc", "net"] {
        assert!(
            namespaces.split_whitespace().any(|n| n == ns),
            "{ns}: {namespaces}"
        );
    }
    // Settings that would break it: a read-only cgroup tree, a private /dev (the registry of
    // running servers lives in /dev/shm for an unprivileged server), a syscall filter below
    // sandbox-run's own (mount, unshare), a user namespace of systemd's making.
    for broken in [
        "ProtectControlGroups=yes",
        "PrivateDevices=yes",
        "SystemCallFilter=",
        "PrivateUsers=yes",
        "MemoryDenyWriteExecute=yes",
    ] {
        assert!(
            !settings.iter().any(|l| l.starts_with(broken)),
            "{broken} breaks the sandbox"
        );
    }
}
