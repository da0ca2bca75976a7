//! A destination opened for a connection: decided (asking, when configured), resolved, every
//! address checked (not the supervisor's listeners, no denied or unnamed special address), and
//! connected, directly or through the upstream proxy.

use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Instant;

use sandbox::policy::network::{Decision, Host, Refusal, canonical_ip, suggested_rule};

use super::super::CONNECT_TIMEOUT;
use super::Proxy;
use sandbox::egress::config::EgressEvent;

/// Why a destination could not be opened.
pub(super) enum OpenError {
    /// Refused by policy; the event was emitted.
    Refused(Box<EgressEvent>),
    /// Allowed, but no address could be resolved or connected.
    Unreachable(String),
}

/// Decides (asking, when configured, before a name the allowlist does not allow is refused),
/// resolves, checks every address and connects. `request`: the method and path of a plain
/// HTTP request, for the question.
pub(super) fn open(
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
    approval: &Option<sandbox::egress::config::Approval>,
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
) -> Result<sandbox::egress::config::Approval, OpenError> {
    use sandbox::egress::ask::{Question, Scope, cut_path};
    use sandbox::egress::config::Approval;
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
    upstream: &sandbox::policy::network::UpstreamProxy,
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
        return match super::super::upstream::open_tunnel(
            &mut stream,
            host,
            port,
            authorization,
            deadline,
        ) {
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
                    format!(
                        "{ip}:{port} is an execward server's listener (the supervisor's own \
                         or another registered server's)"
                    ),
                    "none: execward servers' listeners are never reachable from a sandbox"
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
