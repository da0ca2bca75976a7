//! Who may connect to exec-server's listener (issue 32, items 1 and 2): without the bearer token,
//! only the server's own user (and root) is admitted, as the kernel names the owner of the
//! peer's socket (sock_diag on loopback TCP, SO_PEERCRED on the unix socket); another local user
//! needs the token; a token never goes over plain ws:// to another host; a non-loopback listener
//! must serve wss://, which the clients reach with a CA file.
//!
//! Clients of another user are real processes: the `probe` binary (`ws-session`) started with
//! that uid, which performs the websocket upgrade and, once admitted, `initialize`, so an
//! admission is proven by the JSON-RPC layer answering.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::matrix::{ListenerFixture, NOBODY, OTHER, server_users};
use tests::{DEADLINE, ExecServer, output_within};

const TOKEN: &str = "listener-token";

/// Binaries every uid can run, a token file and a socket directory owned by the server's user
/// ([`ListenerFixture`]), with this file's ways to start a server and to call it.
struct Setup(ListenerFixture);

impl std::ops::Deref for Setup {
    type Target = ListenerFixture;

    fn deref(&self) -> &ListenerFixture {
        &self.0
    }
}

impl Setup {
    fn new(server_uid: Option<u32>) -> Setup {
        Setup(ListenerFixture::new("listener-", TOKEN, server_uid))
    }

    fn start(&self, uid: Option<u32>, args: &[&str]) -> ExecServer {
        ExecServer::start_binary(&self.bin.join("exec-server"), args, |command| {
            command.current_dir("/").env("RUST_LOG", "info");
            if let Some(uid) = uid {
                command.uid(uid).gid(uid);
            }
        })
    }

    fn start_with_token(&self, uid: Option<u32>, listen: &str) -> ExecServer {
        let token = self.token_file.to_str().unwrap();
        self.start(uid, &["--listen", listen, "--auth-token-file", token])
    }

    /// `probe ws-session URL [TOKEN]` as `uid` (the test's own user for `None`): the answer's
    /// `status` and `body`, or after a 101 the `initialize` answer.
    fn session(&self, uid: Option<u32>, url: &str, token: Option<&str>) -> Value {
        let mut args = vec!["ws-session", url];
        args.extend(token);
        self.probe(uid, &args, &format!("to {url}"))
    }
}

/// The answer admitted the client: 101, then a session id from `initialize`.
fn assert_admitted(answer: &Value, who: &str) {
    assert_eq!(answer["status"], 101, "{who}: {answer}");
    let initialize: Value = serde_json::from_str(answer["initialize"].as_str().unwrap()).unwrap();
    assert!(
        initialize["result"]["sessionId"].is_string(),
        "{who}: {initialize}"
    );
}

/// The answer refused the client with `status`, naming its uid.
fn assert_refused(answer: &Value, status: u16, uid: u32, who: &str) {
    assert_eq!(answer["status"], status, "{who}: {answer}");
    let body = answer["body"].as_str().unwrap();
    assert!(body.contains(&format!("uid {uid}")), "{who}: {body}");
    assert!(answer.get("initialize").is_none(), "{who}: {answer}");
}

/// The server logged the refusal of `uid`.
fn assert_refusal_logged(server: &ExecServer, uid: u32) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let log = server.stderr();
        if log.lines().any(|line| {
            line.contains("refused a connection") && line.contains(&format!("uid {uid}"))
        }) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no refusal of uid {uid} logged:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20)); // polling interval under the deadline
    }
}

/// The loopback addresses this host has: 127.0.0.1, and ::1 when it can be bound.
fn loopback_listen_urls() -> Vec<&'static str> {
    let mut urls = vec!["ws://127.0.0.1:0"];
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        urls.push("ws://[::1]:0");
    }
    urls
}

#[test]
fn another_user_without_the_token_is_refused_on_loopback_tcp_while_the_servers_user_is_not() {
    for (server_uid, other) in server_users() {
        let setup = Setup::new(server_uid);
        for listen in loopback_listen_urls() {
            let server = setup.start_with_token(server_uid, listen);
            let who = |what: &str| format!("{what} on {listen}, server uid {server_uid:?}");
            // Another user without the token: refused, and told why.
            let refused = setup.session(Some(other), server.url(), None);
            assert_refused(&refused, 401, other, &who("another user"));
            assert!(refused["body"].as_str().unwrap().contains("Bearer"));
            assert_refusal_logged(&server, other);
            // The same user with the token: admitted.
            assert_admitted(
                &setup.session(Some(other), server.url(), Some(TOKEN)),
                &who("another user with the token"),
            );
            // A wrong token is refused even from the server's own user.
            let wrong = setup.session(server_uid, server.url(), Some("wrong"));
            assert_eq!(wrong["status"], 401, "{}: {wrong}", who("a wrong token"));
            // The server's own user, and root, need no token.
            assert_admitted(
                &setup.session(server_uid, server.url(), None),
                &who("the server's user"),
            );
            assert_admitted(&setup.session(None, server.url(), None), &who("root"));
        }
        // Without a token file nothing admits another user: 403.
        let server = setup.start(server_uid, &["--listen", "ws://127.0.0.1:0"]);
        let refused = setup.session(Some(other), server.url(), Some(TOKEN));
        assert_refused(&refused, 403, other, "another user, no token configured");
        assert!(
            refused["body"]
                .as_str()
                .unwrap()
                .contains("no --auth-token-file")
        );
    }
}

/// The unprotected control: the same client process, of the server's own user, is admitted
/// without a token. What refuses another user is the owner check, not the probe or the port.
#[test]
fn control_a_server_of_the_clients_own_user_admits_it_without_a_token() {
    tests::require_root("the server and its client run as uid 65534");
    let setup = Setup::new(Some(NOBODY));
    for listen in loopback_listen_urls() {
        let server = setup.start(Some(NOBODY), &["--listen", listen]);
        assert_admitted(
            &setup.session(Some(NOBODY), server.url(), None),
            &format!("uid {NOBODY} to its own server on {listen}"),
        );
        // ...which refuses another user, with nothing else changed.
        let refused = setup.session(Some(OTHER), server.url(), None);
        assert_refused(&refused, 403, OTHER, "another user, same server");
    }
}

#[test]
fn the_unix_socket_checks_the_peers_uid_beside_its_mode() {
    for (server_uid, other) in server_users() {
        let setup = Setup::new(server_uid);
        let socket = setup.socket_dir.join("exec.sock");
        let url = format!("unix:{}", socket.display());
        let server = setup.start_with_token(server_uid, &url);
        // First layer: mode 0600, so another user cannot even connect.
        let mut command = Command::new(setup.bin.join("probe"));
        command
            .current_dir("/")
            .args(["unix-connect", socket.to_str().unwrap()])
            .uid(other)
            .gid(other);
        let (_, stdout, _) = output_within(&mut command, b"");
        let report: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(report["error"], "EACCES", "mode 0600: {report}");
        // Second layer, with the first one gone (the mode widened): SO_PEERCRED refuses.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let refused = setup.session(Some(other), &url, None);
        assert_refused(&refused, 401, other, "another user on the unix socket");
        assert_refusal_logged(&server, other);
        assert_admitted(
            &setup.session(Some(other), &url, Some(TOKEN)),
            "another user with the token on the unix socket",
        );
        assert_admitted(
            &setup.session(server_uid, &url, None),
            "the server's user on the unix socket",
        );
    }
}

/// An address of this host that is not loopback (the source address towards the documentation
/// network, found without sending anything), or 0.0.0.0, which is not loopback either.
fn non_loopback_address_of_this_host() -> std::net::IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    match probe
        .connect("192.0.2.1:9")
        .and_then(|()| probe.local_addr())
    {
        Ok(address) if !address.ip().is_loopback() && !address.ip().is_unspecified() => {
            address.ip()
        }
        _ => std::net::Ipv4Addr::UNSPECIFIED.into(),
    }
}

/// A listener on every address of this host that records whether anyone connected.
struct Tripwire(std::net::TcpListener);

impl Tripwire {
    fn new() -> Tripwire {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Tripwire(listener)
    }

    fn url(&self, scheme: &str) -> String {
        let address = non_loopback_address_of_this_host();
        let port = self.0.local_addr().unwrap().port();
        format!("{scheme}://{address}:{port}")
    }

    /// Whether a connection arrived within `wait`.
    fn touched_within(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            if self.0.accept().is_ok() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10)); // polling interval under the deadline
        }
    }
}

#[test]
fn exec_refuses_to_send_a_token_over_plain_ws_to_another_host_before_connecting() {
    let setup = Setup::new(None);
    let tripwire = Tripwire::new();
    let url = tripwire.url("ws");
    let exec = |token: bool| {
        let mut command = Command::new(setup.bin.join("exec-server"));
        command.args(["exec", "--connect", &url, "--cwd", "/"]);
        if token {
            command.args(["--token-file", setup.token_file.to_str().unwrap()]);
        }
        command.args(["--", "/bin/true"]);
        command
    };
    let (status, _, stderr) = output_within(&mut exec(true), b"");
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(
        stderr.contains("refusing to send a bearer token over plain ws://")
            && stderr.contains("not loopback"),
        "{stderr}"
    );
    // exec has exited: a connection it made would be queued on the tripwire by now.
    assert!(
        !tripwire.touched_within(Duration::ZERO),
        "exec connected to {url} before refusing"
    );
    // Control: without a token, the same command reaches the same listener.
    let mut child = exec(false)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let touched = tripwire.touched_within(DEADLINE);
    let _ = child.kill();
    let _ = child.wait();
    assert!(touched, "the control never reached {url}");
}

#[tokio::test]
async fn the_library_client_refuses_a_token_over_plain_ws_to_another_host_before_connecting() {
    let tripwire = Tripwire::new();
    let url = tripwire.url("ws");
    let refused = supervisor::ExecServerClient::connect(
        supervisor::ExecServerClientConnectOptions::new(url.clone())
            .with_auth_token(Some(TOKEN.into())),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(refused, supervisor::ExecServerError::PlainTextToken { .. }),
        "{refused}"
    );
    assert!(
        !tripwire.touched_within(Duration::ZERO),
        "connected to {url}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wss_listener_serves_clients_that_trust_its_ca() {
    let setup = Setup::new(None);
    let ca = tests::relay::TestCa::generate();
    // The key beside the token, outside /tmp (a sandbox's private layer there would hide it
    // whatever the server does).
    let key_file = setup.token_file.with_file_name("server-key.pem");
    std::fs::copy(&ca.key_file, &key_file).unwrap();
    let server = setup.start(
        None,
        &[
            "--listen",
            "wss://127.0.0.1:0",
            "--tls-cert",
            ca.cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
    );
    let url = server.url().to_owned();
    assert!(url.starts_with("wss://127.0.0.1:"), "{url}");
    // exec with the CA: runs.
    let exec = |extra: &[&str]| {
        let mut command = Command::new(setup.bin.join("exec-server"));
        command
            .args(["exec", "--connect", &url, "--cwd", "/"])
            .args(extra)
            .args(["--", "/bin/echo", "over wss"]);
        command
    };
    let ca_file = ca.ca_file.to_str().unwrap();
    let (status, stdout, stderr) = tokio::task::spawn_blocking({
        let mut command = exec(&["--ca-file", ca_file]);
        move || output_within(&mut command, b"")
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "over wss\n");
    // Without the CA the certificate is not trusted: TLS is verified, not only offered.
    let (status, _, stderr) = tokio::task::spawn_blocking({
        let mut command = exec(&[]);
        move || output_within(&mut command, b"")
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(255), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("certificate") || stderr.contains("no trusted root"),
        "{stderr}"
    );
    // The listener's private key is hidden from sandboxed commands like the token file; the
    // same command unsandboxed (the control) reads it.
    let key = key_file.to_str().unwrap();
    for (sandbox, readable) in [(None, true), (Some("read-only"), false)] {
        let mut extra = vec!["--ca-file", ca_file];
        extra.extend(
            sandbox
                .map(|name| ["--sandbox", name])
                .into_iter()
                .flatten(),
        );
        let mut command = Command::new(setup.bin.join("exec-server"));
        command
            .args(["exec", "--connect", &url, "--cwd", "/"])
            .args(&extra)
            .args(["--", "/bin/cat", key]);
        let (_, stdout, stderr) =
            tokio::task::spawn_blocking(move || output_within(&mut command, b""))
                .await
                .unwrap();
        assert_eq!(
            stdout.contains("PRIVATE KEY"),
            readable,
            "sandbox {sandbox:?}: {stdout} {stderr}"
        );
    }
    // The library client, with the CA.
    let client = supervisor::ExecServerClient::connect(
        supervisor::ExecServerClientConnectOptions::new(url.replace("127.0.0.1", "localhost"))
            .with_ca_file(Some(ca.ca_file.clone())),
    )
    .await
    .unwrap();
    client.close();
    // A plain-text client gets no websocket from a TLS listener.
    assert!(
        tests::Client::connect(&url.replace("wss://", "ws://"))
            .await
            .is_err()
    );
}

#[test]
fn a_non_loopback_listen_without_tls_or_without_a_token_is_refused_at_startup() {
    let setup = Setup::new(None);
    let ca = tests::relay::TestCa::generate();
    let token = setup.token_file.to_str().unwrap();
    let (cert, key) = (
        ca.cert_file.to_str().unwrap(),
        ca.key_file.to_str().unwrap(),
    );
    let refused = |args: &[&str], says: &[&str]| {
        let refused = ExecServer::run_expecting_exit(args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {refused:?}");
        assert!(
            refused.stdout.is_empty(),
            "no URL may be printed: {refused:?}"
        );
        for needle in says {
            assert!(refused.stderr.contains(needle), "{args:?}: {refused:?}");
        }
    };
    // Plain text beyond loopback, even with a token.
    refused(
        &["--listen", "ws://0.0.0.0:0", "--auth-token-file", token],
        &["in clear", "wss://", "--tls-cert"],
    );
    // TLS beyond loopback still needs the token.
    refused(
        &[
            "--listen",
            "wss://0.0.0.0:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
        &["bearer token", "--auth-token-file"],
    );
    // wss:// without its certificate, a certificate without wss://.
    refused(
        &["--listen", "wss://127.0.0.1:0"],
        &["--tls-cert PEM and --tls-key PEM"],
    );
    refused(
        &[
            "--listen",
            "ws://127.0.0.1:0",
            "--tls-cert",
            cert,
            "--tls-key",
            key,
        ],
        &["listen on wss://"],
    );
    // And the accepted form starts, answering only over TLS.
    let server = ExecServer::start(&[
        "--listen",
        "wss://0.0.0.0:0",
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--auth-token-file",
        token,
    ]);
    assert!(
        server.url().starts_with("wss://0.0.0.0:"),
        "{}",
        server.url()
    );
}

/// The socket inodes of process `pid` that listen on TCP (v4 or v6).
fn listening_tcp_sockets(pid: u32) -> Vec<String> {
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|table| {
            std::fs::read_to_string(table)
                .unwrap()
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let columns: Vec<&str> = line.split_whitespace().collect();
                    // st 0A is LISTEN; the inode is the tenth column.
                    (columns.get(3) == Some(&"0A"))
                        .then(|| columns.get(9).map(|s| (*s).to_owned()))?
                })
                .collect::<Vec<_>>()
        })
        .filter(|inode| fds.contains(inode))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_mode_opens_no_local_listener_unless_asked() {
    use tests::relay::{EXECUTOR_TOKEN, TOKEN as HARNESS_TOKEN, start_rendezvous};
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let mut executor = Command::new(tests::exec_server_binary())
        .args(["--remote", &registry, "--environment-id", "env-unlistened"])
        .arg("--identity-file")
        .arg(&identity)
        .env(supervisor::relay::EXECUTOR_TOKEN_ENV, EXECUTOR_TOKEN)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // It serves through the rendezvous (exec waits for the registration)...
    let (status, stdout, stderr) = tokio::task::spawn_blocking({
        let registry = registry.clone();
        move || {
            let mut command = Command::new(tests::exec_server_binary());
            command
                .args(["exec", "--remote", &registry])
                .args(["--environment-id", "env-unlistened", "--cwd", "/"])
                .args(["--", "/bin/echo", "relayed"])
                .env(supervisor::relay::REGISTRY_TOKEN_ENV, HARNESS_TOKEN);
            output_within(&mut command, b"")
        }
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "relayed\n");
    // ...and listens on nothing.
    let listening = listening_tcp_sockets(executor.id());
    let _ = executor.kill();
    let _ = executor.wait();
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut executor.stdout.take().unwrap(), &mut printed).unwrap();
    assert!(listening.is_empty(), "listening sockets: {listening:?}");
    assert_eq!(printed, "", "no local URL is printed");
    // Control: asked for one (--listen), an executor listens, and the count above would show it.
    let asked = tests::relay::start_executor(&registry, "env-listened").await;
    assert!(
        asked.first_line.starts_with("ws://127.0.0.1:"),
        "{}",
        asked.first_line
    );
    assert!(!listening_tcp_sockets(asked.pid()).is_empty());
}
