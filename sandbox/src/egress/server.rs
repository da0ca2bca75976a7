//! The proxy's accept loop and connection handler: plain threads and blocking sockets (the
//! proxy confines itself before any thread exists, then serves one sandbox).
//!
//! Per connection: read the request head under [`HANDSHAKE_TIMEOUT`], decide, resolve, check
//! every address, connect under [`CONNECT_TIMEOUT`], answer, then relay both directions, the
//! client's bytes through the [`Inspector`] of the destination's tunnel mode (every later
//! request, every plaintext ClientHello checked). The event of each decision is
//! written before the client hears the answer, so when the command has seen a refusal, its
//! record is already on its way to the outer. The tunnel's part (inspection, relay) is in
//! `tunnel`.

use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::policy::network::{Decision, Host, Refusal, TunnelMode, canonical_ip, suggested_rule};

use super::config::{EgressEvent, ProxyConfig, escape_control};
use super::http::{self, Request};
use super::inspect::Inspector;
use super::socks;
use super::{CONNECT_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_CONCURRENT_CONNECTIONS, MAX_HEADER_BYTES};

mod tunnel;

use tunnel::{Destination, tunnel};

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
    asker: Option<super::ask::Asker>,
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
    pub fn with_asker(mut self, asker: Option<super::ask::Asker>) -> Self {
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

/// Why a destination could not be opened.
enum OpenError {
    /// Refused by policy; the event was emitted.
    Refused(Box<EgressEvent>),
    /// Allowed, but no address could be resolved or connected.
    Unreachable(String),
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

fn handle_http(proxy: &Proxy, mut client: TcpStream, mut buf: Vec<u8>, deadline: Instant) {
    let request = loop {
        match http::parse(&buf) {
            Ok(Some(request)) => break request,
            Ok(None) => match read_more(&mut client, &mut buf, deadline) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(http::HttpError::Refused {
                host,
                port,
                reason,
                rule,
            }) => {
                let event = EgressEvent::refused("http", &host, port, rule, reason);
                proxy.emit(&event);
                let _ = client.write_all(&http::response(
                    403,
                    "Forbidden",
                    &format!("execward: {}\n", event.describe()),
                ));
                return;
            }
            Err(err) => {
                let _ = client.write_all(&http::response(
                    400,
                    "Bad Request",
                    &format!(
                        "execward egress proxy: {}\n",
                        escape_control(&err.to_string())
                    ),
                ));
                return;
            }
        }
    };
    let (host, port, protocol) = match &request {
        Request::Connect { host, port, .. } => (host.clone(), *port, "connect"),
        Request::Forward { host, port, .. } => (host.clone(), *port, "http"),
    };
    let mode = proxy.config.rules.tunnel_mode(&host, port);
    let scope = proxy.config.rules.request_scope(&host, port);
    let limited = match &request {
        Request::Forward { method, path, .. } if !scope.permits(method, path) => Some(format!(
            "{method} {path} to {host}:{port} is outside what its pattern allows ({})",
            scope.describe()
        )),
        Request::Connect { .. }
            if scope.is_limited()
                && mode == TunnelMode::TlsOnly
                && !(scope.inspects() && proxy.terminator.is_some()) =>
        {
            Some(format!(
                "requests to {host}:{port} are limited ({}), and its tunnel carries TLS only, \
                 which would hide them",
                scope.describe()
            ))
        }
        _ => None,
    };
    if let Some(reason) = limited {
        // Refused by what it asks, before any connection (the destination itself is allowed).
        let event = EgressEvent::refused(
            protocol,
            &host.to_string(),
            port,
            format!(
                "--allow-domain '{}' with that method and path (methods=, paths=); TLS to a \
                 limited destination needs inspect=true on its pattern",
                crate::policy::network::suggested_rule(&host, port)
            ),
            reason,
        );
        proxy.emit(&event);
        let _ = client.write_all(&http::response(
            403,
            "Forbidden",
            &format!("execward: {}\n", event.describe()),
        ));
        return;
    }
    if protocol == "http" && mode == TunnelMode::TlsOnly {
        // Plain HTTP to a destination that carries TLS only: refused before any connection.
        let event = EgressEvent::refused(
            protocol,
            &host.to_string(),
            port,
            "none: use https:// (tunnelled with CONNECT) for this port".to_owned(),
            format!(
                "port {port} carries TLS only (its default, or tunnel=tls-only), and this is a \
                 plain HTTP request"
            ),
        );
        proxy.emit(&event);
        let _ = client.write_all(&http::response(
            403,
            "Forbidden",
            &format!("execward: {}\n", event.describe()),
        ));
        return;
    }
    let asked = match &request {
        Request::Forward { method, path, .. } => Some((method.as_str(), path.as_str())),
        Request::Connect { .. } => None,
    };
    let upstream = match open(proxy, protocol, &host, port, asked) {
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
    let inspector = match request {
        Request::Connect { head_len, .. } => {
            if client.write_all(http::CONNECT_ESTABLISHED).is_err() {
                return;
            }
            buf.drain(..head_len);
            if scope.inspects()
                && let Some(terminator) = &proxy.terminator
            {
                let destination = Destination {
                    protocol,
                    host: &host,
                    port,
                };
                inspected(
                    proxy,
                    terminator,
                    &destination,
                    client,
                    upstream,
                    &buf,
                    scope,
                );
                return;
            }
            Inspector::tunnel(host.clone(), port, mode).limited_to(scope)
        }
        Request::Forward {
            upstream: head,
            body,
            head_len,
            ..
        } => {
            let mut upstream = &upstream;
            if upstream.write_all(&head).is_err() {
                return;
            }
            buf.drain(..head_len);
            Inspector::forward(host.clone(), port, body).limited_to(scope)
        }
    };
    let destination = Destination {
        protocol,
        host: &host,
        port,
    };
    tunnel(proxy, &destination, client, upstream, buf, inspector);
}

fn handle_socks(proxy: &Proxy, mut client: TcpStream, mut buf: Vec<u8>, deadline: Instant) {
    let greeting = loop {
        match socks::parse_greeting(&buf) {
            Ok(Some(len)) => break len,
            Ok(None) => match read_more(&mut client, &mut buf, deadline) {
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
            Ok(None) => match read_more(&mut client, &mut buf, deadline) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(err) => {
                if let socks::SocksError::Command {
                    command,
                    host,
                    port,
                } = &err
                {
                    proxy.emit(&EgressEvent::refused(
                        "socks5",
                        &host.to_string(),
                        *port,
                        "none: only SOCKS5 CONNECT is served (UDP fails closed)".to_owned(),
                        format!(
                            "SOCKS5 command {} is not served",
                            socks::command_name(*command)
                        ),
                    ));
                }
                let _ = client.write_all(&socks::reply(err.reply_code()));
                return;
            }
        }
    };
    let rest = buf.split_off(len);
    let upstream = match open(proxy, "socks5", &host, port, None) {
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
    let mode = proxy.config.rules.tunnel_mode(&host, port);
    let destination = Destination {
        protocol: "socks5",
        host: &host,
        port,
    };
    let scope = proxy.config.rules.request_scope(&host, port);
    if scope.inspects()
        && let Some(terminator) = &proxy.terminator
    {
        inspected(
            proxy,
            terminator,
            &destination,
            client,
            upstream,
            &rest,
            scope,
        );
        return;
    }
    let inspector = Inspector::tunnel(host.clone(), port, mode).limited_to(scope);
    tunnel(proxy, &destination, client, upstream, rest, inspector);
}

/// A tunnel whose TLS the proxy terminates (`inspect=true`): the destination's certificate
/// verified against the host's roots (else the refusal is emitted and the client is told why),
/// then the plaintext relayed through the inspector of a checked tunnel limited to `scope`:
/// every request inside is checked as on plain HTTP.
fn inspected(
    proxy: &Proxy,
    terminator: &super::terminate::Terminator,
    destination: &Destination<'_>,
    client: TcpStream,
    upstream: TcpStream,
    first: &[u8],
    scope: crate::policy::network::RequestScope,
) {
    use super::terminate::TerminateError;
    let host = destination.host;
    let refused = |reason: &str| {
        proxy.emit(&EgressEvent::refused(
            destination.protocol,
            &host.to_string(),
            destination.port,
            "none: the destination must present a certificate this host trusts".to_owned(),
            reason.to_owned(),
        ));
    };
    match terminator.terminate(client, first, upstream, host, refused) {
        Ok((client, upstream)) => {
            let inspector = Inspector::tunnel(host.clone(), destination.port, TunnelMode::Checked)
                .limited_to(scope);
            tunnel(proxy, destination, client, upstream, Vec::new(), inspector);
        }
        // Emitted by `refused`.
        Err(TerminateError::Upstream(_)) => {}
        Err(TerminateError::Client(reason)) => proxy.emit(&EgressEvent::refused(
            destination.protocol,
            &host.to_string(),
            destination.port,
            "none: the client must trust the sandbox's inspection CA (SSL_CERT_FILE) and \
             not pin the destination's key"
                .to_owned(),
            format!("TLS with the client failed under inspection: {reason}"),
        )),
    }
}

/// SOCKS4 and SOCKS4a are not served: read the request far enough to name its destination,
/// report the refusal, answer "rejected".
fn refuse_socks4(proxy: &Proxy, mut client: TcpStream, mut buf: Vec<u8>, deadline: Instant) {
    let (host, port) = loop {
        match socks::parse_socks4(&buf) {
            Some(parsed) => break parsed,
            None if buf.len() < MAX_HEADER_BYTES => {
                match read_more(&mut client, &mut buf, deadline) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
            None => return,
        }
    };
    proxy.emit(&EgressEvent::refused(
        "socks4",
        &host,
        port,
        "none: use SOCKS5 (socks5h://) or HTTP CONNECT".to_owned(),
        "SOCKS4 is not served".to_owned(),
    ));
    let _ = client.write_all(&socks::SOCKS4_REJECTED);
}

/// Decides (asking, when configured, before a name the allowlist does not allow is refused),
/// resolves, checks every address and connects. `request`: the method and path of a plain
/// HTTP request, for the question.
fn open(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    request: Option<(&str, &str)>,
) -> Result<TcpStream, OpenError> {
    let rules = &proxy.config.rules;
    let decision = rules.decide(host, port);
    let mut approval = None;
    let rule = match &decision {
        Decision::Allowed(rule) => rule.clone(),
        Decision::Denied(Refusal::NotAllowed) if proxy.asker.is_some() => {
            let granted = ask(proxy, protocol, host, port, request)?;
            let rule = format!("approved by the {} ({})", granted.by, granted.scope);
            approval = Some(granted);
            rule
        }
        Decision::Denied(_) => {
            let event = EgressEvent::from_decision(protocol, host, port, &decision);
            proxy.emit(&event);
            return Err(OpenError::Refused(Box::new(event)));
        }
    };
    // An approval of an address literal names that address, as an `allow` pattern would; an
    // approved name's addresses are checked as any name's.
    let named = approval.is_some() && matches!(host, Host::Ip(_));
    if let Some(upstream) = &rules.upstream {
        // The upstream resolves names: only a literal address is checked here.
        if let Host::Ip(ip) = host {
            usable_addresses(
                proxy,
                protocol,
                host,
                port,
                vec![SocketAddr::new(*ip, port)],
                named,
            )?;
        }
        let stream = through_upstream(proxy, upstream, host, port)?;
        proxy.emit(&allowed_event(protocol, host, port, &rule, &approval));
        return Ok(stream);
    }
    let addresses = resolve(proxy, host, port).map_err(OpenError::Unreachable)?;
    let usable = usable_addresses(proxy, protocol, host, port, addresses, named)?;
    let mut last_error = String::from("no address");
    for address in usable {
        match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                proxy.emit(&allowed_event(protocol, host, port, &rule, &approval));
                return Ok(stream);
            }
            Err(err) => last_error = format!("connecting to {address} failed: {err}"),
        }
    }
    Err(OpenError::Unreachable(last_error))
}

/// The event of an allowed connection: by a pattern, or by an approval.
fn allowed_event(
    protocol: &str,
    host: &Host,
    port: u16,
    rule: &str,
    approval: &Option<super::config::Approval>,
) -> EgressEvent {
    match approval {
        Some(approval) => EgressEvent::approved(protocol, host, port, approval.clone()),
        None => EgressEvent::allowed(protocol, host, port, rule),
    }
}

/// Asks whether `host:port`, which the allowlist does not allow, may be reached: an approval,
/// or the refusal (emitted) saying the answer was no or did not come in time.
fn ask(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    request: Option<(&str, &str)>,
) -> Result<super::config::Approval, OpenError> {
    use super::ask::{Question, Scope, cut_path};
    use super::config::Approval;
    let Some(asker) = &proxy.asker else {
        return Err(refuse_unasked(
            proxy,
            protocol,
            host,
            port,
            "not in the allowlist",
        ));
    };
    let name = host.to_string();
    if asker.remembered(&name, port) {
        return Ok(Approval {
            by: "earlier approval".to_owned(),
            scope: "remembered".to_owned(),
        });
    }
    let question = Question {
        id: 0,
        protocol: protocol.to_owned(),
        host: name,
        port,
        method: request.map(|(method, _)| method.to_owned()),
        path: request.map(|(_, path)| cut_path(path)),
        rule: format!("--allow-domain {}", suggested_rule(host, port)),
    };
    match asker.ask(question) {
        Some(answer) if answer.decision != Scope::Deny => Ok(Approval {
            by: answer.by.unwrap_or_else(|| "client".to_owned()),
            scope: answer.decision.as_str().to_owned(),
        }),
        Some(answer) => Err(refuse_unasked(
            proxy,
            protocol,
            host,
            port,
            &format!(
                "not in the allowlist, and refused when asked (by the {})",
                answer.by.as_deref().unwrap_or("client")
            ),
        )),
        None => {
            let waited = proxy.config.ask.as_ref().map_or(0, |ask| ask.timeout_ms);
            Err(refuse_unasked(
                proxy,
                protocol,
                host,
                port,
                &format!("not in the allowlist, and no approval came within {waited} ms"),
            ))
        }
    }
}

/// Emits and returns the refusal of a name the allowlist does not allow, with `reason`.
fn refuse_unasked(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    reason: &str,
) -> OpenError {
    let event = EgressEvent::refused(
        protocol,
        &host.to_string(),
        port,
        format!("--allow-domain {}", suggested_rule(host, port)),
        reason.to_owned(),
    );
    proxy.emit(&event);
    OpenError::Refused(Box::new(event))
}

/// A tunnel to `host:port` through the upstream proxy: its addresses (the hosts mapping first,
/// then the system resolver) but the supervisor's own listeners, connected in turn, asked
/// `CONNECT host:port`. The upstream is named by the policy, so a private or loopback address
/// of it is used (that is where corporate proxies live).
fn through_upstream(
    proxy: &Proxy,
    upstream: &crate::policy::network::UpstreamProxy,
    host: &Host,
    port: u16,
) -> Result<TcpStream, OpenError> {
    let addresses = resolve(proxy, &upstream.host, upstream.port)
        .map_err(|why| OpenError::Unreachable(format!("the upstream proxy {upstream}: {why}")))?;
    let locals = proxy.local_addresses();
    let mut last_error = format!("the upstream proxy {upstream} has no usable address");
    for address in addresses {
        if own_listener(proxy, &locals, address.ip(), address.port()) {
            last_error = format!(
                "the upstream proxy {upstream} resolves to {address}, the supervisor's own \
                 listener"
            );
            continue;
        }
        let mut stream = match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => stream,
            Err(err) => {
                last_error = format!("connecting to the upstream proxy {address} failed: {err}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let authorization = proxy.config.upstream_authorization.as_deref();
        return match super::upstream::open_tunnel(&mut stream, host, port, authorization, deadline)
        {
            Ok(()) => {
                let _ = stream.set_read_timeout(None);
                Ok(stream)
            }
            Err(why) => Err(OpenError::Unreachable(why)),
        };
    }
    Err(OpenError::Unreachable(last_error))
}

/// The addresses of `host` that may be connected to: not the supervisor's listeners, none a
/// deny pattern names, special or local ones only when an `allow` pattern names them. When
/// none is left, the refusal of the first one is emitted and returned. `named`: the literal
/// address was approved when asked, which names it (the supervisor's listeners and deny
/// patterns still win).
fn usable_addresses(
    proxy: &Proxy,
    protocol: &str,
    host: &Host,
    port: u16,
    addresses: Vec<SocketAddr>,
    named: bool,
) -> Result<Vec<SocketAddr>, OpenError> {
    let rules = &proxy.config.rules;
    let locals = proxy.local_addresses();
    let mut usable = Vec::new();
    let mut refusal = None;
    for address in addresses {
        let ip = canonical_ip(address.ip());
        let denied_by = rules
            .deny
            .iter()
            .find(|p| p.matches(&Host::Ip(ip), port, true));
        if own_listener(proxy, &locals, ip, port) {
            refusal.get_or_insert_with(|| {
                (
                    format!("{ip}:{port} is the supervisor's own listener"),
                    "none: the supervisor's own listeners are never reachable from a sandbox"
                        .to_owned(),
                )
            });
        } else if let Some(pattern) = denied_by {
            refusal.get_or_insert_with(|| {
                (
                    format!(
                        "{host} resolves to {}, denied by the pattern \"{pattern}\"",
                        Host::Ip(ip)
                    ),
                    "none: a deny pattern names the address".to_owned(),
                )
            });
        } else if !named && !rules.address_allowed(ip, port, &|ip| locals.contains(&ip)) {
            refusal.get_or_insert_with(|| {
                let named = Host::Ip(ip);
                (
                    format!(
                        "{host} resolves to {named}, a loopback, private, link-local or this \
                         host's own address"
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
    Ok(usable)
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
fn own_listener(proxy: &Proxy, locals: &[IpAddr], ip: IpAddr, port: u16) -> bool {
    let ip = canonical_ip(ip);
    proxy.config.denied_ports.contains(&port)
        && (ip.is_loopback() || ip.is_unspecified() || locals.contains(&ip))
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
