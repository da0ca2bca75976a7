//! `inspect=true`: the proxy terminates TLS to hold request rules over HTTPS, and its CA's key is
//! nowhere the command can read.

use super::*;

/// A TLS origin whose certificate comes from a test CA, recording each request line and
/// answering 200 to each (one request per connection).
struct RecordingTlsOrigin {
    port: u16,
    ca_pem: String,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

impl RecordingTlsOrigin {
    fn start(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        // A subject of its own: with rcgen's default name on both, OpenSSL clients (curl,
        // Python) take the leaf for a self-signed certificate.
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress test origin CA");
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        leaf.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        let leaf = leaf.signed_by(&key, &ca).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, recorded) = (Arc::clone(&config), Arc::clone(&recorded));
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
                    let line = text(&head).lines().next().unwrap_or_default().to_owned();
                    // Read the request's body too before answering and closing: a socket closed
                    // with unread bytes sends a reset, which can cut the answer short in transit
                    // (seen under load: a POST whose body came after its head lost its response).
                    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    let length = text(&head[..end])
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    let mut unread = length.saturating_sub(head.len() - end);
                    while unread > 0 {
                        match tls.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => unread = unread.saturating_sub(n),
                        }
                    }
                    recorded.lock().unwrap().push(line);
                    let body = b"inspected hello\n";
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
        Self {
            port,
            ca_pem: ca.pem(),
            seen,
        }
    }
}

#[test]
fn inspect_terminates_tls_so_read_only_refuses_a_post_over_https() {
    // The confined proxy terminates TLS (inspect=true) and checks each request: GET passes,
    // POST is refused before it reaches the origin, with its refusal on stderr. The proxy
    // verifies the origin against the bundle SSL_CERT_FILE names in sandbox-run's
    // environment (the test CA). Inside, curl and Python (`requests` when the interpreter has
    // it, else urllib) are given no flag: they trust the per-sandbox CA through the bundle
    // PID 1 installed and the variables pointing at it, which replace the caller's values
    // (the caller's REQUESTS_CA_BUNDLE and SSL_CERT_FILE name the origin's CA only).
    // Control: without inspect=true and limits, the same clients reach the origin directly
    // through the tunnel (trusting it through the caller's variables) and the POST arrives.
    let origin = RecordingTlsOrigin::start("secure.test");
    for uid in identities() {
        let ws = Workspace::new(uid);
        std::fs::write(ws.path.join("hosts"), "127.0.0.1 secure.test\n").unwrap();
        let roots = ws.path.join("roots.pem");
        std::fs::write(&roots, &origin.ca_pem).unwrap();
        std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o644)).unwrap();
        let client = ws.path.join("client.py");
        std::fs::write(&client, PYTHON_GET_THEN_POST).unwrap();
        std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o644)).unwrap();
        let python = python_for(uid);
        let url = format!("https://secure.test:{}/simple/", origin.port);
        let address = format!("127.0.0.1:{}", origin.port);
        let script = format!(
            "curl -sS -m 10 -o /dev/null -w 'get %{{http_code}}\\n' {url}; \
             curl -sS -m 10 -o /dev/null -w 'post %{{http_code}}\\n' -d x {url}; \
             {python} {client} {url}; true",
            python = python.display(),
            client = client.display(),
        );
        for inspect in [true, false] {
            let before = origin.seen.lock().unwrap().len();
            let pattern = if inspect {
                format!("secure.test:{} methods=read-only inspect=true", origin.port)
            } else {
                format!("secure.test:{}", origin.port)
            };
            let args = ["--allow-domain", &pattern, "--allow-domain", &address];
            let mut command = ws.command(&args, &["sh", "-c", &script]);
            command
                .env("SSL_CERT_FILE", &roots)
                .env("REQUESTS_CA_BUNDLE", &roots);
            let child = command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let output = wait_output(child, DEADLINE * 3);
            let out = text(&output.stdout);
            let seen = origin.seen.lock().unwrap()[before..].to_vec();
            let context = format!("{uid:?} inspect={inspect}: {seen:?} {}", describe(&output));
            assert!(out.contains("get 200"), "{context}");
            assert!(out.contains("py get 200"), "{context}");
            if inspect {
                assert!(!out.contains("post 200"), "{context}");
                assert_eq!(
                    seen,
                    ["GET /simple/ HTTP/1.1", "GET /simple/ HTTP/1.1"],
                    "{context}"
                );
                assert!(
                    text(&output.stderr).contains("POST /simple/ to secure.test"),
                    "{context}"
                );
            } else {
                assert!(out.contains("\npost 200"), "{context}");
                assert!(out.contains("py post 200"), "{context}");
                assert_eq!(
                    seen,
                    [
                        "GET /simple/ HTTP/1.1",
                        "POST /simple/ HTTP/1.1",
                        "GET /simple/ HTTP/1.1",
                        "POST /simple/ HTTP/1.1"
                    ],
                    "{context}"
                );
            }
        }
        // The origin's CA is not in the host's trust store: without SSL_CERT_FILE the proxy
        // refuses it, and says why (to a curl that trusts the proxy's CA without a flag).
        let before = origin.seen.lock().unwrap().len();
        let pattern = format!("secure.test:{} methods=read-only inspect=true", origin.port);
        let output = ws.run(
            &["--allow-domain", &pattern, "--allow-domain", &address],
            &["curl", "-sS", "-m", "10", "-w", "code %{http_code}", &url],
        );
        let context = format!("{uid:?} untrusted: {}", describe(&output));
        assert!(text(&output.stdout).ends_with("code 502"), "{context}");
        assert!(
            text(&output.stdout).contains("not trusted by this host"),
            "{context}"
        );
        assert_eq!(origin.seen.lock().unwrap().len(), before, "{context}");
    }
}

/// A Python client inside the sandbox: GET then POST `argv[1]`, printing `py get CODE via LIB`
/// and `py post CODE via LIB` (or the error), with `requests` when the interpreter has it, else
/// urllib. Neither is given a CA: they read the environment's (`REQUESTS_CA_BUNDLE`,
/// `SSL_CERT_FILE`) as they do by default.
const PYTHON_GET_THEN_POST: &str = r#"
import sys
url = sys.argv[1]
try:
    import requests
    lib = "requests"
    def code(data):
        if data is None:
            return requests.get(url, timeout=10).status_code
        return requests.post(url, data=data, timeout=10).status_code
except ImportError:
    import urllib.error
    import urllib.request
    lib = "urllib"
    def code(data):
        try:
            return urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10).status
        except urllib.error.HTTPError as err:
            return err.code
for name, data in (("get", None), ("post", b"x")):
    try:
        print("py", name, code(data), "via", lib, flush=True)
    except Exception as err:
        print("py", name, "error", type(err).__name__, err, "via", lib, flush=True)
"#;

/// The Python for `uid`: the host's `python3` when it has `requests` and `uid` can run it
/// (it may live under root's home), else `/usr/bin/python3` (urllib).
fn python_for(uid: Option<u32>) -> PathBuf {
    let found = Command::new("python3")
        .args(["-c", "import sys, requests; print(sys.executable)"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(text(&out.stdout).trim()));
    let usable = |path: &Path| match uid {
        None => true,
        Some(uid) => Command::new(path)
            .args(["-c", "import requests"])
            .uid(uid)
            .gid(uid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success()),
    };
    found
        .filter(|path| usable(path))
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"))
}

#[test]
fn the_inspection_cas_key_is_nowhere_the_command_can_read() {
    // With inspect=true, from inside (root and 65534): the trust bundle holds CERTIFICATE
    // blocks only, ending with the per-sandbox CA, and the command can neither append to it
    // nor remove it; no file it can read that the sandbox's setup wrote (newer than the
    // start, under /tmp, /run, $TMPDIR, $HOME) holds a private key, while a decoy key the test
    // planted in $HOME is found by the same search (the search works); no process in the
    // sandbox is the proxy, and the proxy's /proc/PID/{environ,mem,fd} (its host pid, sent
    // in by the test) are not the proxy's there. Control: from the host, as the same uid, the
    // proxy is a process whose cmdline is readable.
    let probe = format!(
        "{IS_PROXY}{}",
        r#"
b="$SSL_CERT_FILE"
for v in REQUESTS_CA_BUNDLE NODE_EXTRA_CA_CERTS CURL_CA_BUNDLE GIT_SSL_CAINFO; do
  eval "[ \"\$$v\" = \"$b\" ]" && echo "var $v same"
done
echo "begins $(grep -c -- '-----BEGIN ' "$b") certs $(grep -c -- '-----BEGIN CERTIFICATE-----' "$b")"
echo "marked $(grep -c 'execward per-sandbox inspection CA' "$b")"
sum=$(cksum < "$b")
if (echo x >> "$b") 2>/dev/null; then echo "append ok"; else echo "append refused"; fi
if rm -f "$b" 2>/dev/null && [ ! -e "$b" ]; then echo "rm ok"; else echo "rm refused"; fi
[ "$(cksum < "$b")" = "$sum" ] && echo "bundle unchanged"
for f in $(find /tmp /run "$TMPDIR" "$HOME" -xdev -type f -newer "$HOME/marker" 2>/dev/null); do
  grep -q 'PRIVATE KEY' "$f" 2>/dev/null && echo "key $f"
done
n=0
for p in /proc/[0-9]*; do
  is_proxy "${p#/proc/}" && n=$((n+1))
done
echo "proxies $n"
echo ready
read pid
for what in environ mem cmdline; do
  if is_proxy "$pid" && head -c 1 "/proc/$pid/$what" >/dev/null 2>&1; then
    echo "proxy $what readable"
  fi
done
ls "/proc/$pid/fd" >/dev/null 2>&1 && is_proxy "$pid" && echo "proxy fd listed"
echo done
"#
    );
    for uid in identities() {
        let ws = Workspace::new(uid);
        let marker = ws.path.join("marker");
        std::fs::write(&marker, "").unwrap();
        let past = std::time::SystemTime::now() - Duration::from_secs(2);
        std::fs::File::options()
            .write(true)
            .open(&marker)
            .unwrap()
            .set_modified(past)
            .unwrap();
        let decoy = ws.path.join("decoy.pem");
        std::fs::write(
            &decoy,
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        for path in [&marker, &decoy] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let pattern = "secure.test:443 methods=read-only inspect=true";
        let mut child = ws
            .command(&["--allow-domain", pattern], &["sh", "-c", &probe])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        let pid = child.id();
        let until = |lines: &mut Vec<String>, last: &str| {
            while lines.last().map(String::as_str) != Some(last) {
                match rx.recv_timeout(DEADLINE) {
                    Ok(line) => lines.push(line),
                    Err(_) => {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                        panic!("{uid:?}: no {last:?} from the probe: {lines:?}");
                    }
                }
            }
        };
        until(&mut lines, "ready");
        // Control: from the host, the proxy (sandbox-run's child) is there and readable.
        let proxy = proxy_of(pid).unwrap_or_else(|| panic!("{uid:?}: no proxy"));
        let mut host_probe = Command::new("sh");
        host_probe.args([
            "-c",
            &format!("{IS_PROXY} is_proxy {proxy} && head -c 1 /proc/{proxy}/cmdline && echo seen"),
        ]);
        if let Some(uid) = uid {
            host_probe.uid(uid).gid(uid);
        }
        let seen = host_probe.output().unwrap();
        assert!(text(&seen.stdout).ends_with("seen\n"), "{uid:?}: {seen:?}");
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{proxy}").unwrap();
        drop(stdin);
        until(&mut lines, "done");
        let output = wait_output(child, DEADLINE);
        let context = format!("{uid:?}: {lines:#?} {}", describe(&output));
        assert!(output.status.success(), "{context}");
        for var in [
            "REQUESTS_CA_BUNDLE",
            "NODE_EXTRA_CA_CERTS",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            assert!(lines.contains(&format!("var {var} same")), "{context}");
        }
        let counts = lines.iter().find(|l| l.starts_with("begins ")).unwrap();
        let (begins, certs) = counts
            .strip_prefix("begins ")
            .and_then(|rest| rest.split_once(" certs "))
            .unwrap();
        assert_eq!(begins, certs, "{context}");
        assert!(begins.parse::<u32>().unwrap() >= 1, "{context}");
        assert!(lines.contains(&"marked 1".to_owned()), "{context}");
        assert!(lines.contains(&"append refused".to_owned()), "{context}");
        assert!(lines.contains(&"rm refused".to_owned()), "{context}");
        assert!(lines.contains(&"bundle unchanged".to_owned()), "{context}");
        // Keys the search found: the decoy, and only files the host's own /tmp has (the
        // overlay shows the host's /tmp underneath; nothing the sandbox wrote is there).
        let keys: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("key "))
            .collect();
        assert!(keys.contains(&decoy.to_str().unwrap()), "{context}");
        for key in &keys {
            assert!(
                *key == decoy.to_str().unwrap() || Path::new(key).exists(),
                "{key} holds a private key: {context}"
            );
        }
        assert!(lines.contains(&"proxies 0".to_owned()), "{context}");
        assert!(!lines.iter().any(|l| l.starts_with("proxy ")), "{context}");
    }
}

/// `is_proxy PID`: whether that process's program is `egress-proxy` (sh).
const IS_PROXY: &str = r#"
is_proxy() {
  [ "$(tr '\0' '\n' < "/proc/$1/cmdline" 2>/dev/null | head -n 1 | sed 's,.*/,,')" = egress-proxy ]
}
"#;
