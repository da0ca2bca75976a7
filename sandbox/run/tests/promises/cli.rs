//! `sandbox-run` itself: `--explain`, the audit report file, the environment, interrupts,
//! warnings and hints, and users' own profiles.

use super::*;

#[test]
fn explain_prints_the_policy_and_its_layers_and_runs_nothing() {
    let fx = Fixture::new(None);
    let extra = fx.outside.join("extra");
    std::fs::create_dir(&extra).unwrap();
    let marker = fx.ws.join("ran");
    let out = sandbox_run(
        &[
            "--policy",
            "workspace-write",
            "--writable-root",
            s(&extra),
            "--deny",
            s(&fx.outside_file),
            "--explain",
        ],
        &["/usr/bin/touch", s(&marker)],
        None,
        &fx.ws,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "--explain ran the command");
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rules = explain["policy"]["filesystem"]["rules"].as_array().unwrap();
    let access_of = |path: &std::path::Path| {
        rules
            .iter()
            .find(|rule| rule["path"] == s(path))
            .map(|rule| rule["access"].as_str().unwrap().to_owned())
    };
    assert_eq!(access_of(&fx.ws).as_deref(), Some("write"), "{explain}");
    assert_eq!(access_of(&extra).as_deref(), Some("write"), "{explain}");
    assert_eq!(
        access_of(&fx.ws.join(".git")).as_deref(),
        Some("read"),
        "{explain}"
    );
    assert_eq!(
        explain["command"],
        serde_json::json!(["/usr/bin/touch", s(&marker)])
    );
    assert_eq!(explain["cwd"], s(&fx.ws));
    assert!(
        explain["layers"]["landlock"]["abi"].as_u64().unwrap_or(0) >= 1,
        "{explain}"
    );
    assert!(
        explain.to_string().contains(s(&fx.outside_file)),
        "the denied path is listed: {explain}"
    );
}

/// As uid 65534 only: as root `--audit` switches the kernel audit on for the whole machine.
#[test]
fn the_audit_report_is_opened_before_the_command_so_a_planted_symlink_is_not_followed() {
    let fx = Fixture::new(Some(NOBODY));
    let report = fx.ws.join("denials.jsonl");
    let kept = fx.ws.join("kept.jsonl");
    // The command moves the report aside and plants a symlink to a file outside at its name.
    let script = format!(
        "mv {report} {kept} && ln -s {outside} {report}",
        report = s(&report),
        kept = s(&kept),
        outside = s(&fx.outside_file)
    );
    let out = sandbox_run(
        &["--policy", "workspace-write", "--audit", s(&report)],
        &["/bin/sh", "-c", &script],
        Some(NOBODY),
        &fx.ws,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::symlink_metadata(&report)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the command planted its symlink"
    );
    fx.assert_outside_untouched("the report followed the planted symlink");
    // The report went to the file opened before the command ran, now at the moved-aside name.
    let written = std::fs::read_to_string(&kept).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(written.lines().last().expect("a non-empty report")).unwrap();
    assert_eq!(last["kind"], "coverage", "{written}");
}

#[test]
fn secrets_in_the_callers_environment_reach_the_command_only_when_named() {
    let run = |extra: &[&str]| {
        let output = std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/"])
            .args(extra)
            .args(["--", "/usr/bin/env"])
            .env("MY_SECRET_TOKEN", "hunter2")
            .env("aws_access_key_id", "AKIAEXAMPLE")
            .env("EXECWARD_REGISTRY_TOKEN", "registry")
            .env("PLAIN_SETTING", "kept")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let default = run(&[]);
    assert!(default.contains("PLAIN_SETTING=kept"), "{default}");
    for secret in ["hunter2", "AKIAEXAMPLE", "registry"] {
        assert!(
            !default.contains(secret),
            "{secret} reached the command: {default}"
        );
    }
    // Named, it passes; the others stay out.
    let named = run(&["--env", "MY_SECRET_TOKEN"]);
    assert!(named.contains("MY_SECRET_TOKEN=hunter2"), "{named}");
    assert!(!named.contains("AKIAEXAMPLE"), "{named}");
    // --clearenv: only what is named or set.
    let cleared = run(&["--clearenv", "--env", "PLAIN_SETTING", "--setenv", "A=b=c"]);
    let mut lines: Vec<&str> = cleared.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["A=b=c", "PLAIN_SETTING=kept"], "{cleared}");
    let unset = run(&["--unsetenv", "PLAIN_SETTING"]);
    assert!(!unset.contains("PLAIN_SETTING"), "{unset}");
}

#[test]
fn repeated_interrupts_stop_a_command_that_ignores_them() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    // (extra interrupts sent, longest time to stop): two wait for the grace, three kill at once.
    for (interrupts, within) in [(2, 6), (3, 2)] {
        let mut child = std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/", "--"])
            .args([
                "/bin/sh",
                "-c",
                "trap '' INT TERM; echo ready; sleep 311.5; echo survived",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut ready = [0u8; 6];
        stdout.read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"ready\n");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let started = std::time::Instant::now();
        for _ in 0..interrupts {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
        let status = child.wait().unwrap();
        let took = started.elapsed();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "{interrupts} interrupts: {status:?} {stderr}"
        );
        assert!(!rest.contains("survived"), "the command went on: {rest}");
        assert!(
            took < std::time::Duration::from_secs(within),
            "{interrupts} interrupts took {took:?}"
        );
        assert!(stderr.contains("forwarded to the command"), "{stderr}");
        assert!(stderr.contains("terminating the command"), "{stderr}");
        assert_eq!(
            stderr.contains("killing the command"),
            interrupts == 3,
            "{stderr}"
        );
    }
}

#[test]
fn a_deny_of_a_missing_path_warns_and_an_existing_one_does_not() {
    let run = |deny: &std::path::Path| {
        std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/", "--deny"])
            .arg(deny)
            .args(["--", "/bin/true"])
            .output()
            .unwrap()
    };
    let dir = scratch::scratch_dir("deny-missing-");
    let missing = run(&dir.path().join("no-such-secret"));
    assert!(missing.status.success(), "{missing:?}");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("warning: --deny") && stderr.contains("no such file or directory"),
        "{stderr}"
    );
    let present = run(dir.path());
    assert!(present.status.success(), "{present:?}");
    assert_eq!(String::from_utf8_lossy(&present.stderr), "");
}

#[test]
fn a_command_without_the_separator_gets_a_hint() {
    let output = std::process::Command::new(sandbox_run_exe())
        .args(["--policy", "read-only", "ls", "-la"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("hint: the command goes after `--`"),
        "{stderr}"
    );
}

#[test]
fn a_users_own_profiles_are_listed_and_taken_by_name_and_built_ins_win() {
    let config = scratch::scratch_dir("user-profiles-");
    let profiles = config.path().join("execward/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("mine.toml"),
        "description = \"Mine: read everything, write nothing\"\n[filesystem]\n\":root\" = \"read\"\n",
    )
    .unwrap();
    // A file cannot redefine a built-in name.
    std::fs::write(
        profiles.join("read-only.toml"),
        "description = \"Sneaky\"\nfull_filesystem_access = true\n",
    )
    .unwrap();
    let sandbox_run = |args: &[&str]| {
        std::process::Command::new(sandbox_run_exe())
            .env("XDG_CONFIG_HOME", config.path())
            .args(args)
            .output()
            .unwrap()
    };
    let listed = sandbox_run(&["--list-profiles"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("workspace-write"), "{listed}");
    assert!(
        listed.contains("mine") && listed.contains("Mine: read everything"),
        "{listed}"
    );
    assert!(
        listed.contains("(ignored: a built-in has this name)"),
        "{listed}"
    );

    let out = scratch::scratch_dir("user-profile-out-");
    let target = out.path().join("written.txt");
    let script = format!("echo x > {} && echo wrote || echo denied", target.display());
    for policy in ["mine", "read-only"] {
        let result = sandbox_run(&[
            "--policy", policy, "--cwd", "/", "--", "/bin/sh", "-c", &script,
        ]);
        assert_eq!(
            String::from_utf8_lossy(&result.stdout),
            "denied\n",
            "{policy}: {result:?}"
        );
        assert!(!target.exists(), "{policy} let the write land");
    }
    // Control: with the directory writable the same command writes.
    let out_dir = out.path().to_str().unwrap();
    let result = sandbox_run(&[
        "--policy",
        "workspace-write",
        "--cwd",
        "/",
        "--writable-root",
        out_dir,
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&result.stdout),
        "wrote\n",
        "{result:?}"
    );
}
