//! TLS termination for destinations whose pattern says `inspect=true`: the proxy answers the
//! client's TLS with a certificate for the destination's name from a per-sandbox CA, opens its
//! own TLS to the destination (verified against the host's roots), and relays the plaintext
//! between the two through the same [`Inspector`](super::inspect::Inspector) a plain-HTTP
//! tunnel goes through, so that every request inside is checked (`methods=`, `paths=`).
//!
//! The CA is made when the proxy starts; its key lives in the proxy's memory only (never in a
//! file, an argument or the environment). Only HTTP/1.1 is offered (ALPN `http/1.1`): the
//! checks read HTTP/1.x.
//!
//! Each terminated connection is two TLS endpoints, each a thread moving bytes between its TCP
//! socket and one end of a socket pair; the tunnel relays between the pairs' other ends.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};

use sandbox::policy::network::Host;

use super::{HANDSHAKE_TIMEOUT, IDLE_TIMEOUT, RELAY_BUFFER_BYTES};

/// The ALPN protocol offered on both sides.
const HTTP_1_1: &[u8] = b"http/1.1";

/// Leaf certificates kept per sandbox (one per inspected name; more are minted again).
const MAX_LEAVES: usize = 256;

/// The per-sandbox CA and the upstream trust.
pub struct Terminator {
    ca: CertifiedIssuer<'static, KeyPair>,
    upstream: Arc<ClientConfig>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

/// Why a connection could not be terminated.
#[derive(Debug)]
pub enum TerminateError {
    /// The destination's certificate is not trusted, or its TLS failed: a refusal.
    Upstream(String),
    /// The client's TLS failed (it does not trust the CA, pinned a key, or went away).
    Client(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Terminator {
    /// A new CA, and the upstream trust: `roots` (PEM certificates) when given, else the
    /// host's trust store (`rustls-native-certs`: the system bundle). Read before the proxy
    /// confines itself.
    ///
    /// # Errors
    /// Why the CA or the trust store could not be made.
    pub fn new(roots: Option<&[String]>) -> Result<Self, String> {
        let mut store = RootCertStore::empty();
        match roots {
            Some(pems) => {
                for pem in pems {
                    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes()) {
                        let cert: CertificateDer<'static> =
                            cert.map_err(|err| format!("an upstream root: {err}"))?;
                        store
                            .add(cert)
                            .map_err(|err| format!("an upstream root: {err}"))?;
                    }
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err("the host's trust store holds no usable certificate".to_owned());
                }
            }
        }
        let mut upstream = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|err| err.to_string())?
            .with_root_certificates(store)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![HTTP_1_1.to_vec()];
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "execward per-sandbox inspection CA");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(|err| err.to_string())?;
        let ca = CertifiedIssuer::self_signed(params, key).map_err(|err| err.to_string())?;
        Ok(Self {
            ca,
            upstream: Arc::new(upstream),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate (public part), PEM: what the sandbox is made to trust.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The client side's configuration for `name`: a leaf for it signed by the CA.
    fn leaf(&self, name: &str) -> Result<Arc<ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = leaves.get(name) {
            return Ok(Arc::clone(config));
        }
        let mut params =
            CertificateParams::new(vec![name.to_owned()]).map_err(|err| err.to_string())?;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(|err| err.to_string())?;
        let cert = params
            .signed_by(&key, &self.ca)
            .map_err(|err| err.to_string())?;
        let key = PrivateKeyDer::try_from(key.serialize_der()).map_err(|err| err.to_owned())?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|err| err.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.ca.der().clone()], key)
            .map_err(|err| err.to_string())?;
        config.alpn_protocols = vec![HTTP_1_1.to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name.to_owned(), Arc::clone(&config));
        Ok(config)
    }

    /// Completes TLS with the destination (`upstream`, verified as `host`) and then with the
    /// client (`first`: its bytes already read), and starts the two endpoints. Returns the
    /// plaintext ends: (towards the client, towards the destination), as streams the tunnel
    /// relays between.
    ///
    /// # Errors
    /// [`TerminateError::Upstream`] when the destination is not trusted (`refused` is called
    /// with why, then the client is told why over TLS, in a 502 answer); [`TerminateError::Client`] when the client's TLS
    /// failed.
    pub fn terminate(
        &self,
        client: TcpStream,
        first: &[u8],
        upstream: TcpStream,
        host: &Host,
        refused: impl FnOnce(&str),
    ) -> Result<(TcpStream, TcpStream), TerminateError> {
        let name = host.to_string();
        let server_name = ServerName::try_from(name.clone())
            .map_err(|err| TerminateError::Upstream(format!("{name}: {err}")))?;
        let leaf = self.leaf(&name).map_err(TerminateError::Client)?;
        let mut outer = rustls::ServerConnection::new(leaf)
            .map_err(|err| TerminateError::Client(err.to_string()))?;
        let mut fed = first;
        while !fed.is_empty() {
            if outer.read_tls(&mut fed).is_err() {
                return Err(TerminateError::Client("unreadable ClientHello".to_owned()));
            }
        }
        let mut outer = Connection::from(outer);
        let inner = ClientConnection::new(Arc::clone(&self.upstream), server_name)
            .map_err(|err| TerminateError::Upstream(err.to_string()))?;
        let mut inner = Connection::from(inner);
        let mut upstream = upstream;
        let mut client = client;
        if let Err(err) = handshake(&mut inner, &mut upstream) {
            let why = format!("the TLS of {name} failed or is not trusted by this host: {err}");
            // Recorded before the client hears of it.
            refused(&why);
            // Tell the client why, over TLS it trusts, when it still listens.
            if handshake(&mut outer, &mut client).is_ok() {
                let body = format!("execward: refused: {why}\n");
                let _ = write!(
                    outer.writer(),
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                outer.send_close_notify();
                while outer.wants_write() && outer.write_tls(&mut client).is_ok() {}
                linger(&mut client);
            }
            return Err(TerminateError::Upstream(why));
        }
        handshake(&mut outer, &mut client).map_err(TerminateError::Client)?;
        if let Connection::Server(server) = &outer
            && let Some(sni) = server.server_name()
            && !sni.eq_ignore_ascii_case(&name)
        {
            return Err(TerminateError::Client(format!(
                "the client's TLS names {sni:?}, not {name}"
            )));
        }
        let plain = |what: &str| {
            UnixStream::pair().map_err(|err| TerminateError::Client(format!("{what}: {err}")))
        };
        let (client_plain, client_inner) = plain("socket pair")?;
        let (upstream_plain, upstream_inner) = plain("socket pair")?;
        for (connection, tcp, inner) in [
            (outer, client, client_inner),
            (inner, upstream, upstream_inner),
        ] {
            std::thread::Builder::new()
                .name("egress-tls".to_owned())
                .stack_size(super::THREAD_STACK_BYTES)
                .spawn(move || endpoint(connection, tcp, inner))
                .map_err(|err| TerminateError::Client(err.to_string()))?;
        }
        Ok((as_stream(client_plain), as_stream(upstream_plain)))
    }
}

/// Half-closes `client` and reads what it still sends (its request, sent before it read the
/// answer) for a moment: closing with unread bytes would reset the connection and lose the
/// answer.
fn linger(client: &mut TcpStream) {
    let _ = client.shutdown(Shutdown::Write);
    let deadline = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    while let Ok(n) = super::read_before(client, &mut sink, deadline) {
        if n == 0 {
            break;
        }
    }
}

/// How long [`linger`] waits for the client to close.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// A socket-pair end as the stream type the tunnel takes: it only reads, writes, shuts down
/// and splices, which a Unix stream socket does alike.
fn as_stream(stream: UnixStream) -> TcpStream {
    TcpStream::from(std::os::fd::OwnedFd::from(stream))
}

/// Drives `connection`'s handshake on `tcp` within [`HANDSHAKE_TIMEOUT`].
fn handshake(connection: &mut Connection, tcp: &mut TcpStream) -> Result<(), String> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    while connection.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the TLS handshake took too long".to_owned());
        }
        let _ = tcp.set_read_timeout(Some(left));
        match connection.complete_io(tcp) {
            Ok((0, 0)) if connection.is_handshaking() => {
                return Err("the peer closed during the TLS handshake".to_owned());
            }
            Ok(_) => {}
            Err(err) => {
                // Send the alert (an unknown CA, a bad name) before closing.
                while connection.wants_write() && connection.write_tls(tcp).is_ok() {}
                return Err(err.to_string());
            }
        }
    }
    while connection.wants_write() {
        connection.write_tls(tcp).map_err(|err| err.to_string())?;
    }
    let _ = tcp.set_read_timeout(None);
    Ok(())
}

/// One TLS endpoint: ciphertext on `tcp`, plaintext on `plain`, until both sides ended, one
/// failed, or nothing moved for [`IDLE_TIMEOUT`].
fn endpoint(mut connection: Connection, mut tcp: TcpStream, mut plain: UnixStream) {
    let mut buf = vec![0u8; RELAY_BUFFER_BYTES];
    let (mut tcp_done, mut plain_done) = (false, false);
    let idle_ms = i32::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
    // Plaintext that arrived with the end of the handshake (a request sent with the client's
    // Finished) is already inside the connection: pass it on before waiting.
    if !drain(&mut connection, &mut plain, &mut buf, &mut tcp_done) {
        return finish(&tcp, &plain);
    }
    loop {
        while connection.wants_write() {
            if connection.write_tls(&mut tcp).is_err() {
                return finish(&tcp, &plain);
            }
        }
        if tcp_done && plain_done {
            break;
        }
        // Wait for either side (a side that is done is left out of the poll).
        let (tcp_ready, plain_ready) = match readable(
            (!tcp_done).then(|| tcp.as_fd()),
            (!plain_done).then(|| plain.as_fd()),
            idle_ms,
        ) {
            Ok(Some(ready)) => ready,
            Ok(None) => break,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if tcp_ready {
            match connection.read_tls(&mut tcp) {
                Ok(0) => {
                    tcp_done = true;
                    let _ = plain.shutdown(Shutdown::Write);
                }
                Ok(_) => {}
                Err(err) if err.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
            if connection.process_new_packets().is_err() {
                while connection.wants_write() && connection.write_tls(&mut tcp).is_ok() {}
                break;
            }
            if !drain(&mut connection, &mut plain, &mut buf, &mut tcp_done) {
                return finish(&tcp, &plain);
            }
        }
        if plain_ready {
            match plain.read(&mut buf) {
                Ok(0) | Err(_) => {
                    plain_done = true;
                    connection.send_close_notify();
                    while connection.wants_write() {
                        if connection.write_tls(&mut tcp).is_err() {
                            break;
                        }
                    }
                    let _ = tcp.shutdown(Shutdown::Write);
                }
                Ok(n) => {
                    if send(&mut connection, &mut tcp, &buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    }
    finish(&tcp, &plain);
}

/// Moves the plaintext `connection` holds to `plain`; at the peer's end (close_notify, or a
/// close without it) marks `done` and half-closes `plain`. `false` when `plain` is gone.
fn drain(
    connection: &mut Connection,
    plain: &mut UnixStream,
    buf: &mut [u8],
    done: &mut bool,
) -> bool {
    loop {
        match connection.reader().read(buf) {
            Ok(0) => {
                // close_notify: the peer sends nothing more.
                *done = true;
                let _ = plain.shutdown(Shutdown::Write);
                return true;
            }
            Ok(n) => {
                if plain.write_all(&buf[..n]).is_err() {
                    return false;
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => return true,
            Err(_) => {
                *done = true;
                let _ = plain.shutdown(Shutdown::Write);
                return true;
            }
        }
    }
}

/// Encrypts `bytes` and writes them to `tcp`, as much at a time as the connection buffers.
fn send(connection: &mut Connection, tcp: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = connection.writer().write(rest)?;
        rest = &rest[n..];
        while connection.wants_write() {
            connection.write_tls(tcp)?;
        }
        if n == 0 && !rest.is_empty() && !connection.wants_write() {
            return Err(ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

fn finish(tcp: &TcpStream, plain: &UnixStream) {
    let _ = tcp.shutdown(Shutdown::Both);
    let _ = plain.shutdown(Shutdown::Both);
}

/// Which of `a` and `b` (each left out when `None`) has something to read, waiting at most
/// `timeout_ms`; `None` when neither became ready in time.
fn readable(
    a: Option<BorrowedFd<'_>>,
    b: Option<BorrowedFd<'_>>,
    timeout_ms: i32,
) -> std::io::Result<Option<(bool, bool)>> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds: Vec<PollFd<'_>> = [a, b]
        .into_iter()
        .flatten()
        .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
        .collect();
    let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX);
    if poll(&mut fds, timeout).map_err(std::io::Error::from)? == 0 {
        return Ok(None);
    }
    let mut ready = fds.iter().map(|fd| fd.any().unwrap_or(false));
    let a_ready = a.is_some() && ready.next().unwrap_or(false);
    let b_ready = b.is_some() && ready.next().unwrap_or(false);
    Ok(Some((a_ready, b_ready)))
}
