//! Correlation on records shaped like the ones Linux 6.18 sent for a real run (see
//! `sandbox/tests/audit.rs` for the end-to-end version).

use super::*;
use crate::policy::{Access, FilesystemPolicy, PathRule};
use pretty_assertions::assert_eq;

const ROOT: u32 = 100;
const SESSION: u32 = 7;

fn policy() -> ResolvedPolicy {
    let rule = |path: &str, access| PathRule {
        path: path.into(),
        access,
    };
    ResolvedPolicy {
        filesystem: FilesystemPolicy::Restricted {
            rules: vec![
                rule("/", Access::Read),
                rule("/ws", Access::Write),
                rule("/ws/.git", Access::Read),
            ],
        },
        network: crate::policy::NetworkPolicy::Off,
        hidden: Vec::new(),
        read_only: Vec::new(),
        denied_tcp_ports: Vec::new(),
        tmpdir: None,
    }
}

fn feed(records: &[(u16, &str)]) -> Vec<Denial> {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
        },
        policy(),
    );
    let mut out = Vec::new();
    for (kind, text) in records {
        out.extend(correlator.push(Record::parse(*kind, text.as_bytes()).unwrap()));
    }
    out.extend(correlator.finish());
    out
}

fn summary(denials: &[Denial]) -> Vec<(Layer, String, Option<String>, Option<u32>)> {
    denials
        .iter()
        .map(|d| (d.layer, d.operation.clone(), d.path.clone(), d.pid))
        .collect()
}

#[test]
fn landlock_denials_of_our_domain_get_pid_and_exe_from_the_syscall_record() {
    let denials = feed(&[
        (
            1423,
            r#"audit(10.748:30): domain=1724f0800 blockers=fs.write_file path="/out/f.txt" dev="vda" ino=5"#,
        ),
        (
            1424,
            r#"audit(10.748:30): domain=1724f0800 status=allocated mode=enforcing pid=100 uid=0 exe="/sbin/sandbox-run" comm="sandbox-run""#,
        ),
        (
            1300,
            r#"audit(10.748:30): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=1 a2=241 a3=1b6 items=1 ppid=100 pid=101 auid=0 uid=0 ses=7 comm="sh" exe="/usr/bin/dash" key=(null)"#,
        ),
        (1320, "audit(10.748:30): "),
        (
            1423,
            r#"audit(10.768:32): domain=1724f0800 blockers=fs.make_dir path="/out" dev="vda" ino=4"#,
        ),
    ]);
    assert_eq!(
        summary(&denials),
        vec![
            (
                Layer::Landlock,
                "fs.write_file".into(),
                Some("/out/f.txt".into()),
                Some(101)
            ),
            (
                Layer::Landlock,
                "fs.make_dir".into(),
                Some("/out".into()),
                None
            ),
        ]
    );
    assert_eq!(denials[0].exe.as_deref(), Some("/usr/bin/dash"));
    assert_eq!(denials[0].syscall.as_deref(), Some("openat"));
}

#[test]
fn other_domains_and_other_sessions_are_never_attributed() {
    let denials = feed(&[
        // Another sandboxed process: its own domain, created by pid 555, in session 9.
        (
            1423,
            r#"audit(11.000:40): domain=aaaa blockers=fs.write_file path="/out/x" dev="vda" ino=5"#,
        ),
        (
            1424,
            r#"audit(11.000:40): domain=aaaa status=allocated mode=enforcing pid=555 uid=0 exe="/x" comm="x""#,
        ),
        (
            1300,
            r#"audit(11.000:40): arch=c000003e syscall=257 success=no exit=-13 pid=556 ses=9 comm="sh" exe="/bin/sh""#,
        ),
        (1320, "audit(11.000:40): "),
        (
            1326,
            r#"audit(11.100:41): auid=0 uid=0 gid=0 ses=9 pid=557 comm="python3" exe="/usr/bin/python3" sig=0 arch=c000003e syscall=41 compat=0 ip=0x1 code=0x50000"#,
        ),
        (
            1300,
            r#"audit(11.200:42): arch=c000003e syscall=83 success=no exit=-30 pid=558 ses=9 comm="mkdir" exe="/usr/bin/mkdir""#,
        ),
        (1320, "audit(11.200:42): "),
    ]);
    assert_eq!(denials, Vec::new());
}

#[test]
fn seccomp_records_of_the_session_are_named_by_syscall() {
    let denials = feed(&[(
        1326,
        r#"audit(12.676:21): auid=0 uid=0 gid=0 ses=7 subj=unconfined pid=102 comm="python3" exe="/usr/bin/python3" sig=0 arch=c000003e syscall=41 compat=0 ip=0x7f9a79b28dc7 code=0x50000"#,
    )]);
    assert_eq!(
        summary(&denials),
        vec![(Layer::Seccomp, "socket".into(), None, Some(102))]
    );
    assert_eq!(
        denials[0].allow_rule,
        "network = true (sandbox-run --allow-network)"
    );
}

#[test]
fn the_clone3_fallback_is_not_a_denial() {
    let denials = feed(&[(
        1326,
        r#"audit(12.700:22): auid=0 ses=7 pid=102 comm="t" exe="/t" sig=0 arch=c000003e syscall=435 compat=0 ip=0x1 code=0x50000"#,
    )]);
    assert_eq!(denials, Vec::new());
}

#[test]
fn erofs_syscalls_become_mount_denials_with_landlock_vocabulary() {
    let denials = feed(&[
        // echo a > /out/f.txt (exists): NORMAL item, the file.
        (
            1300,
            r#"audit(13.464:18): arch=c000003e syscall=257 success=no exit=-30 a0=ffffff9c a1=1 a2=241 a3=1b6 items=1 pid=103 ses=7 comm="sh" exe="/usr/bin/dash""#,
        ),
        (1307, r#"audit(13.464:18): cwd="/ws""#),
        (
            1302,
            r#"audit(13.464:18): item=0 name="/out/f.txt" inode=9 dev=fe:00 mode=0100644 nametype=NORMAL"#,
        ),
        (1320, "audit(13.464:18): "),
        // echo b > new.txt relative to /out... here: a new file, only the PARENT item.
        (
            1300,
            r#"audit(13.464:19): arch=c000003e syscall=257 success=no exit=-30 a0=ffffff9c a1=1 a2=241 a3=1b6 items=1 pid=103 ses=7 comm="sh" exe="/usr/bin/dash""#,
        ),
        (1307, r#"audit(13.464:19): cwd="/ws""#),
        (
            1302,
            r#"audit(13.464:19): item=0 name="/out/" inode=8 dev=fe:00 mode=040755 nametype=PARENT"#,
        ),
        (1320, "audit(13.464:19): "),
        // mkdir .git/hooks2 relative to the cwd
        (
            1300,
            r#"audit(13.464:20): arch=c000003e syscall=83 success=no exit=-30 a0=7ffe a1=1ff items=1 pid=104 ses=7 comm="mkdir" exe="/usr/bin/mkdir""#,
        ),
        (1307, r#"audit(13.464:20): cwd="/ws""#),
        (
            1302,
            r#"audit(13.464:20): item=0 name=".git/" inode=8 dev=fe:00 mode=040755 nametype=PARENT"#,
        ),
        (1320, "audit(13.464:20): "),
        // A failure that is not the sandbox's (ENOENT) is not reported.
        (
            1300,
            r#"audit(13.500:21): arch=c000003e syscall=257 success=no exit=-2 pid=104 ses=7"#,
        ),
        (1320, "audit(13.500:21): "),
    ]);
    assert_eq!(
        summary(&denials),
        vec![
            (
                Layer::Mount,
                "fs.write_file".into(),
                Some("/out/f.txt".into()),
                Some(103)
            ),
            (
                Layer::Mount,
                "fs.make_reg".into(),
                Some("/out".into()),
                Some(103)
            ),
            (
                Layer::Mount,
                "fs.make_dir".into(),
                Some("/ws/.git".into()),
                Some(104)
            ),
        ]
    );
    assert!(
        denials[2]
            .allow_rule
            .starts_with("/ws/.git is a protected path")
    );
}

#[test]
fn without_a_session_only_the_root_pid_is_attributed() {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: None,
        },
        policy(),
    );
    let record = |pid: u32| {
        let text = format!(
            "audit(14.000:{pid}): ses=4294967295 pid={pid} exe=\"/x\" syscall=101 code=0x50000"
        );
        Record::parse(1326, text.as_bytes()).unwrap()
    };
    let mut out = correlator.push(record(ROOT));
    out.extend(correlator.push(record(ROOT + 1)));
    out.extend(correlator.finish());
    assert_eq!(
        summary(&out),
        vec![(Layer::Seccomp, "ptrace".into(), None, Some(ROOT))]
    );
}
