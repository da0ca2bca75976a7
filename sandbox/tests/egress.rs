//! Network allowlists end to end: the real `sandbox-run` and `egress-proxy`, real clients inside
//! the sandbox (curl, pip, python sockets), and origin servers on the host's 127.0.0.1 that
//! count what reaches them. No internet: names are mapped with `--egress-hosts`.
//!
//! Every case runs as root and as uid 65534 (the denial-audit cases as 65534 only: as root
//! `--audit` would switch the kernel audit on for the whole machine).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

#[path = "../../tests/src/scratch.rs"]
mod scratch;

const NOBODY: u32 = 65534;
/// Deadline for any single wait.
const DEADLINE: Duration = Duration::from_secs(20);
const PYTHON: &str = "/usr/bin/python3";

fn identities() -> Vec<Option<u32>> {
    if nix::unistd::geteuid().is_root() {
        vec![None, Some(NOBODY)]
    } else {
        vec![None]
    }
}

/// `sandbox-run` and `egress-proxy` side by side in a directory every identity can traverse.
fn installed() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch::scratch_dir("egress-bin-").keep();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (name, from) in [
            ("sandbox-run", env!("CARGO_BIN_EXE_sandbox-run")),
            ("egress-proxy", env!("CARGO_BIN_EXE_egress-proxy")),
        ] {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    })
}

/// A scratch directory owned by `uid` with a hosts file mapping the test names to 127.0.0.1.
struct Workspace {
    _dir: tempfile::TempDir,
    path: PathBuf,
    hosts: PathBuf,
    uid: Option<u32>,
}

impl Workspace {
    fn new(uid: Option<u32>) -> Self {
        let dir = scratch::scratch_dir("egress-");
        let path = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hosts = path.join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1 registry.test pypi.test other.test a.example.test secret.example.test\n",
        )
        .unwrap();
        std::fs::set_permissions(&hosts, std::fs::Permissions::from_mode(0o644)).unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        }
        Self {
            _dir: dir,
            path,
            hosts,
            uid,
        }
    }

    /// `sandbox-run --policy workspace-write --egress-hosts HOSTS ARGS -- COMMAND` as the
    /// workspace's identity.
    fn command(&self, args: &[&str], command: &[&str]) -> Command {
        let mut cmd = Command::new(installed().join("sandbox-run"));
        cmd.args(["--policy", "workspace-write", "--egress-hosts"])
            .arg(&self.hosts)
            .args(args)
            .arg("--")
            .args(command)
            .current_dir(&self.path)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.path)
            .stdin(Stdio::null());
        if let Some(uid) = self.uid {
            cmd.uid(uid).gid(uid);
        }
        cmd
    }

    fn run(&self, args: &[&str], command: &[&str]) -> Output {
        let child = self
            .command(args, command)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_output(child, DEADLINE * 3)
    }
}

/// Waits for `child` under a deadline (killing it and failing when it passes).
fn wait_output(child: std::process::Child, deadline: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("sandbox-run did not finish within {deadline:?}");
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    )
}

/// An origin server on the host's 127.0.0.1 that counts connections and request bytes.
///
/// Paths: `/hello`, `/simple/demo/` (a PEP 503 index), `/files/<wheel>`, `/stream` (endless
/// body; announces itself on `streams`); a connection that sends no request is held open until
/// the client closes it.
struct Origin {
    port: u16,
    connections: Arc<AtomicUsize>,
    bytes_in: Arc<AtomicUsize>,
    streams: Mutex<mpsc::Receiver<()>>,
    /// The request line of every request served, in order.
    requests: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    fn start(wheel: Option<(String, Vec<u8>)>) -> Self {
        Self::start_on("127.0.0.1:0", wheel)
    }

    /// An origin listening on `bind` (`[::]:0`: every address of its network namespace).
    fn start_on(bind: &str, wheel: Option<(String, Vec<u8>)>) -> Self {
        let listener = TcpListener::bind(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let bytes_in = Arc::new(AtomicUsize::new(0));
        let (stream_tx, streams) = mpsc::channel();
        let (counted, bytes) = (Arc::clone(&connections), Arc::clone(&bytes_in));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        let wheel = Arc::new(wheel);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                let (bytes, wheel, stream_tx, recorded) = (
                    Arc::clone(&bytes),
                    Arc::clone(&wheel),
                    stream_tx.clone(),
                    Arc::clone(&recorded),
                );
                std::thread::spawn(move || serve(stream, &bytes, &wheel, &stream_tx, &recorded));
            }
        });
        Self {
            port,
            connections,
            bytes_in,
            streams: Mutex::new(streams),
            requests,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn serve(
    mut stream: TcpStream,
    bytes: &AtomicUsize,
    wheel: &Option<(String, Vec<u8>)>,
    streams: &mpsc::Sender<()>,
    requests: &Mutex<Vec<String>>,
) {
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                bytes.fetch_add(n, Ordering::SeqCst);
                head.extend_from_slice(&chunk[..n]);
            }
        }
    }
    let line = text(&head);
    requests
        .lock()
        .unwrap()
        .push(line.lines().next().unwrap_or_default().to_owned());
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let respond = |stream: &mut TcpStream, kind: &str, body: &[u8]| {
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(body);
    };
    match (path.as_str(), wheel) {
        ("/hello", _) => respond(&mut stream, "text/plain", b"hello from origin\n"),
        ("/simple/demo/", Some((name, _))) => {
            let page = format!(
                "<!DOCTYPE html><html><body><a href=\"/files/{name}\">{name}</a></body></html>"
            );
            respond(&mut stream, "text/html", page.as_bytes());
        }
        (files, Some((name, data))) if files == format!("/files/{name}") => {
            respond(&mut stream, "application/octet-stream", data);
        }
        ("/stream", _) => {
            // A framed body: an early end is an error for the client, not a complete file.
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                  Content-Length: 1099511627776\r\n\r\n",
            );
            let _ = streams.send(());
            let block = vec![b'x'; 64 * 1024];
            while stream.write_all(&block).is_ok() {}
        }
        _ => {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
}

/// `--allow-domain` arguments for `names` plus the origin's address itself (names resolve to
/// 127.0.0.1, which is reached only when named).
fn allow(names: &[&str], origin: &Origin) -> Vec<String> {
    let mut args = Vec::new();
    for name in names {
        args.push("--allow-domain".to_owned());
        args.push(format!("{name}:{}", origin.port));
    }
    args.push("--allow-domain".to_owned());
    args.push(format!("127.0.0.1:{}", origin.port));
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

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
fn a_name_resolving_to_loopback_is_refused_unless_the_address_is_named() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let before = origin.connections();
        let url = format!("http://registry.test:{}/hello", origin.port);
        let only_name = [
            "--allow-domain".to_owned(),
            format!("registry.test:{}", origin.port),
        ];
        let output = ws.run(&strs(&only_name), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(!output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("resolves to 127.0.0.1"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), before, "{uid:?}");
        let named = ws.run(
            &strs(&allow(&["registry.test"], &origin)),
            &["curl", "-sS", "-f", "-m", "10", &url],
        );
        assert!(named.status.success(), "{uid:?}: {}", describe(&named));
    }
}

#[test]
fn an_ipv4_mapped_answer_is_checked_as_its_ipv4_address() {
    let origin = Origin::start(None);
    for uid in identities() {
        let ws = Workspace::new(uid);
        std::fs::write(&ws.hosts, "::ffff:127.0.0.1 mapped.test\n").unwrap();
        let url = format!("http://mapped.test:{}/hello", origin.port);
        let args = allow(&["mapped.test"], &origin);
        // The control: the mapped form of the named address is that address.
        let before = origin.connections();
        let output = ws.run(&strs(&args), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
        // A deny pattern naming the IPv4 address holds against the mapped answer.
        let mut denied = args.clone();
        denied.extend(["--deny-domain".to_owned(), "127.0.0.1".to_owned()]);
        let before = origin.connections();
        let output = ws.run(&strs(&denied), &["curl", "-sS", "-f", "-m", "10", &url]);
        assert!(!output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stderr).contains("denied by the pattern \"127.0.0.1\""),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections(), before, "{uid:?}");
    }
}

/// Runs `body` on a thread in a network namespace of its own (so children it starts are there
/// too), whose `lo` is up and also carries `addresses`: public-looking addresses of "this host",
/// which a name may resolve to. Needs root.
fn in_private_network<T: Send>(addresses: &[&str], body: impl FnOnce() -> T + Send) -> T {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a network namespace: run it as root"
    );
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare on this thread only; no memory is touched.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
                let ip = |args: &[&str]| {
                    let status = Command::new("ip").args(args).status().unwrap();
                    assert!(status.success(), "ip {args:?}");
                };
                ip(&["link", "set", "lo", "up"]);
                for address in addresses {
                    ip(&["addr", "add", address, "dev", "lo"]);
                }
                body()
            })
            .join()
            .unwrap()
    })
}

#[test]
fn a_name_resolving_to_one_of_the_hosts_own_addresses_is_refused_unless_named() {
    in_private_network(&["11.22.33.5/32", "2606:4700:10::5/128"], || {
        let origin = Origin::start_on("[::]:0", None);
        let p = origin.port;
        for uid in identities() {
            let ws = Workspace::new(uid);
            std::fs::write(
                &ws.hosts,
                "11.22.33.5 own4.test\n2606:4700:10::5 own6.test\n",
            )
            .unwrap();
            let names = [
                "--allow-domain".to_owned(),
                format!("own4.test:{p}"),
                "--allow-domain".to_owned(),
                format!("own6.test:{p}"),
            ];
            let script = format!(
                "curl -sS -f -m 10 http://own4.test:{p}/hello; echo \"v4=$?\"; \
                 curl -sS -f -m 10 http://own6.test:{p}/hello; echo \"v6=$?\""
            );
            let before = origin.connections();
            let output = ws.run(&strs(&names), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            assert!(
                out.contains("v4=22") && out.contains("v6=22"),
                "{uid:?}: {}",
                describe(&output)
            );
            for refused in ["resolves to 11.22.33.5", "resolves to [2606:4700:10::5]"] {
                assert!(
                    text(&output.stderr).contains(refused)
                        && text(&output.stderr).contains("this host's own address"),
                    "{uid:?}: {refused}: {}",
                    describe(&output)
                );
            }
            assert_eq!(origin.connections(), before, "{uid:?}");
            // The control: with the addresses named, both are reached.
            let mut named = names.to_vec();
            named.extend([
                "--allow-domain".to_owned(),
                format!("11.22.33.5:{p}"),
                "--allow-domain".to_owned(),
                format!("[2606:4700:10::5]:{p}"),
            ]);
            let output = ws.run(&strs(&named), &["sh", "-c", &script]);
            let out = text(&output.stdout);
            assert!(
                out.contains("hello from origin\nv4=0") && out.contains("hello from origin\nv6=0"),
                "{uid:?}: {}",
                describe(&output)
            );
            assert_eq!(origin.connections() - before, 2, "{uid:?}");
        }
    });
}

#[test]
fn a_request_head_trickled_past_the_handshake_deadline_is_not_served() {
    let origin = Origin::start(None);
    let timeout = sandbox::egress::HANDSHAKE_TIMEOUT.as_secs();
    let code = format!(
        "import socket, os, time\n\
         port = int(os.environ['HTTP_PROXY'].rstrip('/').rsplit(':', 1)[1])\n\
         def trickle(seconds):\n\
         \x20   s = socket.create_connection(('127.0.0.1', port), timeout=60)\n\
         \x20   s.sendall(b'GET http://registry.test:{p}/hello HTTP/1.1\\r\\nHost: registry.test:{p}\\r\\n')\n\
         \x20   try:\n\
         \x20       for i in range(seconds):\n\
         \x20           time.sleep(1)\n\
         \x20           s.sendall(b'X-Trickle: 1\\r\\n')\n\
         \x20       s.sendall(b'\\r\\n')\n\
         \x20       print(seconds, s.recv(1024).split(b'\\r\\n')[0].decode() or 'closed')\n\
         \x20   except OSError as e:\n\
         \x20       print(seconds, 'closed', e.errno)\n\
         trickle(3)\n\
         trickle({late})\n",
        p = origin.port,
        late = timeout + 3,
    );
    for uid in identities() {
        let ws = Workspace::new(uid);
        let before = origin.connections();
        let output = python(&ws, &allow(&["registry.test"], &origin), &code);
        let out = text(&output.stdout);
        // The control: a head trickled well inside the deadline is served.
        assert!(
            out.contains("3 HTTP/1.1 200"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            out.contains(&format!("{} closed", timeout + 3)),
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
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

/// A Python snippet run inside the sandbox.
fn python(ws: &Workspace, args: &[String], code: &str) -> Output {
    ws.run(&strs(args), &[PYTHON, "-c", code])
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

/// A TLS ClientHello for `name`, sent through a CONNECT tunnel to the origin by Python.
fn sni_probe(origin: &Origin, name: &str) -> String {
    format!(
        "import socket, ssl, os\n\
         port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])\n\
         s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
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
        // is no TLS server, so the handshake fails there).
        let output = python(
            &ws,
            &allow(&["registry.test"], &origin),
            &sni_probe(&origin, "registry.test"),
        );
        assert!(
            text(&output.stdout).contains("tls failed"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(
            origin.bytes_in.load(Ordering::SeqCst) > before,
            "{uid:?}: the matching ClientHello did not reach the origin"
        );
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

#[test]
fn connections_beyond_the_bound_are_closed_and_the_rest_stay_up() {
    let origin = Origin::start(None);
    let bound = sandbox::egress::MAX_CONCURRENT_CONNECTIONS;
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

/// The `egress-proxy` whose parent is `parent`.
fn proxy_of(parent: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((comm, rest)) = stat.split_once(") ") else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if comm.ends_with("(egress-proxy") && ppid == Some(parent) {
            return Some(pid);
        }
    }
    None
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
fn proxy_refusals_are_denial_records_in_every_audit_format_without_root() {
    let origin = Origin::start(None);
    // As 65534 only: as root, --audit would switch the kernel audit on machine-wide.
    let uid = if nix::unistd::geteuid().is_root() {
        Some(NOBODY)
    } else {
        None
    };
    let ws = Workspace::new(uid);
    let url = format!("http://other.test:{}/hello", origin.port);
    for (format, needle) in [
        ("jsonl", "\"layer\":\"proxy\""),
        ("sarif", "net.connect"),
        ("github", "proxy"),
    ] {
        let report = ws.path.join(format!("report.{format}"));
        let mut args = allow(&["registry.test"], &origin);
        args.extend([
            "--audit".to_owned(),
            report.display().to_string(),
            "--audit-format".to_owned(),
            format.to_owned(),
            "--fail-on-denial".to_owned(),
        ]);
        let output = ws.run(&strs(&args), &["curl", "-sS", "-m", "10", &url]);
        assert_eq!(
            output.status.code(),
            Some(3),
            "{format}: {}",
            describe(&output)
        );
        let text = std::fs::read_to_string(&report).unwrap();
        assert!(
            text.contains(needle) && text.contains(&format!("other.test:{}", origin.port)),
            "{format}: {text}"
        );
        if format == "jsonl" {
            let denial: serde_json::Value = text
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .find(|v| v["kind"] == "denial")
                .unwrap();
            assert_eq!(denial["operation"], "net.connect");
            assert_eq!(
                denial["allow_rule"],
                format!("--allow-domain other.test:{}", origin.port)
            );
        }
    }
}

#[test]
fn the_egress_log_lists_allowed_destinations_for_ci() {
    let origin = Origin::start(None);
    let ws = Workspace::new(None);
    let log = ws.path.join("egress.jsonl");
    let mut args = allow(&["registry.test"], &origin);
    args.extend(["--egress-log".to_owned(), log.display().to_string()]);
    let url = format!("http://registry.test:{}/hello", origin.port);
    let output = ws.run(&strs(&args), &["curl", "-sS", "-f", "-m", "10", &url]);
    assert!(output.status.success(), "{}", describe(&output));
    let events: Vec<serde_json::Value> = BufReader::new(std::fs::File::open(&log).unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["allowed"], true);
    assert_eq!(events[0]["host"], "registry.test");
    assert_eq!(events[0]["port"], origin.port);
    assert_eq!(events[0]["rule"], format!("registry.test:{}", origin.port));
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
    sandbox::egress::server::local_addresses()
        .into_iter()
        .find(|ip| ip.is_ipv4())
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
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

/// Python helpers for the framing and STARTTLS cases: the proxy's port, `exchange` (send each
/// message, `None` meaning "read one answer", then half-close and read to the end: prints how
/// many `200` answers came back) and `hello(name)` (a hand-made ClientHello naming `name`).
const CLIENT_PY: &str = "import socket, os, sys\n\
port = int(os.environ['HTTP_PROXY'].rstrip('/').rsplit(':', 1)[1])\n\
def exchange(label, *messages):\n\
\x20   s = socket.create_connection(('127.0.0.1', port), timeout=10)\n\
\x20   answers = b''\n\
\x20   try:\n\
\x20       for m in messages:\n\
\x20           if m is None:\n\
\x20               answers += s.recv(4096)\n\
\x20           else:\n\
\x20               s.sendall(m)\n\
\x20       s.shutdown(socket.SHUT_WR)\n\
\x20       while True:\n\
\x20           chunk = s.recv(4096)\n\
\x20           if not chunk:\n\
\x20               break\n\
\x20           answers += chunk\n\
\x20   except OSError as e:\n\
\x20       pass\n\
\x20   print(label, answers.count(b' 200 '))\n\
def hello(name):\n\
\x20   name = name.encode()\n\
\x20   entry = b'\\x00' + len(name).to_bytes(2, 'big') + name\n\
\x20   names = len(entry).to_bytes(2, 'big') + entry\n\
\x20   ext = b'\\x00\\x00' + len(names).to_bytes(2, 'big') + names\n\
\x20   body = b'\\x03\\x03' + bytes(32) + b'\\x00' + b'\\x00\\x02\\x13\\x01' + b'\\x01\\x00' + len(ext).to_bytes(2, 'big') + ext\n\
\x20   hs = b'\\x01' + len(body).to_bytes(3, 'big') + body\n\
\x20   return b'\\x16\\x03\\x01' + len(hs).to_bytes(2, 'big') + hs\n";

/// The refusals in an `--egress-log`.
fn refusals(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["allowed"] == false)
        .collect()
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

/// What the asking peer (the test, standing where exec-server stands) does with each question
/// in turn: answer with this decision, or never answer.
type Plan = Vec<Option<&'static str>>;

/// Runs `script` under `--ask --ask-fd 3` with the test as the peer on descriptor 3, answering
/// by `plan`: returns the output, the questions received and how long the run took.
fn run_asking(
    ws: &Workspace,
    args: &[&str],
    script: &str,
    plan: Plan,
) -> (Output, Vec<serde_json::Value>, Duration) {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let questions = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&questions);
    let peer = std::thread::spawn(move || {
        let mut reader = BufReader::new(ours.try_clone().unwrap());
        let mut writer = ours;
        let mut plan = plan.into_iter();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let question: serde_json::Value = serde_json::from_str(&line).unwrap();
            recorded.lock().unwrap().push(question.clone());
            if let Some(Some(decision)) = plan.next() {
                let answer = serde_json::json!({"id": question["id"], "decision": decision});
                let _ = writeln!(writer, "{answer}");
            }
        }
    });
    let mut all = vec!["--ask", "--ask-fd", "3"];
    all.extend_from_slice(args);
    let mut command = ws.command(&all, &["sh", "-c", script]);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let began = Instant::now();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(theirs);
    let output = wait_output(child, DEADLINE * 3);
    let elapsed = began.elapsed();
    peer.join().unwrap();
    let questions = questions.lock().unwrap().clone();
    (output, questions, elapsed)
}

/// `--ask` with a peer on `--ask-fd` (what exec-server does for `egress/approve`): a name the
/// allowlist refuses is held while the peer is asked, with host, port, method, path and the
/// rule that would allow it. "connection" lets that one connection through (the next one is
/// asked again and "deny" refuses it); "process" covers the process's later connections (one
/// question, two successes); a second process asks again; no answer refuses after
/// --ask-timeout (1 s here), not before; approval does not lift the address checks (the name
/// resolves to loopback, refused unless the address is named); a deny pattern is final, never
/// asked. The control: without --ask nothing is asked and the request is refused at once.
#[test]
fn asking_approves_per_connection_or_process_and_refuses_on_deny_or_no_answer() {
    let origin = Origin::start(None);
    let url = format!("http://other.test:{}/hello", origin.port);
    let fetch = format!("curl -sS -m 10 {url}");
    let loopback = format!("127.0.0.1:{}", origin.port);
    let registry = format!("registry.test:{}", origin.port);
    let args = [
        "--allow-domain",
        registry.as_str(),
        "--allow-domain",
        loopback.as_str(),
        "--ask-timeout",
        "1",
    ];
    for uid in identities() {
        let ws = Workspace::new(uid);
        let hello = |output: &Output| text(&output.stdout).matches("hello from origin").count();
        let asked_by_client =
            |output: &Output| text(&output.stdout).matches("refused when asked").count();

        // Once for this connection, then deny.
        let before = origin.connections();
        let (output, questions, _) = run_asking(
            &ws,
            &args,
            &format!("{fetch}; {fetch}"),
            vec![Some("connection"), Some("deny")],
        );
        assert_eq!(hello(&output), 1, "{uid:?}: {}", describe(&output));
        assert_eq!(
            asked_by_client(&output),
            1,
            "{uid:?}: {}",
            describe(&output)
        );
        assert_eq!(origin.connections() - before, 1, "{uid:?}");
        assert_eq!(questions.len(), 2, "{uid:?}: {questions:?}");
        assert_eq!(questions[0]["host"], "other.test", "{questions:?}");
        assert_eq!(questions[0]["port"], origin.port, "{questions:?}");
        assert_eq!(questions[0]["method"], "GET", "{questions:?}");
        assert_eq!(questions[0]["path"], "/hello", "{questions:?}");
        assert_eq!(
            questions[0]["rule"],
            format!("--allow-domain other.test:{}", origin.port),
            "{questions:?}"
        );

        // For the process: asked once, both connections pass.
        let before = origin.connections();
        let (output, questions, _) = run_asking(
            &ws,
            &args,
            &format!("{fetch} && {fetch}"),
            vec![Some("process")],
        );
        assert_eq!(hello(&output), 2, "{uid:?}: {}", describe(&output));
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(origin.connections() - before, 2, "{uid:?}");

        // A second process is asked again.
        let (output, questions, _) = run_asking(&ws, &args, &fetch, vec![Some("deny")]);
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));

        // No answer: refused after the timeout, not before.
        let before = origin.connections();
        let (output, questions, elapsed) = run_asking(&ws, &args, &fetch, vec![None]);
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("no approval came within 1000 ms"),
            "{uid:?}: {}",
            describe(&output)
        );
        assert!(elapsed >= Duration::from_secs(1), "{uid:?}: {elapsed:?}");
        assert!(elapsed < Duration::from_secs(8), "{uid:?}: {elapsed:?}");
        assert_eq!(origin.connections(), before, "{uid:?}");

        // Approved, but the name resolves to loopback, which no pattern names: refused.
        let (output, questions, _) = run_asking(
            &ws,
            &["--allow-domain", registry.as_str()],
            &fetch,
            vec![Some("process")],
        );
        assert_eq!(questions.len(), 1, "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("loopback"),
            "{uid:?}: {}",
            describe(&output)
        );

        // A deny pattern is final: never asked.
        let denied = format!("other.test:{}", origin.port);
        let mut with_deny = args.to_vec();
        with_deny.extend(["--deny-domain", denied.as_str()]);
        let (output, questions, _) = run_asking(&ws, &with_deny, &fetch, vec![Some("process")]);
        assert!(questions.is_empty(), "{uid:?}: {questions:?}");
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));

        // Control: without --ask, refused at once, nothing asked.
        let output = ws.run(&args[..4], &["sh", "-c", &fetch]);
        assert_eq!(hello(&output), 0, "{uid:?}: {}", describe(&output));
        assert!(
            text(&output.stdout).contains("not in the allowlist"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

/// `--ask` with no controlling terminal (a CI job, a daemon): refused at once, without waiting
/// for the timeout, and the refusal says it was asked of the terminal.
#[test]
fn asking_without_a_terminal_refuses_at_once() {
    let origin = Origin::start(None);
    let url = format!("http://other.test:{}/hello", origin.port);
    let loopback = format!("127.0.0.1:{}", origin.port);
    for uid in identities() {
        let ws = Workspace::new(uid);
        let mut command = ws.command(
            &["--allow-domain", &loopback, "--ask", "--ask-timeout", "20"],
            &["curl", "-sS", "-m", "10", &url],
        );
        // SAFETY: setsid only, between fork and exec: no controlling terminal.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let began = Instant::now();
        let child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = wait_output(child, DEADLINE);
        assert!(began.elapsed() < Duration::from_secs(10), "{uid:?}");
        assert!(
            text(&output.stdout).contains("refused when asked (by the terminal)"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
}

/// The question socket (`--ask-fd`) is `sandbox-run`'s and the proxy's, never the command's:
/// the command's descriptors hold no socket. The control: the same listing run directly with
/// the socket inherited shows it.
#[test]
fn the_ask_socket_never_reaches_the_command() {
    let listing = "ls -l /proc/self/fd/";
    for uid in identities() {
        let ws = Workspace::new(uid);
        let (output, questions, _) =
            run_asking(&ws, &["--allow-domain", "registry.test"], listing, vec![]);
        assert!(output.status.success(), "{uid:?}: {}", describe(&output));
        assert!(questions.is_empty(), "{uid:?}: {questions:?}");
        assert!(
            !text(&output.stdout).contains("socket:"),
            "{uid:?}: {}",
            describe(&output)
        );
    }
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    let mut control = Command::new("sh");
    control.args(["-c", listing]);
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        control.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = control.output().unwrap();
    assert!(
        text(&output.stdout).contains("socket:"),
        "{}",
        describe(&output)
    );
}

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
