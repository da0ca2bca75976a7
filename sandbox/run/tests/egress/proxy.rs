//! The proxy process itself: the handshake deadline, the connection bound, its lifetime tied to
//! the sandbox's, and its own confinement.

use super::*;

#[test]
fn a_request_head_trickled_past_the_handshake_deadline_is_not_served() {
    let timeout = egress::HANDSHAKE_TIMEOUT.as_secs();
    // The control (a head trickled well inside the deadline) and the late head at once, each
    // identity with an origin of its own, all at once: the test takes the deadline once.
    let code = |port: u16| {
        format!(
            "import socket, os, time, threading\n\
             port = int(os.environ['HTTP_PROXY'].rstrip('/').rsplit(':', 1)[1])\n\
             def trickle(seconds):\n\
             \x20   s = socket.create_connection(('127.0.0.1', port), timeout=60)\n\
             \x20   s.sendall(b'GET http://registry.test:{port}/hello HTTP/1.1\\r\\nHost: registry.test:{port}\\r\\n')\n\
             \x20   try:\n\
             \x20       for i in range(seconds):\n\
             \x20           time.sleep(1)\n\
             \x20           s.sendall(b'X-Trickle: 1\\r\\n')\n\
             \x20       s.sendall(b'\\r\\n')\n\
             \x20       print(seconds, s.recv(1024).split(b'\\r\\n')[0].decode() or 'closed', flush=True)\n\
             \x20   except OSError as e:\n\
             \x20       print(seconds, 'closed', e.errno, flush=True)\n\
             both = [threading.Thread(target=trickle, args=(n,)) for n in (3, {late})]\n\
             [t.start() for t in both]\n\
             [t.join() for t in both]\n",
            late = timeout + 3,
        )
    };
    std::thread::scope(|scope| {
        for uid in identities() {
            scope.spawn(move || {
                let origin = Origin::start(None);
                let ws = Workspace::new(uid);
                let output = python(&ws, &allow(&["registry.test"], &origin), &code(origin.port));
                let out = text(&output.stdout);
                assert!(
                    out.contains("3 HTTP/1.1 200"),
                    "{uid:?}: the control was not served: {}",
                    describe(&output)
                );
                assert!(
                    out.contains(&format!("{} closed", timeout + 3)),
                    "{uid:?}: the late head was served: {}",
                    describe(&output)
                );
                assert_eq!(origin.connections(), 1, "{uid:?}");
            });
        }
    });
}

#[test]
fn connections_beyond_the_bound_are_closed_and_the_rest_stay_up() {
    let origin = Origin::start(None);
    let bound = egress::MAX_CONCURRENT_CONNECTIONS;
    let extra = 12;
    for uid in identities() {
        let ws = Workspace::new(uid);
        let before = origin.connections();
        let code = format!(
            "import socket, os\n\
             port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])\n\
             held, ok, closed = [], 0, 0\n\
             for i in range({total}):\n\
             \x20   s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
             \x20   s.sendall(b'CONNECT registry.test:{p} HTTP/1.1\\r\\n\\r\\n')\n\
             \x20   try:\n\
             \x20       answer = s.recv(1024)\n\
             \x20   except ConnectionResetError:\n\
             \x20       answer = b''\n\
             \x20   if answer.startswith(b'HTTP/1.1 200'):\n\
             \x20       ok += 1\n\
             \x20   elif answer == b'':\n\
             \x20       closed += 1\n\
             \x20   held.append(s)\n\
             print('ok', ok, 'closed', closed)\n",
            total = bound + extra,
            p = origin.port
        );
        let output = python(&ws, &allow(&["registry.test"], &origin), &code);
        assert_eq!(
            text(&output.stdout).trim(),
            format!("ok {bound} closed {extra}"),
            "{uid:?}: {}",
            describe(&output)
        );
        // The origin counts a connection when its accept loop gets to it, which may be after
        // the command has exited: wait for the count, then check no more arrive.
        let deadline = Instant::now() + Duration::from_secs(10);
        while origin.connections() - before < bound && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20)); // polling interval
        }
        std::thread::sleep(Duration::from_millis(200)); // any connection beyond the bound
        assert_eq!(origin.connections() - before, bound, "{uid:?}");
    }
}

#[test]
fn killing_the_proxy_mid_transfer_gives_the_command_an_error_not_a_hang() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let url = format!("http://registry.test:{}/stream", origin.port);
        let child = ws
            .command(
                &strs(&allow(&["registry.test"], &origin)),
                &["curl", "-sS", "-m", "60", "-o", "/dev/null", &url],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        origin
            .streams
            .lock()
            .unwrap()
            .recv_timeout(DEADLINE)
            .expect("the transfer started");
        let proxy = proxy_of(child.id()).expect("egress-proxy is a child of sandbox-run");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(proxy),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let output = wait_output(child, DEADLINE);
        assert!(
            !output.status.success() && text(&output.stderr).contains("curl: ("),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

#[test]
fn the_proxy_ends_with_the_sandbox() {
    let origin = Origin::start(None);
    let ws = Workspace::new(None);
    let mut child = ws
        .command(
            &strs(&allow(&["registry.test"], &origin)),
            &["sh", "-c", "read line"],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let parent = child.id();
    let deadline = std::time::Instant::now() + DEADLINE;
    let proxy = loop {
        if let Some(pid) = proxy_of(parent) {
            break pid;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no egress-proxy appeared"
        );
        std::thread::yield_now();
    };
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let output = wait_output(child, DEADLINE);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        !Path::new(&format!("/proc/{proxy}")).exists(),
        "egress-proxy {proxy} outlived its sandbox"
    );
}

/// The `Name:` line of `/proc/<pid>/status`, value trimmed.
fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in status:\n{status}"))
        .trim()
        .to_owned()
}

#[test]
fn the_proxy_runs_with_an_empty_environment_no_capabilities_seccomp_and_only_its_descriptors() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let url = format!("http://registry.test:{}/hello", origin.port);
        // One request through the proxy first: it serves only after it confined itself.
        let script = format!("curl -sS -f -m 10 -o /dev/null {url} && echo ready && read line");
        let mut child = ws
            .command(
                &strs(&allow(&["registry.test"], &origin)),
                &["sh", "-c", &script],
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(DEADLINE).expect("the request went through");
        assert_eq!(line.trim(), "ready", "{uid:?}");
        let proxy = proxy_of(child.id()).expect("egress-proxy is a child of sandbox-run");
        let status = std::fs::read_to_string(format!("/proc/{proxy}/status")).unwrap();
        let environ = std::fs::read(format!("/proc/{proxy}/environ")).unwrap();
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{proxy}/fd"))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .collect();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let output = wait_output(child, DEADLINE);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));

        assert!(
            environ.is_empty(),
            "{uid:?}: the proxy's environment: {:?}",
            text(&environ)
        );
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                status_field(&status, set),
                "0000000000000000",
                "{uid:?}: {set}\n{status}"
            );
        }
        assert_eq!(
            status_field(&status, "NoNewPrivs"),
            "1",
            "{uid:?}\n{status}"
        );
        // 2: SECCOMP_MODE_FILTER.
        assert_eq!(status_field(&status, "Seccomp"), "2", "{uid:?}\n{status}");
        // Sockets, pipes and /dev/null only: the configuration memfd is closed after reading
        // and no file is open.
        assert!(
            fds.iter().all(|target| target.starts_with("socket:")
                || target.starts_with("pipe:")
                || target.starts_with("anon_inode:")
                || target == "/dev/null"),
            "{uid:?}: the proxy's descriptors {fds:?}"
        );
    }
}
