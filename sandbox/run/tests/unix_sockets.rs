//! Pathname unix sockets: a sandboxed command reaches one only inside its writable roots or when
//! the policy names it (`--allow-unix-socket`), on both ways in (namespaces, and
//! `--no-namespaces`), as root and as an unprivileged uid, each against an unsandboxed control
//! that reaches the same listener.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use common::{Fixture, assert_allowed, identities, probe, s};

const WW: &[&str] = &["--policy", "workspace-write"];
const RO: &[&str] = &["--policy", "read-only"];
const FREE: &[&str] = &["--policy", "danger-full-access"];
/// The two ways a command is confined: namespaces (PID 1 holds the listener) and without
/// them (`sandbox-run` itself holds it; best effort for workspace-write's read-only `.git`,
/// which only the namespace layer keeps).
const LAUNCHES: [&[&str]; 2] = [&[], &["--no-namespaces", "--best-effort"]];

#[test]
#[ignore = "entry point of the in-sandbox probe, not a test"]
fn probe_entry() {
    common::probe_entry();
}

/// A listener on `path` that answers each connection with `greeting` and counts them.
struct Listener {
    listener: UnixListener,
    greeting: &'static str,
}

impl Listener {
    fn bind(path: &Path, greeting: &'static str) -> Self {
        let listener = UnixListener::bind(path).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        Self { listener, greeting }
    }

    /// Answers the connections waiting now; returns how many there were.
    fn drain(&self) -> usize {
        let mut count = 0;
        while let Ok((mut stream, _)) = self.listener.accept() {
            let _ = stream.write_all(self.greeting.as_bytes());
            count += 1;
        }
        count
    }
}

/// A probe that connects to `path` and reads the greeting, while this thread answers.
fn connect(
    args: &[&str],
    path: &Path,
    uid: Option<u32>,
    cwd: &Path,
    listener: &Listener,
) -> serde_json::Value {
    std::thread::scope(|scope| {
        let run = scope.spawn(|| probe(args, &["unix-connect-read", s(path)], uid, cwd));
        let mut count = 0;
        while !run.is_finished() {
            count += listener.drain();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        count += listener.drain();
        let result = run.join().unwrap();
        serde_json::json!({"result": result, "accepted": count})
    })
}

fn with(launch: &[&str], policy: &[&str], extra: &[&str]) -> Vec<String> {
    launch
        .iter()
        .chain(policy)
        .chain(extra)
        .map(|a| (*a).to_owned())
        .collect()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[test]
fn a_socket_outside_the_roots_is_unreachable_unless_named() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.outside.join("daemon.sock");
        let listener = Listener::bind(&path, "daemon");
        for launch in LAUNCHES {
            for policy in [WW, RO] {
                let context = format!("{launch:?} {policy:?} as {uid:?}");
                let args = with(launch, policy, &[]);
                let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
                assert_eq!(
                    seen["result"]["error"], "EACCES",
                    "{context}: expected EACCES, got {seen}"
                );
                assert_eq!(
                    seen["accepted"], 0,
                    "{context}: the listener saw a connection"
                );
                let args = with(launch, policy, &["--allow-unix-socket", s(&path)]);
                let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
                assert_allowed(&seen["result"], &format!("{context}, named"));
                assert_eq!(seen["result"]["detail"], "daemon", "{context}, named");
                assert_eq!(seen["accepted"], 1, "{context}, named");
            }
        }
        let seen = connect(FREE, &path, uid, &fx.ws, &listener);
        assert_allowed(&seen["result"], &format!("control as {uid:?}"));
        assert_eq!(seen["accepted"], 1, "control: the listener counts");
    }
}

#[test]
fn a_socket_inside_a_writable_root_is_reachable() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.ws.join("lsp.sock");
        let listener = Listener::bind(&path, "lsp");
        for launch in LAUNCHES {
            let context = format!("{launch:?} as {uid:?}");
            let args = with(launch, WW, &[]);
            let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
            assert_allowed(&seen["result"], &context);
            assert_eq!(seen["accepted"], 1, "{context}");
            // Read-only: the workspace is no writable root there.
            let args = with(launch, RO, &[]);
            let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
            assert_eq!(
                seen["result"]["error"], "EACCES",
                "{context} read-only: {seen}"
            );
            assert_eq!(seen["accepted"], 0, "{context} read-only");
            // A relative path resolves against the command's working directory.
            let args = with(launch, WW, &[]);
            let seen = connect(&strs(&args), Path::new("lsp.sock"), uid, &fx.ws, &listener);
            assert_allowed(&seen["result"], &format!("{context} relative"));
            // A socket the command binds itself, in its root.
            let own = fx.ws.join("own.sock");
            let result = probe(&strs(&args), &["unix-bind-connect", s(&own)], uid, &fx.ws);
            assert_allowed(&result, &format!("{context} own socket"));
        }
    }
}

#[test]
fn a_symlink_in_a_root_to_an_outside_socket_is_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.outside.join("daemon.sock");
        let listener = Listener::bind(&path, "daemon");
        let link = fx.ws.join("daemon.sock");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        for launch in LAUNCHES {
            let args = with(launch, WW, &[]);
            let seen = connect(&strs(&args), &link, uid, &fx.ws, &listener);
            assert_eq!(
                seen["result"]["error"], "EACCES",
                "{launch:?} as {uid:?}: {seen}"
            );
            assert_eq!(seen["accepted"], 0, "{launch:?} as {uid:?}");
        }
        let seen = connect(FREE, &link, uid, &fx.ws, &listener);
        assert_allowed(&seen["result"], "control through the link");
    }
}

/// The policy names `named.sock`; while the command runs, `named.sock` is replaced by a symlink
/// to `other.sock`, whose listener the policy does not name. The connect must not follow it.
#[test]
fn a_named_socket_swapped_for_a_symlink_is_not_followed() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let named = fx.outside.join("named.sock");
        let other = fx.outside.join("other.sock");
        let named_listener = Listener::bind(&named, "named");
        let other_listener = Listener::bind(&other, "other");
        for launch in LAUNCHES {
            let context = format!("{launch:?} as {uid:?}");
            let ready = fx.ws.join("ready");
            let go = fx.ws.join("go");
            let _ = std::fs::remove_file(&ready);
            let _ = std::fs::remove_file(&go);
            let args = with(launch, WW, &["--allow-unix-socket", s(&named)]);
            let result = std::thread::scope(|scope| {
                let run = scope.spawn(|| {
                    probe(
                        &strs(&args),
                        &["unix-connect-when", s(&ready), s(&go), s(&named)],
                        uid,
                        &fx.ws,
                    )
                });
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while !ready.exists() {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{context}: never ready"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                // The swap: the named path is now a symlink to the unnamed listener.
                std::fs::rename(&named, fx.outside.join("named.sock.moved")).unwrap();
                std::os::unix::fs::symlink(&other, &named).unwrap();
                std::fs::write(&go, b"go").unwrap();
                run.join().unwrap()
            });
            assert_eq!(result["error"], "EACCES", "{context}: {result}");
            assert_eq!(
                other_listener.drain(),
                0,
                "{context}: the symlink was followed"
            );
            assert_eq!(named_listener.drain(), 0, "{context}");
            // Put the named socket back for the next round.
            std::fs::remove_file(&named).unwrap();
            std::fs::rename(fx.outside.join("named.sock.moved"), &named).unwrap();
        }
        // Control: unsandboxed, the symlink leads to the other listener.
        std::fs::rename(&named, fx.outside.join("named.sock.moved")).unwrap();
        std::os::unix::fs::symlink(&other, &named).unwrap();
        let seen = connect(FREE, &named, uid, &fx.ws, &other_listener);
        assert_eq!(seen["result"]["detail"], "other", "control: {seen}");
    }
}

#[test]
fn datagram_unix_sockets_are_refused_and_stream_pairs_work() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        for launch in LAUNCHES {
            for policy in [WW, RO] {
                let context = format!("{launch:?} {policy:?} as {uid:?}");
                let args = with(launch, policy, &[]);
                for op in ["unix-socket", "unix-socketpair"] {
                    let result = probe(&strs(&args), &[op, "dgram"], uid, &fx.ws);
                    assert_eq!(result["error"], "EACCES", "{context} {op} dgram: {result}");
                    for kind in ["stream", "seqpacket"] {
                        let result = probe(&strs(&args), &[op, kind], uid, &fx.ws);
                        assert_allowed(&result, &format!("{context} {op} {kind}"));
                    }
                }
            }
        }
        for op in ["unix-socket", "unix-socketpair"] {
            assert_allowed(&probe(FREE, &[op, "dgram"], uid, &fx.ws), "control");
        }
    }
}

/// A datagram sent to a pathname outside the roots: refused where it starts (no datagram
/// socket can be made), and the host socket receives nothing.
#[test]
fn a_datagram_to_a_host_socket_is_refused() {
    let fx = Fixture::new(None);
    let path: PathBuf = fx.outside.join("log.sock");
    let host = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    host.set_nonblocking(true).unwrap();
    for launch in LAUNCHES {
        let args = with(launch, WW, &[]);
        let result = probe(&strs(&args), &["unix-dgram-send", s(&path)], None, &fx.ws);
        assert_eq!(result["error"], "EACCES", "{launch:?}: {result}");
    }
    let mut buf = [0u8; 16];
    assert!(
        host.recv(&mut buf).is_err(),
        "the host socket got a datagram"
    );
    assert_allowed(
        &probe(FREE, &["unix-dgram-send", s(&path)], None, &fx.ws),
        "control",
    );
    assert_eq!(
        host.recv(&mut buf).unwrap(),
        5,
        "control: the datagram arrives"
    );
}

/// The holder's own `pidfd_getfd` is refused to the command (its filter answers `EPERM` before
/// the kernel looks at the junk arguments, which unsandboxed get `EINVAL`).
#[test]
fn the_command_cannot_take_descriptors_with_pidfd_getfd() {
    let nr = libc::SYS_pidfd_getfd.to_string();
    for uid in identities() {
        let fx = Fixture::new(uid);
        for launch in LAUNCHES {
            for policy in [WW, RO] {
                let args = with(launch, policy, &[]);
                let result = probe(&strs(&args), &["syscall", &nr], uid, &fx.ws);
                assert_eq!(
                    result["error"], "EPERM",
                    "{launch:?} {policy:?} as {uid:?}: {result}"
                );
            }
        }
        let result = probe(FREE, &["syscall", &nr], uid, &fx.ws);
        assert_eq!(result["error"], "EINVAL", "control as {uid:?}: {result}");
    }
}

/// `--explain` lists the named sockets and the mechanism this host uses.
#[test]
fn explain_names_the_allowed_sockets_and_the_mechanism() {
    let fx = Fixture::new(None);
    let path = fx.outside.join("agent.sock");
    let _listener = Listener::bind(&path, "agent");
    let out = common::sandbox_run(
        &[
            "--policy",
            "read-only",
            "--allow-unix-socket",
            s(&path),
            "--explain",
        ],
        &["true"],
        None,
        &fx.ws,
    );
    assert!(out.status.success(), "{out:?}");
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected =
        serde_json::to_value(sandbox::linux::unix_sockets::Mechanism::of_this_host()).unwrap();
    assert!(
        expected == "landlock" || expected == "seccomp-notify",
        "{expected}"
    );
    assert_eq!(explain["layers"]["unix_sockets"]["mechanism"], expected);
    assert_eq!(
        explain["layers"]["unix_sockets"]["allowed"],
        serde_json::json!([s(&path)])
    );
    assert_eq!(
        explain["policy"]["unix_sockets"],
        serde_json::json!([s(&path)])
    );
}

/// The layer and operation a refused connect is recorded under on this host: the gate's own
/// records where seccomp user notification keeps the rule, Landlock's (kernel audit, root only)
/// from ABI 9.
fn expected_record() -> (&'static str, Option<&'static str>) {
    match sandbox::linux::unix_sockets::Mechanism::of_this_host() {
        sandbox::linux::unix_sockets::Mechanism::SeccompNotify => {
            ("unix-sockets", Some("unix.connect"))
        }
        sandbox::linux::unix_sockets::Mechanism::Landlock => ("landlock", None),
    }
}

/// The listed denials of a JSON-lines report.
fn report_denials(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] == "denial")
        .collect()
}

#[test]
fn a_refused_connect_is_a_denial_record_naming_the_socket() {
    let (layer, operation) = expected_record();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.outside.join("daemon.sock");
        let listener = Listener::bind(&path, "daemon");
        let jsonl = fx.ws.join("report.jsonl");
        let sarif = fx.ws.join("report.sarif");
        for launch in LAUNCHES {
            let context = format!("{launch:?} as {uid:?}");
            // JSON lines: the refusal names the socket, the pid and the errno.
            let args = with(launch, WW, &["--audit", s(&jsonl)]);
            let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
            assert_eq!(seen["result"]["error"], "EACCES", "{context}: {seen}");
            assert_eq!(seen["accepted"], 0, "{context}: the listener saw it");
            let denials = report_denials(&jsonl);
            if layer == "landlock" && uid.is_some() {
                // The kernel audit needs root; Landlock's refusals are invisible to nobody.
                continue;
            }
            let record = denials
                .iter()
                .find(|d| d["layer"] == layer && d["path"] == s(&path))
                .unwrap_or_else(|| {
                    panic!("{context}: no {layer} record of {path:?}: {denials:#?}")
                });
            if let Some(operation) = operation {
                assert_eq!(record["operation"], operation, "{context}: {record}");
                assert_eq!(record["errno"], "EACCES", "{context}: {record}");
                assert_eq!(record["syscall"], "connect", "{context}: {record}");
                assert!(record["pid"].as_u64().is_some(), "{context}: {record}");
                assert!(
                    record["allow_rule"]
                        .as_str()
                        .unwrap()
                        .contains("allowUnixSockets"),
                    "{context}: {record}"
                );
            }
            // The notified connect itself is no seccomp denial.
            assert!(
                !denials
                    .iter()
                    .any(|d| d["layer"] == "seccomp" && d["syscall"] == "connect"),
                "{context}: {denials:#?}"
            );
            // SARIF: one result of the rule; the socket is outside the repository, so its
            // location is the runtime artifact and the socket is named in its message.
            let args = with(
                launch,
                WW,
                &["--audit", s(&sarif), "--audit-format", "sarif"],
            );
            let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
            assert_eq!(seen["result"]["error"], "EACCES", "{context}: {seen}");
            let log: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&sarif).unwrap()).unwrap();
            let results = log["runs"][0]["results"].as_array().unwrap();
            let uri = audit::sarif::RUNTIME_ARTIFACT_URI;
            assert!(
                results.iter().any(|r| {
                    let location = &r["locations"][0];
                    r["properties"]["layer"] == layer
                        && location["physicalLocation"]["artifactLocation"]["uri"] == uri
                        && location["message"]["text"]
                            .as_str()
                            .is_some_and(|t| t.contains(s(&path)))
                }),
                "{context}: no SARIF result at {uri} naming {path:?}: {log:#}"
            );
            validate_sarif(&sarif);
            // Named: it connects, and nothing is recorded.
            let args = with(
                launch,
                WW,
                &["--allow-unix-socket", s(&path), "--audit", s(&jsonl)],
            );
            let seen = connect(&strs(&args), &path, uid, &fx.ws, &listener);
            assert_allowed(&seen["result"], &format!("{context}, named"));
            assert_eq!(seen["accepted"], 1, "{context}, named");
            let denials = report_denials(&jsonl);
            assert!(
                denials.iter().all(|d| d["path"] != s(&path)),
                "{context}, named: {denials:#?}"
            );
        }
        let seen = connect(FREE, &path, uid, &fx.ws, &listener);
        assert_allowed(&seen["result"], &format!("control as {uid:?}"));
    }
}

/// Without the audit, a refusal is one line on the command's stderr, whose control characters
/// (the socket's name is the command's choice) are escaped.
#[test]
fn without_the_audit_a_refusal_is_one_escaped_line_on_stderr() {
    if sandbox::linux::unix_sockets::Mechanism::of_this_host()
        != sandbox::linux::unix_sockets::Mechanism::SeccompNotify
    {
        // Landlock refuses in the kernel: no line is printed there, and none is promised.
        return;
    }
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.outside.join("ev\n\u{1b}[2Jil.sock");
        let listener = Listener::bind(&path, "evil");
        for launch in LAUNCHES {
            let context = format!("{launch:?} as {uid:?}");
            let mut cmd = std::process::Command::new(common::sandbox_run_exe());
            cmd.args(launch)
                .args(WW)
                .arg("--")
                .arg(common::probe_exe())
                .args(common::PROBE_ARGS)
                .current_dir(&fx.ws)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("HOME", common::empty_home())
                .env(
                    common::PROBE_ENV,
                    serde_json::to_string(&["unix-connect-read", s(&path)]).unwrap(),
                );
            if let Some(uid) = uid {
                use std::os::unix::process::CommandExt;
                cmd.uid(uid).gid(uid);
            }
            let out = cmd.output().unwrap();
            assert_eq!(listener.drain(), 0, "{context}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr
                .lines()
                .filter(|l| l.contains("denied: connect to unix socket"))
                .collect();
            assert_eq!(lines.len(), 1, "{context}: {stderr}");
            assert!(
                lines[0].contains("ev\\n\\u{1b}[2Jil.sock"),
                "{context}: {stderr}"
            );
            assert!(!stderr.contains('\u{1b}'), "{context}: {stderr:?}");
        }
    }
}

fn validate_sarif(report: &Path) {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sarif-schema-2.1.0.json");
    let script = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        log = json.load(open(sys.argv[2]))\n\
        jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker()).validate(log)\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, s(&schema), s(report)])
        .output()
        .expect("python3 is needed to validate SARIF (pip install jsonschema)");
    assert!(
        out.status.success(),
        "SARIF does not validate against the 2.1.0 schema (or python3 lacks the jsonschema \
         module): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A command looping on refused connects: every refusal is counted, one example is listed, and
/// the report stays small (nothing grows with the number of refusals).
#[test]
fn a_flood_of_refused_connects_is_counted_not_listed() {
    const TIMES: u64 = 2000;
    let (layer, _) = expected_record();
    if layer != "unix-sockets" {
        // Landlock's refusals go through the kernel audit's own bounds (audit_cost.rs).
        return;
    }
    for uid in identities() {
        let fx = Fixture::new(uid);
        let path = fx.outside.join("daemon.sock");
        let listener = Listener::bind(&path, "daemon");
        let jsonl = fx.ws.join("flood.jsonl");
        for launch in LAUNCHES {
            let context = format!("{launch:?} as {uid:?}");
            let args = with(launch, WW, &["--audit", s(&jsonl)]);
            let result = probe(
                &strs(&args),
                &["repeat", &TIMES.to_string(), "unix-connect", s(&path)],
                uid,
                &fx.ws,
            );
            assert_eq!(
                result["detail"]["outcomes"],
                serde_json::json!({"EACCES": TIMES}),
                "{context}: {result}"
            );
            assert_eq!(listener.drain(), 0, "{context}");
            let text = std::fs::read_to_string(&jsonl).unwrap();
            assert!(text.len() < 16 * 1024, "{context}: {} bytes", text.len());
            let lines: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let listed = lines
                .iter()
                .filter(|l| l["kind"] == "denial" && l["layer"] == layer)
                .count();
            assert_eq!(listed, 1, "{context}: one distinct socket, one example");
            let counted: u64 = lines
                .iter()
                .filter(|l| l["kind"] == "group" && l["layer"] == layer)
                .map(|l| l["count"].as_u64().unwrap())
                .sum();
            let coverage = lines.last().unwrap();
            // Refusals the channel had no room for are counted as a coverage gap.
            let dropped: u64 = coverage["gaps"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|g| g.as_str()?.strip_suffix(" refused unix-socket connects were not reported (the refusal channel was full)"))
                .map(|n| n.parse::<u64>().unwrap())
                .sum();
            assert_eq!(counted + dropped, TIMES, "{context}: {coverage}");
            if dropped > 0 {
                assert_eq!(coverage["complete"], false, "{context}: {coverage}");
            }
        }
    }
}
