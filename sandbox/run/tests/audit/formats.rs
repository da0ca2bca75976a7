//! The report formats (SARIF, GitHub annotations), `--fail-on-denial`, and a blind audit.

use super::*;

#[test]
fn sarif_report_validates_against_the_sarif_2_1_0_schema() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../audit.sarif");
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--cwd",
            s(&fx.ws),
            "--audit",
            s(&report),
            "--audit-format",
            "sarif",
        ],
        &[
            "write",
            s(&fx.outside_file),
            ";",
            "mkdir",
            &format!("{}/d", s(&fx.outside)),
            ";",
            "udp-socket",
        ],
        2,
        &fx.ws,
        None,
    );
    assert!(out.status.success(), "{}", context(&out));
    let log: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let results = log["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "one result per distinct denial: {log:#}");
    assert!(
        results.iter().all(|r| r["properties"]["count"] == 2),
        "{log:#}"
    );
    assert_eq!(
        log["runs"][0]["invocations"][0]["executionSuccessful"],
        true
    );
    validate_sarif(&report);
}

#[test]
fn blind_sarif_report_validates_too_and_says_it_is_blind() {
    let _guard = require_audit();
    let fx = Fixture::new(Some(NOBODY));
    let report = fx.ws.join("blind.sarif");
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--audit",
            s(&report),
            "--audit-format",
            "sarif",
        ],
        &["write", s(&fx.outside_file)],
        1,
        &fx.ws,
        Some(NOBODY),
    );
    assert!(out.status.success(), "{}", context(&out));
    let log: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let invocation = &log["runs"][0]["invocations"][0];
    assert_eq!(invocation["executionSuccessful"], false, "{log:#}");
    assert!(
        invocation["toolExecutionNotifications"][0]["message"]["text"]
            .as_str()
            .unwrap()
            .contains("CAP_AUDIT_READ"),
        "{log:#}"
    );
    validate_sarif(&report);
}

#[test]
fn fail_on_denial_exits_3_on_a_denial_and_keeps_the_program_status_otherwise() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let ws = s(&fx.ws);
    let run = |script: &str, extra: &[&str]| {
        let mut cmd = Command::new(common::sandbox_run_exe());
        cmd.args(["--policy", "workspace-write", "--cwd", ws])
            .args(extra)
            .args(["--", "/bin/sh", "-c", script])
            .current_dir(&fx.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let denied = format!("echo x > '{}' ; exit 0", s(&fx.outside_file));
    let (code, stderr) = run(&denied, &["--fail-on-denial"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("fs.write_file"), "{stderr}");
    let (code, stderr) = run("echo ok > inside.txt; exit 0", &["--fail-on-denial"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("sandbox-run: audit: no denials observed"),
        "{stderr}"
    );
    let (code, stderr) = run("exit 7", &["--fail-on-denial"]);
    assert_eq!(code, Some(7), "{stderr}");
    let (code, stderr) = run(
        &format!("echo x > '{}'; exit 5", s(&fx.outside_file)),
        &["--audit", "/dev/null"],
    );
    assert_eq!(
        code,
        Some(5),
        "without --fail-on-denial the program's status stays: {stderr}"
    );
}

#[test]
fn blind_audit_says_so_once_and_never_reports_clean() {
    let _guard = require_audit();
    let fx = Fixture::new(Some(NOBODY));
    let report = fx.ws.join("blind.jsonl");
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--audit",
            s(&report),
            "--fail-on-denial",
        ],
        &["write", s(&fx.outside_file)],
        1,
        &fx.ws,
        Some(NOBODY),
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "blind + --fail-on-denial: {}",
        context(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("UNAVAILABLE").count(), 1, "{stderr}");
    assert!(stderr.contains("CAP_AUDIT_READ"), "{stderr}");
    assert!(!stderr.contains("no denials"), "{stderr}");
    let Jsonl {
        denials,
        groups,
        coverage,
    } = read_jsonl(&report);
    assert!(denials.is_empty() && groups.is_empty());
    assert_eq!(coverage["audit"], false, "{coverage}");
    assert_eq!(coverage["complete"], false, "{coverage}");

    let github = fx.ws.join("blind.github");
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--audit",
            s(&github),
            "--audit-format",
            "github",
        ],
        &["write", s(&fx.outside_file)],
        1,
        &fx.ws,
        Some(NOBODY),
    );
    assert!(out.status.success(), "{}", context(&out));
    let text = std::fs::read_to_string(&github).unwrap();
    assert!(
        text.starts_with("::warning title=Sandbox audit unavailable::"),
        "{text}"
    );
}

#[test]
fn github_format_annotates_each_distinct_denial() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../annotations.txt");
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--cwd",
            s(&fx.ws),
            "--audit",
            s(&report),
            "--audit-format",
            "github",
            "--fail-on-denial",
        ],
        &["write", s(&fx.outside_file), ";", "udp-socket"],
        2,
        &fx.ws,
        None,
    );
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    let text = std::fs::read_to_string(&report).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("::error title=Sandbox denied fs.write_file (mount)::"),
        "{text}"
    );
    assert!(lines[0].contains("denied 2x"), "{text}");
    assert!(
        lines[1].starts_with("::error title=Sandbox denied socket (seccomp)::"),
        "{text}"
    );
}
