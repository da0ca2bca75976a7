//! Correlation on records shaped like the ones Linux 6.18 sent for a real run (see
//! `sandbox/run/tests/audit/` for the end-to-end version).

use super::*;
use pretty_assertions::assert_eq;
use sandbox::policy::{Access, FilesystemPolicy, PathRule};

const ROOT: u32 = 100;
const SESSION: u32 = 7;
/// The collector's pid (in the session too).
const OUTER: u32 = 99;

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
                rule("/ws/secret", Access::Deny),
            ],
        },
        network: sandbox::policy::NetworkPolicy::Off,
        hidden: Vec::new(),
        read_only: Vec::new(),
        denied_tcp_ports: Vec::new(),
        tmpdir: None,
        unix_sockets: Vec::new(),
    }
}

fn feed(records: &[(u16, &str)]) -> Vec<Denial> {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
            own_pids: vec![OUTER],
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
    assert_eq!(denials[0].errno, None);
}

#[test]
fn a_notified_connect_is_not_a_seccomp_denial() {
    // The unix-socket gate's filter notifies on connect; the gate reports its own refusals.
    let denials = feed(&[(
        1326,
        r#"audit(12.690:23): auid=0 ses=7 pid=102 comm="p" exe="/p" sig=0 arch=c000003e syscall=42 compat=0 ip=0x1 code=0x7fc00000"#,
    )]);
    assert_eq!(denials, Vec::new());
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
    assert_eq!(denials[2].errno.as_deref(), Some("EROFS"));
}

#[test]
fn without_a_session_only_the_root_pid_is_attributed() {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: None,
            own_pids: vec![OUTER],
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

fn kinds(denials: &[Denial]) -> Vec<(Layer, String, Option<String>, Option<String>)> {
    denials
        .iter()
        .map(|d| {
            (
                d.layer,
                d.operation.clone(),
                d.path.clone(),
                d.errno.clone(),
            )
        })
        .collect()
}

#[test]
fn an_eacces_no_layer_logged_is_reported_as_unexplained() {
    // What a Landlock domain the command stacked with logging off looks like: the syscall
    // failed with EACCES and no LANDLOCK_ACCESS record came with it.
    let denials = feed(&[
        (
            1300,
            r#"audit(15.000:50): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=7ffd a2=0 a3=0 items=1 pid=105 ses=7 comm="cat" exe="/usr/bin/cat""#,
        ),
        (1307, r#"audit(15.000:50): cwd="/ws""#),
        (
            1302,
            r#"audit(15.000:50): item=0 name="/etc/shadow" inode=9 dev=fe:00 mode=0100640 nametype=NORMAL"#,
        ),
        (1327, "audit(15.000:50): proctitle=636174"),
        (1320, "audit(15.000:50): "),
        // EPERM without a path: a capability the sandbox does not grant.
        (
            1300,
            r#"audit(15.001:51): arch=c000003e syscall=105 success=no exit=-1 a0=3e8 items=0 pid=105 ses=7 comm="su" exe="/usr/bin/su""#,
        ),
        (1320, "audit(15.001:51): "),
    ]);
    assert_eq!(
        kinds(&denials),
        vec![
            (
                Layer::Unexplained,
                "openat".into(),
                Some("/etc/shadow".into()),
                Some("EACCES".into())
            ),
            (
                Layer::Unexplained,
                "setuid".into(),
                None,
                Some("EPERM".into())
            ),
        ]
    );
    assert_eq!(denials[0].pid, Some(105));
}

#[test]
fn eacces_on_a_masked_path_is_the_mount_layer() {
    // /ws/secret is a deny entry: the mount layer covers it with a mode-000 file.
    let denials = feed(&[
        (
            1300,
            r#"audit(16.000:60): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=7ffd a2=0 a3=0 items=1 pid=106 ses=7 comm="cat" exe="/usr/bin/cat""#,
        ),
        (1307, r#"audit(16.000:60): cwd="/ws""#),
        (
            1302,
            r#"audit(16.000:60): item=0 name="secret" inode=9 dev=00:20 mode=0100000 nametype=NORMAL"#,
        ),
        (1320, "audit(16.000:60): "),
    ]);
    assert_eq!(
        kinds(&denials),
        vec![(
            Layer::Mount,
            "fs.read_file".into(),
            Some("/ws/secret".into()),
            Some("EACCES".into())
        )]
    );
}

#[test]
fn landlock_denials_are_not_also_reported_as_unexplained() {
    let denials = feed(&[
        (
            1423,
            r#"audit(17.000:70): domain=1724f0800 blockers=fs.read_file path="/srv/x" dev="vda" ino=5"#,
        ),
        (
            1424,
            r#"audit(17.000:70): domain=1724f0800 status=allocated mode=enforcing pid=100 uid=0 exe="/sbin/sandbox-run" comm="sandbox-run""#,
        ),
        (
            1300,
            r#"audit(17.000:70): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=1 a2=0 items=1 pid=107 ses=7 comm="cat" exe="/usr/bin/cat""#,
        ),
        (1320, "audit(17.000:70): "),
    ]);
    assert_eq!(
        kinds(&denials),
        vec![(
            Layer::Landlock,
            "fs.read_file".into(),
            Some("/srv/x".into()),
            Some("EACCES".into())
        )]
    );
}

#[test]
fn sandbox_runs_own_processes_and_queries_are_not_denials() {
    let denials = feed(&[
        // The collector itself (in the session too).
        (
            1300,
            r#"audit(18.000:80): arch=c000003e syscall=62 success=no exit=-1 pid=99 ses=7 comm="sandbox-run" exe="/sbin/sandbox-run""#,
        ),
        (1320, "audit(18.000:80): "),
        // `test -w /etc`: faccessat answering "no" (EROFS and EACCES alike).
        (
            1300,
            r#"audit(18.001:81): arch=c000003e syscall=269 success=no exit=-30 a0=ffffff9c a2=2 pid=108 ses=7 comm="sh" exe="/bin/sh""#,
        ),
        (1320, "audit(18.001:81): "),
        (
            1300,
            r#"audit(18.002:82): arch=c000003e syscall=21 success=no exit=-13 pid=108 ses=7 comm="sh" exe="/bin/sh""#,
        ),
        (1320, "audit(18.002:82): "),
    ]);
    assert_eq!(denials, Vec::new());
}

#[test]
fn refused_nesting_attempts_are_denials_and_recorded_as_evasion() {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
            own_pids: vec![OUTER],
        },
        policy(),
    );
    let seccomp = |serial: u32, nr: i64| {
        let text = format!(
            "audit(19.000:{serial}): auid=0 uid=0 gid=0 ses=7 pid=109 comm=\"evil\" exe=\"/x/evil\" sig=0 arch=c000003e syscall={nr} compat=0 ip=0x1 code=0x50000"
        );
        Record::parse(AUDIT_SECCOMP, text.as_bytes()).unwrap()
    };
    let mut out = Vec::new();
    out.extend(correlator.push(seccomp(90, libc::SYS_landlock_restrict_self)));
    out.extend(correlator.push(seccomp(91, libc::SYS_seccomp)));
    out.extend(correlator.push(seccomp(92, libc::SYS_prctl)));
    out.extend(correlator.push(seccomp(93, libc::SYS_seccomp)));
    assert_eq!(
        summary(&out),
        vec![
            (
                Layer::Seccomp,
                "landlock_restrict_self".into(),
                None,
                Some(109)
            ),
            (Layer::Seccomp, "seccomp".into(), None, Some(109)),
            (Layer::Seccomp, "prctl".into(), None, Some(109)),
            (Layer::Seccomp, "seccomp".into(), None, Some(109)),
        ]
    );
    let evasion = correlator.evasion();
    assert_eq!(
        evasion.nesting,
        BTreeMap::from([
            ("landlock_restrict_self".to_owned(), 1),
            ("prctl".to_owned(), 1),
            ("seccomp".to_owned(), 2),
        ])
    );
    let gaps = evasion.gaps();
    assert!(
        gaps[0].starts_with(
            "the command tried to stack a Landlock domain of its own (landlock_restrict_self, once)"
        ),
        "{gaps:?}"
    );
    assert!(
        gaps[2].contains("a seccomp filter of its own (seccomp, 2 times)"),
        "{gaps:?}"
    );
}

#[test]
fn a_denial_by_a_domain_the_sandbox_did_not_create_is_evasion() {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
            own_pids: vec![OUTER],
        },
        policy(),
    );
    let records = [
        (
            1423,
            r#"audit(20.000:95): domain=bbbb blockers=fs.read_file path="/etc/hostname" dev="vda" ino=5"#,
        ),
        (
            1424,
            r#"audit(20.000:95): domain=bbbb status=allocated mode=enforcing pid=110 uid=0 exe="/x/evil" comm="evil""#,
        ),
        (
            1300,
            r#"audit(20.000:95): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c a1=1 a2=0 items=0 pid=110 ses=7 comm="evil" exe="/x/evil""#,
        ),
        (1320, "audit(20.000:95): "),
    ];
    let mut out = Vec::new();
    for (kind, text) in records {
        out.extend(correlator.push(Record::parse(kind, text.as_bytes()).unwrap()));
    }
    assert_eq!(
        kinds(&out),
        vec![(
            Layer::Unexplained,
            "openat".into(),
            None,
            Some("EACCES".into())
        )]
    );
    assert_eq!(correlator.evasion().foreign_domain_denials, 1);
    assert!(!correlator.evasion().is_empty());
}

#[test]
fn open_events_are_bounded_and_seccomp_records_complete_at_once() {
    let mut correlator = Correlator::new(
        Target {
            root_pid: ROOT,
            session: Some(SESSION),
            own_pids: vec![OUTER],
        },
        policy(),
    );
    // Syscall records that never get their EOE, all in the same second.
    let mut out = Vec::new();
    for serial in 0..1000u32 {
        let text = format!(
            "audit(21.000:{serial}): arch=c000003e syscall=83 success=no exit=-30 items=0 pid=111 ses=7 comm=\"m\" exe=\"/m\""
        );
        out.extend(correlator.push(Record::parse(AUDIT_SYSCALL, text.as_bytes()).unwrap()));
        assert!(correlator.pending.len() <= MAX_PENDING_EVENTS + 1);
    }
    // Every event was completed (the oldest first) and none was lost.
    out.extend(correlator.finish());
    assert_eq!(out.len(), 1000);
    // A seccomp record is complete on arrival.
    let text = "audit(21.500:5000): ses=7 pid=111 exe=\"/m\" syscall=101 code=0x50000";
    let found = correlator.push(Record::parse(AUDIT_SECCOMP, text.as_bytes()).unwrap());
    assert_eq!(
        summary(&found),
        vec![(Layer::Seccomp, "ptrace".into(), None, Some(111))]
    );
    assert!(correlator.pending.is_empty());
}
