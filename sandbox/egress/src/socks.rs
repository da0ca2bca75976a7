//! SOCKS5 (RFC 1928), sans-I/O: the greeting, the `CONNECT` request (IPv4, IPv6 and domain
//! forms; the domain form lets the proxy resolve, as `socks5h://` clients want) and the
//! replies. No authentication method is offered but "none"; `BIND` and `UDP ASSOCIATE` are
//! refused (UDP fails closed).
//!
//! Written here rather than taken from a crate: the SOCKS5 server crates are tokio-based, and the
//! proxy is a small synchronous program that confines itself before any runtime exists; the
//! parsing below is two fixed-layout messages.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sandbox::policy::network::Host;

/// Protocol version byte.
pub const VERSION: u8 = 5;
/// SOCKS4's version byte (not served: recognised to report the refusal by name).
pub const VERSION_4: u8 = 4;
/// SOCKS4's "request rejected" reply.
pub const SOCKS4_REJECTED: [u8; 8] = [0, 0x5b, 0, 0, 0, 0, 0, 0];
/// Reply: succeeded.
pub const REPLY_OK: u8 = 0;
/// Reply: general failure.
pub const REPLY_FAILURE: u8 = 1;
/// Reply: connection not allowed by ruleset.
pub const REPLY_NOT_ALLOWED: u8 = 2;
/// Reply: host unreachable.
pub const REPLY_HOST_UNREACHABLE: u8 = 4;
/// Reply: command not supported.
pub const REPLY_COMMAND_NOT_SUPPORTED: u8 = 7;
/// Reply: address type not supported.
pub const REPLY_ADDRESS_NOT_SUPPORTED: u8 = 8;

/// Why a SOCKS5 message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    /// Not version 5.
    #[error("not a SOCKS5 message (version byte {0})")]
    Version(u8),
    /// The client offers no method without authentication.
    #[error("the client offers no SOCKS5 method without authentication")]
    NoAcceptableMethod,
    /// Only CONNECT is served.
    #[error("SOCKS5 command {command} is not supported (only CONNECT)")]
    Command {
        /// The command byte (2 BIND, 3 UDP ASSOCIATE).
        command: u8,
        /// The address the request names.
        host: Host,
        /// Its port.
        port: u16,
    },
    /// Unknown address type.
    #[error("SOCKS5 address type {0} is not supported")]
    AddressType(u8),
    /// A domain that is not a host name.
    #[error("SOCKS5 domain {0:?} is not a host name")]
    BadDomain(String),
}

impl SocksError {
    /// The reply code for this error.
    pub fn reply_code(&self) -> u8 {
        match self {
            SocksError::Command { .. } => REPLY_COMMAND_NOT_SUPPORTED,
            SocksError::AddressType(_) => REPLY_ADDRESS_NOT_SUPPORTED,
            _ => REPLY_FAILURE,
        }
    }
}

/// Checks a complete greeting (`05 N METHODS...`); `Ok(None)` when more bytes are needed.
/// `Ok(Some(len))`: its length; answer [`method_reply`].
///
/// # Errors
/// [`SocksError`].
pub fn parse_greeting(buf: &[u8]) -> Result<Option<usize>, SocksError> {
    let (Some(&version), Some(&count)) = (buf.first(), buf.get(1)) else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    let len = 2 + usize::from(count);
    let Some(methods) = buf.get(2..len) else {
        return Ok(None);
    };
    if !methods.contains(&0) {
        return Err(SocksError::NoAcceptableMethod);
    }
    Ok(Some(len))
}

/// The method selection reply: "no authentication" (or "no acceptable method").
pub fn method_reply(acceptable: bool) -> [u8; 2] {
    [VERSION, if acceptable { 0 } else { 0xff }]
}

/// Parses a complete CONNECT request; `Ok(None)` when more bytes are needed. `Ok(Some((host,
/// port, len)))`.
///
/// # Errors
/// [`SocksError`].
pub fn parse_request(buf: &[u8]) -> Result<Option<(Host, u16, usize)>, SocksError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    if buf[0] != VERSION {
        return Err(SocksError::Version(buf[0]));
    }
    let (host, at) = match buf[3] {
        1 => {
            let Some(octets) = buf.get(4..8) else {
                return Ok(None);
            };
            let ip = Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]);
            (Host::Ip(IpAddr::V4(ip)), 8)
        }
        4 => {
            let Some(octets) = buf.get(4..20) else {
                return Ok(None);
            };
            let mut bytes = [0u8; 16];
            bytes.copy_from_slice(octets);
            (Host::Ip(IpAddr::V6(Ipv6Addr::from(bytes))), 20)
        }
        3 => {
            let len = usize::from(buf[4]);
            let Some(name) = buf.get(5..5 + len) else {
                return Ok(None);
            };
            let text = String::from_utf8_lossy(name).into_owned();
            let host = Host::parse(&text).map_err(|_| SocksError::BadDomain(text.clone()))?;
            (host, 5 + len)
        }
        other => return Err(SocksError::AddressType(other)),
    };
    let Some(port) = buf.get(at..at + 2) else {
        return Ok(None);
    };
    let port = u16::from_be_bytes([port[0], port[1]]);
    if buf[1] != 1 {
        // Refused once the address is read, so the refusal names it.
        return Err(SocksError::Command {
            command: buf[1],
            host,
            port,
        });
    }
    Ok(Some((host, port, at + 2)))
}

/// A SOCKS command's name.
pub fn command_name(command: u8) -> String {
    match command {
        1 => "CONNECT".to_owned(),
        2 => "BIND".to_owned(),
        3 => "UDP ASSOCIATE".to_owned(),
        other => other.to_string(),
    }
}

/// The destination of a complete SOCKS4 or SOCKS4a request (`04 CMD PORT IP USERID 00
/// [HOST 00]`), as text (an IPv4 address or the SOCKS4a name); `None` while incomplete.
pub fn parse_socks4(buf: &[u8]) -> Option<(String, u16)> {
    let port = u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]);
    let ip = Ipv4Addr::new(*buf.get(4)?, *buf.get(5)?, *buf.get(6)?, *buf.get(7)?);
    let user_end = 8 + buf.get(8..)?.iter().position(|b| *b == 0)?;
    let [0, 0, 0, last] = ip.octets() else {
        return Some((ip.to_string(), port));
    };
    if last == 0 {
        return Some((ip.to_string(), port));
    }
    let name = buf.get(user_end + 1..)?;
    let name_end = name.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8_lossy(&name[..name_end]).into_owned(),
        port,
    ))
}

/// A reply with `code` and an unspecified bound address.
pub fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_needs_no_auth_offered() {
        assert_eq!(parse_greeting(&[5, 1]).unwrap(), None);
        assert_eq!(parse_greeting(&[5, 2, 2, 0]).unwrap(), Some(4));
        assert_eq!(
            parse_greeting(&[5, 1, 2]).unwrap_err(),
            SocksError::NoAcceptableMethod
        );
        assert_eq!(
            parse_greeting(&[4, 1, 0]).unwrap_err(),
            SocksError::Version(4)
        );
    }

    #[test]
    fn requests_in_every_address_form() {
        let mut domain = vec![5, 1, 0, 3, 8];
        domain.extend_from_slice(b"PyPI.org");
        domain.extend_from_slice(&443u16.to_be_bytes());
        let (host, port, len) = parse_request(&domain).unwrap().unwrap();
        assert_eq!(
            (host.to_string(), port, len),
            ("pypi.org".into(), 443, domain.len())
        );
        assert_eq!(parse_request(&domain[..9]).unwrap(), None);
        let v4 = [5, 1, 0, 1, 127, 0, 0, 1, 0x1f, 0x90];
        let (host, port, _) = parse_request(&v4).unwrap().unwrap();
        assert_eq!((host.to_string(), port), ("127.0.0.1".into(), 8080));
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0, 80]);
        let (host, _, _) = parse_request(&v6).unwrap().unwrap();
        assert_eq!(host.to_string(), "[::1]");
        assert_eq!(
            parse_request(&[5, 3, 0, 1, 10, 0, 0, 1, 0, 53]).unwrap_err(),
            SocksError::Command {
                command: 3,
                host: Host::Ip("10.0.0.1".parse().unwrap()),
                port: 53
            }
        );
    }

    #[test]
    fn socks4_and_socks4a_requests_name_their_destination() {
        let mut a = vec![4, 1, 0, 80, 0, 0, 0, 1];
        a.extend_from_slice(b"user\0evil.test\0");
        assert_eq!(parse_socks4(&a), Some(("evil.test".to_owned(), 80)));
        assert_eq!(parse_socks4(&a[..a.len() - 1]), None);
        let plain = [4, 1, 1, 187, 10, 0, 0, 1, 0];
        assert_eq!(parse_socks4(&plain), Some(("10.0.0.1".to_owned(), 443)));
    }
}
