//! The probe's network operations (part of `probe`, split out for size): every way a process
//! can open a transport connection to an address (`connect` is `tcp-connect` in the probe
//! itself), and the sweeps of socket protocols, send flags and TCP socket options that check the
//! seccomp filter's argument rules by construction.
//!
//! Each connecting op sends a websocket upgrade request (what an attacker sends to an
//! exec-server before opening a session) and returns the first line of the reply, so a success
//! means a server answered on that connection, not only that a call returned 0.

use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use serde_json::{Value, json};

/// What every connecting op sends once connected: a websocket upgrade (the key is RFC 6455's
/// example).
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: probe\r\nUpgrade: websocket\r\n\
    Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
    Sec-WebSocket-Version: 13\r\n\r\n";
/// How long an op waits for the reply before reporting `EAGAIN`.
const REPLY_TIMEOUT_SECS: libc::time_t = 5;
/// Socket types swept: every number under `SOCK_TYPE_MASK` (0xf).
const SWEEP_TYPES: std::ops::RangeInclusive<i64> = 0..=15;
/// Families swept: past `AF_MAX` (46 on Linux 6.x), so a family the kernel adds is covered.
const SWEEP_FAMILIES: std::ops::RangeInclusive<i64> = 0..=63;
/// Protocol numbers swept: every IP protocol number and past the kernel's private ones
/// (`IPPROTO_MPTCP` is 262).
const SWEEP_PROTOCOLS: std::ops::RangeInclusive<i64> = 0..=300;
/// Protocols swept beyond the range: high bits above the 32 the kernel reads (a filter
/// comparing 64 bits would let them through), and the extremes of an int.
const SWEEP_EXTRA_PROTOCOLS: &[i64] = &[
    (1 << 32) | libc::IPPROTO_MPTCP as i64,
    (1 << 32) | libc::IPPROTO_SCTP as i64,
    (1 << 32) | libc::IPPROTO_TCP as i64,
    i32::MAX as i64,
    -1,
];
/// `SOCK_NONBLOCK | SOCK_CLOEXEC`: the flags a type may carry above the mask.
const TYPE_FLAGS: i64 = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as i64;
/// Socket option levels swept by [`setsockopt_sweep`] (TCP, also with a high bit set; IP;
/// SOL_SOCKET; IPv6; SCTP) and option names (every TCP option and beyond).
const SWEEP_LEVELS: &[i64] = &[6, (1 << 32) | 6, 0, 1, 41, 132];
const SWEEP_OPTNAMES: std::ops::RangeInclusive<i64> = 0..=64;

/// Runs the network op `op` with `args`; `None` when `op` is not one of them.
pub fn run(op: &str, args: &[String]) -> Option<Result<Value, std::io::Error>> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    Some(match op {
        "tfo-sendto" | "tfo-sendmsg" | "tfo-sendmmsg" | "tfo-connect-option" => {
            parse_addr(&arg(1)).and_then(|addr| fast_open(op, addr))
        }
        "protocol-connect" => parse_addr(&arg(2)).and_then(|addr| {
            let protocol = arg(1).parse().map_err(std::io::Error::other)?;
            protocol_connect(protocol, addr)
        }),
        "socket-sweep" => Ok(socket_sweep(libc::SYS_socket, &arg(1), &arg(2))),
        "socketpair-sweep" => Ok(socket_sweep(libc::SYS_socketpair, &arg(1), &arg(2))),
        "send-flag-sweep" => Ok(send_flag_sweep()),
        "setsockopt-sweep" => Ok(setsockopt_sweep()),
        "ws-session" => ws_session(&arg(1), args.get(2).map(String::as_str)),
        "http-get" => http_get(&arg(1), &arg(2), args.get(3).map(String::as_str)),
        _ => return None,
    })
}

/// Read/write stream of `ws-session`.
trait Duplex: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> Duplex for T {}

/// `ws-session URL [TOKEN]`: as this process's user, connect to `ws://HOST:PORT` or
/// `unix:/path`, send a websocket upgrade (with `Authorization: Bearer TOKEN` when given) and
/// report the answer's status and body; after a `101`, send `initialize` and report the text of
/// the answer, so an admission is proven by the JSON-RPC layer answering, not by a status alone.
fn ws_session(url: &str, token: Option<&str>) -> Result<Value, std::io::Error> {
    use std::io::Write;
    let mut stream = connect_url(url)?;
    let mut request = REQUEST[..REQUEST.len() - 2].to_vec();
    if let Some(token) = token {
        request.extend_from_slice(format!("Authorization: Bearer {token}\r\n").as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request)?;
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        received.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    if status != 101 {
        let mut body = received[head_end..].to_vec();
        let _ = stream.read_to_end(&mut body);
        return Ok(json!({"status": status, "body": String::from_utf8_lossy(&body)}));
    }
    // One masked text frame (mask 0: the payload goes as is), then the server's first frame.
    let initialize = br#"{"id":1,"method":"initialize","params":{"clientName":"probe"}}"#;
    let mut frame = vec![
        0x81,
        0x80 | u8::try_from(initialize.len()).unwrap_or(0),
        0,
        0,
        0,
        0,
    ];
    frame.extend_from_slice(initialize);
    stream.write_all(&frame)?;
    let mut header = [0u8; 2];
    stream.read_exact(&mut header)?;
    let length = match header[1] & 0x7f {
        126 => {
            let mut extended = [0u8; 2];
            stream.read_exact(&mut extended)?;
            usize::from(u16::from_be_bytes(extended))
        }
        127 => return Err(std::io::Error::other("an initialize answer over 64 KiB")),
        short => usize::from(short),
    };
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload)?;
    Ok(json!({"status": status, "initialize": String::from_utf8_lossy(&payload)}))
}

/// A stream to `ws://HOST:PORT` or `unix:/path`, with a read timeout.
fn connect_url(url: &str) -> Result<Box<dyn Duplex>, std::io::Error> {
    let timeout = Some(std::time::Duration::from_secs(
        REPLY_TIMEOUT_SECS.unsigned_abs(),
    ));
    if let Some(path) = url.strip_prefix("unix:") {
        let stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.set_read_timeout(timeout)?;
        return Ok(Box::new(stream));
    }
    let address = url
        .strip_prefix("ws://")
        .ok_or_else(|| std::io::Error::other(format!("unsupported URL {url}")))?;
    let stream = std::net::TcpStream::connect(address.trim_end_matches('/'))?;
    stream.set_read_timeout(timeout)?;
    Ok(Box::new(stream))
}

/// `http-get URL PATH [TOKEN]`: as this process's user, send a plain `GET PATH` (with
/// `Authorization: Bearer TOKEN` when given) to the listener at `URL` (`ws://HOST:PORT` or
/// `unix:/path`) and report the answer's status and body.
fn http_get(url: &str, path: &str, token: Option<&str>) -> Result<Value, std::io::Error> {
    use std::io::Write;
    let mut stream = connect_url(url)?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut received = Vec::new();
    stream.read_to_end(&mut received)?;
    let text = String::from_utf8_lossy(&received).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok(json!({"status": status, "body": body}))
}

fn parse_addr(text: &str) -> Result<SocketAddr, std::io::Error> {
    text.parse()
        .map_err(|e| std::io::Error::other(format!("bad address {text:?}: {e}")))
}

/// `addr` as a `sockaddr_storage` and its length.
fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid (unspecified) address.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn family(addr: SocketAddr) -> libc::c_int {
    if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    }
}

/// A new stream socket of `protocol` for `addr`'s family, with a reply timeout.
fn stream_socket(addr: SocketAddr, protocol: libc::c_int) -> Result<OwnedFd, std::io::Error> {
    // SAFETY: integer arguments.
    let fd = unsafe {
        libc::socket(
            family(addr),
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: REPLY_TIMEOUT_SECS,
        tv_usec: 0,
    };
    // SAFETY: `timeout` is a valid timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    check(rc.into())?;
    Ok(fd)
}

fn check(rc: libc::c_long) -> Result<libc::c_long, std::io::Error> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The first line the peer sends on `fd`.
fn reply_line(fd: OwnedFd) -> Result<Value, std::io::Error> {
    let mut stream = std::net::TcpStream::from(fd);
    let mut reply = [0u8; 256];
    let n = stream.read(&mut reply)?;
    let text = String::from_utf8_lossy(&reply[..n]);
    Ok(json!(text.lines().next().unwrap_or("")))
}

/// Opens a TCP connection to `addr` by TCP Fast Open, the connection made inside the send call
/// (`tfo-sendto`, `tfo-sendmsg`, `tfo-sendmmsg`: `MSG_FASTOPEN` with the address) or by the
/// first `write` after `TCP_FASTOPEN_CONNECT` and a `connect` that returns at once
/// (`tfo-connect-option`); sends the request and returns the reply's first line.
fn fast_open(how: &str, addr: SocketAddr) -> Result<Value, std::io::Error> {
    let fd = stream_socket(addr, 0)?;
    let raw = fd.as_raw_fd();
    let (mut storage, len) = sockaddr(addr);
    let mut iov = libc::iovec {
        iov_base: REQUEST.as_ptr().cast_mut().cast(),
        iov_len: REQUEST.len(),
    };
    // SAFETY: msghdr is plain data; the fields used are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&raw mut storage).cast();
    msg.msg_namelen = len;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    let sent = match how {
        // SAFETY: `REQUEST` and `storage` are valid for the lengths passed.
        "tfo-sendto" => unsafe {
            libc::sendto(
                raw,
                REQUEST.as_ptr().cast(),
                REQUEST.len(),
                libc::MSG_FASTOPEN,
                (&raw const storage).cast(),
                len,
            ) as libc::c_long
        },
        // SAFETY: `msg` points at `storage` and `iov`, which point at live buffers.
        "tfo-sendmsg" => unsafe {
            libc::sendmsg(raw, &raw const msg, libc::MSG_FASTOPEN) as libc::c_long
        },
        "tfo-sendmmsg" => {
            let mut mmsg = libc::mmsghdr {
                msg_hdr: msg,
                msg_len: 0,
            };
            // SAFETY: one mmsghdr whose header points at live buffers, as above.
            let sent = unsafe { libc::sendmmsg(raw, &raw mut mmsg, 1, libc::MSG_FASTOPEN as _) };
            // sendmmsg counts messages; the bytes of the one sent are in msg_len.
            if sent == 1 {
                mmsg.msg_len as libc::c_long
            } else {
                sent as libc::c_long
            }
        }
        _ => {
            let on: libc::c_int = 1;
            // SAFETY: `on` is a valid int of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    raw,
                    libc::IPPROTO_TCP,
                    libc::TCP_FASTOPEN_CONNECT,
                    (&raw const on).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            check(rc.into())?;
            // SAFETY: `storage` is valid for `len` bytes.
            let rc = unsafe { libc::connect(raw, (&raw const storage).cast(), len) };
            check(rc.into())?;
            // SAFETY: `REQUEST` is valid for its length.
            unsafe { libc::write(raw, REQUEST.as_ptr().cast(), REQUEST.len()) as libc::c_long }
        }
    };
    check(sent)?;
    reply_line(fd)
}

/// `socket(family, SOCK_STREAM, protocol)` (MPTCP, SCTP, ...) connected to `addr`, the request
/// sent; returns the reply's first line.
fn protocol_connect(protocol: libc::c_int, addr: SocketAddr) -> Result<Value, std::io::Error> {
    let fd = stream_socket(addr, protocol)?;
    let (storage, len) = sockaddr(addr);
    // SAFETY: `storage` is valid for `len` bytes.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const storage).cast(), len) };
    check(rc.into())?;
    // SAFETY: `REQUEST` is valid for its length.
    let sent = unsafe { libc::write(fd.as_raw_fd(), REQUEST.as_ptr().cast(), REQUEST.len()) };
    check(sent as libc::c_long)?;
    reply_line(fd)
}

/// The errno name of a failed call, or `ok`.
fn outcome(rc: libc::c_long) -> String {
    match check(rc) {
        Ok(_) => "ok".to_owned(),
        Err(err) => err.raw_os_error().map_or_else(
            || "?".to_owned(),
            |errno| format!("{:?}", nix::errno::Errno::from_raw(errno)),
        ),
    }
}

/// Calls `socket(family, type, protocol)` (or, with `SYS_socketpair` as `call`, `socketpair`
/// with the same three and a valid pair buffer) through the raw syscall (all 64 bits of each
/// argument reach the filter) for every family, type (with and without `SOCK_NONBLOCK |
/// SOCK_CLOEXEC`) and protocol swept, closing what it creates, and returns
/// `{"family/type/protocol": outcome}` for every call that was not refused with EPERM or ENOSYS
/// (the sandbox's two answers; the kernel's own refusals, such as raw sockets without
/// CAP_NET_RAW, count as refused too, which only makes the set smaller). `families` and `types`
/// (comma lists; empty: all) narrow the sweep: unsandboxed as root, making and closing the
/// thousands of packet and raw sockets of a full sweep takes half a minute.
fn socket_sweep(call: libc::c_long, families: &str, types: &str) -> Value {
    let mut reached = serde_json::Map::new();
    let protocols: Vec<i64> = SWEEP_PROTOCOLS
        .chain(SWEEP_EXTRA_PROTOCOLS.iter().copied())
        .collect();
    let list = |text: &str, all: std::ops::RangeInclusive<i64>| -> Vec<i64> {
        if text.is_empty() {
            all.collect()
        } else {
            text.split(',').filter_map(|n| n.parse().ok()).collect()
        }
    };
    let types = list(types, SWEEP_TYPES);
    for family in list(families, SWEEP_FAMILIES) {
        for kind in types.iter().flat_map(|&t| [t, t | TYPE_FLAGS]) {
            for &protocol in &protocols {
                let mut pair: [libc::c_int; 2] = [-1, -1];
                // SAFETY: integer arguments and, for socketpair, a buffer of two ints; every
                // descriptor created is closed at once.
                let rc = unsafe { libc::syscall(call, family, kind, protocol, pair.as_mut_ptr()) };
                if rc >= 0 {
                    let created = if call == libc::SYS_socket {
                        vec![rc as libc::c_int]
                    } else {
                        pair.to_vec()
                    };
                    for fd in created {
                        // SAFETY: our own descriptor, just created.
                        unsafe { libc::close(fd) };
                    }
                }
                let result = outcome(rc);
                if result != "EPERM" && result != "ENOSYS" {
                    reached.insert(format!("{family}/{kind:#x}/{protocol:#x}"), json!(result));
                }
            }
        }
    }
    Value::Object(reached)
}

/// The flag words [`send_flag_sweep`] passes: each of the 32 bits alone, `MSG_FASTOPEN` with
/// each other bit, and both with a bit above the 32 the kernel reads.
pub fn swept_send_flags() -> Vec<i64> {
    let fast_open = libc::MSG_FASTOPEN as i64;
    let mut flags: Vec<i64> = (0..32).map(|bit| 1i64 << bit).collect();
    flags.extend((0..32).map(|bit| fast_open | (1i64 << bit)));
    flags.extend([1 << 32, (1 << 32) | fast_open, 0]);
    flags.sort_unstable();
    flags.dedup();
    flags
}

/// `sendto`, `sendmsg` and `sendmmsg` on descriptor -1 with every flag word of
/// [`swept_send_flags`]: a call the filter lets through fails with EBADF (nothing is sent), a
/// refused one with EPERM. Returns `{"call/flags": outcome}` for every call.
fn send_flag_sweep() -> Value {
    let mut outcomes = serde_json::Map::new();
    let byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr().cast_mut().cast(),
        iov_len: 1,
    };
    // SAFETY: msghdr is plain data; only the iovec is set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    let mut mmsg = libc::mmsghdr {
        msg_hdr: msg,
        msg_len: 0,
    };
    for flags in swept_send_flags() {
        // SAFETY: descriptor -1: the kernel fails with EBADF before reading any buffer, which
        // are valid all the same.
        let calls = unsafe {
            [
                (
                    "sendto",
                    libc::syscall(libc::SYS_sendto, -1, byte.as_ptr(), 1, flags, 0, 0),
                ),
                (
                    "sendmsg",
                    libc::syscall(libc::SYS_sendmsg, -1, &raw const msg, flags),
                ),
                (
                    "sendmmsg",
                    libc::syscall(libc::SYS_sendmmsg, -1, &raw mut mmsg, 1, flags),
                ),
            ]
        };
        for (call, rc) in calls {
            outcomes.insert(format!("{call}/{flags:#x}"), json!(outcome(rc)));
        }
    }
    Value::Object(outcomes)
}

/// `setsockopt(-1, level, optname, &1, 4)` for every level and option name swept: EBADF when
/// the filter lets it through, EPERM when it refuses. Returns `{"level/optname": outcome}`.
fn setsockopt_sweep() -> Value {
    let mut outcomes = serde_json::Map::new();
    let one: libc::c_int = 1;
    let optnames: Vec<i64> = SWEEP_OPTNAMES
        .chain([(1 << 32) | i64::from(libc::TCP_FASTOPEN_CONNECT)])
        .collect();
    for &level in SWEEP_LEVELS {
        for &optname in &optnames {
            // SAFETY: descriptor -1 (EBADF before anything is read); `one` is a valid int.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_setsockopt,
                    -1,
                    level,
                    optname,
                    &raw const one,
                    std::mem::size_of::<libc::c_int>(),
                )
            };
            outcomes.insert(format!("{level:#x}/{optname:#x}"), json!(outcome(rc)));
        }
    }
    Value::Object(outcomes)
}
