//! The egress proxy: the only way out of a sandbox whose network is an allowlist.
//!
//! ```text
//!  command (network namespace with only `lo`; Landlock: TCP connect to one port only)
//!    │ TCP 127.0.0.1:PORT (HTTP CONNECT, absolute-form HTTP, SOCKS5)
//!    ▼
//!  listening socket, created by PID 1 inside the namespace, handed to the outer
//!    │ accept()ed by
//!  egress-proxy (host's network namespace; exec'd by the outer `sandbox-run`; cleared
//!    │           environment, no capabilities, no filesystem writes, Landlock + seccomp)
//!    ▼ connect() from the host's namespace, after the checks
//!  the allowed destination
//! ```
//!
//! Checks, in order, for every connection: the name against the allowlist
//! ([`sandbox::policy::network`], deny wins); the name resolved here (the hosts-file mapping first,
//! then the system resolver) and every address checked: loopback, private, link-local and other
//! special addresses only when an `allow` pattern names the address itself, the supervisor's own
//! listeners never; then every byte the client sends is followed ([`inspect`]): each plaintext TLS
//! ClientHello must name the host it asked for (no domain fronting), each HTTP request (kept-alive,
//! pipelined, inside a tunnel) must name it too, and what the tunnel may carry at all is the
//! pattern's [`TunnelMode`](sandbox::policy::network::TunnelMode) (TLS only on 443, TLS or checked
//! HTTP elsewhere, anything with `tunnel=any`). With an upstream proxy ([`upstream`]), an allowed
//! connection leaves through it with `CONNECT host:port` instead: the name is checked against the
//! allowlist as above but not resolved here (the upstream resolves it), so the address checks apply
//! to IP literals only; the upstream's own address is checked against the supervisor's listeners.
//! Every decision is an [`EgressEvent`](sandbox::egress::EgressEvent) written to the outer, which
//! turns refusals into denial records (layer `proxy`, operation `net.connect`).
//!
//! Module map: [`http`] and [`socks`] (request parsing, sans-I/O), [`sni`] (ClientHello
//! parsing), [`framing`] (HTTP/1.x body framing), [`tls`] (TLS record following), [`inspect`]
//! (what passes: the three together, per tunnel mode), [`upstream`] (the `CONNECT` to an
//! upstream proxy), [`server`] (the accept loop and the connection handler), [`terminate`] (TLS
//! termination for `inspect=true`), [`helper`] (the process: descriptors, confinement, serve).
//! The outer's side lives in the sandbox crate ([`sandbox::egress`]): the configuration it
//! hands the proxy, the hosts-file mapping, the CA installed inside the sandbox, starting the
//! proxy and reading its events.
#![deny(unsafe_code)]

pub mod framing;
pub mod http;
pub mod inspect;
pub mod sni;
pub mod socks;
pub mod tls;
pub mod upstream;

#[cfg(target_os = "linux")]
pub mod helper;
#[cfg(target_os = "linux")]
pub mod server;
#[cfg(target_os = "linux")]
pub mod terminate;

use std::time::Duration;

/// Largest request head (request line plus headers, or a SOCKS5 request) read before a
/// destination is known: bounds the memory a client can make the proxy hold.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Most headers in one request head (the parser's fixed table).
pub const MAX_HEADERS: usize = 64;

/// Connections one proxy (one sandbox) serves at once; more are closed at once. Each costs two
/// threads and two 64 KiB buffers.
pub const MAX_CONCURRENT_CONNECTIONS: usize = 128;

/// One read that fails with `TimedOut` once `deadline` has passed: the read timeout is what
/// is left of the deadline, so trickling bytes does not extend it.
pub(crate) fn read_before(
    stream: &mut std::net::TcpStream,
    chunk: &mut [u8],
    deadline: std::time::Instant,
) -> std::io::Result<usize> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    stream.set_read_timeout(Some(left))?;
    std::io::Read::read(stream, chunk)
}

/// How long a client has in total to send its request head once connected (and, separately,
/// each message the proxy must see whole once its first byte arrived: a later request head, a
/// chunk-size line, a record holding a ClientHello): one deadline, not a timeout per read.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection to one address of the destination may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A tunnel with no byte in either direction for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How often an idle direction wakes up to check [`IDLE_TIMEOUT`].
pub const IDLE_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Bytes copied per read in each direction of a tunnel.
pub const RELAY_BUFFER_BYTES: usize = 64 * 1024;

/// Most client bytes held at once while a message is incomplete (a request head, a chunk-size
/// line, a TLS record holding a ClientHello): each parser bounds its own, this bounds them all.
pub const MAX_HELD_BYTES: usize = 32 * 1024;

/// Stack of a connection thread: buffers live on the heap.
pub(crate) const THREAD_STACK_BYTES: usize = 256 * 1024;
