//! The run leaves the kernel and its output as it found them, says when the report is
//! incomplete, and stays within its memory bound under a flood.

use super::*;

#[test]
fn audit_state_is_restored_after_the_run() {
    let _guard = require_audit();
    let mut control = audit::netlink::Control::open().unwrap();
    let original = control.status().unwrap().enabled != 0;
    let fx = Fixture::new(None);
    // From both starting states, so the check is never vacuous: a run that leaves auditing on
    // (or switches it off when it was on) fails one of the two.
    for before in [false, true] {
        control.set_enabled(before).unwrap();
        let report = fx.ws.join(format!("../audit-{before}.jsonl"));
        let outside_file = s(&fx.outside_file);
        let out = run_probe_tree(
            &["--policy", "read-only", "--audit", s(&report)],
            &["write", outside_file],
            1,
            &fx.ws,
            None,
        );
        let enabled_after = control.status().unwrap().enabled != 0;
        control.set_enabled(original).unwrap();
        assert!(out.status.success(), "{}", context(&out));
        assert_eq!(enabled_after, before, "audit enabled flag changed");
        // Auditing was really on during the run: the denial is in the report.
        let Jsonl { denials, .. } = read_jsonl(&report);
        assert!(
            denials.iter().any(|d| d["path"] == outside_file),
            "starting from enabled={before} the run recorded {denials:?}"
        );
    }
}

#[test]
fn a_report_to_a_device_writes_it_and_never_replaces_the_device() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let out = Command::new(common::sandbox_run_exe())
        .args(["--policy", "workspace-write", "--audit", "/dev/null", "--"])
        .args(["/bin/true"])
        .current_dir(&fx.ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", context(&out));
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    let still_a_device = std::os::unix::fs::FileTypeExt::is_char_device(&meta.file_type());
    if !still_a_device {
        // Put the machine right before failing, so the rest of the suite is not broken too.
        let _ = std::fs::remove_file("/dev/null");
        let _ = nix::sys::stat::mknod(
            "/dev/null",
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        );
    }
    assert!(
        still_a_device,
        "/dev/null was replaced by the report: {meta:?}"
    );
}

#[test]
fn a_command_stacking_its_own_landlock_domain_or_seccomp_filter_gets_a_failing_incomplete_report() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    // (probe operations that try to hide later denials, the syscalls audit.json refuses them at)
    let cases: [(&[&str], &[&str]); 4] = [
        (&["landlock-nest"], &["landlock_restrict_self"]),
        (&["seccomp-nest"], &["seccomp"]),
        (&["prctl-seccomp-nest"], &["prctl"]),
        (
            &[
                "landlock-nest",
                ";",
                "seccomp-nest",
                ";",
                "prctl-seccomp-nest",
            ],
            &["landlock_restrict_self", "seccomp", "prctl"],
        ),
    ];
    for (hide, refused) in cases {
        // What the hostile command of the issue does after stacking: a forbidden write and an
        // AF_INET socket, which its own layers would have refused without a record.
        let mut ops: Vec<&str> = hide.to_vec();
        ops.extend([";", "write", outside_file, ";", "udp-socket"]);
        let out = run_probe_tree(
            &[
                "--policy",
                "workspace-write",
                "--cwd",
                ws,
                "--audit",
                "-",
                "--fail-on-denial",
            ],
            &ops,
            1,
            &fx.ws,
            None,
        );
        let what = format!("{hide:?}: {}", context(&out));
        assert_eq!(out.status.code(), Some(3), "{what}");
        let results = probe_results(&out.stdout);
        for result in &results[..results.len() - 2] {
            assert_eq!(result["error"], "EPERM", "stacking is refused: {what}");
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("INCOMPLETE"), "{what}");
        assert!(!stderr.contains("no denials"), "{what}");

        let Jsonl {
            groups, coverage, ..
        } = jsonl_of_stdout(&out.stdout);
        assert_eq!(coverage["audit"], true, "{what}");
        assert_eq!(coverage["complete"], false, "{what}");
        let gaps = coverage["gaps"].as_array().unwrap();
        assert_eq!(
            gaps.len(),
            refused.len(),
            "one gap per refused call: {what}"
        );
        for syscall in refused {
            assert!(
                gaps.iter()
                    .any(|g| g.as_str().unwrap().contains(&format!("({syscall}, once)"))),
                "{syscall}: {what}"
            );
        }
        let mut expected: BTreeMap<_, _> = refused
            .iter()
            .map(|syscall| (key("seccomp", syscall, "-"), 1))
            .collect();
        expected.insert(key("mount", "fs.write_file", &format!("{outside}/")), 1);
        expected.insert(key("seccomp", "socket", "-"), 1);
        pretty_assertions::assert_eq!(group_counts(&groups), expected, "{what}");
        for group in &groups {
            if refused.contains(&group["operation"].as_str().unwrap()) {
                let rule = group["allow_rule"].as_str().unwrap();
                assert!(
                    rule.contains("policies/seccomp/audit.json") && rule.contains("incomplete"),
                    "{rule}"
                );
            }
        }

        let sarif_report = fx.ws.join("../nested.sarif");
        let out = run_probe_tree(
            &[
                "--policy",
                "workspace-write",
                "--cwd",
                ws,
                "--audit",
                s(&sarif_report),
                "--audit-format",
                "sarif",
                "--fail-on-denial",
            ],
            &ops,
            1,
            &fx.ws,
            None,
        );
        let what = format!("{hide:?} (SARIF): {}", context(&out));
        assert_eq!(out.status.code(), Some(3), "{what}");
        let log: Value =
            serde_json::from_str(&std::fs::read_to_string(&sarif_report).unwrap()).unwrap();
        let invocation = &log["runs"][0]["invocations"][0];
        assert_eq!(invocation["executionSuccessful"], false, "{log:#}");
        assert_eq!(
            invocation["properties"]["coverage"]["complete"], false,
            "{log:#}"
        );
        let notifications = invocation["toolExecutionNotifications"].as_array().unwrap();
        assert_eq!(notifications.len(), refused.len(), "{log:#}");
        assert!(
            notifications.iter().all(|n| n["level"] == "error"),
            "{log:#}"
        );
        let rule_ids: Vec<&str> = log["runs"][0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["ruleId"].as_str().unwrap())
            .collect();
        for syscall in refused {
            assert!(
                rule_ids.contains(&format!("seccomp/{syscall}").as_str()),
                "{rule_ids:?}"
            );
        }
        validate_sarif(&sarif_report);
        fx.assert_outside_untouched(&what);
    }
}

#[test]
fn a_flood_of_a_million_denials_keeps_sandbox_run_under_its_memory_bound() {
    use std::os::unix::process::ExitStatusExt;
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    const SOCKETS: u64 = 900_000;
    const WRITES: u64 = 100_000;
    let report = fx.ws.join("../flood.jsonl");
    let out_path = fx.ws.join("../flood.out");
    let err_path = fx.ws.join("../flood.err");
    let args = serde_json::to_string(&[
        "sequence",
        "repeat",
        &SOCKETS.to_string(),
        "udp-socket",
        ";",
        "repeat",
        &WRITES.to_string(),
        "write",
        outside_file,
    ])
    .unwrap();
    let probe = format!(
        "'{}' --exact probe_entry --ignored --nocapture --test-threads=1 -q",
        common::probe_exe().display()
    );
    let child = Command::new(common::sandbox_run_exe())
        .args(["--policy", "workspace-write", "--cwd", ws])
        .args(["--audit", s(&report), "--", "/bin/sh", "-c", &probe])
        .current_dir(&fx.ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(PROBE_ENV, args)
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let pid = i32::try_from(child.id()).unwrap();
    let mut status = 0;
    // SAFETY: all-zero is a valid `struct rusage`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet waited for (std's `Child` is never waited on: it is
    // forgotten below); `status` and `usage` are valid for writes.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    std::mem::forget(child);
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let status = std::process::ExitStatus::from_raw(status);
    let stdout = std::fs::read(&out_path).unwrap();
    let stderr = String::from_utf8_lossy(&std::fs::read(&err_path).unwrap()).into_owned();
    let what = format!("status {status:?}\nstderr: {stderr}");
    assert_eq!(status.code(), Some(0), "{what}");

    // The wait4 figure is the largest of sandbox-run and the descendants it waited for (its PID 1,
    // the shell, the probe): sandbox-run's own peak is at most that.
    let peak = u64::try_from(usage.ru_maxrss).unwrap() * 1024;
    eprintln!(
        "flood of {} denials: sandbox-run peak RSS {:.1} MiB (bound {} MiB)",
        SOCKETS + WRITES,
        peak as f64 / 1048576.0,
        audit::limits::AUDIT_PEAK_RSS_BYTES / (1024 * 1024)
    );
    assert!(
        peak < audit::limits::AUDIT_PEAK_RSS_BYTES as u64,
        "peak RSS {peak} bytes over the documented bound: {what}"
    );

    let results = probe_results(&stdout);
    assert_eq!(results[0]["detail"]["outcomes"]["EPERM"], SOCKETS, "{what}");
    assert_eq!(results[1]["detail"]["outcomes"]["EROFS"], WRITES, "{what}");
    let Jsonl {
        denials,
        groups,
        coverage,
    } = read_jsonl(&report);
    // On a loaded machine the collector may fall behind and the socket overflow: then the
    // report must say so and count fewer, never claim a complete count.
    let total = coverage["denials"].as_u64().unwrap();
    if coverage["complete"] == true {
        assert_eq!(total, SOCKETS + WRITES, "{coverage}");
    } else {
        let gaps = coverage["gaps"].to_string();
        assert!(
            gaps.contains("overflowed") || gaps.contains("dropped"),
            "incomplete only for lost records: {coverage}"
        );
        assert!(total < SOCKETS + WRITES, "{coverage}");
        eprintln!("flood: records were lost under load, reported as such: {coverage}");
    }
    let aggregated = coverage["aggregated"].as_u64().unwrap();
    assert_eq!(aggregated, total - denials.len() as u64, "{coverage}");
    let counts = group_counts(&groups);
    let socket_key = key("seccomp", "socket", "-");
    let write_key = key("mount", "fs.write_file", &format!("{outside}/"));
    if coverage["complete"] == true {
        assert_eq!(denials.len(), 2, "one distinct target per group is listed");
        assert_eq!(
            counts.keys().collect::<Vec<_>>(),
            vec![&write_key, &socket_key],
            "{counts:?}"
        );
    } else {
        // A dropped record can leave its syscall's refusal unaccounted for (reported as
        // unexplained) or a record cut in two: besides the two groups, at most a few others.
        assert!(
            counts.contains_key(&write_key) && counts.contains_key(&socket_key),
            "{counts:?}"
        );
        assert!(
            counts.len() <= 4 && denials.len() <= 4,
            "lost records explain a few extra groups, not {}: {counts:?} {denials:?}",
            counts.len()
        );
        eprintln!("flood: groups of the incomplete report: {counts:?}");
    }
    if coverage["complete"] == true {
        assert_eq!(counts[&socket_key], SOCKETS, "{counts:?}");
        assert_eq!(counts[&write_key], WRITES, "{counts:?}");
    }
    assert!(
        stderr.contains(&format!("{aggregated} of them aggregated")),
        "{what}"
    );
}
