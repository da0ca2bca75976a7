//! The denial audit end to end: real `sandbox-run --audit` runs, real kernel audit records.
//!
//! These tests need root and the kernel audit subsystem (CI runs as root). They check their
//! preconditions and FAIL with the reason when they are missing, never pass silently.
//! Every audited run turns auditing on and back off, so the tests of this binary take one lock.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod advice;
mod formats;
mod locations;
mod robustness;
mod tree;

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
    if let Err(err) = audit::netlink::MulticastReader::open() {
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
