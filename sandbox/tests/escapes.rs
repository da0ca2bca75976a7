//! Escape classes an attacker's command tried (issue 11), each closed by construction and each
//! proven on the host: the effect did not happen. Every case runs as root and as uid 65534, in a
//! fresh `sandbox-run`, with a control run where the sandbox is what makes the difference.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support functions outside #[test]

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

const WW: &[&str] = &["--policy", "workspace-write"];

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

/// Host pids of `sleep <marker>` processes. Only the daemon itself counts: a shell on its way
/// to it shows its marker too, but mid-`execve` its command line reads empty for a moment, and
/// a scan in that moment would miss a daemon that is about to exist.
fn daemons(marker: &str) -> Vec<u32> {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                let line = String::from_utf8_lossy(&cmdline);
                line == wanted || line.ends_with(&format!("/{wanted}"))
            })
        })
        .collect()
}

/// Starts `sleep <marker>` as a `setsid` double-forked daemon and returns once it had time
/// to reach its `sleep`.
const DAEMON_SCRIPT: &str = "(setsid sleep MARKER >/dev/null 2>&1 &) ; sleep 0.3; echo started";

#[test]
fn a_setsid_double_forked_daemon_does_not_outlive_the_sandbox() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let marker = format!("1{}.{}", std::process::id(), uid.unwrap_or(0));
        let script = DAEMON_SCRIPT.replace("MARKER", &marker);
        let out = sandbox_run(WW, &["/bin/sh", "-c", &script], uid, &fx.ws);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n", "{out:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !daemons(&marker).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            daemons(&marker).is_empty(),
            "the daemon outlived sandbox-run as {uid:?}"
        );
    }
    // Control: unsandboxed, the same script leaves the daemon running (the scan would see it).
    let control = format!("2{}", std::process::id());
    let out = Command::new("/bin/sh")
        .args(["-c", &DAEMON_SCRIPT.replace("MARKER", &control)])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n", "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut survivors = daemons(&control);
    while survivors.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        survivors = daemons(&control);
    }
    assert!(
        !survivors.is_empty(),
        "control: an unsandboxed daemon survives"
    );
    for pid in survivors {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn host_system_v_shared_memory_is_out_of_reach() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let key = 0x4557_0000 + uid.unwrap_or(0) as libc::key_t;
        // SAFETY: a fresh 4 KiB segment of ours, written within its size and removed at the end.
        let id = unsafe { libc::shmget(key, 4096, libc::IPC_CREAT | 0o666) };
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        // SAFETY: as above.
        let addr = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        // SAFETY: the mapping is 4096 bytes long.
        unsafe { std::ptr::copy_nonoverlapping(b"host-secret".as_ptr(), addr.cast(), 11) };
        let result = probe(WW, &["shm-read", &key.to_string()], uid, &fx.ws);
        assert_blocked(&result, &["ENOENT"], &format!("shm as {uid:?}"));
        let free = probe(
            &["--policy", "danger-full-access"],
            &["shm-read", &key.to_string()],
            uid,
            &fx.ws,
        );
        assert_eq!(free["detail"], "host-secret", "control: {free}");
        // SAFETY: detach and remove our own segment.
        unsafe {
            libc::shmdt(addr);
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

#[test]
fn other_terminals_and_the_console_cannot_be_opened() {
    // Another session's terminal: a pty pair the test holds, with typed input waiting.
    let master =
        nix::pty::posix_openpt(nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY).unwrap();
    nix::pty::grantpt(&master).unwrap();
    nix::pty::unlockpt(&master).unwrap();
    let slave_path = nix::pty::ptsname_r(&master).unwrap();
    std::fs::set_permissions(&slave_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    nix::unistd::write(&master, b"typed-password\n").unwrap();
    for uid in identities() {
        let fx = Fixture::new(uid);
        for tty in [
            slave_path.as_str(),
            "/dev/tty1",
            "/dev/console",
            "/dev/ttyS0",
            "/dev/vda",
        ] {
            let result = probe(WW, &["open-tty", tty], uid, &fx.ws);
            assert_blocked(&result, &["ENOENT"], &format!("open {tty} as {uid:?}"));
        }
        let free = probe(
            &["--policy", "danger-full-access"],
            &["open-tty", &slave_path],
            uid,
            &fx.ws,
        );
        assert_allowed(&free, "control: the other terminal is openable unsandboxed");
    }
    // The typed line is still there for its own session to read.
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&slave_path)
        .unwrap();
    nix::fcntl::fcntl(
        &slave,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut line = [0u8; 64];
    let n = nix::unistd::read(&slave, &mut line).unwrap();
    assert_eq!(&line[..n], b"typed-password\n");
}

#[test]
fn a_host_daemon_socket_in_tmp_or_run_is_unreachable() {
    let dir = format!("/tmp/ew-daemon-{}", std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = format!("{dir}/default");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    for uid in identities() {
        let fx = Fixture::new(uid);
        for policy in [WW, &["--policy", "read-only"][..]] {
            let result = probe(policy, &["unix-connect", &path], uid, &fx.ws);
            // Under workspace-write /tmp is an overlay: the seccomp-notify gate refuses a host
            // socket seen through its lower layer (EACCES); where Landlock (ABI 9) keeps the
            // rule, /tmp's write right lets the connect reach the kernel, which finds no
            // listener on the overlay's inode (ECONNREFUSED). The listener's empty queue below
            // proves nothing got through.
            assert_blocked(
                &result,
                &["ENOENT", "ECONNREFUSED"],
                &format!("{policy:?} as {uid:?}"),
            );
        }
    }
    assert!(
        listener.accept().is_err(),
        "a sandboxed command reached the host daemon"
    );
    let fx = Fixture::new(None);
    let free = probe(
        &["--policy", "danger-full-access"],
        &["unix-connect", &path],
        None,
        &fx.ws,
    );
    assert_allowed(&free, "control connect");
    assert!(listener.accept().is_ok(), "control: the listener counts");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_git_directory_at_any_depth_stays_read_only() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let hooks = fx.ws.join("vendor/lib/.git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        if let Some(uid) = uid {
            for dir in [
                "vendor",
                "vendor/lib",
                "vendor/lib/.git",
                "vendor/lib/.git/hooks",
            ] {
                std::os::unix::fs::chown(fx.ws.join(dir), Some(uid), Some(uid)).unwrap();
            }
        }
        let hook = hooks.join("post-checkout");
        let result = probe(WW, &["write", s(&hook)], uid, &fx.ws);
        assert_blocked(&result, &[], &format!("nested hook as {uid:?}"));
        assert!(!hook.exists(), "the nested hook was written");
        let config = fx.ws.join("vendor/lib/.git/config");
        assert_blocked(
            &probe(WW, &["write", s(&config)], uid, &fx.ws),
            &[],
            "nested config",
        );
        assert!(!config.exists());
        // Its siblings stay writable.
        assert_allowed(
            &probe(
                WW,
                &["write", s(&fx.ws.join("vendor/lib/src.rs"))],
                uid,
                &fx.ws,
            ),
            "sibling",
        );
    }
}

#[test]
fn a_profile_inside_a_writable_root_is_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let profile = fx.ws.join("my-profile.toml");
        std::fs::write(
            &profile,
            "[filesystem]\n\":root\" = \"read\"\n\":project_roots\" = \"write\"\n",
        )
        .unwrap();
        let out = sandbox_run(
            &["--policy", "./my-profile.toml"],
            &["/bin/true"],
            uid,
            &fx.ws,
        );
        assert_eq!(out.status.code(), Some(125), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("lies inside a writable root"), "{stderr}");
        // The same profile outside the workspace is fine.
        let outside_profile = fx.outside.join("my-profile.toml");
        std::fs::copy(&profile, &outside_profile).unwrap();
        let out = sandbox_run(
            &["--policy", s(&outside_profile)],
            &["/bin/true"],
            uid,
            &fx.ws,
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}

#[test]
fn a_denied_path_cannot_be_moved_from_under_the_next_command() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let sub = fx.ws.join("sub");
        std::fs::create_dir_all(sub.join("keys")).unwrap();
        std::fs::write(sub.join("keys/secret.pem"), "PRIVATE").unwrap();
        if let Some(uid) = uid {
            for path in ["sub", "sub/keys", "sub/keys/secret.pem"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        let secret = sub.join("keys/secret.pem");
        let args = ["--policy", "workspace-write", "--deny", s(&secret)];
        assert_blocked(
            &probe(&args, &["read", s(&secret)], uid, &fx.ws),
            &[],
            "read",
        );
        // Renaming an ancestor of the denied file is refused (it is a mount point inside).
        for from in [&sub, &sub.join("keys")] {
            let to = fx.ws.join("moved");
            let result = probe(&args, &["rename", s(from), s(&to)], uid, &fx.ws);
            assert_blocked(
                &result,
                &["EBUSY", "EXDEV"],
                &format!("rename {from:?} as {uid:?}"),
            );
            assert!(from.exists() && !to.exists());
        }
        assert_blocked(
            &probe(&args, &["read", s(&secret)], uid, &fx.ws),
            &[],
            "read after the rename attempts",
        );
    }
}

#[test]
fn nothing_of_the_tree_outlives_sandbox_run_on_a_terminal() {
    // sandbox-run run from a terminal: a leftover process of the command must not read what
    // the user types after sandbox-run returned.
    for uid in identities() {
        let fx = Fixture::new(uid);
        let marker = fx.ws.join("stolen");
        let master =
            nix::pty::posix_openpt(nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY)
                .unwrap();
        nix::pty::grantpt(&master).unwrap();
        nix::pty::unlockpt(&master).unwrap();
        let slave_path = nix::pty::ptsname_r(&master).unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&slave_path, Some(uid), Some(uid)).unwrap();
        }
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&slave_path)
            .unwrap();
        let script = format!(
            "(sleep 0.5; head -c 5 > {m} 2>&1) & echo ready",
            m = marker.display()
        );
        let mut cmd = Command::new(sandbox_run_exe());
        cmd.args(WW)
            .args(["--", "/bin/sh", "-c", &script])
            .current_dir(&fx.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        // SAFETY: setsid in the child before exec; async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        drop(slave);
        let status = wait_with_deadline(&mut child, Duration::from_secs(20));
        assert!(status.success(), "{status:?}");
        // What the user types next.
        let mut master = std::fs::File::from(std::os::fd::OwnedFd::from(master));
        let _ = master.write_all(b"secret-typed-later\n");
        std::thread::sleep(Duration::from_millis(900)); // longer than the leftover's delay
        let stolen = std::fs::read_to_string(&marker).unwrap_or_default();
        assert!(stolen.is_empty(), "a leftover read {stolen:?} as {uid:?}");
        let mut seen = Vec::new();
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let _ = master.read_to_end(&mut seen);
        assert!(
            String::from_utf8_lossy(&seen).contains("ready"),
            "the command's output reached the terminal: {:?}",
            String::from_utf8_lossy(&seen)
        );
    }
}

fn wait_with_deadline(child: &mut Child, deadline: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            panic!("sandbox-run did not exit within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(10)); // polling interval, not a wait
    }
}

#[test]
fn the_sandbox_has_its_own_pid_namespace_and_proc() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let out = sandbox_run(
            WW,
            &["/bin/sh", "-c", "echo $$; ls /proc | grep -c '^[0-9]'"],
            uid,
            &fx.ws,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("2"), "{out:?}");
        let visible: usize = lines.next().unwrap().trim().parse().unwrap();
        assert!(
            visible <= 4,
            "{visible} processes visible in /proc: {out:?}"
        );
        let _ = Stdio::null();
    }
}

#[test]
fn a_protected_repository_cannot_be_moved_from_under_its_path_by_renaming_an_ancestor() {
    // vendor/lib/.git (a nested repository) and sub/.git (a submodule's gitfile) are kept
    // read-only by binds; renaming vendor/lib, vendor or sub would carry the bind away and
    // leave the path an ordinary directory the command could refill with a .git of its own.
    for uid in identities() {
        let fx = Fixture::new(uid);
        for dir in ["vendor/lib/.git", "sub"] {
            std::fs::create_dir_all(fx.ws.join(dir)).unwrap();
        }
        std::fs::write(fx.ws.join("vendor/lib/.git/config"), "[core]\n").unwrap();
        std::fs::write(fx.ws.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        std::fs::create_dir_all(fx.ws.join(".git/modules/sub")).unwrap();
        if let Some(uid) = uid {
            for path in ["vendor", "vendor/lib", "vendor/lib/.git", "sub", "sub/.git"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        for from in ["vendor/lib", "vendor", "sub"] {
            let (from, to) = (fx.ws.join(from), fx.ws.join("moved"));
            let result = probe(WW, &["rename", s(&from), s(&to)], uid, &fx.ws);
            assert_blocked(
                &result,
                &["EBUSY", "EXDEV"],
                &format!("rename {from:?} as {uid:?}"),
            );
            assert!(from.exists() && !to.exists(), "{from:?} moved as {uid:?}");
            // Control: without the sandbox the same rename moves it (and it is put back).
            let free = probe(
                &["--policy", "danger-full-access"],
                &["rename", s(&from), s(&to)],
                uid,
                &fx.ws,
            );
            assert_allowed(&free, &format!("unsandboxed rename {from:?} as {uid:?}"));
            std::fs::rename(&to, &from).unwrap();
        }
    }
}

#[test]
fn a_deny_below_a_read_entry_cannot_be_moved_by_renaming_the_entrys_parent() {
    // services/api is a read entry inside the writable workspace, services/api/.env is denied;
    // renaming services would carry both away, and the next command (or this one) would read
    // the secret at the moved path.
    for uid in identities() {
        let fx = Fixture::new(uid);
        let api = fx.ws.join("services/api");
        std::fs::create_dir_all(&api).unwrap();
        let env = api.join(".env");
        std::fs::write(&env, "TOKEN=secret").unwrap();
        if let Some(uid) = uid {
            for path in ["services", "services/api", "services/api/.env"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        let entry = |path: &Path, access: &str| serde_json::json!({"path": {"type": "path", "path": path}, "access": access});
        let policy = serde_json::json!({"permissions": {"type": "managed", "file_system": {
        "type": "restricted", "entries": [
            entry(Path::new("/"), "read"),
            entry(&fx.ws, "write"),
            entry(&api, "read"),
            entry(&env, "deny"),
        ]}}})
        .to_string();
        let args = ["--policy", policy.as_str()];
        assert_blocked(&probe(&args, &["read", s(&env)], uid, &fx.ws), &[], "read");
        let (from, to) = (fx.ws.join("services"), fx.ws.join("moved"));
        let result = probe(&args, &["rename", s(&from), s(&to)], uid, &fx.ws);
        assert_blocked(&result, &["EBUSY", "EXDEV"], &format!("rename as {uid:?}"));
        assert!(from.exists() && !to.exists(), "services moved as {uid:?}");
        let free = probe(
            &["--policy", "danger-full-access"],
            &["rename", s(&from), s(&to)],
            uid,
            &fx.ws,
        );
        assert_allowed(&free, &format!("unsandboxed rename as {uid:?}"));
        std::fs::rename(&to, &from).unwrap();
    }
}

#[test]
fn a_host_git_status_runs_nothing_a_command_planted_behind_a_renamed_repository() {
    // The whole attack of issue 31, end to end as root (the rename itself is refused for both
    // identities above): the command moves vendor/lib away and makes vendor/lib a repository of
    // its own whose core.fsmonitor is its program; the user's next `git status` there would run
    // it unsandboxed.
    let fx = Fixture::new(None);
    let lib = fx.ws.join("vendor/lib");
    let git = |dir: &Path, args: &[&str]| {
        std::process::Command::new("git")
            .args(["-c", "safe.directory=*", "-C"])
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", fx.outside.as_os_str())
            .output()
            .unwrap()
    };
    std::fs::create_dir_all(&lib).unwrap();
    assert!(
        git(&lib, &["init", "-q"]).status.success(),
        "git init vendor/lib"
    );
    let marker = fx.outside.join("fsmonitor-ran");
    let attack = format!(
        "mv vendor/lib vendor/lib.moved && mkdir vendor/lib && git init -q vendor/lib && \
         git -C vendor/lib config core.fsmonitor 'touch {}; false'",
        marker.display()
    );
    let run = |policy: &str| {
        std::process::Command::new(sandbox_run_exe())
            .args(["--policy", policy, "--cwd"])
            .arg(&fx.ws)
            .args(["--", "/bin/sh", "-c", &attack])
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", fx.outside.as_os_str())
            .output()
            .unwrap()
    };
    let sandboxed = run("workspace-write");
    assert!(
        !sandboxed.status.success(),
        "the attack went through: {sandboxed:?}"
    );
    assert!(lib.join(".git").is_dir() && !fx.ws.join("vendor/lib.moved").exists());
    let _ = git(&lib, &["status", "--short"]);
    assert!(
        !marker.exists(),
        "host git status ran the command's fsmonitor"
    );
    // Control: without the sandbox the same script plants the hook and git status runs it.
    let free = run("danger-full-access");
    assert!(free.status.success(), "{free:?}");
    let _ = git(&lib, &["status", "--short"]);
    assert!(
        marker.exists(),
        "the control plant did not run: the test proves nothing"
    );
}
