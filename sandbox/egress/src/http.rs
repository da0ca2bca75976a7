//! The HTTP side of the proxy, sans-I/O: parse a request head into a destination and the bytes
//! to send upstream; render refusals.
//!
//! Two forms are served: `CONNECT host:port` (a tunnel) and absolute-form requests
//! (`GET http://host[:port]/path HTTP/1.1`), which are rewritten to origin form with
//! `Connection: close` (so every request on a connection goes to the host that was checked) and
//! without `Proxy-*` headers. A `Host` header naming another host than the URL is refused.
//! `https://` absolute-form requests are refused: clients tunnel TLS with `CONNECT`. A
//! request's body framing is checked here (the [`super::framing`] module); the bytes after the
//! head are the caller's to follow, so that every later request on the connection is parsed
//! and checked the same way.

use sandbox::policy::network::Host;

use super::framing::{self, Body};
use super::{MAX_HEADER_BYTES, MAX_HEADERS};

/// A parsed request head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `CONNECT host:port`: reply 200, then tunnel.
    Connect {
        /// Destination host.
        host: Host,
        /// Destination port.
        port: u16,
        /// Length of the head (what follows is the client's first tunnel bytes).
        head_len: usize,
    },
    /// An absolute-form request: send `upstream`, then its body.
    Forward {
        /// Destination host.
        host: Host,
        /// Destination port.
        port: u16,
        /// The request method.
        method: String,
        /// The request target in origin form (`/path?query`), as sent upstream.
        path: String,
        /// The rewritten head.
        upstream: Vec<u8>,
        /// How the body that follows the head is framed.
        body: Body,
        /// Length of the head as the client sent it.
        head_len: usize,
    },
}

/// Why a head was refused (a 4xx answer, not a denial record: no destination was chosen).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// More than [`MAX_HEADER_BYTES`] without the end of the head.
    #[error("the request head is larger than MAX_HEADER_BYTES ({MAX_HEADER_BYTES} bytes)")]
    TooLarge,
    /// Not HTTP/1.x.
    #[error("malformed request head: {0}")]
    Malformed(String),
    /// An origin-form request or another scheme.
    #[error("{0}")]
    Unsupported(String),
    /// A request that names a destination and is refused for what it asks of it (reported like
    /// every refusal of a destination).
    #[error("{reason}")]
    Refused {
        /// The destination as the request names it (not normalised when it does not parse).
        host: String,
        /// Its port.
        port: u16,
        /// Why.
        reason: String,
        /// What to do instead.
        rule: String,
    },
}

/// Parses `buf`. `Ok(None)`: the head is incomplete, read more.
///
/// # Errors
/// [`HttpError`].
pub fn parse(buf: &[u8]) -> Result<Option<Request>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let status = request
        .parse(buf)
        .map_err(|err| HttpError::Malformed(err.to_string()))?;
    let head_len = match status {
        httparse::Status::Partial if buf.len() >= MAX_HEADER_BYTES => {
            return Err(HttpError::TooLarge);
        }
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(len) if len > MAX_HEADER_BYTES => {
            return Err(HttpError::TooLarge);
        }
        httparse::Status::Complete(len) => len,
    };
    let method = request.method.unwrap_or_default();
    let target = request.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = authority(target, None)?;
        return Ok(Some(Request::Connect {
            host,
            port,
            head_len,
        }));
    }
    let lower = target.to_ascii_lowercase();
    let Some(after) = lower.strip_prefix("http://").map(|_| &target[7..]) else {
        let message = if lower.starts_with("https://") {
            let text = &target[8..];
            let authority_text = &text[..text.find(['/', '?', '#']).unwrap_or(text.len())];
            let authority_text = authority_text
                .rsplit_once('@')
                .map_or(authority_text, |(_, host)| host);
            let (host, port) = authority(authority_text, Some(443)).map_or_else(
                |_| (authority_text.to_owned(), 443),
                |(host, port)| (host.to_string(), port),
            );
            return Err(HttpError::Refused {
                host,
                port,
                reason: "https:// URLs are tunnelled with CONNECT, not sent to the proxy"
                    .to_owned(),
                rule: "none: send CONNECT host:port (what HTTPS_PROXY clients do)".to_owned(),
            });
        } else {
            format!(
                "this is a proxy: send absolute-form requests (GET http://host/path) or CONNECT \
                 host:port (got {target:?})"
            )
        };
        return Err(HttpError::Unsupported(message));
    };
    let (authority_text, path) = match after.find(['/', '?', '#']) {
        Some(index) => (&after[..index], &after[index..]),
        None => (after, "/"),
    };
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    let authority_text = authority_text
        .rsplit_once('@')
        .map_or(authority_text, |(_, host)| host);
    let (host, port) = authority(authority_text, Some(80))?;
    let unframed = |err: framing::FramingError| HttpError::Refused {
        host: host.to_string(),
        port,
        reason: format!("{err}: the request cannot be framed the one way every server would"),
        rule: "none: send a request with one Content-Length or Transfer-Encoding: chunked \
               and CRLF line ends"
            .to_owned(),
    };
    framing::check_line_ends(&buf[..head_len]).map_err(unframed)?;
    let body = framing::body_of(request.version.unwrap_or(1), request.headers).map_err(unframed)?;
    let mut upstream = format!(
        "{method} {path} HTTP/1.{}\r\n",
        request.version.unwrap_or(1)
    )
    .into_bytes();
    let mut saw_host = false;
    for header in request.headers.iter() {
        let name = header.name.to_ascii_lowercase();
        if name == "host" {
            let value = std::str::from_utf8(header.value)
                .map_err(|_| HttpError::Malformed("Host header is not UTF-8".to_owned()))?;
            if !host_header_names(value, &host, port) {
                return Err(HttpError::Refused {
                    host: host.to_string(),
                    port,
                    reason: format!(
                        "the Host header {value:?} names another host than the URL ({host})"
                    ),
                    rule: "none: leave the Host header out or name the URL's host".to_owned(),
                });
            }
            saw_host = true;
        }
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        upstream.extend_from_slice(header.name.as_bytes());
        upstream.extend_from_slice(b": ");
        upstream.extend_from_slice(header.value);
        upstream.extend_from_slice(b"\r\n");
    }
    if !saw_host {
        let value = if port == 80 {
            host.to_string()
        } else {
            format!("{host}:{port}")
        };
        upstream.extend_from_slice(format!("Host: {value}\r\n").as_bytes());
    }
    upstream.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(Request::Forward {
        host,
        port,
        method: method.to_owned(),
        path,
        upstream,
        body,
        head_len,
    }))
}

/// Whether a `Host` header value names `host` (its port, if any, is not compared; a value that
/// is no `host[:port]` names nothing). The proxy's absolute-form check and `http/request`'s
/// share it.
pub fn host_header_names(value: &str, host: &Host, port: u16) -> bool {
    authority(value.trim(), Some(port)).is_ok_and(|(named, _)| named == *host)
}

/// Parses `host[:port]` (`[v6]:port`); `default_port` when the port may be left out.
fn authority(text: &str, default_port: Option<u16>) -> Result<(Host, u16), HttpError> {
    let bad = || {
        HttpError::Malformed(format!(
            "{text:?} is not host:port (expected e.g. example.com:443 or [::1]:8080)"
        ))
    };
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let (v6, after) = inner.split_once(']').ok_or_else(bad)?;
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(bad()),
        };
        (v6, port)
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(bad)?,
        None => default_port.ok_or_else(bad)?,
    };
    let host = Host::parse(host).map_err(|_| bad())?;
    Ok((host, port))
}

/// A complete HTTP response with a plain-text body, closing the connection.
pub fn response(status: u16, reason: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\nX-Execward-Egress: refused\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer that opens a tunnel.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn connect_names_host_and_port_and_keeps_the_rest() {
        let head = b"CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n";
        let parsed = parse(&[&head[..], b"\x16\x03"].concat()).unwrap().unwrap();
        assert_eq!(
            parsed,
            Request::Connect {
                host: Host::parse("example.com").unwrap(),
                port: 443,
                head_len: head.len(),
            }
        );
        assert!(matches!(
            parse(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n").unwrap(),
            Some(Request::Connect { port: 8080, .. })
        ));
        assert!(parse(b"CONNECT example.com HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn absolute_form_is_rewritten_to_origin_form_with_connection_close() {
        let parsed = parse(
            b"POST http://pypi.test:8080/simple/x/?a=1 HTTP/1.1\r\nHost: pypi.test:8080\r\n\
              Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nBODY",
        )
        .unwrap()
        .unwrap();
        let Request::Forward {
            host,
            port,
            method,
            path,
            upstream,
            body,
            head_len,
        } = parsed
        else {
            panic!("not forward");
        };
        assert_eq!((host.to_string(), port), ("pypi.test".to_owned(), 8080));
        assert_eq!((method.as_str(), path.as_str()), ("POST", "/simple/x/?a=1"));
        assert_eq!(body, Body::Length(4));
        assert_eq!(head_len, 148);
        assert_eq!(
            String::from_utf8(upstream).unwrap(),
            "POST /simple/x/?a=1 HTTP/1.1\r\nHost: pypi.test:8080\r\nContent-Length: 4\r\n\
             Connection: close\r\n\r\n"
        );
        for unframed in [
            &b"POST http://a.test/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"GET http://a.test/ HTTP/1.1\nHost: a.test\r\n\r\n",
        ] {
            assert!(matches!(parse(unframed), Err(HttpError::Refused { .. })));
        }
    }

    #[test]
    fn a_host_header_naming_another_host_is_refused() {
        let err =
            parse(b"GET http://allowed.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n").unwrap_err();
        assert!(err.to_string().contains("another host"), "{err}");
    }

    #[test]
    fn incomplete_heads_ask_for_more_and_oversized_ones_fail() {
        assert_eq!(
            parse(b"GET http://a.test/ HTTP/1.1\r\nHost: a").unwrap(),
            None
        );
        let mut big = b"GET http://a.test/ HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEADER_BYTES + 10, b'a');
        assert_eq!(parse(&big).unwrap_err(), HttpError::TooLarge);
        assert!(matches!(
            parse(b"GET /origin HTTP/1.1\r\n\r\n").unwrap_err(),
            HttpError::Unsupported(_)
        ));
    }
}
