//! The denial audit end to end: real `sandbox-run --audit` runs, real kernel audit records.
//!
//! These tests need root and the kernel audit subsystem (CI runs as root). They check their
//! preconditions and FAIL with the reason when they are missing, never pass silently.
//! Every audited run turns auditing on and back off, so the tests of this binary take one lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Fixture, NOBODY, PROBE_ENV, s};
use serde_json::Value;

/// Audited runs of this binary are serialised (they share the kernel's audit state).
static AUDIT_LOCK: Mutex<()> = Mutex::new(());

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

/// Fails (does not skip) when this machine cannot run the audit tests.
fn require_audit() -> std::sync::MutexGuard<'static, ()> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the denial-audit tests need root (CAP_AUDIT_READ and CAP_AUDIT_CONTROL); CI runs them as root"
    );
    if let Err(err) = sandbox::audit::netlink::MulticastReader::open() {
        panic!("the kernel audit subsystem is not usable here: {err}");
    }
    AUDIT_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `sandbox-run ARGS -- <this test binary as the probe> sequence OPS...`, `times` times in a
/// row from `/bin/sh` (so the denials come from grandchildren of sandbox-run).
fn run_probe_tree(
    sandbox_args: &[&str],
    ops: &[&str],
    times: usize,
    cwd: &Path,
    uid: Option<u32>,
) -> Output {
    let exe = common::probe_exe();
    let probe = format!(
        "'{}' --exact probe_entry --ignored --nocapture --test-threads=1 -q",
        exe.display()
    );
    let script = vec![probe; times].join("; ");
    let mut args: Vec<String> = std::iter::once("sequence".to_owned())
        .chain(ops.iter().map(|o| (*o).to_owned()))
        .collect();
    args.retain(|_| true);
    let mut cmd = Command::new(common::sandbox_run_exe());
    cmd.args(sandbox_args)
        .args(["--", "/bin/sh", "-c", &script])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(PROBE_ENV, serde_json::to_string(&args).unwrap());
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    cmd.output().unwrap()
}

/// A JSON-lines report: the listed denials (examples), the groups with their counts, and the
/// coverage line (last).
struct Jsonl {
    denials: Vec<Value>,
    groups: Vec<Value>,
    coverage: Value,
}

fn read_jsonl(path: &Path) -> Jsonl {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let coverage = lines.pop().expect("a coverage line");
    assert_eq!(coverage["kind"], "coverage", "{text}");
    let (denials, groups): (Vec<Value>, Vec<Value>) =
        lines.into_iter().partition(|l| l["kind"] == "denial");
    assert!(groups.iter().all(|g| g["kind"] == "group"), "{text}");
    let counted: u64 = groups.iter().map(|g| g["count"].as_u64().unwrap()).sum();
    assert_eq!(coverage["denials"].as_u64(), Some(counted), "{text}");
    assert_eq!(
        coverage["listed"].as_u64(),
        Some(denials.len() as u64),
        "{text}"
    );
    assert_eq!(
        coverage["aggregated"].as_u64(),
        Some(counted - denials.len() as u64),
        "{text}"
    );
    Jsonl {
        denials,
        groups,
        coverage,
    }
}

/// Listed denials: `(layer, operation, target) -> count`.
fn tally(denials: &[Value]) -> BTreeMap<(String, String, String), u64> {
    let mut out = BTreeMap::new();
    for d in denials {
        assert_eq!(d["kind"], "denial");
        let target = d["path"].as_str().or(d["address"].as_str()).unwrap_or("-");
        *out.entry((
            d["layer"].as_str().unwrap().to_owned(),
            d["operation"].as_str().unwrap().to_owned(),
            target.to_owned(),
        ))
        .or_default() += 1;
    }
    out
}

/// Groups: `(layer, operation, prefix) -> count`.
fn group_counts(groups: &[Value]) -> BTreeMap<(String, String, String), u64> {
    groups
        .iter()
        .map(|g| {
            (
                key(
                    g["layer"].as_str().unwrap(),
                    g["operation"].as_str().unwrap(),
                    g["prefix"].as_str().unwrap(),
                ),
                g["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn key(layer: &str, op: &str, target: &str) -> (String, String, String) {
    (layer.to_owned(), op.to_owned(), target.to_owned())
}

fn context(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn audit_lists_exactly_the_forbidden_operations_of_the_command_tree() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../audit.jsonl");
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    let git_config = format!("{ws}/.git/config");
    let ops = [
        // forbidden
        "write",
        outside_file,
        ";",
        "write",
        &format!("{outside}/new.txt"),
        ";",
        "mkdir",
        &format!("{outside}/newdir"),
        ";",
        "write",
        &git_config,
        ";",
        "tcp-connect",
        "127.0.0.1:9",
        ";",
        "udp-socket",
        ";",
        // allowed
        "write",
        &format!("{ws}/inside.txt"),
        ";",
        "mkdir",
        &format!("{ws}/made"),
        ";",
        "read",
        "/etc/hostname",
        ";",
        "read",
        outside_file,
    ];
    // An unrelated sandboxed process is denied at the same time, over and over: none of its
    // denials (other paths, same kinds) may show up in our report.
    let unrelated_dir = fx.outside.with_file_name("unrelated");
    std::fs::create_dir(&unrelated_dir).unwrap();
    let stop = AtomicBool::new(false);
    let unrelated_runs = std::thread::scope(|scope| {
        let noise = scope.spawn(|| {
            let mut runs = 0;
            let target = format!("{}/x.txt", unrelated_dir.display());
            while !stop.load(Ordering::SeqCst) || runs == 0 {
                let out = run_probe_tree(
                    &["--policy", "workspace-write", "--cwd", ws],
                    &["write", &target, ";", "udp-socket", ";", "mkdir", &target],
                    1,
                    &fx.ws,
                    None,
                );
                assert!(out.status.success(), "{}", context(&out));
                runs += 1;
            }
            runs
        });
        let out = run_probe_tree(
            &[
                "--policy",
                "workspace-write",
                "--cwd",
                ws,
                "--audit",
                s(&report),
            ],
            &ops,
            2,
            &fx.ws,
            None,
        );
        stop.store(true, Ordering::SeqCst);
        assert!(out.status.success(), "{}", context(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("sandbox-run: audit: 12 denials in 5 groups by seccomp, mount"),
            "{stderr}"
        );
        noise.join().unwrap()
    });
    assert!(unrelated_runs >= 1);

    let Jsonl {
        denials,
        groups,
        coverage,
    } = read_jsonl(&report);
    assert_eq!(coverage["audit"], true, "{coverage}");
    assert_eq!(coverage["complete"], true, "{coverage}");
    assert_eq!(coverage["gaps"], serde_json::json!([]), "{coverage}");
    assert_eq!(coverage["denials"], 12, "{coverage}");
    // Each distinct target is listed once; repeats are only counted in their group.
    let listed: BTreeMap<_, _> = [
        key("mount", "fs.write_file", outside_file),
        key("mount", "fs.make_reg", outside),
        key("mount", "fs.make_dir", outside),
        key("mount", "fs.write_file", &git_config),
        // seccomp refuses socket() itself (records carry no arguments: no family, no address)
        key("seccomp", "socket", "-"),
    ]
    .into_iter()
    .map(|k| (k, 1))
    .collect();
    pretty_assertions::assert_eq!(tally(&denials), listed);
    let grouped: BTreeMap<_, _> = [
        (key("mount", "fs.write_file", &format!("{outside}/")), 2),
        (key("mount", "fs.make_reg", &format!("{outside}/")), 2),
        (key("mount", "fs.make_dir", &format!("{outside}/")), 2),
        (key("mount", "fs.write_file", &format!("{ws}/.git/")), 2),
        (key("seccomp", "socket", "-"), 4),
    ]
    .into_iter()
    .collect();
    pretty_assertions::assert_eq!(group_counts(&groups), grouped);
    let exe = common::probe_exe();
    for d in &denials {
        assert!(d["pid"].as_u64().is_some(), "{d}");
        assert_eq!(d["exe"].as_str(), Some(s(&exe)), "{d}");
        assert!(!d["allow_rule"].as_str().unwrap().is_empty(), "{d}");
    }
    let git = denials
        .iter()
        .find(|d| d["path"] == git_config.as_str())
        .unwrap();
    assert!(
        git["allow_rule"]
            .as_str()
            .unwrap()
            .contains("protected path"),
        "{git}"
    );
    fx.assert_outside_untouched("audited run");
}

#[test]
fn landlock_denials_are_reported_without_the_namespace_layer() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let report = fx.ws.join("../landlock.jsonl");
    let (ws, outside, outside_file) = (s(&fx.ws), s(&fx.outside), s(&fx.outside_file));
    let out = run_probe_tree(
        &[
            "--policy",
            "workspace-write",
            "--cwd",
            ws,
            "--no-namespaces",
            "--best-effort",
            "--audit",
            s(&report),
        ],
        &[
            "write",
            outside_file,
            ";",
            "mkdir",
            &format!("{outside}/d"),
            ";",
            "write",
            &format!("{ws}/ok.txt"),
        ],
        1,
        &fx.ws,
        None,
    );
    assert!(out.status.success(), "{}", context(&out));
    let Jsonl {
        denials, coverage, ..
    } = read_jsonl(&report);
    assert_eq!(coverage["landlock"], true, "{coverage}");
    assert_eq!(coverage["complete"], true, "{coverage}");
    let expected: BTreeMap<_, _> = [
        (key("landlock", "fs.write_file", outside_file), 1),
        (key("landlock", "fs.make_dir", outside), 1),
    ]
    .into_iter()
    .collect();
    pretty_assertions::assert_eq!(tally(&denials), expected);
    assert!(denials.iter().all(|d| d["pid"].as_u64().is_some()));
}

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

fn validate_sarif(report: &Path) {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sarif-schema-2.1.0.json");
    let script = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        log = json.load(open(sys.argv[2]))\n\
        jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker()).validate(log)\n";
    let out = Command::new("python3")
        .args(["-c", script, s(&schema), s(report)])
        .output()
        .expect("python3 is needed to validate SARIF (pip install jsonschema)");
    assert!(
        out.status.success(),
        "SARIF does not validate against the 2.1.0 schema (or python3 lacks the jsonschema \
         module: pip install jsonschema):\n{}",
        context(&out)
    );
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

#[test]
fn audit_state_is_restored_after_the_run() {
    let _guard = require_audit();
    let mut control = sandbox::audit::netlink::Control::open().unwrap();
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

/// The JSON lines of a report written to stdout (`--audit -`), among the command's own output.
fn jsonl_of_stdout(stdout: &[u8]) -> Jsonl {
    let text = String::from_utf8_lossy(stdout);
    let report: String = text
        .lines()
        .filter(|l| l.starts_with("{\"kind\":"))
        .map(|l| format!("{l}\n"))
        .collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), report).unwrap();
    read_jsonl(file.path())
}

/// The probe's results (`sequence`: one per operation), from the command's stdout.
fn probe_results(stdout: &[u8]) -> Vec<Value> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("PROBE_RESULT "))
        .unwrap_or_else(|| panic!("no probe result in {text}"));
    let result: Value = serde_json::from_str(line).unwrap();
    result["detail"].as_array().unwrap().clone()
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
        sandbox::audit::limits::AUDIT_PEAK_RSS_BYTES / (1024 * 1024)
    );
    assert!(
        peak < sandbox::audit::limits::AUDIT_PEAK_RSS_BYTES as u64,
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

#[test]
fn advice_names_the_rule_that_refused_each_denial() {
    let _guard = require_audit();
    let fx = Fixture::new(None);
    let root = fx.ws.parent().unwrap().to_path_buf();
    let (ws, outside_file) = (s(&fx.ws), s(&fx.outside_file));
    let no_rule = root.join("norule.txt");
    std::fs::write(&no_rule, "x\n").unwrap();
    // Another user's private file: the sandbox holds no CAP_DAC_OVERRIDE even as uid 0, so
    // opening it fails with EACCES that no layer logs.
    let private = root.join("private");
    std::fs::create_dir(&private).unwrap();
    let secret = private.join("secret");
    std::fs::write(&secret, "s\n").unwrap();
    std::os::unix::fs::chown(&secret, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(fx.ws.join("denied")).unwrap();
    std::fs::write(fx.ws.join("flagged.txt"), "f\n").unwrap();
    let exe_dir = common::probe_exe().parent().unwrap().to_path_buf();
    let profile = root.join("narrow.toml");
    std::fs::write(
        &profile,
        format!(
            "description = \"audit advice test\"\nnetwork = false\n[filesystem]\n\
             \":cwd\" = \"write\"\n\"/usr\" = \"read\"\n\"/lib\" = \"read\"\n\
             \"/lib64\" = \"read\"\n\"/bin\" = \"read\"\n\"/etc\" = \"read\"\n\
             \"{exe}\" = \"read\"\n\"{private}\" = \"read\"\n\"{outside}\" = \"read\"\n\
             \"{ws}/denied\" = \"deny\"\n",
            exe = exe_dir.display(),
            private = private.display(),
            outside = s(&fx.outside),
        ),
    )
    .unwrap();
    let git_config = format!("{ws}/.git/config");
    let denied = format!("{ws}/denied/x");
    let flagged = format!("{ws}/flagged.txt");
    let out = run_probe_tree(
        &[
            "--policy",
            s(&profile),
            "--cwd",
            ws,
            "--deny",
            "flagged.txt",
            "--audit",
            "-",
            "--fail-on-denial",
        ],
        &[
            "read",
            s(&no_rule),
            ";",
            "read",
            &denied,
            ";",
            "read",
            &flagged,
            ";",
            "write",
            &git_config,
            ";",
            "write",
            outside_file,
            ";",
            "read",
            s(&secret),
        ],
        1,
        &fx.ws,
        None,
    );
    let what = context(&out);
    assert_eq!(out.status.code(), Some(3), "{what}");
    let results = probe_results(&out.stdout);
    assert!(results.iter().all(|r| r["blocked"] == true), "{what}");
    let Jsonl {
        denials, coverage, ..
    } = jsonl_of_stdout(&out.stdout);
    assert_eq!(coverage["complete"], true, "{coverage}");
    let advice = |target: &str| -> (String, String) {
        let d = denials
            .iter()
            .find(|d| d["path"] == target)
            .unwrap_or_else(|| panic!("no denial of {target}: {what}"));
        (
            d["layer"].as_str().unwrap().to_owned(),
            d["allow_rule"].as_str().unwrap().to_owned(),
        )
    };
    let no_rule = s(&no_rule);
    let (_, rule) = advice(no_rule);
    assert_eq!(
        rule,
        format!(
            "no rule grants read on {no_rule} (a path no rule covers is denied): \
             \"{no_rule}\" = \"read\" in a profile file"
        )
    );
    let (_, rule) = advice(&denied);
    assert_eq!(
        rule,
        format!(
            "remove the deny entry \"{ws}/denied\" = \"deny\" of the policy, which covers {denied}"
        )
    );
    let (_, rule) = advice(&flagged);
    assert!(
        rule.starts_with(&format!("remove --deny {flagged}")),
        "{rule}"
    );
    let (_, rule) = advice(&git_config);
    assert!(
        rule.starts_with(&format!("{ws}/.git is a protected path")),
        "{rule}"
    );
    let (_, rule) = advice(outside_file);
    let outside = s(&fx.outside);
    assert_eq!(
        rule,
        format!("\"{outside}\" = \"write\" (sandbox-run --writable-root {outside})")
    );
    let (layer, rule) = advice(s(&secret));
    assert_eq!(layer, "unexplained", "{rule}");
    assert!(rule.contains("the file's own mode or owner"), "{rule}");
}

/// One audited run with file denials (one in the workspace, one outside, on a path with `|`),
/// a seccomp denial and an egress-proxy refusal, as root and as 65534, rendered as `format`.
/// Returns the report's text, the run's output and the workspace root.
fn mixed_denials_run(fx: &Fixture, format: &str) -> (String, Output) {
    let report = fx.ws.join(format!("mixed.{format}"));
    let _ = std::fs::remove_file(&report);
    let hostile = fx.outside.join("a|b c.txt");
    std::fs::write(&hostile, "original\n").unwrap();
    if let Some(uid) = fx.uid {
        nix::unistd::chown(&hostile, Some(uid.into()), Some(uid.into())).unwrap();
    }
    let exe = common::probe_exe();
    let ops = vec![
        "sequence".to_owned(),
        "write".to_owned(),
        s(&hostile).to_owned(),
        ";".to_owned(),
        "write".to_owned(),
        format!("{}/.git/config", s(&fx.ws)),
        ";".to_owned(),
        "io-uring-setup".to_owned(),
    ];
    let script = format!(
        "'{}' --exact probe_entry --ignored --nocapture --test-threads=1 -q; \
         curl -sS -m 10 http://other.test:9/x; exit 0",
        exe.display()
    );
    let mut cmd = Command::new(common::sandbox_run_exe());
    cmd.args([
        "--policy",
        "workspace-write",
        "--cwd",
        s(&fx.ws),
        "--allow-domain",
        "registry.test",
        "--audit",
        s(&report),
        "--audit-format",
        format,
        "--",
        "/bin/sh",
        "-c",
        &script,
    ])
    .current_dir(&fx.ws)
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env(PROBE_ENV, serde_json::to_string(&ops).unwrap());
    if let Some(uid) = fx.uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", context(&out));
    // The denials happened: both writes failed with a permission error, the files are as they
    // were, and the syscall was refused.
    let results = probe_results(&out.stdout);
    for result in &results[..2] {
        assert!(
            matches!(result["errno"].as_i64(), Some(1 | 13 | 30)),
            "{}",
            context(&out)
        );
    }
    assert_eq!(results[2]["ok"], false, "{}", context(&out));
    assert_eq!(std::fs::read_to_string(&hostile).unwrap(), "original\n");
    assert_eq!(
        std::fs::read_to_string(fx.ws.join(".git/config")).unwrap(),
        "[core]\n"
    );
    (std::fs::read_to_string(&report).unwrap(), out)
}

#[test]
fn sarif_locations_are_repository_relative_for_file_seccomp_and_proxy_denials() {
    let _guard = require_audit();
    // Control: without the sandbox the same write lands.
    let control = Fixture::new(None);
    let control_file = control.outside.join("a|b c.txt");
    std::fs::write(&control_file, "changed\n").unwrap();
    assert_eq!(std::fs::read_to_string(&control_file).unwrap(), "changed\n");
    for uid in common::identities() {
        let fx = Fixture::new(uid);
        let (text, out) = mixed_denials_run(&fx, "sarif");
        let log: Value = serde_json::from_str(&text).unwrap();
        let run = &log["runs"][0];
        let root_uri = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
            .as_str()
            .unwrap();
        assert_eq!(root_uri, format!("file://{}/", s(&fx.ws)), "{log:#}");
        assert!(
            run["tool"]["driver"]["informationUri"]
                .as_str()
                .is_some_and(|u| u.starts_with("https://") && u.contains("docs/audit.md")),
            "{log:#}"
        );
        for rule in run["tool"]["driver"]["rules"].as_array().unwrap() {
            assert!(
                rule["helpUri"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("https://") && u.contains("docs/audit.md#")),
                "{rule:#}"
            );
        }
        let results = run["results"].as_array().unwrap();
        let mut seen = BTreeMap::new();
        for result in results {
            let locations = result["locations"].as_array().unwrap();
            assert!(
                !locations.is_empty(),
                "every result has a location: {result:#}"
            );
            for location in locations {
                let artifact = &location["physicalLocation"]["artifactLocation"];
                assert_eq!(artifact["uriBaseId"], "%SRCROOT%", "{result:#}");
                let uri = artifact["uri"].as_str().unwrap();
                assert!(
                    !uri.is_empty() && !uri.starts_with('/') && !uri.contains(':'),
                    "relative, no scheme: {uri}"
                );
                assert!(
                    uri.split('/')
                        .all(|seg| !seg.is_empty() && seg != ".." && seg != "."),
                    "no empty, . or .. segment: {uri}"
                );
                let resolved = fx.ws.join(uri);
                assert!(
                    resolved.starts_with(&fx.ws)
                        && resolved
                            .components()
                            .all(|c| !matches!(c, std::path::Component::ParentDir)),
                    "{uri} resolves under {}",
                    fx.ws.display()
                );
                seen.insert(
                    (
                        result["properties"]["layer"].as_str().unwrap().to_owned(),
                        result["properties"]["operation"]
                            .as_str()
                            .unwrap()
                            .to_owned(),
                    ),
                    uri.to_owned(),
                );
            }
        }
        // The proxy's refusal needs no kernel audit: as root and as 65534.
        assert_eq!(
            seen.get(&("proxy".to_owned(), "net.connect".to_owned()))
                .map(String::as_str),
            Some(".execward/sandbox-run"),
            "{uid:?} {log:#}\n{}",
            context(&out)
        );
        if uid.is_none() {
            // The kernel layers are seen as root: the workspace file is itself, the outside
            // file and the syscall point at the runtime artifact (and keep the real target).
            let file_uris: Vec<&String> = seen
                .iter()
                .filter(|((_, op), _)| op == "fs.write_file")
                .map(|(_, uri)| uri)
                .collect();
            assert!(
                text.contains("\"uri\": \".git/config\""),
                "the workspace denial points at the file: {log:#}"
            );
            assert!(!file_uris.is_empty(), "{log:#}");
            assert_eq!(
                seen.get(&("seccomp".to_owned(), "io_uring_setup".to_owned()))
                    .map(String::as_str),
                Some(".execward/sandbox-run"),
                "{log:#}"
            );
            assert!(text.contains("a|b c.txt"), "the real path is kept: {log:#}");
        } else {
            assert_eq!(run["invocations"][0]["executionSuccessful"], false);
        }
        validate_sarif(&fx.ws.join("mixed.sarif"));
    }
}

#[test]
fn markdown_summary_renders_one_row_per_group_with_hostile_paths_escaped() {
    let _guard = require_audit();
    for uid in common::identities() {
        let fx = Fixture::new(uid);
        let (text, out) = mixed_denials_run(&fx, "markdown");
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows.get(..2),
            Some(
                &[
                    "| layer | operation | where | count | allow |",
                    "|---|---|---|---:|---|"
                ][..]
            ),
            "{text}"
        );
        // Every row has exactly five cells: no `|` of a path ends a cell.
        for row in &rows {
            assert_eq!(row.replace("\\|", "").matches('|').count(), 6, "{row}");
        }
        let layers: Vec<&str> = rows[2..]
            .iter()
            .map(|r| r.split(" | ").next().unwrap().trim_start_matches("| "))
            .collect();
        assert!(layers.contains(&"proxy"), "{text}\n{}", context(&out));
        if uid.is_none() {
            let groups = text
                .lines()
                .find_map(|l| l.strip_prefix("**"))
                .and_then(|l| l.split(" denial").next())
                .unwrap_or_default();
            assert!(
                text.contains(&format!("in {} groups**", rows.len() - 2)),
                "one row per group ({groups} denials): {text}"
            );
            assert!(layers.contains(&"seccomp"), "{text}");
            assert!(text.contains("a\\|b c.txt"), "the | is escaped: {text}");
        } else {
            assert!(text.contains("Audit unavailable"), "{text}");
        }
    }
}
