//! `network.upstream` on the wire: the upstream proxy sees exactly the allowed connections.

use super::*;

/// A recording upstream HTTP proxy: records every request head, answers `CONNECT NAME:PORT`
/// with 200 and relays the tunnel to `127.0.0.1:PORT` (every name is this host here).
struct Upstream {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl Upstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&heads);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut client) = stream else { continue };
                let recorded = Arc::clone(&recorded);
                std::thread::spawn(move || {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match client.read(&mut byte) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => head.push(byte[0]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    recorded.lock().unwrap().push(head.clone());
                    let target = head.split_whitespace().nth(1).unwrap_or_default();
                    let port = target.rsplit_once(':').map_or("0", |(_, p)| p).to_owned();
                    let Ok(server) = TcpStream::connect(format!("127.0.0.1:{port}")) else {
                        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                        return;
                    };
                    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                    let (mut up_from, mut up_to) =
                        (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut up_from, &mut up_to);
                        let _ = up_to.shutdown(std::net::Shutdown::Write);
                    });
                    let (mut down_from, mut down_to) = (server, client);
                    let _ = std::io::copy(&mut down_from, &mut down_to);
                    let _ = down_to.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Self { port, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// `network.upstream` on the wire (root and 65534, launcher and one-shot servers): the allowed
/// name leaves through the upstream as `CONNECT registry.test:PORT` (the name is not resolved
/// by the egress proxy: the upstream resolves it), the refused one never reaches it. The
/// control: the upstream records a refused name when asked directly from the host.
#[tokio::test]
async fn network_upstream_on_the_wire_sees_exactly_the_allowed_connections() {
    let origin = Origin::start();
    let upstream = Upstream::start();
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let setup = Setup::new(uid);
            let server = setup.start_with(uid, args);
            let mut client = server.client().await;
            let seen = upstream.heads().len();
            let script = format!(
                "curl -sS -m 10 http://registry.test:{p}/; curl -sS -m 10 http://other.test:{p}/",
                p = origin.port
            );
            let out = client
                .run(
                    "upstream",
                    &["/bin/sh", "-c", &script],
                    json!({
                        "sandbox": {
                            "profile": "workspace-write",
                            "cwd": file_uri(&setup.workspace),
                            "network": {
                                "allow": [format!("registry.test:{}", origin.port)],
                                "upstream": format!("http://127.0.0.1:{}", upstream.port),
                            },
                        },
                        "cwd": file_uri(&setup.workspace),
                    }),
                )
                .await;
            let stdout = out.stdout_text();
            assert_eq!(
                stdout.matches("hello from origin").count(),
                1,
                "{uid:?} {args:?}: {out:?}"
            );
            assert!(
                stdout.contains("refused other.test"),
                "{uid:?} {args:?}: {out:?}"
            );
            let heads = upstream.heads()[seen..].to_vec();
            assert_eq!(heads.len(), 1, "{uid:?} {args:?}: {heads:?}");
            assert!(
                heads[0].starts_with(&format!(
                    "CONNECT registry.test:{} HTTP/1.1\r\n",
                    origin.port
                )),
                "{uid:?} {args:?}: {heads:?}"
            );
        }
    }
    // Control: asked directly, the upstream records any name.
    let seen = upstream.heads().len();
    let mut direct = TcpStream::connect(("127.0.0.1", upstream.port)).unwrap();
    write!(
        direct,
        "CONNECT other.test:{} HTTP/1.1\r\n\r\n",
        origin.port
    )
    .unwrap();
    let mut answer = [0u8; 12];
    direct.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    assert!(upstream.heads()[seen..][0].starts_with("CONNECT other.test:"));
}
