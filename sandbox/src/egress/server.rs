//! The proxy's accept loop and connection handler: plain threads and blocking sockets (the
//! proxy confines itself before any thread exists, then serves one sandbox).
//!
//! Per connection: read the request head under [`HANDSHAKE_TIMEOUT`], decide, resolve, check
//! every address, connect under [`CONNECT_TIMEOUT`], answer, then relay both directions with
//! the TLS gate on the client's first bytes ([`sni`]). The event of each decision is written
//! before the client hears the answer, so when the command has seen a refusal, its record is
//! already on its way to the outer.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::policy::network::{Decision, Host};

use super::config::{EgressEvent, ProxyConfig};
use super::http::{self, Request};
use super::sni::{self, ClientHello};
use super::socks;
use super::{
    CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, IDLE_CHECK_INTERVAL, IDLE_TIMEOUT, MAX_CLIENT_HELLO_BYTES,
    MAX_CONCURRENT_CONNECTIONS, MAX_HEADER_BYTES, RELAY_BUFFER_BYTES, TLS_PORTS,
};

/// Stack of a connection thread: buffers live on the heap.
const THREAD_STACK_BYTES: usize = 256 * 1024;

/// The pipe a direction's bytes are spliced through. Measured on 2 cores with 2 GiB bulk
/// transfers: 256 KiB beat both 64 KiB and 1 MiB (less data in flight keeps it in cache).
const SPLICE_PIPE_BYTES: usize = 256 * 1024;

/// What every connection thread shares.
pub struct Proxy {
    config: ProxyConfig,
    /// This host's addresses (the supervisor's listeners may be bound to any of them).
    local_addresses: Vec<IpAddr>,
    events: Mutex<File>,
    active: AtomicUsize,
    started: Instant,
}

impl Proxy {
    /// A proxy for `config`, writing events to `events`.
    pub fn new(config: ProxyConfig, local_addresses: Vec<IpAddr>, events: File) -> Self {
        Self {
            config,
            local_addresses,
            events: Mutex::new(events),
            active: AtomicUsize::new(0),
            started: Instant::now(),
        }
    }

    fn emit(&self, event: &EgressEvent) {
        let mut line = serde_json::to_string(event).unwrap_or_default();
        line.push('\n');
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        // One write per line (shorter than PIPE_BUF): lines never interleave. A gone outer is
        // not the proxy's problem: it is about to be killed.
        let _ = events.write_all(line.as_bytes());
    }
}

/// Serves `listener` until the process is killed (the outer kills it when the sandbox ends).
pub fn serve(listener: TcpListener, proxy: Proxy) -> ! {
    let proxy = Arc::new(proxy);
    let mut warned = false;
    loop {
        let Ok((stream, _)) = listener.accept() else {
            continue;
        };
        if proxy.active.load(Ordering::Acquire) >= MAX_CONCURRENT_CONNECTIONS {
            if !warned {
                eprintln!(
                    "egress-proxy: more than MAX_CONCURRENT_CONNECTIONS \
                     ({MAX_CONCURRENT_CONNECTIONS}) connections at once; closing the extra ones"
                );
                warned = true;
            }
            drop(stream);
            continue;
        }
        proxy.active.fetch_add(1, Ordering::AcqRel);
        let guard = ActiveGuard(Arc::clone(&proxy));
        let spawned = std::thread::Builder::new()
            .name("egress-conn".to_owned())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || {
                let proxy = Arc::clone(&guard.0);
                handle(&proxy, stream);
                drop(guard);
            });
        if spawned.is_err() {
            // The guard went with the closure and decremented the count.
            eprintln!("egress-proxy: cannot start a connection thread");
        }
    }
}

struct ActiveGuard(Arc<Proxy>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a destination could not be opened.
enum OpenError {
    /// Refused by policy; the event was emitted.
    Refused(Box<EgressEvent>),
    /// Allowed, but no address could be resolved or connected.
    Unreachable(String),
}

fn handle(proxy: &Proxy, mut client: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = client.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    let mut buf = Vec::with_capacity(1024);
    if read_more(&mut client, &mut buf).is_err() || buf.is_empty() {
        return;
    }
    if buf[0] == socks::VERSION {
        handle_socks(proxy, client, buf);
    } else {
        handle_http(proxy, client, buf);
    }
}

/// Appends what one read returns (at most up to [`MAX_HEADER_BYTES`] in total).
fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let room = MAX_HEADER_BYTES
        .saturating_sub(buf.len())
        .clamp(1, chunk.len());
    let n = stream.read(&mut chunk[..room])?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn handle_http(proxy: &Proxy, mut client: TcpStream, mut buf: Vec<u8>) {
    let request = loop {
        match http::parse(&buf) {
            Ok(Some(request)) => break request,
            Ok(None) => match read_more(&mut client, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(err) => {
                let _ = client.write_all(&http::response(
                    400,
                    "Bad Request",
                    &format!("execward egress proxy: {err}\n"),
                ));
                return;
            }
        }
    };
    let (host, port, protocol) = match &request {
        Request::Connect { host, port, .. } => (host.clone(), *port, "connect"),
        Request::Forward { host, port, .. } => (host.clone(), *port, "http"),
    };
    let upstream = match open(proxy, protocol, &host, port) {
        Ok(upstream) => upstream,
        Err(OpenError::Refused(event)) => {
            let _ = client.write_all(&http::response(
                403,
                "Forbidden",
                &format!("execward: {}\n", event.describe()),
            ));
            return;
        }
        Err(OpenError::Unreachable(why)) => {
            let _ = client.write_all(&http::response(
                502,
                "Bad Gateway",
                &format!("execward egress proxy: {host}:{port}: {why}\n"),
            ));
            return;
        }
    };
    let first = match request {
        Request::Connect { rest, .. } => {
            if client.write_all(http::CONNECT_ESTABLISHED).is_err() {
                return;
            }
            rest
        }
        Request::Forward { upstream: head, .. } => {
            let mut upstream = &upstream;
            if upstream.write_all(&head).is_err() {
                return;
            }
            Vec::new()
        }
    };
    tunnel(proxy, protocol, &host, port, client, upstream, first);
}

fn handle_socks(proxy: &Proxy, mut client: TcpStream, mut buf: Vec<u8>) {
    let greeting = loop {
        match socks::parse_greeting(&buf) {
            Ok(Some(len)) => break len,
            Ok(None) => match read_more(&mut client, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(_) => {
                let _ = client.write_all(&socks::method_reply(false));
                return;
            }
        }
    };
    if client.write_all(&socks::method_reply(true)).is_err() {
        return;
    }
    buf.drain(..greeting);
    let (host, port, len) = loop {
        match socks::parse_request(&buf) {
            Ok(Some(parsed)) => break parsed,
            Ok(None) => match read_more(&mut client, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(err) => {
                let _ = client.write_all(&socks::reply(err.reply_code()));
                return;
            }
        }
    };
    let rest = buf.split_off(len);
    let upstream = match open(proxy, "socks5", &host, port) {
        Ok(upstream) => upstream,
        Err(OpenError::Refused(_)) => {
            let _ = client.write_all(&socks::reply(socks::REPLY_NOT_ALLOWED));
            return;
        }
        Err(OpenError::Unreachable(_)) => {
            let _ = client.write_all(&socks::reply(socks::REPLY_HOST_UNREACHABLE));
            return;
        }
    };
    if client.write_all(&socks::reply(socks::REPLY_OK)).is_err() {
        return;
    }
    tunnel(proxy, "socks5", &host, port, client, upstream, rest);
}

/// Decides, resolves, checks every address and connects.
fn open(proxy: &Proxy, protocol: &str, host: &Host, port: u16) -> Result<TcpStream, OpenError> {
    let rules = &proxy.config.rules;
    let decision = rules.decide(host, port);
    let rule = match &decision {
        Decision::Allowed(rule) => rule.clone(),
        Decision::Denied(_) => {
            let event = EgressEvent::from_decision(protocol, host, port, &decision);
            proxy.emit(&event);
            return Err(OpenError::Refused(Box::new(event)));
        }
    };
    let addresses = resolve(proxy, host, port).map_err(OpenError::Unreachable)?;
    let mut usable = Vec::new();
    let mut refusal = None;
    for address in addresses {
        let ip = address.ip();
        if own_listener(proxy, ip, port) {
            refusal.get_or_insert_with(|| {
                (
                    format!("{ip}:{port} is the supervisor's own listener"),
                    "none: the supervisor's own listeners are never reachable from a sandbox"
                        .to_owned(),
                )
            });
        } else if !rules.address_allowed(ip, port) {
            refusal.get_or_insert_with(|| {
                let named = Host::Ip(ip);
                (
                    format!(
                        "{host} resolves to {named}, a loopback, private or link-local address"
                    ),
                    format!("--allow-domain {named}:{port} (name the address itself)"),
                )
            });
        } else {
            usable.push(address);
        }
    }
    if usable.is_empty() {
        let (reason, rule) = refusal
            .unwrap_or_else(|| (format!("{host} resolves to no address"), "none".to_owned()));
        let event = EgressEvent::refused(protocol, &host.to_string(), port, rule, reason);
        proxy.emit(&event);
        return Err(OpenError::Refused(Box::new(event)));
    }
    let mut last_error = String::from("no address");
    for address in usable {
        match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                proxy.emit(&EgressEvent::allowed(protocol, host, port, &rule));
                return Ok(stream);
            }
            Err(err) => last_error = format!("connecting to {address} failed: {err}"),
        }
    }
    Err(OpenError::Unreachable(last_error))
}

/// The destination's addresses: the hosts mapping first, then the system resolver.
fn resolve(proxy: &Proxy, host: &Host, port: u16) -> Result<Vec<SocketAddr>, String> {
    let name = match host {
        Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, port)]),
        Host::Name(name) => name,
    };
    let mapped: Vec<SocketAddr> = proxy
        .config
        .hosts
        .iter()
        .filter(|(mapped, _)| mapped == name)
        .map(|(_, ip)| SocketAddr::new(*ip, port))
        .collect();
    if !mapped.is_empty() {
        return Ok(mapped);
    }
    (name.as_str(), port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .map_err(|err| format!("cannot resolve {name}: {err}"))
}

/// Whether `ip:port` may be one of the supervisor's listeners.
fn own_listener(proxy: &Proxy, ip: IpAddr, port: u16) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    proxy.config.denied_ports.contains(&port)
        && (ip.is_loopback() || ip.is_unspecified() || proxy.local_addresses.contains(&ip))
}

/// Relays both directions until both ended, one failed, or the tunnel was idle for
/// [`IDLE_TIMEOUT`]. The client's first bytes pass the TLS gate first.
fn tunnel(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
) {
    let (Ok(client_reader), Ok(upstream_writer)) = (client.try_clone(), upstream.try_clone())
    else {
        return;
    };
    let last = Arc::new(AtomicU64::new(0));
    let started = proxy.started;
    touch(&last, started);
    let down_last = Arc::clone(&last);
    // Server to client: starts at once (server-first protocols).
    let down = std::thread::Builder::new()
        .name("egress-down".to_owned())
        .stack_size(THREAD_STACK_BYTES)
        .spawn(move || copy(upstream, client, &down_last, started));
    let Ok(down) = down else {
        return;
    };
    let mut client_reader = client_reader;
    let mut upstream_writer = upstream_writer;
    match tls_gate(proxy, protocol, host, port, &mut client_reader, first) {
        Some(first) if upstream_writer.write_all(&first).is_ok() => {
            touch(&last, started);
            copy(client_reader, upstream_writer, &last, started);
        }
        _ => {
            let _ = client_reader.shutdown(Shutdown::Both);
            let _ = upstream_writer.shutdown(Shutdown::Both);
        }
    }
    let _ = down.join();
}

/// Reads the client's first bytes; when they are a TLS ClientHello, its server name must be
/// `host`; a port of [`TLS_PORTS`] must carry TLS. Returns the bytes to send on, or `None` to
/// close the tunnel (the refusal was emitted).
fn tls_gate(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    client: &mut TcpStream,
    mut buf: Vec<u8>,
) -> Option<Vec<u8>> {
    let tls_only = TLS_PORTS.contains(&port);
    if buf.is_empty() && !tls_only {
        // Nothing sent yet on a port that may carry anything: the first read decides.
        let _ = client.set_read_timeout(Some(IDLE_CHECK_INTERVAL));
        let mut chunk = vec![0u8; RELAY_BUFFER_BYTES];
        let deadline = Instant::now() + IDLE_TIMEOUT;
        loop {
            match client.read(&mut chunk) {
                Ok(0) => return Some(Vec::new()),
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    break;
                }
                Err(err) if is_timeout(&err) && Instant::now() < deadline => {}
                Err(_) => return None,
            }
        }
    }
    let _ = client.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
    let refuse = |reason: String, rule: String| {
        proxy.emit(&EgressEvent::refused(
            protocol,
            &host.to_string(),
            port,
            rule,
            reason,
        ));
        None
    };
    loop {
        match sni::parse(&buf) {
            Ok(ClientHello::Incomplete) if buf.len() < MAX_CLIENT_HELLO_BYTES => {
                let mut chunk = [0u8; 4096];
                let room = (MAX_CLIENT_HELLO_BYTES - buf.len()).min(chunk.len());
                match client.read(&mut chunk[..room]) {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            Ok(ClientHello::Incomplete) => {
                return refuse(
                    "the TLS ClientHello is larger than MAX_CLIENT_HELLO_BYTES".to_owned(),
                    "none".to_owned(),
                );
            }
            Ok(ClientHello::NotTls) if tls_only => {
                return refuse(
                    format!("port {port} carries TLS only, and the client did not start TLS"),
                    "none: speak TLS on this port".to_owned(),
                );
            }
            Ok(ClientHello::NotTls | ClientHello::Parsed(None)) => return Some(buf),
            Ok(ClientHello::Parsed(Some(name))) => {
                return match Host::parse(&name) {
                    Ok(named) if named == *host => Some(buf),
                    _ => refuse(
                        format!(
                            "the TLS server name {name:?} is not the host the tunnel was \
                             opened for ({host}): domain fronting"
                        ),
                        format!("open the tunnel to {name} itself (and allow it)"),
                    ),
                };
            }
            Err(err) => return refuse(err.to_string(), "none".to_owned()),
        }
    }
}

fn is_timeout(err: &std::io::Error) -> bool {
    matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn touch(last: &AtomicU64, started: Instant) {
    let now = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    last.store(now, Ordering::Relaxed);
}

/// Copies `from` to `to` until EOF (then half-closes `to`), an error, or the tunnel's idle
/// timeout (then closes both). The bytes move through a pipe with `splice(2)`, so they are
/// never copied into the proxy; a read/write loop is the fallback when no pipe can be made.
fn copy(from: TcpStream, to: TcpStream, last: &AtomicU64, started: Instant) {
    let _ = from.set_read_timeout(Some(IDLE_CHECK_INTERVAL));
    let ended = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok((pipe_out, pipe_in)) => {
            let _ = nix::fcntl::fcntl(
                &pipe_in,
                nix::fcntl::FcntlArg::F_SETPIPE_SZ(SPLICE_PIPE_BYTES as i32),
            );
            splice_loop(&from, &to, &pipe_out, &pipe_in, last, started)
        }
        Err(_) => read_write_loop(&from, &to, last, started),
    };
    if ended {
        let _ = to.shutdown(Shutdown::Write);
        return;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// What a failed read means: go on (interrupted, or a timeout before the idle limit) or stop.
fn keep_going(err: &std::io::Error, last: &AtomicU64, started: Instant) -> bool {
    if err.kind() == ErrorKind::Interrupted {
        return true;
    }
    if !is_timeout(err) {
        return false;
    }
    let now = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let idle = now.saturating_sub(last.load(Ordering::Relaxed));
    u128::from(idle) < IDLE_TIMEOUT.as_millis()
}

/// `true` at EOF, `false` on an error or the idle timeout.
fn splice_loop(
    from: &TcpStream,
    to: &TcpStream,
    pipe_out: &std::os::fd::OwnedFd,
    pipe_in: &std::os::fd::OwnedFd,
    last: &AtomicU64,
    started: Instant,
) -> bool {
    use std::os::fd::AsRawFd;
    // No SPLICE_F_MORE on the sending side: it would hold a short reply back (MSG_MORE).
    let flags = libc::SPLICE_F_MOVE;
    loop {
        // SAFETY: plain descriptors owned for the whole call; no offsets.
        let got = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                pipe_in.as_raw_fd(),
                std::ptr::null_mut(),
                SPLICE_PIPE_BYTES,
                flags,
            )
        };
        if got == 0 {
            return true;
        }
        if got < 0 {
            if keep_going(&std::io::Error::last_os_error(), last, started) {
                continue;
            }
            return false;
        }
        let mut pending = got as usize;
        while pending > 0 {
            // SAFETY: as above.
            let sent = unsafe {
                libc::splice(
                    pipe_out.as_raw_fd(),
                    std::ptr::null_mut(),
                    to.as_raw_fd(),
                    std::ptr::null_mut(),
                    pending,
                    flags,
                )
            };
            if sent < 0 {
                if std::io::Error::last_os_error().kind() == ErrorKind::Interrupted {
                    continue;
                }
                return false;
            }
            if sent == 0 {
                return false;
            }
            pending -= sent as usize;
        }
        touch(last, started);
    }
}

/// `true` at EOF, `false` on an error or the idle timeout.
fn read_write_loop(
    mut from: &TcpStream,
    mut to: &TcpStream,
    last: &AtomicU64,
    started: Instant,
) -> bool {
    let mut buf = vec![0u8; RELAY_BUFFER_BYTES];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return false;
                }
                touch(last, started);
            }
            Err(err) if keep_going(&err, last, started) => {}
            Err(_) => return false,
        }
    }
}

/// This host's interface addresses (read before the proxy confines itself).
pub fn local_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(addresses) = nix::ifaddrs::getifaddrs() {
        for interface in addresses {
            let Some(address) = interface.address else {
                continue;
            };
            if let Some(v4) = address.as_sockaddr_in() {
                out.push(IpAddr::V4(v4.ip()));
            } else if let Some(v6) = address.as_sockaddr_in6() {
                out.push(IpAddr::V6(v6.ip()));
            }
        }
    }
    out.retain(|ip| !ip.is_loopback());
    out.sort();
    out.dedup();
    out
}
