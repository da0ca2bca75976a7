//! Allowed connections through an upstream HTTP proxy: `CONNECT host:port` (with
//! `Proxy-Authorization` when credentials were given), then the tunnel is the destination.
//!
//! The request is written and the answer read here, sans tunnel: the answer's head is read one
//! byte at a time (it is a few hundred bytes, once per connection) so not a byte of what
//! follows it (a server-first protocol's greeting) is taken from the tunnel.

use sandbox::policy::network::Host;

use super::MAX_HEADER_BYTES;

/// The `CONNECT` request for `host:port`.
pub fn connect_request(host: &Host, port: u16, authorization: Option<&str>) -> Vec<u8> {
    let target = format!("{host}:{port}");
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(value) = authorization {
        request.push_str(&format!("Proxy-Authorization: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.into_bytes()
}

#[cfg(target_os = "linux")]
/// Asks the upstream (`stream`, connected) for a tunnel to `host:port` and reads its answer
/// until `deadline`. `Ok(())` on a 2xx answer: the stream is then the tunnel.
///
/// # Errors
/// Why the upstream did not open the tunnel, in words (its status line, or the I/O error).
pub fn open_tunnel(
    stream: &mut std::net::TcpStream,
    host: &Host,
    port: u16,
    authorization: Option<&str>,
    deadline: std::time::Instant,
) -> Result<(), String> {
    use std::io::Write;
    stream
        .write_all(&connect_request(host, port, authorization))
        .map_err(|err| format!("sending CONNECT to the upstream proxy failed: {err}"))?;
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEADER_BYTES {
            return Err(format!(
                "the upstream proxy's answer head is longer than MAX_HEADER_BYTES \
                 ({MAX_HEADER_BYTES})"
            ));
        }
        match super::read_before(stream, &mut byte, deadline) {
            Ok(0) => return Err("the upstream proxy closed the connection".to_owned()),
            Ok(_) => head.push(byte[0]),
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(format!("reading the upstream proxy's answer: {err}")),
        }
    }
    let status_line = head
        .split(|b| *b == b'\r')
        .next()
        .map(|line| String::from_utf8_lossy(line).into_owned())
        .unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or_default();
    let code = parts.next().and_then(|code| code.parse::<u16>().ok());
    match code {
        Some(200..=299) if version.starts_with("HTTP/1.") => Ok(()),
        _ => Err(format!(
            "the upstream proxy refused CONNECT {host}:{port}: {}",
            sandbox::egress::config::escape_control(&status_line)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_request_names_the_destination_and_carries_the_credentials() {
        let host = Host::parse("Example.COM").unwrap();
        let request = connect_request(&host, 443, Some("Basic dTpw"));
        assert_eq!(
            String::from_utf8(request).unwrap(),
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\
             Proxy-Authorization: Basic dTpw\r\n\r\n"
        );
        let v6 = Host::parse("::1").unwrap();
        let request = String::from_utf8(connect_request(&v6, 8080, None)).unwrap();
        assert_eq!(
            request,
            "CONNECT [::1]:8080 HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"
        );
    }
}
