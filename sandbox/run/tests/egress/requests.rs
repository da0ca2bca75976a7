//! What the proxy reads of HTTP: `methods=`/`paths=` rules, plain HTTP to the TLS-only port,
//! refusals made while parsing reported by name, and every request on a connection or in a
//! tunnel having its `Host` checked (a front server records what reaches it).

use super::*;

/// `methods=read-only paths=/hello` on a destination: GET of `/hello` reaches it by plain
/// HTTP and through a CONNECT tunnel; a POST, another path, a dot-segment path that reads as
/// `/hello` and TLS through the tunnel (which would hide the requests) are refused with the
/// rule named, and none of them reaches the origin (its request log shows only the GETs). The
/// control: the same requests under a pattern without limits all reach it.
#[test]
fn request_rules_limit_methods_and_paths_and_refuse_tls_that_would_hide_them() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let url = format!("http://registry.test:{}", origin.port);
        let requests = format!(
            "for args in '{url}/hello' '-X POST -d x {url}/hello' '{url}/other' \
                 '--path-as-is {url}/hello/../other' '-p {url}/hello' '-p -X POST -d x {url}/hello'; do \
               code=$(curl -sS -m 10 -o /dev/null -w '%{{http_code}}' $args 2>/dev/null); \
               echo \"$code $args\"; \
             done"
        );
        // TLS to the plain origin only where the proxy must cut it (else it would wait there).
        let tls = format!(
            "; curl -sS -m 10 -k -p -o /dev/null https://registry.test:{}/hello 2>/dev/null; \
             echo \"tls $?\"",
            origin.port
        );
        for (limited, pattern) in [
            (
                true,
                format!(
                    "registry.test:{} methods=read-only paths=/hello",
                    origin.port
                ),
            ),
            (false, format!("registry.test:{}", origin.port)),
        ] {
            origin.requests.lock().unwrap().clear();
            let args = [
                "--allow-domain".to_owned(),
                pattern.clone(),
                "--allow-domain".to_owned(),
                format!("127.0.0.1:{}", origin.port),
            ];
            let script = if limited {
                format!("{requests}{tls}")
            } else {
                requests.clone()
            };
            let output = ws.run(&strs(&args), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            let codes: Vec<&str> = out
                .lines()
                .map(|line| line.split_whitespace().next().unwrap_or_default())
                .collect();
            let seen = origin.requests.lock().unwrap().clone();
            let context = format!(
                "{uid:?} {pattern}: {}\norigin saw {seen:?}",
                describe(&output)
            );
            if limited {
                // GET /hello twice (plain, tunnelled); the plain refusals answer 403; the
                // tunnelled POST is cut (curl reports no status); TLS is cut.
                assert_eq!(codes[..4], ["200", "403", "403", "403"], "{context}");
                assert_eq!(codes[4], "200", "{context}");
                assert_ne!(codes[5], "200", "{context}");
                assert!(out.contains("tls ") && !out.contains("tls 0"), "{context}");
                assert_eq!(
                    seen,
                    ["GET /hello HTTP/1.1", "GET /hello HTTP/1.1"],
                    "{context}"
                );
                let stderr = text(&output.stderr);
                assert!(
                    stderr.contains(
                        "is outside what its pattern allows (methods=GET,HEAD,OPTIONS paths=/hello)"
                    ),
                    "{context}"
                );
                assert!(stderr.contains("TLS would hide them"), "{context}");
            } else {
                assert_eq!(
                    codes[..6],
                    ["200", "200", "404", "404", "200", "200"],
                    "{context}"
                );
                assert_eq!(seen.len(), 6, "{context}");
            }
        }
    }
}

#[test]
fn plain_http_to_the_tls_only_port_is_refused_before_it_is_sent() {
    in_private_network(&[], || {
        // An origin on 443 and one on another port, both counting what reaches them.
        let tls_port = Origin::start_on("127.0.0.1:443", None);
        let other = Origin::start(None);
        for uid in identities() {
            let ws = Workspace::new(uid);
            let log = ws.path.join("egress.jsonl");
            let mut args = allow(&["registry.test"], &other);
            args.extend([
                "--allow-domain".to_owned(),
                "registry.test:443".to_owned(),
                "--allow-domain".to_owned(),
                "127.0.0.1:443".to_owned(),
                "--egress-log".to_owned(),
                log.display().to_string(),
            ]);
            let script = format!(
                "curl -sS -m 10 -o /dev/null -w '%{{http_code}}\\n' http://registry.test:443/hello; \
                 curl -sS -f -m 10 http://registry.test:{}/hello",
                other.port
            );
            let output = ws.run(&strs(&args), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            assert!(out.starts_with("403\n"), "{uid:?}: {}", describe(&output));
            // The control: plain HTTP to another allowed port is served.
            assert!(
                out.contains("hello from origin"),
                "{uid:?}: {}",
                describe(&output)
            );
            assert!(
                text(&output.stderr).contains("port 443 carries TLS only"),
                "{uid:?}: {}",
                describe(&output)
            );
            let events = std::fs::read_to_string(&log).unwrap();
            assert!(
                events.contains("\"allowed\":false") && events.contains("\"port\":443"),
                "{uid:?}: {events}"
            );
            assert_eq!(tls_port.connections(), 0, "{uid:?}");
            assert_eq!(tls_port.bytes_in.load(Ordering::SeqCst), 0, "{uid:?}");
        }
    });
}

#[test]
fn refusals_made_while_parsing_are_reported_by_name() {
    let origin = Origin::start(None);
    let p = origin.port;
    let code = format!(
        "import socket, os\n\
         port = int(os.environ['HTTP_PROXY'].rstrip('/').rsplit(':', 1)[1])\n\
         def probe(label, *messages):\n\
         \x20   s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
         \x20   answer = b''\n\
         \x20   for m in messages:\n\
         \x20       s.sendall(m)\n\
         \x20       answer = s.recv(1024)\n\
         \x20   print(label, answer[:12])\n\
         probe('fronted', b'GET http://registry.test:{p}/hello HTTP/1.1\\r\\nHost: fronted.test\\r\\n\\r\\n')\n\
         probe('https', b'GET https://httpsform.test/ HTTP/1.1\\r\\nHost: httpsform.test\\r\\n\\r\\n')\n\
         probe('socks4a', b'\\x04\\x01' + ({p}).to_bytes(2, 'big') + b'\\x00\\x00\\x00\\x01u\\x00socksfour.test\\x00')\n\
         probe('udp', b'\\x05\\x01\\x00', b'\\x05\\x03\\x00\\x03\\x0dudpassoc.test\\x00\\x35')\n\
         probe('bind', b'\\x05\\x01\\x00', b'\\x05\\x02\\x00\\x03\\x0abindx.test\\x00\\x50')\n\
         probe('allowed', b'GET http://registry.test:{p}/hello HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n\\r\\n')\n"
    );
    for uid in identities() {
        let ws = Workspace::new(uid);
        let log = ws.path.join("egress.jsonl");
        let mut args = allow(&["registry.test"], &origin);
        args.extend(["--egress-log".to_owned(), log.display().to_string()]);
        let before = origin.connections();
        let output = python(&ws, &args, &code);
        let out = text(&output.stdout);
        assert!(
            out.contains("allowed b'HTTP/1.1 200'") && out.contains("fronted b'HTTP/1.1 403'"),
            "{uid:?}: {}",
            describe(&output)
        );
        let events: Vec<serde_json::Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let stderr = text(&output.stderr);
        for (host, port, why) in [
            ("registry.test".to_owned(), p, "fronted.test"),
            ("httpsform.test".to_owned(), 443, "CONNECT"),
            ("socksfour.test".to_owned(), p, "SOCKS4"),
            ("udpassoc.test".to_owned(), 53, "UDP ASSOCIATE"),
            ("bindx.test".to_owned(), 80, "BIND"),
        ] {
            assert!(
                events.iter().any(|e| e["allowed"] == false
                    && e["host"] == host.as_str()
                    && e["port"] == port
                    && e["reason"].as_str().unwrap_or_default().contains(why)),
                "{uid:?}: no refusal of {host}:{port}: {events:?}"
            );
            assert!(
                stderr.contains(&format!("egress proxy refused {host}:{port}")),
                "{uid:?}: {host}: {}",
                describe(&output)
            );
        }
        // The control: the allowed request is served and logged as allowed; nothing else
        // reached the origin.
        assert!(
            events
                .iter()
                .any(|e| e["allowed"] == true && e["host"] == "registry.test"),
            "{uid:?}: {events:?}"
        );
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
    }
}

/// A shared front on `bind`: HTTP/1.1 kept alive whatever the request says (as a front that
/// serves many hosts may), Content-Length and chunked bodies, every request's `Host` and body
/// recorded; each answered `200 OK` with the body `ok\n`.
struct Front {
    requests: Arc<Mutex<Vec<Recorded>>>,
}

/// One request a [`Front`] served: its `Host` and its body.
type Recorded = (String, Vec<u8>);

impl Front {
    fn start(bind: &str) -> Self {
        let listener = TcpListener::bind(bind).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let recorded = Arc::clone(&recorded);
                std::thread::spawn(move || serve_front(stream, &recorded));
            }
        });
        Self { requests }
    }

    fn hosts(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests.iter().map(|(host, _)| host.clone()).collect()
    }
}

fn serve_front(stream: TcpStream, requests: &Mutex<Vec<Recorded>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let line = |reader: &mut BufReader<TcpStream>| {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(text(&line)),
        }
    };
    while let Some(_request_line) = line(&mut reader) {
        let (mut host, mut length, mut chunked) = (String::new(), 0usize, false);
        loop {
            let Some(header) = line(&mut reader) else {
                return;
            };
            if header == "\r\n" {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((&header, ""));
            let value = value.trim().to_owned();
            match name.to_ascii_lowercase().as_str() {
                "host" => host = value,
                "content-length" => length = value.parse().unwrap(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let Some(size) = line(&mut reader) else {
                    return;
                };
                let size =
                    usize::from_str_radix(size.trim().split(';').next().unwrap(), 16).unwrap();
                if size == 0 {
                    while line(&mut reader).is_some_and(|l| l != "\r\n") {}
                    break;
                }
                let mut data = vec![0u8; size + 2];
                if reader.read_exact(&mut data).is_err() {
                    return;
                }
                body.extend_from_slice(&data[..size]);
            }
        } else {
            body.resize(length, 0);
            if reader.read_exact(&mut body).is_err() {
                return;
            }
        }
        requests.lock().unwrap().push((host, body));
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            .is_err()
        {
            return;
        }
    }
}

#[test]
fn every_request_on_a_connection_or_in_a_tunnel_to_port_80_has_its_host_checked() {
    in_private_network(&[], || {
        let front = Front::start("127.0.0.1:80");
        for uid in identities() {
            let ws = Workspace::new(uid);
            let log = ws.path.join("egress.jsonl");
            let args = [
                "--allow-domain".to_owned(),
                "registry.test".to_owned(),
                "--allow-domain".to_owned(),
                "127.0.0.1:80".to_owned(),
                "--egress-log".to_owned(),
                log.display().to_string(),
            ];
            // Each case sends a first request for registry.test, then one for `second`.
            let code = format!(
                "{CLIENT_PY}\
                 second = sys.argv[1].encode()\n\
                 first = b'GET http://registry.test/1 HTTP/1.1\\r\\nHost: registry.test\\r\\n\\r\\n'\n\
                 exchange('pipelined', first + b'GET http://' + second + b'/2 HTTP/1.1\\r\\nHost: ' + second + b'\\r\\n\\r\\n')\n\
                 exchange('kept-alive', first, None, b'GET http://' + second + b'/2 HTTP/1.1\\r\\nHost: ' + second + b'\\r\\n\\r\\n')\n\
                 connect = b'CONNECT registry.test:80 HTTP/1.1\\r\\nHost: registry.test:80\\r\\n\\r\\n'\n\
                 inner = b'GET /1 HTTP/1.1\\r\\nHost: registry.test\\r\\n\\r\\n'\n\
                 exchange('connect-kept-alive', connect, None, inner, None, b'GET /2 HTTP/1.1\\r\\nHost: ' + second + b'\\r\\n\\r\\n')\n\
                 exchange('connect-pipelined', connect, None, inner + b'GET /2 HTTP/1.1\\r\\nHost: ' + second + b'\\r\\n\\r\\n')\n"
            );
            let cases = [
                "pipelined",
                "kept-alive",
                "connect-kept-alive",
                "connect-pipelined",
            ];
            // The control: a second request for the same host is served on every path.
            let before = front.hosts().len();
            let output = ws.run(&strs(&args), &[PYTHON, "-c", &code, "registry.test"]);
            let out = text(&output.stdout);
            for case in cases {
                // The CONNECT answer is one more 200.
                let expected = if case.starts_with("connect") { 3 } else { 2 };
                assert!(
                    out.contains(&format!("{case} {expected}\n")),
                    "{uid:?}: {case}: {}",
                    describe(&output)
                );
            }
            let hosts = front.hosts();
            assert_eq!(hosts.len() - before, 8, "{uid:?}: {hosts:?}");
            assert!(refusals(&log).is_empty(), "{uid:?}: {:?}", refusals(&log));

            // The attack: the second request names evil.test; it never reaches the front.
            std::fs::remove_file(&log).unwrap();
            let before = front.hosts().len();
            let output = ws.run(&strs(&args), &[PYTHON, "-c", &code, "evil.test"]);
            let out = text(&output.stdout);
            for case in cases {
                let expected = if case.starts_with("connect") { 2 } else { 1 };
                assert!(
                    out.contains(&format!("{case} {expected}\n")),
                    "{uid:?}: {case}: {}",
                    describe(&output)
                );
            }
            let hosts = front.hosts();
            assert_eq!(hosts.len() - before, 4, "{uid:?}: {hosts:?}");
            assert!(
                !hosts.iter().any(|h| h.contains("evil")),
                "{uid:?}: {hosts:?}"
            );
            let refused = refusals(&log);
            assert_eq!(refused.len(), 4, "{uid:?}: {refused:?}");
            for event in &refused {
                assert_eq!(event["host"], "registry.test", "{uid:?}: {event}");
                assert_eq!(event["port"], 80, "{uid:?}: {event}");
                assert!(
                    event["reason"].as_str().unwrap().contains("evil.test"),
                    "{uid:?}: {event}"
                );
            }
            assert!(
                text(&output.stderr).contains("egress proxy refused registry.test:80"),
                "{uid:?}: {}",
                describe(&output)
            );
        }
    });
}

#[test]
fn a_chunked_body_holding_a_request_head_is_a_body_not_a_request() {
    in_private_network(&[], || {
        let front = Front::start("127.0.0.1:80");
        let fake = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        for uid in identities() {
            let ws = Workspace::new(uid);
            let log = ws.path.join("egress.jsonl");
            let args = [
                "--allow-domain".to_owned(),
                "registry.test".to_owned(),
                "--allow-domain".to_owned(),
                "127.0.0.1:80".to_owned(),
                "--egress-log".to_owned(),
                log.display().to_string(),
            ];
            // A chunked POST whose one chunk is a request head for evil.test (split across
            // chunks of two sends), then a real request: both are served.
            let code = format!(
                "{CLIENT_PY}\
                 fake = sys.argv[1].encode()\n\
                 connect = b'CONNECT registry.test:80 HTTP/1.1\\r\\nHost: registry.test:80\\r\\n\\r\\n'\n\
                 post = b'POST /upload HTTP/1.1\\r\\nHost: registry.test\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n'\n\
                 body = b'%x\\r\\n' % len(fake) + fake + b'\\r\\n0\\r\\n\\r\\n'\n\
                 after = b'GET /after HTTP/1.1\\r\\nHost: registry.test\\r\\n\\r\\n'\n\
                 exchange('chunked', connect, None, post + body[:20], body[20:] + after)\n\
                 exchange('length', connect, None, b'POST /u HTTP/1.1\\r\\nHost: registry.test\\r\\nContent-Length: %d\\r\\n\\r\\n' % len(fake) + fake + after)\n\
                 exchange('not-a-body', connect, None, after + fake)\n"
            );
            let before = front.requests.lock().unwrap().len();
            let output = ws.run(&strs(&args), &[PYTHON, "-c", &code, fake]);
            let out = text(&output.stdout);
            // The CONNECT answer, then one per request served.
            for (case, expected) in [("chunked", 2), ("length", 2), ("not-a-body", 1)] {
                assert!(
                    out.contains(&format!("{case} {}\n", expected + 1)),
                    "{uid:?}: {case}: {}",
                    describe(&output)
                );
            }
            let requests = front.requests.lock().unwrap()[before..].to_vec();
            let bodies: Vec<String> = requests.iter().map(|(_, body)| text(body)).collect();
            assert_eq!(requests.len(), 5, "{uid:?}: {requests:?}");
            assert_eq!(
                bodies.iter().filter(|b| b.as_str() == fake).count(),
                2,
                "{uid:?}: the bodies arrived whole: {bodies:?}"
            );
            assert!(
                requests.iter().all(|(host, _)| host == "registry.test"),
                "{uid:?}: {requests:?}"
            );
            // The control: the same head outside a body is a request, and refused.
            let refused = refusals(&log);
            assert_eq!(refused.len(), 1, "{uid:?}: {refused:?}");
            assert!(
                refused[0]["reason"]
                    .as_str()
                    .unwrap()
                    .contains("\"evil.test\""),
                "{uid:?}: {refused:?}"
            );
        }
    });
}
