//! The egress group: a sandboxed client through `egress-proxy` against a direct connection.
//!
//! The egress proxy: bytes and connections from inside a sandbox whose network is an allowlist
//! (through `egress-proxy`) against the same client connecting directly over loopback.

use std::io::Read;
use std::process::{Command, Stdio};

use crate::bin_dir;
use crate::table::{Row, summary_ms, throughput_row};

/// The client, run directly and inside the sandbox: `bulk MIB` sends MIB MiB of an opaque
/// protocol and waits for the sink's one-byte acknowledgement, printing MiB/s; `post MIB` sends
/// the same bytes as the body of one HTTP POST (`Content-Length`); `connect N` opens N
/// connections, each until its first echoed byte, printing each time in milliseconds. Through
/// the proxy (`HTTPS_PROXY` set) each connection is a CONNECT tunnel.
const EGRESS_CLIENT: &str = r#"
import os, socket, sys, time
mode, count, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get('HTTPS_PROXY')
def connect():
    if not proxy:
        return socket.create_connection(('127.0.0.1', port))
    s = socket.create_connection(('127.0.0.1', int(proxy.rsplit(':', 1)[1])))
    s.sendall(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n' % port)
    head = b''
    while not head.endswith(b'\r\n\r\n'):
        head += s.recv(1)
    assert head.startswith(b'HTTP/1.1 200'), head
    return s
if mode == 'tlspost':
    import ssl
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    s = context.wrap_socket(connect())
    s.sendall(b'POST /upload HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n' % (port, count << 20))
    block = memoryview(bytearray(1 << 20))
    started = time.perf_counter()
    for _ in range(count):
        s.sendall(block)
    answer = b''
    while not answer.endswith(b'k'):
        chunk = s.recv(4096)
        assert chunk, answer
        answer += chunk
    print(count / (time.perf_counter() - started))
elif mode in ('bulk', 'post'):
    s = connect()
    if mode == 'bulk':
        s.sendall(b'B')
    else:
        s.sendall(b'POST /upload HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n' % (port, count << 20))
    block = memoryview(bytearray(1 << 20))
    started = time.perf_counter()
    for _ in range(count):
        s.sendall(block)
    s.shutdown(socket.SHUT_WR)
    assert s.recv(1) == b'k'
    print(count / (time.perf_counter() - started))
else:
    for _ in range(count):
        started = time.perf_counter()
        s = connect()
        s.sendall(b'E')
        assert s.recv(1) == b'E'
        print((time.perf_counter() - started) * 1000)
        s.close()
"#;

/// A sink on 127.0.0.1: `E` echoed; anything else (`B`, or a POST) read until EOF, answered
/// with `k`.
fn egress_sink() -> u16 {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut first = [0u8; 1];
                if stream.read_exact(&mut first).is_err() {
                    return;
                }
                if first[0] == b'E' {
                    let _ = stream.write_all(b"E");
                    return;
                }
                let mut buf = vec![0u8; 1 << 20];
                while stream.read(&mut buf).is_ok_and(|n| n > 0) {}
                let _ = stream.write_all(b"k");
            });
        }
    });
    port
}

/// A TLS sink on 127.0.0.1 (a certificate for the address from a fresh test CA): reads one
/// HTTP request with a `Content-Length` body, answers 200 with the body `k`. Returns its port
/// and the CA's PEM.
fn tls_sink() -> (u16, String) {
    use std::io::Write;
    use std::sync::Arc;
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
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
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let config = Arc::clone(&config);
            std::thread::spawn(move || {
                let connection = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut buf = vec![0u8; 1 << 20];
                let mut head = Vec::new();
                let end = loop {
                    if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                };
                let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
                let length: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0));
                let mut left = length.saturating_sub(head.len() - end);
                while left > 0 {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => left = left.saturating_sub(n),
                    }
                }
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nk");
                let _ = tls.flush();
            });
        }
    });
    (port, ca.pem())
}

/// Runs [`EGRESS_CLIENT`] directly or inside `sandbox-run --allow-domain 127.0.0.1:PORT`
/// (with the pattern's `setting`, e.g. ` tunnel=any`); returns the numbers it printed.
fn egress_client(sandboxed: bool, mode: &str, count: usize, port: u16, setting: &str) -> Vec<f64> {
    egress_client_trusting(sandboxed, mode, count, port, setting, None)
}

/// [`egress_client`], `sandbox-run` given `SSL_CERT_FILE=roots` (the inspection's upstream
/// roots) when `roots` is set.
fn egress_client_trusting(
    sandboxed: bool,
    mode: &str,
    count: usize,
    port: u16,
    setting: &str,
    roots: Option<&std::path::Path>,
) -> Vec<f64> {
    let args = [mode.to_owned(), count.to_string(), port.to_string()];
    let mut command = if sandboxed {
        let mut command = Command::new(bin_dir().join("sandbox-run"));
        command.env_clear();
        if let Some(roots) = roots {
            command.env("SSL_CERT_FILE", roots);
        }
        command
            .args(["--policy", "read-only", "--allow-domain"])
            .arg(format!("127.0.0.1:{port}{setting}"))
            .args(["--", "/usr/bin/python3", "-c", EGRESS_CLIENT]);
        command
    } else {
        let mut command = Command::new("/usr/bin/python3");
        command.env_clear().args(["-c", EGRESS_CLIENT]);
        command
    };
    let output = command
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "egress client {mode} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| line.trim().parse::<f64>().unwrap())
        .collect()
}

/// The floor of the proxy's topology: a bare relay on 127.0.0.1 (no sandbox, no policy, no
/// handshake) that splices each connection to the sink through a pipe as the proxy does, so
/// its bytes cross the same two loopback TCP hops.
fn splice_relay(sink: u16) -> u16 {
    fn pump(from: std::net::TcpStream, to: std::net::TcpStream) {
        use std::os::fd::{AsFd, BorrowedFd};
        let (pipe_out, pipe_in) = nix::unistd::pipe().unwrap();
        let _ = nix::fcntl::fcntl(&pipe_in, nix::fcntl::FcntlArg::F_SETPIPE_SZ(256 * 1024));
        // An error ends the relay as end of file does.
        let splice = |from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize| {
            crate::sys::splice(from, to, len).unwrap_or(0)
        };
        loop {
            let mut pending = splice(from.as_fd(), pipe_in.as_fd(), 256 * 1024);
            if pending == 0 {
                break;
            }
            while pending > 0 {
                let sent = splice(pipe_out.as_fd(), to.as_fd(), pending);
                if sent == 0 {
                    return;
                }
                pending -= sent;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let upstream = std::net::TcpStream::connect(("127.0.0.1", sink)).unwrap();
            let (client_reader, upstream_writer) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            std::thread::spawn(move || pump(client_reader, upstream_writer));
            std::thread::spawn(move || pump(upstream, client));
        }
    });
    port
}

pub(crate) fn egress_proxy(rows: &mut Vec<Row>, mib: usize, runs: usize, connects: usize) {
    let port = egress_sink();
    let relay = splice_relay(port);
    // Opaque bytes need `tunnel=any` (the proxy scans them for a TLS ClientHello); an HTTP body
    // passes the default checked tunnel by count (spliced).
    const ANY: &str = " tunnel=any";
    let (mut proxied, mut bare, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let (mut posted, mut bare_posted) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        proxied.extend(egress_client(true, "bulk", mib, port, ANY));
        bare.extend(egress_client(false, "bulk", mib, relay, ""));
        direct.extend(egress_client(false, "bulk", mib, port, ""));
        posted.extend(egress_client(true, "post", mib, port, ""));
        bare_posted.extend(egress_client(false, "post", mib, relay, ""));
    }
    rows.push(throughput_row(
        format!(
            "{mib} MiB through the egress proxy (CONNECT tunnel, opaque bytes, tunnel=any) vs \
             direct loopback TCP ({runs} runs)"
        ),
        (proxied.clone(), ""),
        (direct.clone(), " direct"),
        70.0,
    ));
    let mut floor = throughput_row(
        format!(
            "{mib} MiB through a bare splice relay (the same two loopback hops, no sandbox) vs \
             direct: the topology's floor"
        ),
        (bare.clone(), " bare relay"),
        (direct, " direct"),
        0.0,
    );
    floor.target = "floor reported".into();
    floor.holds = None;
    rows.push(floor);
    rows.push(throughput_row(
        format!(
            "{mib} MiB through the egress proxy vs the bare splice relay (opaque bytes, \
             tunnel=any: every byte scanned for a TLS ClientHello)"
        ),
        (proxied, ""),
        (bare, " bare relay"),
        85.0,
    ));
    rows.push(throughput_row(
        format!(
            "{mib} MiB as one HTTP POST body through the egress proxy (default checked tunnel: \
             head checked, body spliced by count) vs the bare splice relay"
        ),
        (posted, ""),
        (bare_posted, " bare relay"),
        85.0,
    ));
    let (tls_port, ca) = tls_sink();
    let roots =
        std::env::temp_dir().join(format!("execward-bench-roots-{}.pem", std::process::id()));
    std::fs::write(&roots, ca).unwrap();
    let (mut inspected, mut tunnelled) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        inspected.extend(egress_client_trusting(
            true,
            "tlspost",
            mib,
            tls_port,
            " methods=POST inspect=true",
            Some(&roots),
        ));
        tunnelled.extend(egress_client(true, "tlspost", mib, tls_port, ""));
    }
    let _ = std::fs::remove_file(&roots);
    let mut row = throughput_row(
        format!(
            "{mib} MiB as one HTTPS POST body through the egress proxy with inspect=true (TLS \
             terminated and re-encrypted, the request checked) vs the plain CONNECT tunnel"
        ),
        (inspected, " inspected"),
        (tunnelled, " tunnel"),
        0.0,
    );
    row.target = "cost reported".into();
    row.holds = None;
    rows.push(row);
    let (ours, ours_text) = summary_ms(egress_client(true, "connect", connects, port, ANY));
    let (base, base_text) = summary_ms(egress_client(false, "connect", connects, port, ""));
    rows.push(Row {
        figure: format!(
            "connect + first byte through the egress proxy vs direct ({connects} connections)"
        ),
        ours: ours_text,
        baseline: base_text,
        ratio: format!("+{:.2} ms", ours - base),
        target: "added latency reported".into(),
        holds: None,
    });
}
