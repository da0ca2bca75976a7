//! `--upstream-proxy`: the allowed connections, and only those, leave through the upstream proxy
//! with the credentials; bad URLs and a missing allowlist are refused.

use super::*;

/// A recording upstream HTTP proxy on the host's 127.0.0.1: records the head of every request
/// it receives, answers `CONNECT NAME:PORT` with 200 and relays the tunnel to
/// `127.0.0.1:PORT` (every name is this host here), answers anything else 405.
struct UpstreamProxy {
    port: u16,
    /// Every request head received, in order.
    heads: Arc<Mutex<Vec<String>>>,
}

impl UpstreamProxy {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&heads);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let recorded = Arc::clone(&recorded);
                std::thread::spawn(move || Self::serve(stream, &recorded));
            }
        });
        Self { port, heads }
    }

    fn serve(mut client: TcpStream, heads: &Mutex<Vec<String>>) {
        client
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match client.read(&mut byte) {
                Ok(0) | Err(_) => return,
                Ok(_) => head.push(byte[0]),
            }
        }
        let head = text(&head);
        heads.lock().unwrap().push(head.clone());
        let mut words = head.split_whitespace();
        let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
            let _ =
                client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        let port = target.rsplit_once(':').unwrap().1;
        let Ok(server) = TcpStream::connect(format!("127.0.0.1:{port}")) else {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .unwrap();
        client.set_read_timeout(None).unwrap();
        let (mut client_in, mut server_out) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        let up = std::thread::spawn(move || {
            let _ = std::io::copy(&mut client_in, &mut server_out);
            let _ = server_out.shutdown(std::net::Shutdown::Write);
        });
        let (mut server_in, mut client_out) = (server, client);
        let _ = std::io::copy(&mut server_in, &mut client_out);
        let _ = client_out.shutdown(std::net::Shutdown::Write);
        let _ = up.join();
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// `--upstream-proxy` with `--upstream-proxy-credentials`: the allowed destination is reached
/// by plain HTTP and through a CONNECT tunnel, both leaving through the upstream as `CONNECT
/// registry.test:PORT` with the credentials as `Proxy-Authorization: Basic`; the refused
/// destination (another name, the origin's address literal) is refused by the egress proxy and
/// the upstream never hears of it. The control: the same upstream asked directly from the host
/// for the refused name records it (so its absence above is the sandbox's doing), and without
/// `--upstream-proxy` the upstream sees nothing.
#[test]
fn an_upstream_proxy_sees_exactly_the_allowed_connections_with_credentials() {
    let origin = Origin::start(None);
    let upstream = UpstreamProxy::start();
    let upstream_url = format!("http://127.0.0.1:{}", upstream.port);
    let allowed = format!("http://registry.test:{}/hello", origin.port);
    let refused = format!("http://other.test:{}/hello", origin.port);
    let literal = format!("http://127.0.0.1:{}/hello", origin.port);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let credentials = ws.path.join("proxy-credentials");
        std::fs::write(&credentials, "alice:s3cret\n").unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&credentials, Some(uid), Some(uid)).unwrap();
        }
        std::fs::set_permissions(&credentials, std::fs::Permissions::from_mode(0o600)).unwrap();
        let seen = upstream.heads().len();
        let before = origin.connections();
        let script = format!(
            "curl -sS -f -m 10 {allowed} && curl -sS -f -m 10 -p {allowed} && \
             curl -sS -m 10 {refused}; curl -sS -m 10 -p {refused}; curl -sS -m 10 {literal}"
        );
        let registry = format!("registry.test:{}", origin.port);
        let output = ws.run(
            &[
                "--allow-domain",
                &registry,
                "--upstream-proxy",
                &upstream_url,
                "--upstream-proxy-credentials",
                credentials.to_str().unwrap(),
            ],
            &["sh", "-c", &script],
        );
        let stdout = text(&output.stdout);
        assert_eq!(
            stdout.matches("hello from origin").count(),
            2,
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(
            stdout
                .matches(&format!("refused other.test:{}", origin.port))
                .count(),
            1,
            "{uid:?}: the plain request is refused with a 403 naming it: {}",
            describe(&output)
        );
        assert_eq!(
            text(&output.stderr).matches("egress proxy refused").count(),
            3,
            "{uid:?}: both forms for other.test and the literal are refused: {}",
            describe(&output)
        );
        let heads: Vec<String> = upstream.heads()[seen..].to_vec();
        assert_eq!(heads.len(), 2, "{uid:?}: {heads:?}");
        for head in &heads {
            assert!(
                head.starts_with(&format!("CONNECT {registry} HTTP/1.1\r\n")),
                "{uid:?}: {head:?}"
            );
            assert!(
                head.contains("\r\nProxy-Authorization: Basic YWxpY2U6czNjcmV0\r\n"),
                "{uid:?}: {head:?}"
            );
        }
        assert_eq!(origin.connections() - before, 2, "{uid:?}");
    }
    // Control: the upstream records what it is asked, a refused name included.
    let seen = upstream.heads().len();
    let direct = Command::new("curl")
        .args(["-sS", "-m", "10", "-p", "-x", &upstream_url, &refused])
        .output()
        .unwrap();
    assert!(direct.status.success(), "{}", describe(&direct));
    assert!(
        upstream.heads()[seen..]
            .iter()
            .any(|head| head.starts_with(&format!("CONNECT other.test:{}", origin.port))),
        "{:?}",
        upstream.heads()
    );
    // Control: without --upstream-proxy the destination is reached directly.
    let ws = Workspace::new(None);
    let seen = upstream.heads().len();
    let output = ws.run(
        &strs(&allow(&["registry.test"], &origin)),
        &["curl", "-sS", "-f", "-m", "10", &allowed],
    );
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(upstream.heads().len(), seen);
}

/// An upstream URL with credentials in it, another scheme or a path is refused before
/// anything runs, and `--upstream-proxy` needs an allowlist.
#[test]
fn upstream_proxy_urls_are_checked_and_need_an_allowlist() {
    let ws = Workspace::new(None);
    for (url, needle) in [
        (
            "http://alice:pw@proxy.test:3128",
            "--upstream-proxy-credentials",
        ),
        ("https://proxy.test:3128", "only http://"),
        ("http://proxy.test:3128/path", "no path"),
        ("http://proxy.test:0", "port"),
    ] {
        let output = ws.run(
            &["--allow-domain", "registry.test", "--upstream-proxy", url],
            &["true"],
        );
        assert!(!output.status.success(), "{url}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains(needle),
            "{url}: {}",
            describe(&output)
        );
    }
    let output = ws.run(&["--upstream-proxy", "http://proxy.test:3128"], &["true"]);
    assert!(!output.status.success(), "{}", describe(&output));
    assert!(
        text(&output.stderr).contains("needs a network allowlist"),
        "{}",
        describe(&output)
    );
    // The control: a well-formed URL with an allowlist runs.
    let output = ws.run(
        &[
            "--allow-domain",
            "registry.test",
            "--upstream-proxy",
            "http://proxy.test:3128",
        ],
        &["true"],
    );
    assert!(output.status.success(), "{}", describe(&output));
}
