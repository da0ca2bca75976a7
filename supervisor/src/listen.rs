//! The `--listen` URL: `ws://IP:PORT`, `wss://IP:PORT` (TLS) or `unix:PATH`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// The listen URL used when none is given: loopback, a free port.
pub const DEFAULT_LISTEN_URL: &str = "ws://127.0.0.1:0";

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    /// A TCP address serving websockets.
    Tcp(SocketAddr),
    /// A TCP address serving websockets over TLS (`--tls-cert`, `--tls-key`).
    Wss(SocketAddr),
    /// A unix socket path serving websockets, created with mode 0600.
    Unix(PathBuf),
}

/// Why a `--listen` value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid listen URL {url:?}: {reason}; expected ws://IP:PORT (e.g. {DEFAULT_LISTEN_URL}), wss://IP:PORT or unix:/absolute/path.sock"
)]
pub struct ExecServerListenUrlParseError {
    /// The rejected input.
    pub url: String,
    /// What was wrong with it.
    pub reason: ListenUrlProblem,
}

/// What is wrong with a `--listen` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenUrlProblem {
    /// `unix:` with a relative path.
    #[error("the unix socket path must be absolute")]
    RelativeUnixPath,
    /// Neither `ws://`, `wss://` nor `unix:`.
    #[error("unsupported scheme")]
    UnsupportedScheme,
    /// `ws://IP:PORT/path`.
    #[error("a path is not allowed")]
    Path,
    /// No `:PORT`.
    #[error("the port is missing: give IP:PORT (port 0 picks a free port)")]
    MissingPort,
    /// The port is not decimal digits.
    #[error("the port {port:?} is not a number from 0 to 65535")]
    PortNotANumber {
        /// The port as given.
        port: String,
    },
    /// The port is past 65535.
    #[error("the port {port} is out of range (0 to 65535)")]
    PortOutOfRange {
        /// The port as given.
        port: String,
    },
    /// The host is a name (only `localhost` is accepted) or not an address.
    #[error(
        "the host {host:?} is not an IP address (IPv6 in brackets; names other than localhost \
         are not resolved)"
    )]
    HostNotAnAddress {
        /// The host as given.
        host: String,
    },
    /// An IPv6 address without brackets.
    #[error("an IPv6 address must be in brackets, e.g. ws://[::1]:0")]
    Ipv6WithoutBrackets,
}

impl ListenAddress {
    /// Parse a listen URL.
    ///
    /// # Errors
    /// [`ExecServerListenUrlParseError`] naming the problem.
    pub fn parse(url: &str) -> Result<Self, ExecServerListenUrlParseError> {
        let error = |reason: ListenUrlProblem| ExecServerListenUrlParseError {
            url: url.to_owned(),
            reason,
        };
        if let Some(path) = url.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(error(ListenUrlProblem::RelativeUnixPath));
            }
            return Ok(Self::Unix(path));
        }
        let (authority, tls) = match (url.strip_prefix("ws://"), url.strip_prefix("wss://")) {
            (Some(authority), _) => (authority, false),
            (None, Some(authority)) => (authority, true),
            (None, None) => return Err(error(ListenUrlProblem::UnsupportedScheme)),
        };
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err(error(ListenUrlProblem::Path));
        }
        let Some((host, port)) = authority.rsplit_once(':').filter(|(host, _)| {
            // `[::1]` alone has colons but no port.
            !host.is_empty() && (!host.starts_with('[') || host.ends_with(']'))
        }) else {
            return Err(error(ListenUrlProblem::MissingPort));
        };
        let port = parse_port(port).map_err(error)?;
        let ip = if host == "localhost" {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            bare.parse::<IpAddr>().map_err(|_| {
                error(ListenUrlProblem::HostNotAnAddress {
                    host: host.to_owned(),
                })
            })?
        };
        if ip.is_ipv6() && !host.starts_with('[') {
            return Err(error(ListenUrlProblem::Ipv6WithoutBrackets));
        }
        let address = SocketAddr::new(ip, port);
        Ok(if tls {
            Self::Wss(address)
        } else {
            Self::Tcp(address)
        })
    }

    /// Whether only this machine can connect (loopback TCP or a unix socket).
    pub fn is_local_only(&self) -> bool {
        match self {
            Self::Tcp(address) | Self::Wss(address) => address.ip().is_loopback(),
            Self::Unix(_) => true,
        }
    }

    /// Whether the listener serves TLS (`wss://`).
    pub fn is_tls(&self) -> bool {
        matches!(self, Self::Wss(_))
    }
}

/// A decimal port from 0 to 65535, or what is wrong with `text`.
fn parse_port(text: &str) -> Result<u16, ListenUrlProblem> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ListenUrlProblem::PortNotANumber {
            port: text.to_owned(),
        });
    }
    text.parse::<u16>()
        .map_err(|_| ListenUrlProblem::PortOutOfRange {
            port: text.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_unix_and_localhost() {
        assert_eq!(
            ListenAddress::parse("ws://127.0.0.1:0").unwrap(),
            ListenAddress::Tcp("127.0.0.1:0".parse().unwrap())
        );
        assert_eq!(
            ListenAddress::parse("ws://[::1]:80").unwrap(),
            ListenAddress::Tcp("[::1]:80".parse().unwrap())
        );
        assert_eq!(
            ListenAddress::parse("ws://localhost:9").unwrap(),
            ListenAddress::Tcp("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(
            ListenAddress::parse("wss://0.0.0.0:443").unwrap(),
            ListenAddress::Wss("0.0.0.0:443".parse().unwrap())
        );
        assert_eq!(
            ListenAddress::parse("unix:/tmp/s.sock").unwrap(),
            ListenAddress::Unix("/tmp/s.sock".into())
        );
    }

    #[test]
    fn rejects_bad_urls_with_the_expected_form() {
        for bad in [
            "http://127.0.0.1:1",
            "ws://example.com:1",
            "ws://127.0.0.1",
            "unix:rel.sock",
            "ws://1.2.3.4:1/x",
        ] {
            let error = ListenAddress::parse(bad).unwrap_err();
            assert!(
                error.to_string().contains("expected ws://IP:PORT"),
                "{error}"
            );
        }
    }

    #[test]
    fn each_part_of_a_bad_tcp_url_is_named() {
        let reason = |url: &str| ListenAddress::parse(url).unwrap_err().reason.to_string();
        assert_eq!(
            reason("ws://127.0.0.1:99999"),
            "the port 99999 is out of range (0 to 65535)"
        );
        assert_eq!(
            reason("ws://127.0.0.1:http"),
            "the port \"http\" is not a number from 0 to 65535"
        );
        assert!(reason("ws://example.com:1").contains("\"example.com\" is not an IP address"));
        assert!(reason("ws://127.0.0.1").contains("the port is missing"));
        assert!(reason("ws://[::1]").contains("the port is missing"));
        assert!(reason("ws://::1:80").contains("in brackets"));
    }

    #[test]
    fn loopback_detection() {
        assert!(
            ListenAddress::parse("ws://127.0.0.1:1")
                .unwrap()
                .is_local_only()
        );
        assert!(
            !ListenAddress::parse("ws://0.0.0.0:1")
                .unwrap()
                .is_local_only()
        );
    }
}
