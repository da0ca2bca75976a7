//! Kernel tests: each case is a fresh `sandbox-run` process probed from inside, run as root and
//! as an unprivileged uid. Denials are proven: the errno is a refusal and the outside is
//! unchanged; network denials are checked against a real listener and a control run.
#![cfg(target_os = "linux")]

mod common;

use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

const WW: &[&str] = &["--policy", "workspace-write"];

#[test]
fn workspace_write_denies_every_write_outside_the_roots() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let out = s(&fx.outside_file);
        let new = fx.outside.join("new.txt");
        let cases: Vec<(Vec<String>, &[&str])> = vec![
            (vec!["write".into(), s(&new).into()], &[]),
            (vec!["append".into(), out.into()], &[]),
            (vec!["truncate".into(), out.into()], &[]),
            (vec!["mkdir".into(), s(&fx.outside.join("d")).into()], &[]),
            (vec!["unlink".into(), out.into()], &[]),
            (
                vec!["rename".into(), out.into(), s(&fx.ws.join("moved")).into()],
                &["EXDEV"],
            ),
            (
                vec![
                    "rename".into(),
                    s(&fx.ws.join("inside.txt")).into(),
                    s(&fx.outside.join("in")).into(),
                ],
                &["EXDEV"],
            ),
            (
                vec!["link".into(), out.into(), s(&fx.ws.join("hardlink")).into()],
                &["EXDEV"],
            ),
            (vec!["chmod".into(), out.into()], &[]),
        ];
        for (op, also) in cases {
            let op: Vec<&str> = op.iter().map(String::as_str).collect();
            let result = probe(WW, &op, uid, &fx.ws);
            let context = format!("{op:?} as {uid:?}");
            assert_blocked(&result, also, &context);
            fx.assert_outside_untouched(&context);
        }
        assert!(!fx.ws.join("moved").exists() && !fx.ws.join("hardlink").exists());
        assert!(fx.ws.join("inside.txt").exists());
    }
}

#[test]
fn read_only_denies_writes_even_in_the_cwd() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let target = fx.ws.join("new.txt");
        let result = probe(
            &["--policy", "read-only"],
            &["write", s(&target)],
            uid,
            &fx.ws,
        );
        assert_blocked(&result, &[], "read-only write in cwd");
        assert!(!target.exists());
        let result = probe(
            &["--policy", "read-only"],
            &["write", "/dev/null"],
            uid,
            &fx.ws,
        );
        assert_allowed(&result, "read-only write /dev/null");
    }
}

#[test]
fn workspace_write_denies_symlink_escape() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let link = fx.ws.join("escape");
        std::os::unix::fs::symlink(&fx.outside_file, &link).unwrap();
        let result = probe(WW, &["write", s(&link)], uid, &fx.ws);
        assert_blocked(&result, &[], "write through symlink");
        fx.assert_outside_untouched("symlink escape");
    }
}

#[test]
fn workspace_write_keeps_git_read_only() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let git = fx.ws.join(".git");
        for op in [
            vec!["write", s(&git.join("config"))],
            vec!["write", s(&git.join("hooks-pre-commit"))],
            vec!["unlink", s(&git.join("config"))],
            vec!["rename", s(&git), s(&fx.ws.join("git-moved"))],
            vec!["chmod", s(&git.join("config"))],
        ] {
            let result = probe(WW, &op, uid, &fx.ws);
            assert_blocked(&result, &["EBUSY"], &format!("{op:?} as {uid:?}"));
        }
        assert_eq!(
            std::fs::read_to_string(git.join("config")).unwrap(),
            "[core]\n"
        );
        assert!(!git.join("hooks-pre-commit").exists());
    }
}

#[test]
fn allowed_operations_work_inside_the_workspace_and_tmp() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let file = fx.ws.join("a/b.txt");
        std::fs::create_dir_all(fx.ws.join("a")).unwrap();
        std::fs::create_dir_all(fx.ws.join("c")).unwrap();
        if let Some(uid) = uid {
            for dir in ["a", "c"] {
                std::os::unix::fs::chown(fx.ws.join(dir), Some(uid), Some(uid)).unwrap();
            }
        }
        assert_allowed(&probe(WW, &["write", s(&file)], uid, &fx.ws), "write ws");
        // One ruleset, not stacked ones: cross-directory rename inside a root must work.
        let moved = fx.ws.join("c/b.txt");
        assert_allowed(
            &probe(WW, &["rename", s(&file), s(&moved)], uid, &fx.ws),
            "rename",
        );
        assert_allowed(&probe(WW, &["unlink", s(&moved)], uid, &fx.ws), "unlink ws");
        // /tmp is the sandbox's own: writable inside, and nothing lands in the host's /tmp.
        let tmp = format!("/tmp/sbx-probe-{}-{uid:?}", std::process::id());
        let steps = probe(
            WW,
            &[
                "sequence", "write", &tmp, ";", "read", &tmp, ";", "unlink", &tmp,
            ],
            uid,
            &fx.ws,
        );
        for step in steps["detail"].as_array().unwrap() {
            assert_allowed(step, "write, read, unlink in /tmp");
        }
        let again = probe(WW, &["write", &tmp], uid, &fx.ws);
        assert_allowed(&again, "write /tmp again");
        assert!(
            !Path::new(&tmp).exists(),
            "a write to the sandbox's /tmp landed in the host's /tmp"
        );
        assert_allowed(
            &probe(WW, &["read", "/etc/passwd"], uid, &fx.ws),
            "read /etc",
        );
        assert_allowed(
            &probe(WW, &["read", "/usr/include/stdio.h"], uid, &fx.ws),
            "read /usr",
        );
    }
}

#[test]
fn shells_interpreters_and_compilers_run_inside() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let run = |cmd: &[&str]| sandbox_run(WW, cmd, uid, &fx.ws);
        let out = run(&["/bin/sh", "-c", "echo hi > f && cat f && rm f"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n", "{out:?}");
        let out = run(&["/usr/bin/python3", "-c", "print(6 * 7)"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n", "{out:?}");
        std::fs::write(
            fx.ws.join("hello.c"),
            "#include <stdio.h>\nint main(void){puts(\"hello\");return 0;}\n",
        )
        .unwrap();
        let out = run(&["/bin/sh", "-c", "cc -o hello hello.c && ./hello"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{out:?}");
    }
}

#[test]
fn network_off_refuses_tcp_and_udp_to_a_live_listener() {
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_addr = tcp.local_addr().unwrap().to_string();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let udp_addr = udp.local_addr().unwrap().to_string();
    for uid in identities() {
        let fx = Fixture::new(uid);
        // With and without the namespace layer (read-only: no .git carve-out needs namespaces).
        for policy in [WW, &["--policy", "read-only", "--no-namespaces"]] {
            let result = probe(policy, &["tcp-connect", &tcp_addr], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("tcp {policy:?} {uid:?}"));
            let result = probe(policy, &["udp-send", &udp_addr], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("udp {policy:?} {uid:?}"));
            let mut buf = [0u8; 16];
            assert!(udp.recv_from(&mut buf).is_err(), "a datagram got through");
        }
        // Control: the same probes reach the listeners when the network is allowed.
        let open = &["--policy", "workspace-write", "--allow-network"];
        assert_allowed(
            &probe(open, &["tcp-connect", &tcp_addr], uid, &fx.ws),
            "tcp control",
        );
        assert_allowed(
            &probe(open, &["udp-send", &udp_addr], uid, &fx.ws),
            "udp control",
        );
        let mut buf = [0u8; 16];
        assert!(udp.recv_from(&mut buf).is_ok(), "control datagram missing");
    }
}

#[test]
fn dangerous_syscalls_are_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        for op in [
            vec!["io-uring-setup"],
            vec!["unshare"],
            vec!["clone-newuser"],
            vec!["mount-bind", s(&fx.ws), s(&fx.outside)],
            vec!["tiocsti"],
            vec!["tiocsti-high-bits"],
            vec!["x32-getpid"],
        ] {
            let result = probe(WW, &op, uid, &fx.ws);
            assert_eq!(result["error"], "EPERM", "{op:?} as {uid:?}: {result}");
        }
        // Control: without a sandbox the same calls are not refused with EPERM.
        let free = &["--policy", "danger-full-access"];
        let result = probe(free, &["io-uring-setup"], uid, &fx.ws);
        assert_ne!(result["error"], "EPERM", "io_uring control: {result}");
        let result = probe(free, &["tiocsti-high-bits"], uid, &fx.ws);
        assert_eq!(result["error"], "ENOTTY", "tiocsti control: {result}");
        let result = probe(&["--policy", "read-only"], &["no-new-privs"], uid, &fx.ws);
        assert_eq!(result["detail"], "1", "{result}");
    }
}

#[test]
fn ptrace_and_proc_environ_of_an_outside_process_are_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let mut sleeper = std::process::Command::new("/bin/sleep");
        sleeper.arg("30").env("SECRET_TOKEN", "hunter2");
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut sleeper, uid);
            std::os::unix::process::CommandExt::gid(&mut sleeper, uid);
        }
        let mut child = sleeper.spawn().unwrap();
        let pid = child.id().to_string();
        let environ = format!("/proc/{pid}/environ");
        // With namespaces the outside process does not even exist for the sandbox (its own
        // PID namespace and /proc); without them Landlock and seccomp refuse.
        for (args, unreachable) in [
            (WW, &["ESRCH", "ENOENT"][..]),
            (
                &[
                    "--policy",
                    "workspace-write",
                    "--no-namespaces",
                    "--best-effort",
                ][..],
                &[][..],
            ),
        ] {
            let context = format!("{args:?} as {uid:?}");
            assert_blocked(
                &probe(args, &["ptrace-attach", &pid], uid, &fx.ws),
                unreachable,
                &format!("ptrace {context}"),
            );
            assert_blocked(
                &probe(args, &["read", &environ], uid, &fx.ws),
                unreachable,
                &format!("environ {context}"),
            );
            assert_blocked(
                &probe(args, &["kill", &pid], uid, &fx.ws),
                unreachable,
                &format!("signal scope {context}"),
            );
        }
        // Controls: unsandboxed, the same identity reads, signals and attaches (so the
        // refusals above are the sandbox's, not the uid's). Attaching stops the sleeper, so
        // it goes last.
        let free = &["--policy", "danger-full-access"];
        assert_allowed(
            &probe(free, &["read", &environ], uid, &fx.ws),
            "environ control",
        );
        assert_allowed(&probe(free, &["kill", &pid], uid, &fx.ws), "signal control");
        assert_allowed(
            &probe(free, &["ptrace-attach", &pid], uid, &fx.ws),
            "ptrace control",
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn setuid_programs_do_not_gain_privilege() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a setuid-root copy of id and must run as root (it then drops to uid 65534)"
    );
    let fx = Fixture::new(None);
    let id = fx.outside.join("id-setuid");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let free = sandbox_run(
        &["--policy", "danger-full-access"],
        &[s(&id), "-u"],
        Some(NOBODY),
        &fx.ws,
    );
    let sandboxed = sandbox_run(WW, &[s(&id), "-u"], Some(NOBODY), &fx.ws);
    assert_eq!(
        String::from_utf8_lossy(&free.stdout),
        "0\n",
        "control: setuid works unsandboxed"
    );
    assert_eq!(
        String::from_utf8_lossy(&sandboxed.stdout),
        "65534\n",
        "{sandboxed:?}"
    );
}

#[test]
fn user_namespace_maps_every_id_for_root_and_only_its_own_otherwise() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let maps = ["/proc/self/uid_map", "/proc/self/gid_map"];
        let out = sandbox_run(WW, &["/bin/cat", maps[0], maps[1]], uid, &fx.ws);
        assert!(out.status.success(), "{out:?}");
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let (own_uid, own_gid) = match uid {
            Some(id) => (id, id),
            None => (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            ),
        };
        let expected = if own_uid == 0 {
            // Written from outside the namespace: every id, mapped onto itself.
            vec!["0 0 4294967295".to_owned(); 2]
        } else {
            vec![
                format!("{own_uid} {own_uid} 1"),
                format!("{own_gid} {own_gid} 1"),
            ]
        };
        assert_eq!(lines, expected, "as {uid:?}");
    }
}

/// Every Landlock filesystem right of the running ABI, one probe operation each, with the
/// namespace layer off (`--no-namespaces`: no read-only mount answers first, so Landlock alone
/// decides): under a profile that reads only the system directories and one `readable`
/// directory and writes only the workspace, each operation fails with Landlock's errno
/// (`EACCES`; `EXDEV` for reparenting), and each succeeds in an unsandboxed control run by
/// the same uid. A Landlock ruleset that stopped handling one right (say `Truncate`, which a
/// read-only mount would otherwise hide) fails its row. `MakeChar` and `MakeBlock` have no
/// row: without `CAP_MKNOD`, which every sandbox drops, the capability check answers first;
/// the unit test of the handled set covers them.
#[test]
fn landlock_alone_refuses_each_filesystem_right_it_was_not_given() {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only answers
    // the ABI version.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    } as i32;
    assert!(abi >= 1, "Landlock is unavailable on this kernel");
    let probe_dir = probe_exe().parent().unwrap().to_path_buf();
    for uid in identities() {
        let fx = Fixture::new(uid);
        let root = fx.ws.parent().unwrap().to_path_buf();
        let readable = root.join("readable");
        std::fs::create_dir_all(readable.join("sub")).unwrap();
        std::fs::write(readable.join("file"), "kept\n").unwrap();
        let outside_true = fx.outside.join("true");
        std::fs::copy("/bin/true", &outside_true).unwrap();
        if let Some(uid) = uid {
            for path in [&readable, &readable.join("sub"), &readable.join("file")] {
                std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
            }
            std::os::unix::fs::chown(&outside_true, Some(uid), Some(uid)).unwrap();
        }
        let mut profile = String::from(
            "network = false\nprotected_subpaths = []\ndeny_credential_stores = false\n[filesystem]\n",
        );
        for (path, access) in [
            (Path::new("/usr"), "read"),
            (Path::new("/lib"), "read"),
            (Path::new("/lib64"), "read"),
            (Path::new("/bin"), "read"),
            (Path::new("/etc"), "read"),
            (Path::new("/proc"), "read"),
            (Path::new("/sys"), "read"),
            (Path::new("/dev"), "read"),
            (probe_dir.as_path(), "read"),
            (readable.as_path(), "read"),
            (fx.ws.as_path(), "write"),
        ] {
            if path.exists() {
                profile.push_str(&format!("{:?} = \"{access}\"\n", path.to_str().unwrap()));
            }
        }
        let profile_path = root.join("profile.toml");
        std::fs::write(&profile_path, profile).unwrap();
        let policy = ["--policy", s(&profile_path), "--no-namespaces"];
        let r = |name: &str| s(&readable.join(name)).to_owned();
        // (right, first ABI with it, probe operation, errno under the sandbox)
        let rows: Vec<(&str, i32, Vec<String>, i32)> = vec![
            (
                "ReadFile",
                1,
                vec!["read".into(), s(&fx.outside_file).into()],
                libc::EACCES,
            ),
            (
                "ReadDir",
                1,
                vec!["readdir".into(), s(&fx.outside).into()],
                libc::EACCES,
            ),
            (
                "Execute",
                1,
                vec!["exec".into(), s(&outside_true).into()],
                libc::EACCES,
            ),
            (
                "WriteFile",
                1,
                vec!["append".into(), r("file")],
                libc::EACCES,
            ),
            (
                "Truncate",
                3,
                vec!["truncate-path".into(), r("file")],
                libc::EACCES,
            ),
            (
                "RemoveFile",
                1,
                vec!["unlink".into(), r("file")],
                libc::EACCES,
            ),
            ("RemoveDir", 1, vec!["rmdir".into(), r("sub")], libc::EACCES),
            ("MakeReg", 1, vec!["write".into(), r("new")], libc::EACCES),
            (
                "MakeDir",
                1,
                vec!["mkdir".into(), r("newdir")],
                libc::EACCES,
            ),
            (
                "MakeSym",
                1,
                vec!["symlink".into(), "/".into(), r("link")],
                libc::EACCES,
            ),
            (
                "MakeFifo",
                1,
                vec!["mkfifo".into(), r("fifo")],
                libc::EACCES,
            ),
            (
                "MakeSock",
                1,
                vec!["unix-bind".into(), r("sock")],
                libc::EACCES,
            ),
            (
                "IoctlDev",
                5,
                vec!["ioctl-tcgets".into(), "/dev/zero".into()],
                libc::EACCES,
            ),
            (
                "Refer",
                2,
                vec!["link".into(), r("file"), s(&fx.ws.join("linked")).into()],
                libc::EXDEV,
            ),
        ];
        let rows: Vec<_> = rows.into_iter().filter(|row| row.1 <= abi).collect();
        for (right, _, op, errno) in &rows {
            let op: Vec<&str> = op.iter().map(String::as_str).collect();
            let result = probe(&policy, &op, uid, &fx.ws);
            assert_eq!(
                result["errno"],
                serde_json::json!(errno),
                "{right} as {uid:?}: {op:?} under Landlock alone: {result}"
            );
        }
        // Nothing the refused operations named changed.
        assert_eq!(
            std::fs::read_to_string(readable.join("file")).unwrap(),
            "kept\n"
        );
        let mut names: Vec<String> = std::fs::read_dir(&readable)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["file", "sub"], "as {uid:?}: readable/ changed");
        assert!(!fx.ws.join("linked").exists());
        // The controls, in an order where each finds what it needs (the link before the
        // unlink): every operation works for this uid without the sandbox.
        let order = [
            "ReadFile",
            "ReadDir",
            "Execute",
            "WriteFile",
            "Truncate",
            "Refer",
            "RemoveFile",
            "RemoveDir",
            "MakeReg",
            "MakeDir",
            "MakeSym",
            "MakeFifo",
            "MakeSock",
            "IoctlDev",
        ];
        for right in order {
            let Some((_, _, op, _)) = rows.iter().find(|row| row.0 == right) else {
                continue;
            };
            let result = unsandboxed_probe(op, uid, &fx.ws);
            let made_the_call = if right == "IoctlDev" {
                result["errno"] == serde_json::json!(libc::ENOTTY)
            } else {
                result["ok"] == true
            };
            assert!(
                made_the_call,
                "{right} control as {uid:?}: {op:?}: {result}"
            );
        }
    }
}

/// The probe `op` run directly as `uid`, with no sandbox: the control of a denial.
#[allow(clippy::unwrap_used)]
fn unsandboxed_probe(op: &[String], uid: Option<u32>, cwd: &Path) -> serde_json::Value {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(probe_exe());
    cmd.args(PROBE_ARGS)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(PROBE_ENV, serde_json::to_string(op).unwrap());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let output = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("PROBE_RESULT "))
        .unwrap_or_else(|| panic!("control probe {op:?} printed no result: {stdout}"));
    serde_json::from_str(line).unwrap()
}
