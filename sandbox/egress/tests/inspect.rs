//! `inspect = true`: the egress proxy terminates TLS with a per-sandbox CA, checks every
//! request inside against the pattern's methods/paths, and verifies the destination against
//! its upstream roots. The proxy runs in this process (its accept loop on a loopback listener)
//! against a local HTTPS origin with a certificate from a test CA; the client trusts only the
//! proxy's CA. Each case has a control showing what passes without inspection.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress::server::{Proxy, serve};
use egress::terminate::Terminator;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sandbox::egress::ProxyConfig;
use sandbox::egress::config::EgressEvent;
use sandbox::policy::EgressRules;

const ORIGIN: &str = "origin.test";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA: its PEM, and a server configuration for `name` signed by it.
fn test_ca(name: &str) -> (String, Arc<rustls::ServerConfig>) {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )
        .unwrap();
    (ca.pem(), Arc::new(config))
}

/// An HTTPS origin recording the request line of every request, answering each with 200.
struct Origin {
    port: u16,
    ca_pem: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    fn start() -> Self {
        let (ca_pem, config) = test_ca(ORIGIN);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, recorded) = (Arc::clone(&config), Arc::clone(&recorded));
                std::thread::spawn(move || serve_origin(stream, config, &recorded));
            }
        });
        Self { port, ca_pem, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve_origin(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    recorded: &Mutex<Vec<String>>,
) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let connection = rustls::ServerConnection::new(config).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() < end + 4 + length {
                break;
            }
            buf.drain(..end + 4 + length);
            let line = head.lines().next().unwrap_or_default().to_owned();
            recorded.lock().unwrap().push(line.clone());
            let body = format!("origin saw {line}\n");
            let _ = write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.flush();
        }
        match tls.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A proxy in this process for `patterns`, its upstream roots `roots`; returns its port, its
/// CA (PEM) when it inspects, and where its events go.
fn start_proxy(patterns: &[String], roots: &str) -> (u16, Option<String>, tempfile::NamedTempFile) {
    let rules = EgressRules::parse(patterns, &[]).unwrap();
    let config = ProxyConfig {
        rules,
        denied_ports: Vec::new(),
        hosts: vec![(ORIGIN.to_owned(), IpAddr::V4(Ipv4Addr::LOCALHOST))],
        upstream_authorization: None,
        ask: None,
        upstream_roots: Some(vec![roots.to_owned()]),
    };
    let terminator = config
        .rules
        .inspects_any()
        .then(|| Terminator::new(config.upstream_roots.as_deref()).unwrap());
    let ca = terminator.as_ref().map(Terminator::ca_pem);
    let events = tempfile::NamedTempFile::new().unwrap();
    let file = events.reopen().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = Proxy::new(config, Vec::new(), file).with_terminator(terminator);
    std::thread::spawn(move || serve(listener, proxy));
    (port, ca, events)
}

fn events(file: &tempfile::NamedTempFile) -> Vec<EgressEvent> {
    std::fs::read_to_string(file.path())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// `CONNECT`s through the proxy, speaks TLS trusting `ca` only, sends `requests` (each a
/// method and a path) on one connection; returns what came back (or the error that ended it).
fn through(proxy: u16, origin: u16, ca: &str, requests: &[(&str, &str)]) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", proxy)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "CONNECT {ORIGIN}:{origin} HTTP/1.1\r\nHost: {ORIGIN}:{origin}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).unwrap() == 0 {
            return format!("CONNECT answered: {}", String::from_utf8_lossy(&head));
        }
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca.as_bytes()) {
        let cert: CertificateDer<'static> = cert.unwrap();
        roots.add(cert).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connection = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from(ORIGIN.to_owned()).unwrap(),
    )
    .unwrap();
    let mut tls = rustls::StreamOwned::new(connection, stream);
    let mut out = String::new();
    for (method, path) in requests {
        let sent = write!(
            tls,
            "{method} {path} HTTP/1.1\r\nHost: {ORIGIN}:{origin}\r\nContent-Length: 2\r\n\r\nhi"
        )
        .and_then(|()| tls.flush());
        if let Err(err) = sent {
            out.push_str(&format!("[error: {err}]"));
            return out;
        }
        match read_response(&mut tls) {
            Ok(Some(answer)) => out.push_str(&answer),
            Ok(None) => {
                out.push_str("[closed]");
                return out;
            }
            Err(err) => {
                out.push_str(&format!("[error: {err}]"));
                return out;
            }
        }
    }
    out
}

/// One response (head and `Content-Length` body); `None` at a close before any byte.
fn read_response(tls: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + length {
                return Ok(Some(String::from_utf8_lossy(&buf).to_string()));
            }
        }
        let n = tls.read(&mut chunk)?;
        if n == 0 {
            return Ok((!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).to_string()));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn inspected_https_passes_get_and_refuses_post_with_a_record() {
    let origin = Origin::start();
    let pattern = format!("{ORIGIN}:{} methods=read-only inspect=true", origin.port);
    let (proxy, ca, log) = start_proxy(
        &[pattern, format!("127.0.0.1:{}", origin.port)],
        &origin.ca_pem,
    );
    let ca = ca.expect("an inspecting proxy has a CA");
    let answer = through(
        proxy,
        origin.port,
        &ca,
        &[("GET", "/simple/"), ("POST", "/upload")],
    );
    assert!(
        answer.contains("origin saw GET /simple/ HTTP/1.1"),
        "{answer}"
    );
    assert!(!answer.contains("POST"), "{answer}");
    assert!(
        answer.ends_with("[closed]") || answer.contains("[error"),
        "{answer}"
    );
    assert_eq!(origin.seen(), ["GET /simple/ HTTP/1.1"]);
    let events = events(&log);
    let refused: Vec<_> = events.iter().filter(|e| !e.allowed).collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    let reason = refused[0].reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("POST /upload") && reason.contains("methods=GET,HEAD,OPTIONS"),
        "{reason}"
    );
    // The client trusting the origin's own CA (not the proxy's) is refused: the proxy answers
    // with its leaf, and the origin still saw nothing more.
    let answer = through(proxy, origin.port, &origin.ca_pem, &[("GET", "/simple/")]);
    assert!(
        answer.contains("[error") && answer.contains("UnknownIssuer"),
        "{answer}"
    );
    assert_eq!(origin.seen().len(), 1);
}

#[test]
fn without_inspection_the_tunnel_carries_the_post_unseen() {
    // Control: the same origin allowed without methods/paths: TLS passes end to end (the
    // client trusts the origin's CA itself) and the POST reaches the origin.
    let origin = Origin::start();
    let (proxy, ca, _log) = start_proxy(
        &[
            format!("{ORIGIN}:{}", origin.port),
            format!("127.0.0.1:{}", origin.port),
        ],
        &origin.ca_pem,
    );
    assert!(ca.is_none());
    let answer = through(proxy, origin.port, &origin.ca_pem, &[("POST", "/upload")]);
    assert!(answer.contains("origin saw POST /upload"), "{answer}");
    assert_eq!(origin.seen(), ["POST /upload HTTP/1.1"]);
}

#[test]
fn limited_https_without_inspect_is_refused_before_any_tls() {
    // Control for the limit: methods= without inspect=true cannot see inside TLS; the tunnel
    // is refused on its ClientHello and the origin sees nothing.
    let origin = Origin::start();
    let (proxy, ca, log) = start_proxy(
        &[
            format!("{ORIGIN}:{} methods=read-only", origin.port),
            format!("127.0.0.1:{}", origin.port),
        ],
        &origin.ca_pem,
    );
    assert!(ca.is_none());
    let answer = through(proxy, origin.port, &origin.ca_pem, &[("GET", "/simple/")]);
    assert!(!answer.contains("origin saw"), "{answer}");
    assert!(origin.seen().is_empty());
    assert!(
        events(&log)
            .iter()
            .any(|e| !e.allowed && e.rule.contains("inspect=true")),
        "{:?}",
        events(&log)
    );
}

#[test]
fn an_origin_the_upstream_roots_do_not_trust_is_refused_and_told() {
    let origin = Origin::start();
    // The proxy trusts another CA: the origin's certificate is not verified.
    let (other_ca, _) = test_ca("other.test");
    let pattern = format!("{ORIGIN}:{} methods=read-only inspect=true", origin.port);
    let (proxy, ca, log) = start_proxy(&[pattern, format!("127.0.0.1:{}", origin.port)], &other_ca);
    let answer = through(proxy, origin.port, &ca.unwrap(), &[("GET", "/simple/")]);
    assert!(
        answer.contains("502") && answer.contains("not trusted"),
        "{answer}"
    );
    assert!(origin.seen().is_empty());
    let events = events(&log);
    assert!(
        events.iter().any(|e| !e.allowed
            && e.reason
                .as_deref()
                .is_some_and(|r| r.contains("not trusted by this host")
                    && r.contains("invalid peer certificate"))),
        "{events:?}"
    );
}
