//! Privileges: no capability, no writable copy of a read-only mount, no set-id bit or file
//! capability carried out, no change to another process's limits or scheduling.

use super::*;

/// A host process of `uid` the sandboxed command will try to reach.
fn sleeper(uid: Option<u32>) -> Child {
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("60");
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd.spawn().unwrap()
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_command_holds_no_capability_in_any_set() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let result = probe(WW, &["capabilities"], uid, &fx.ws);
        assert_allowed(&result, "capabilities");
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                result["detail"][set], "0000000000000000",
                "{set} as {uid:?}: {result}"
            );
        }
        // Without the sandbox, root holds every capability: the probe can tell.
        if uid.is_none() {
            let free = probe(
                &["--policy", "danger-full-access"],
                &["capabilities"],
                uid,
                &fx.ws,
            );
            assert_ne!(
                free["detail"]["CapEff"], "0000000000000000",
                "control: {free}"
            );
        }
    }
}

#[test]
fn the_mount_api_cannot_make_a_writable_copy_of_a_read_only_mount() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        for op in [
            vec!["open-tree".to_owned(), s(&fx.outside).to_owned()],
            // open_tree_attr (Linux 6.15), fsopen, fspick, mount_setattr, move_mount by number:
            // refused whatever the kernel adds next.
            vec!["syscall".to_owned(), "467".to_owned()],
            vec!["syscall".to_owned(), libc::SYS_fsopen.to_string()],
            vec!["syscall".to_owned(), libc::SYS_fspick.to_string()],
            vec!["syscall".to_owned(), libc::SYS_mount_setattr.to_string()],
            vec!["syscall".to_owned(), libc::SYS_move_mount.to_string()],
        ] {
            let op: Vec<&str> = op.iter().map(String::as_str).collect();
            let result = probe(WW, &op, uid, &fx.ws);
            assert_blocked(&result, &["ENOSYS"], &format!("{op:?} as {uid:?}"));
        }
        // And the outcome that mattered: the outside file kept its mode, owner and content.
        let chmod = probe(
            WW,
            &["chmod-mode", s(&fx.outside_file), "4755"],
            uid,
            &fx.ws,
        );
        assert_blocked(&chmod, &[], "chmod outside");
        fx.assert_outside_untouched(&format!("mount api as {uid:?}"));
        if uid.is_none() {
            let free = probe(
                &["--policy", "danger-full-access"],
                &["open-tree", s(&fx.outside)],
                uid,
                &fx.ws,
            );
            assert_allowed(&free, "control: open_tree works unsandboxed as root");
        }
    }
}

#[test]
fn files_made_inside_carry_no_set_id_bit_or_file_capability_out() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let made = fx.ws.join("made");
        assert_allowed(&probe(WW, &["write", s(&made)], uid, &fx.ws), "write");
        for mode in ["4755", "2755", "6755"] {
            let result = probe(WW, &["chmod-mode", s(&made), mode], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("chmod {mode} as {uid:?}"));
            let created = fx.ws.join(format!("created-{mode}"));
            let result = probe(WW, &["create-mode", s(&created), mode], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("create {mode} as {uid:?}"));
            assert!(!created.exists(), "created with mode {mode}");
            let result = probe(WW, &["tmpfile-mode", s(&fx.ws), mode], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("O_TMPFILE {mode} as {uid:?}"));
            assert!(!fx.ws.join("tmpfile").exists(), "linked O_TMPFILE {mode}");
        }
        let result = probe(WW, &["set-file-capability", s(&made)], uid, &fx.ws);
        assert_blocked(&result, &[], &format!("file capability as {uid:?}"));
        let meta = std::fs::metadata(&made).unwrap();
        assert_eq!(meta.mode() & 0o6000, 0, "set-id bit on {}", made.display());
        assert!(
            xattr_absent(&made, "security.capability"),
            "a file capability outlived the sandbox"
        );
        // Control: the same chmod without the sandbox works (the bit is the filter's doing).
        let free = probe(
            &["--policy", "danger-full-access"],
            &["chmod-mode", s(&made), "4755"],
            uid,
            &fx.ws,
        );
        assert_allowed(&free, "control chmod");
    }
}

#[test]
fn reads_with_set_id_bits_in_the_ignored_mode_argument_are_allowed() {
    // Without O_CREAT or O_TMPFILE the kernel ignores open's mode argument, and callers that
    // pass only two arguments (jemalloc's raw open of /proc and /sys files, inside rustc) leave
    // whatever was in the register there: the set-id rules must not refuse those reads.
    for uid in identities() {
        let fx = Fixture::new(uid);
        let file = fx.ws.join("inside.txt");
        for mode in ["4755", "2755", "6755"] {
            let result = probe(WW, &["open-read-mode", s(&file), mode], uid, &fx.ws);
            assert_allowed(&result, &format!("read with mode {mode} as {uid:?}"));
        }
    }
}

fn xattr_absent(path: &Path, name: &str) -> bool {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings; size 0 only asks for the length.
    let rc = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    rc < 0
}

/// Resource limits, niceness, affinity and I/O priority of a host process, as /proc shows them.
fn scheduling_of(pid: u32) -> (String, String, String, libc::c_long) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let cpu = limits
        .lines()
        .find(|l| l.starts_with("Max cpu time"))
        .unwrap()
        .to_owned();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let nice = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(16)
        .unwrap()
        .to_owned();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cpus = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap()
        .to_owned();
    // SAFETY: integer arguments only.
    let ioprio = unsafe { libc::syscall(libc::SYS_ioprio_get, 1, pid as libc::c_int) };
    (cpu, nice, cpus, ioprio)
}

#[test]
fn another_process_s_limits_and_scheduling_cannot_be_changed() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let host = sleeper(uid);
        let pid = host.id();
        let before = scheduling_of(pid);
        let ops = ["prlimit", "setpriority", "sched-setaffinity", "ioprio-set"];
        for args in [
            // The PID namespace: the process does not exist for the sandbox.
            (WW, &["ESRCH"][..]),
            // Without namespaces, the seccomp filter allows these calls on the caller only.
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
            for op in ops {
                let result = probe(args.0, &[op, &pid.to_string()], uid, &fx.ws);
                assert_blocked(&result, args.1, &format!("{op} {:?} as {uid:?}", args.0));
            }
        }
        assert_eq!(scheduling_of(pid), before, "the host process was changed");
        // Control: unsandboxed, the same calls change it.
        let free = probe(
            &["--policy", "danger-full-access"],
            &["setpriority", &pid.to_string()],
            uid,
            &fx.ws,
        );
        assert_allowed(&free, "control setpriority");
        assert_ne!(
            scheduling_of(pid).1,
            before.1,
            "control did not change the nice value"
        );
        stop(host);
    }
}
