//! One tunnel's life after the destination answered: the TLS gate on the client's first bytes
//! ([`sni`]), then both directions relayed (`splice(2)` through a pipe, or a read/write loop)
//! until they end, fail, or the tunnel is idle for [`IDLE_TIMEOUT`].

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::policy::network::Host;

use super::super::config::EgressEvent;
use super::super::sni::{self, ClientHello};
use super::super::{
    HANDSHAKE_TIMEOUT, IDLE_CHECK_INTERVAL, IDLE_TIMEOUT, MAX_CLIENT_HELLO_BYTES,
    RELAY_BUFFER_BYTES, TLS_PORTS,
};
use super::{Proxy, THREAD_STACK_BYTES};

/// The pipe a direction's bytes are spliced through. Measured on 2 cores with 2 GiB bulk
/// transfers: 256 KiB beat both 64 KiB and 1 MiB (less data in flight keeps it in cache).
const SPLICE_PIPE_BYTES: usize = 256 * 1024;

/// Relays both directions until both ended, one failed, or the tunnel was idle for
/// [`IDLE_TIMEOUT`]. The client's first bytes pass the TLS gate first.
pub(super) fn tunnel(
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
    // One deadline for the whole ClientHello, however it is spread over reads.
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
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
                match super::read_before(client, &mut chunk[..room], deadline) {
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
