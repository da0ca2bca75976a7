//! The `--listen` URL: `ws://IP:PORT` or `unix:PATH`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// The listen URL used when none is given: loopback, a free port.
pub const DEFAULT_LISTEN_URL: &str = "ws://127.0.0.1:0";

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddress {
    /// A TCP address serving websockets.
    Tcp(SocketAddr),
    /// A unix socket path serving websockets, created with mode 0600.
    Unix(PathBuf),
}

/// Why a `--listen` value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid listen URL {url:?}: {reason}; expected ws://IP:PORT (e.g. {DEFAULT_LISTEN_URL}) or unix:/absolute/path.sock"
)]
pub struct ExecServerListenUrlParseError {
    /// The rejected input.
    pub url: String,
    /// What was wrong with it.
    pub reason: String,
}

impl ListenAddress {
    /// Parse a listen URL.
    ///
    /// # Errors
    /// [`ExecServerListenUrlParseError`] naming the problem.
    pub fn parse(url: &str) -> Result<Self, ExecServerListenUrlParseError> {
        let error = |reason: &str| ExecServerListenUrlParseError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        if let Some(path) = url.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(error("the unix socket path must be absolute"));
            }
            return Ok(Self::Unix(path));
        }
        let Some(authority) = url.strip_prefix("ws://") else {
            return Err(error("unsupported scheme"));
        };
        let authority = authority.strip_suffix('/').unwrap_or(authority);
        if authority.contains('/') {
            return Err(error("a path is not allowed"));
        }
        if let Some(port) = authority.strip_prefix("localhost:") {
            let port = port
                .parse::<u16>()
                .map_err(|_| error("the port must be a number from 0 to 65535"))?;
            return Ok(Self::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        authority.parse::<SocketAddr>().map(Self::Tcp).map_err(|_| {
            error("the host must be an IP address (IPv6 in brackets) followed by :PORT")
        })
    }

    /// Whether only this machine can connect (loopback TCP or a unix socket).
    pub fn is_local_only(&self) -> bool {
        match self {
            Self::Tcp(address) => address.ip().is_loopback(),
            Self::Unix(_) => true,
        }
    }
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
