//! What an allowlist lets through and what it keeps out: an allowed name by plain HTTP, CONNECT
//! and SOCKS5, a denied one refused by name, wildcards with deny winning, pip configured only
//! by the environment; a program that ignores the proxy (raw TCP, UDP, DNS) reaches nothing,
//! and an allowlist without the namespace layer is refused.

use super::*;

#[test]
fn allowed_host_is_reached_through_plain_http_connect_and_socks5() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let url = format!("http://registry.test:{}/hello", origin.port);
        let before = origin.connections();
        let script = format!(
            "curl -sS -f -m 10 {url} && curl -sS -f -m 10 -p {url} && \
             curl -sS -f -m 10 -x \"$ALL_PROXY\" {url}"
        );
        let output = ws.run(
            &strs(&allow(&["registry.test"], &origin)),
            &["sh", "-c", &script],
        );
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert_eq!(
            text(&output.stdout).matches("hello from origin").count(),
            3,
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections() - before, 3, "{uid:?}");
    }
}

#[test]
fn denied_host_gets_a_clear_refusal_and_never_reaches_the_origin() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let before = origin.connections();
        let url = format!("http://other.test:{}/hello", origin.port);
        let output = ws.run(
            &strs(&allow(&["registry.test"], &origin)),
            &["curl", "-sS", "-m", "10", &url],
        );
        let body = text(&output.stdout);
        assert!(
            body.contains(&format!("refused other.test:{}", origin.port))
                && body.contains(&format!("--allow-domain other.test:{}", origin.port)),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            text(&output.stderr).contains("egress proxy refused other.test"),
            "{uid:?}: the refusal is reported on stderr: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), before, "{uid:?}");
    }
}

#[test]
fn wildcards_allow_subdomains_and_deny_wins() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let mut args = allow(&[], &origin);
        args.extend([
            "--allow-domain".to_owned(),
            format!("*.example.test:{}", origin.port),
            "--deny-domain".to_owned(),
            "secret.example.test".to_owned(),
        ]);
        let script = format!(
            "curl -sS -f -m 10 http://a.example.test:{p}/hello; echo \"a=$?\"; \
             curl -sS -f -m 10 http://secret.example.test:{p}/hello; echo \"secret=$?\"",
            p = origin.port
        );
        let output = ws.run(&strs(&args), &["sh", "-c", &script]);
        let out = text(&output.stdout);
        assert!(
            out.contains("hello from origin\na=0"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            out.contains("secret=22") && text(&output.stderr).contains("denied by the pattern"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

#[test]
fn a_raw_connect_that_ignores_the_proxy_never_reaches_the_origin() {
    let origin = Origin::start(None);
    let host_ip = host_address();
    for uid in identities() {
        let ws = Workspace::new(uid);
        let code = format!(
            "import socket\n\
             for host in ['127.0.0.1', '{host_ip}']:\n\
             \x20   try:\n\
             \x20       socket.create_connection((host, {port}), timeout=5)\n\
             \x20       print(host, 'CONNECTED')\n\
             \x20   except OSError as e:\n\
             \x20       print(host, 'errno', e.errno)\n",
            port = origin.port
        );
        let output = python(&ws, &allow(&["registry.test"], &origin), &code);
        let out = text(&output.stdout);
        assert!(
            output.status.success()
                && !out.contains("CONNECTED")
                && out.matches("errno").count() == 2,
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), 0, "{uid:?}");
    }
}

#[test]
fn udp_and_dns_fail_closed() {
    let origin = Origin::start(None);
    let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let udp_port = receiver.local_addr().unwrap().port();
    for uid in identities() {
        let ws = Workspace::new(uid);
        let code = format!(
            "import socket\n\
             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
             s.sendto(b'to-host-loopback', ('127.0.0.1', {udp_port}))\n\
             try:\n\
             \x20   s.sendto(b'x', ('192.0.2.1', 53))\n\
             \x20   print('public SENT')\n\
             except OSError as e:\n\
             \x20   print('public errno', e.errno)\n\
             try:\n\
             \x20   socket.getaddrinfo('registry.test', 80)\n\
             \x20   print('dns RESOLVED')\n\
             except OSError as e:\n\
             \x20   print('dns failed')\n"
        );
        let output = python(&ws, &allow(&["registry.test"], &origin), &code);
        let out = text(&output.stdout);
        assert!(
            out.contains(&format!("public errno {}", libc::ENETUNREACH))
                && out.contains("dns failed"),
            "{uid:?}: {}",
            describe(&output)
        );
        let mut buf = [0u8; 64];
        assert!(
            receiver.recv_from(&mut buf).is_err(),
            "{uid:?}: a datagram from the sandbox reached the host's loopback"
        );
    }
}

/// A minimal wheel (a zip with the dist-info files), built with Python's zipfile.
fn build_wheel(dir: &Path) -> (String, Vec<u8>) {
    let name = "demo-1.0-py3-none-any.whl".to_owned();
    let path = dir.join(&name);
    let code = format!(
        "import zipfile\n\
         with zipfile.ZipFile('{}', 'w') as z:\n\
         \x20   z.writestr('demo/__init__.py', 'VALUE = 1\\n')\n\
         \x20   z.writestr('demo-1.0.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: demo\\nVersion: 1.0\\n')\n\
         \x20   z.writestr('demo-1.0.dist-info/WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
         \x20   z.writestr('demo-1.0.dist-info/RECORD', '')\n",
        path.display()
    );
    let status = Command::new(PYTHON).args(["-c", &code]).status().unwrap();
    assert!(status.success());
    (name.clone(), std::fs::read(&path).unwrap())
}

#[test]
fn pip_configured_only_by_the_environment_downloads_from_a_local_index() {
    let wheel_dir = tempfile::tempdir().unwrap();
    let wheel = build_wheel(wheel_dir.path());
    let name = wheel.0.clone();
    let origin = Origin::start(Some(wheel));
    for uid in identities() {
        let ws = Workspace::new(uid);
        let index = format!("http://pypi.test:{}/simple/", origin.port);
        let output = ws.run(
            &strs(&allow(&["pypi.test"], &origin)),
            &[
                PYTHON,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-cache-dir",
                "--disable-pip-version-check",
                "--index-url",
                &index,
                "--trusted-host",
                "pypi.test",
                "-d",
                "dl",
                "demo==1.0",
            ],
        );
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(
            ws.path.join("dl").join(&name).is_file(),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

#[test]
fn an_allowlist_without_the_namespace_layer_is_refused() {
    let ws = Workspace::new(None);
    let output = ws.run(
        &["--no-namespaces", "--allow-domain", "pypi.org"],
        &["true"],
    );
    assert_eq!(output.status.code(), Some(125), "{}", describe(&output));
    assert!(
        text(&output.stderr).contains("needs the namespace layer"),
        "{}",
        describe(&output)
    );
}

/// A non-loopback address of this host (for the raw-connect case), or 127.0.0.1 when it has
/// none.
fn host_address() -> String {
    egress::server::local_addresses()
        .into_iter()
        .find(|ip| ip.is_ipv4())
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
}
