//! The host's processes and IPC: daemons, System V shared memory, terminals, daemon sockets,
//! and the process tree on a terminal, all out of reach or gone with the sandbox.

use super::*;

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
