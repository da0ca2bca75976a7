//! The proxy's accept loop and connection handler: plain threads and blocking sockets (the
//! proxy confines itself before any thread exists, then serves one sandbox).
//!
//! Per connection: read the request head under [`HANDSHAKE_TIMEOUT`], decide, resolve, check
//! every address, connect under [`CONNECT_TIMEOUT`](super::CONNECT_TIMEOUT), answer, then
//! relay both directions, the client's bytes through the
//! [`Inspector`](super::inspect::Inspector) of the destination's tunnel mode (every later
//! request, every plaintext ClientHello checked). The event of each decision is written before
//! the client hears the answer, so when the command has seen a refusal, its record is already on
//! its way to the outer. Reading and deciding each protocol's request is in `handle`; deciding,
//! resolving, checking and connecting a destination in `open`; the tunnel's part (inspection,
//! relay) in `tunnel`.

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox::policy::network::canonical_ip;

use super::socks;
use super::{HANDSHAKE_TIMEOUT, MAX_CONCURRENT_CONNECTIONS, MAX_HEADER_BYTES};
use sandbox::egress::config::{EgressEvent, ProxyConfig};

mod handle;
mod open;
mod tunnel;

use handle::{handle_http, handle_socks, refuse_socks4};

/// How long a reading of this host's interface addresses is used before it is read again.
const LOCAL_ADDRESSES_TTL: Duration = Duration::from_secs(1);

pub(crate) use super::THREAD_STACK_BYTES;

/// What every connection thread shares.
pub struct Proxy {
    config: ProxyConfig,
    /// This host's addresses (the supervisor's listeners may be bound to any of them; an
    /// allowed name resolving to one is refused like loopback) and when they were read.
    local_addresses: Mutex<(Instant, Vec<IpAddr>)>,
    events: Mutex<File>,
    active: AtomicUsize,
    started: Instant,
    /// Asks before a refusal is final (`--ask`), when configured.
    asker: Option<sandbox::egress::ask::Asker>,
    /// Terminates TLS to destinations whose pattern says `inspect=true`, when one does.
    terminator: Option<super::terminate::Terminator>,
}

impl Proxy {
    /// A proxy for `config`, writing events to `events`.
    pub fn new(config: ProxyConfig, local_addresses: Vec<IpAddr>, events: File) -> Self {
        Self {
            config,
            local_addresses: Mutex::new((Instant::now(), local_addresses)),
            events: Mutex::new(events),
            active: AtomicUsize::new(0),
            started: Instant::now(),
            asker: None,
            terminator: None,
        }
    }

    /// This proxy terminating TLS with `terminator` where a pattern says `inspect=true`
    /// (without one, such destinations are refused as limited destinations behind TLS are).
    pub fn with_terminator(mut self, terminator: Option<super::terminate::Terminator>) -> Self {
        self.terminator = terminator;
        self
    }

    /// This proxy asking `asker` before refusing a name the allowlist does not allow.
    pub fn with_asker(mut self, asker: Option<sandbox::egress::ask::Asker>) -> Self {
        self.asker = asker;
        self
    }

    /// This host's addresses, read again when the last reading is older than
    /// [`LOCAL_ADDRESSES_TTL`] (interfaces come and go); a failed reading keeps the last one.
    fn local_addresses(&self) -> Vec<IpAddr> {
        let mut cached = self
            .local_addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if cached.0.elapsed() >= LOCAL_ADDRESSES_TTL
            && let Some(fresh) = read_local_addresses()
        {
            *cached = (Instant::now(), fresh);
        }
        cached.1.clone()
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

fn handle(proxy: &Proxy, mut client: TcpStream) {
    let _ = client.set_nodelay(true);
    // One deadline for the whole request head, however it is spread over reads.
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    if read_more(&mut client, &mut buf, deadline).is_err() || buf.is_empty() {
        return;
    }
    if buf[0] == socks::VERSION_4 {
        refuse_socks4(proxy, client, buf, deadline);
    } else if buf[0] == socks::VERSION {
        handle_socks(proxy, client, buf, deadline);
    } else {
        handle_http(proxy, client, buf, deadline);
    }
}

/// Appends what one read returns (at most up to [`MAX_HEADER_BYTES`] in total), failing once
/// `deadline` has passed.
fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let room = MAX_HEADER_BYTES
        .saturating_sub(buf.len())
        .clamp(1, chunk.len());
    let n = super::read_before(stream, &mut chunk[..room], deadline)?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// This host's interface addresses, every interface, v4 and v6, in [`canonical_ip`] form, but
/// loopback (read before the proxy confines itself, and again while it serves).
pub fn local_addresses() -> Vec<IpAddr> {
    read_local_addresses().unwrap_or_default()
}

fn read_local_addresses() -> Option<Vec<IpAddr>> {
    let mut out = Vec::new();
    for interface in nix::ifaddrs::getifaddrs().ok()? {
        let Some(address) = interface.address else {
            continue;
        };
        if let Some(v4) = address.as_sockaddr_in() {
            out.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = address.as_sockaddr_in6() {
            out.push(canonical_ip(IpAddr::V6(v6.ip())));
        }
    }
    out.retain(|ip| !ip.is_loopback());
    out.sort();
    out.dedup();
    Some(out)
}
