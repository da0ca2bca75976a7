//! One connection's request, by protocol (HTTP and CONNECT, SOCKS5, refused SOCKS4), read under
//! the handshake deadline, decided, and handed to the tunnel (through TLS termination when the
//! destination's pattern says `inspect=true`).

use std::io::Write;
use std::net::TcpStream;
use std::time::Instant;

use sandbox::policy::network::TunnelMode;

use super::super::MAX_HEADER_BYTES;
use super::super::http::{self, Request};
use super::super::inspect::Inspector;
use super::super::socks;
use super::open::{OpenError, open};
use super::tunnel::{Destination, tunnel};
use super::{Proxy, read_more};
use sandbox::egress::config::{EgressEvent, escape_control};

pub(super) fn handle_http(
    proxy: &Proxy,
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
) {
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
                sandbox::policy::network::suggested_rule(&host, port)
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

pub(super) fn handle_socks(
    proxy: &Proxy,
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
) {
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
    terminator: &super::super::terminate::Terminator,
    destination: &Destination<'_>,
    client: TcpStream,
    upstream: TcpStream,
    first: &[u8],
    scope: sandbox::policy::network::RequestScope,
) {
    use super::super::terminate::TerminateError;
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
pub(super) fn refuse_socks4(
    proxy: &Proxy,
    mut client: TcpStream,
    mut buf: Vec<u8>,
    deadline: Instant,
) {
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
