//! Tunnels: HTTPS through CONNECT, a TLS server name other than the tunnel's host refused (and
//! escaped when reported), a STARTTLS ClientHello checked, and `tunnel = any` letting an opaque
//! protocol through.

use super::*;

#[test]
fn https_is_tunnelled_with_connect_to_a_local_tls_server() {
    let tls = TlsOrigin::start("secure.test");
    for uid in identities() {
        let ws = Workspace::new(uid);
        std::fs::write(ws.path.join("hosts"), "127.0.0.1 secure.test\n").unwrap();
        let ca = ws.path.join("ca.pem");
        std::fs::write(&ca, &tls.cert_pem).unwrap();
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).unwrap();
        let args = [
            "--allow-domain".to_owned(),
            format!("secure.test:{}", tls.port),
            "--allow-domain".to_owned(),
            format!("127.0.0.1:{}", tls.port),
        ];
        let url = format!("https://secure.test:{}/", tls.port);
        let output = ws.run(
            &strs(&args),
            &["curl", "-sS", "-f", "-m", "10", "--cacert", "ca.pem", &url],
        );
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert_eq!(text(&output.stdout), "hello over tls\n", "{uid:?}");
    }
}

/// A TLS ClientHello for `name`, sent through a CONNECT tunnel to the origin by Python.
fn sni_probe(origin: &Origin, name: &str) -> String {
    sni_probe_waiting(origin, name, 10)
}

/// [`sni_probe`], waiting at most `seconds` for each answer.
fn sni_probe_waiting(origin: &Origin, name: &str, seconds: u32) -> String {
    format!(
        "import socket, ssl, os\n\
         port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])\n\
         s = socket.create_connection(('127.0.0.1', port), timeout={seconds})\n\
         s.sendall(b'CONNECT registry.test:{p} HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n\\r\\n')\n\
         print(s.recv(1024).split(b'\\r\\n')[0].decode())\n\
         ctx = ssl.create_default_context()\n\
         try:\n\
         \x20   ctx.wrap_socket(s, server_hostname='{name}')\n\
         except (OSError, ssl.SSLError) as e:\n\
         \x20   print('tls failed', type(e).__name__)\n",
        p = origin.port
    )
}

#[test]
fn a_tls_server_name_other_than_the_tunnel_host_is_refused() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let log = ws.path.join("egress.jsonl");
        let mut args = allow(&["registry.test"], &origin);
        args.extend(["--egress-log".to_owned(), log.display().to_string()]);
        let before = origin.bytes_in.load(Ordering::SeqCst);
        let output = python(&ws, &args, &sni_probe(&origin, "evil.test"));
        assert!(
            text(&output.stdout).starts_with("HTTP/1.1 200")
                && text(&output.stdout).contains("tls failed"),
            "{uid:?}: {}",
            describe(&output)
        );
        let events = std::fs::read_to_string(&log).unwrap();
        assert!(
            events.contains("domain fronting") && events.contains("\"allowed\":false"),
            "{uid:?}: {events}"
        );
        assert_eq!(
            origin.bytes_in.load(Ordering::SeqCst),
            before,
            "{uid:?}: the mismatched ClientHello reached the origin"
        );
        // The control: the matching name passes the gate, so its bytes reach the origin (which
        // is no TLS server and never answers: the handshake times out, after 2 s rather than
        // the mismatch's 10, which the proxy answers at once).
        let output = python(
            &ws,
            &allow(&["registry.test"], &origin),
            &sni_probe_waiting(&origin, "registry.test", 2),
        );
        assert!(
            text(&output.stdout).contains("tls failed"),
            "{uid:?}: {}",
            describe(&output)
        );
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while origin.bytes_in.load(Ordering::SeqCst) == before {
            assert!(
                std::time::Instant::now() < until,
                "{uid:?}: the matching ClientHello did not reach the origin"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A CONNECT to registry.test, then a hand-made ClientHello whose server name is `name`
/// (any bytes, which `ssl` would refuse to send); prints what the proxy did.
fn raw_sni_probe(origin: &Origin, name: &str) -> String {
    format!(
        "import socket, os\n\
         port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])\n\
         s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
         s.sendall(b'CONNECT registry.test:{p} HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n\\r\\n')\n\
         print(s.recv(1024).split(b'\\r\\n')[0].decode())\n\
         name = bytes.fromhex('{hex}')\n\
         entry = b'\\x00' + len(name).to_bytes(2, 'big') + name\n\
         names = len(entry).to_bytes(2, 'big') + entry\n\
         ext = b'\\x00\\x00' + len(names).to_bytes(2, 'big') + names\n\
         body = b'\\x03\\x03' + bytes(32) + b'\\x00' + b'\\x00\\x02\\x13\\x01' + b'\\x01\\x00' + len(ext).to_bytes(2, 'big') + ext\n\
         hs = b'\\x01' + len(body).to_bytes(3, 'big') + body\n\
         s.sendall(b'\\x16\\x03\\x01' + len(hs).to_bytes(2, 'big') + hs)\n\
         print('answer', len(s.recv(1024)))\n",
        p = origin.port,
        hex = name.bytes().map(|b| format!("{b:02x}")).collect::<String>(),
    )
}

#[test]
fn control_characters_in_a_reported_name_are_escaped_on_stderr() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let args = allow(&["registry.test"], &origin);
        let before = origin.bytes_in.load(Ordering::SeqCst);
        let forged = "evil.test\nsandbox-run: forged\x1b[31m";
        let output = python(&ws, &args, &raw_sni_probe(&origin, forged));
        let stderr = text(&output.stderr);
        assert!(
            text(&output.stdout).contains("answer 0"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            stderr.contains("open the tunnel to evil.test\\nsandbox-run: forged\\u{1b}[31m"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            !stderr.contains('\x1b')
                && !stderr.lines().any(|l| l.starts_with("sandbox-run: forged")),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.bytes_in.load(Ordering::SeqCst), before, "{uid:?}");
        // The control: a plain name's refusal reads as it is.
        let output = python(&ws, &args, &raw_sni_probe(&origin, "evil.test"));
        assert!(
            text(&output.stderr).contains("open the tunnel to evil.test itself"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

/// A TLS origin (rustls, self-signed for `name`) answering every request with a fixed body.
struct TlsOrigin {
    port: u16,
    cert_pem: String,
}

impl TlsOrigin {
    fn start(name: &str) -> Self {
        let certified = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert_pem = certified.cert.pem();
        let key = rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let config = Arc::clone(&config);
                std::thread::spawn(move || {
                    stream
                        .set_read_timeout(Some(Duration::from_secs(20)))
                        .unwrap();
                    let connection = rustls::ServerConnection::new(config).unwrap();
                    let mut tls = rustls::StreamOwned::new(connection, stream);
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = b"hello over tls\n";
                    let _ = write!(
                        tls,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(body);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                });
            }
        });
        Self { port, cert_pem }
    }
}

/// A TCP server on 127.0.0.1 that records every byte of every connection until EOF, and
/// answers nothing.
struct Recorder {
    port: u16,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let all = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let all = Arc::clone(&all);
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut chunk) {
                        if n == 0 {
                            break;
                        }
                        all.lock().unwrap().extend_from_slice(&chunk[..n]);
                    }
                });
            }
        });
        Self { port, received }
    }

    fn received(&self) -> String {
        text(&self.received.lock().unwrap())
    }

    fn clear(&self) {
        self.received.lock().unwrap().clear();
    }
}

/// `--allow-domain` for registry.test and 127.0.0.1 on `port`, each with `setting`.
fn allow_with(port: u16, setting: &str, log: &Path) -> Vec<String> {
    vec![
        "--allow-domain".to_owned(),
        format!("registry.test:{port}{setting}"),
        "--allow-domain".to_owned(),
        format!("127.0.0.1:{port}"),
        "--egress-log".to_owned(),
        log.display().to_string(),
    ]
}

#[test]
fn a_starttls_client_hello_naming_another_host_is_refused() {
    let recorder = Recorder::start();
    let p = recorder.port;
    // A Postgres SSLRequest and SMTP's STARTTLS, then the ClientHello of the switch.
    let code = format!(
        "{CLIENT_PY}\
         connect = b'CONNECT registry.test:{p} HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n\\r\\n'\n\
         plain = b'\\x00\\x00\\x00\\x08\\x04\\xd2\\x16\\x2fEHLO x\\r\\nSTARTTLS\\r\\n'\n\
         exchange('starttls', connect, None, plain + hello(sys.argv[1]) + b'\\x17\\x03\\x03\\x00\\x05after')\n"
    );
    for uid in identities() {
        let ws = Workspace::new(uid);
        let log = ws.path.join("egress.jsonl");
        let args = allow_with(p, " tunnel=any", &log);
        // The control: the ClientHello naming the tunnel's host passes, and what follows it.
        recorder.clear();
        let output = ws.run(&strs(&args), &[PYTHON, "-c", &code, "registry.test"]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        let received = recorder.received();
        assert!(
            received.contains("STARTTLS")
                && received.contains("registry.test")
                && received.ends_with("after"),
            "{uid:?}: {received:?} {}",
            describe(&output)
        );
        assert!(refusals(&log).is_empty(), "{uid:?}: {:?}", refusals(&log));
        // The attack: the plaintext passes, the ClientHello naming evil.test does not.
        recorder.clear();
        let output = ws.run(&strs(&args), &[PYTHON, "-c", &code, "evil.test"]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        let received = recorder.received();
        assert!(
            received.contains("STARTTLS") && !received.contains("evil.test"),
            "{uid:?}: {received:?}"
        );
        let refused = refusals(&log);
        assert!(
            refused.len() == 1
                && refused[0]["host"] == "registry.test"
                && refused[0]["reason"]
                    .as_str()
                    .unwrap()
                    .contains("\"evil.test\""),
            "{uid:?}: {refused:?}"
        );
        assert!(
            text(&output.stderr).contains(&format!("egress proxy refused registry.test:{p}")),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

#[test]
fn tunnel_any_lets_an_opaque_protocol_through_that_the_default_refuses() {
    let recorder = Recorder::start();
    let p = recorder.port;
    let code = format!(
        "{CLIENT_PY}\
         connect = b'CONNECT registry.test:{p} HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n\\r\\n'\n\
         exchange(sys.argv[1], connect, None, sys.argv[2].encode())\n"
    );
    let http = format!("GET / HTTP/1.1\r\nHost: registry.test:{p}\r\n\r\n");
    for uid in identities() {
        let ws = Workspace::new(uid);
        let log = ws.path.join("egress.jsonl");
        for (setting, payload, passes, why) in [
            ("", "EHLO opaque.example\r\n", false, "neither TLS nor HTTP"),
            (" tunnel=any", "EHLO opaque.example\r\n", true, ""),
            // The default lets checked HTTP through; tls-only does not.
            ("", http.as_str(), true, ""),
            (" tunnel=tls-only", http.as_str(), false, "TLS only"),
        ] {
            let _ = std::fs::remove_file(&log);
            recorder.clear();
            let output = ws.run(
                &strs(&allow_with(p, setting, &log)),
                &[PYTHON, "-c", &code, "case", payload],
            );
            assert!(output.status.success(), "{uid:?}: {}", describe(&output));
            let received = recorder.received();
            let refused = refusals(&log);
            if passes {
                assert_eq!(
                    received,
                    payload,
                    "{uid:?} {setting:?}: {}",
                    describe(&output)
                );
                assert!(refused.is_empty(), "{uid:?} {setting:?}: {refused:?}");
            } else {
                assert_eq!(received, "", "{uid:?} {setting:?}");
                assert!(
                    refused.len() == 1
                        && refused[0]["port"] == p
                        && refused[0]["reason"].as_str().unwrap().contains(why),
                    "{uid:?} {setting:?}: {refused:?}"
                );
                assert!(
                    text(&output.stderr)
                        .contains(&format!("egress proxy refused registry.test:{p}")),
                    "{uid:?}: {}",
                    describe(&output)
                );
            }
        }
    }
}
