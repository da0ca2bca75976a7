//! The one rule every client follows before it sends a bearer token: over plain text (`ws://`,
//! `http://`) only to a loopback host, so a token never crosses the network in clear. The
//! remote client (`relay::tls::check_url`) and the local one (`client::transport`) both ask
//! [`is_loopback_host`], before they connect.

/// Whether a URL's host names this machine's loopback: `localhost`, an address of 127.0.0.0/8,
/// or `::1` (with or without brackets). Any other name is not, even one that resolves to
/// loopback today: a resolver can change its answer after the check.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_hosts_are_loopback() {
        for host in [
            "localhost",
            "LOCALHOST",
            "127.0.0.1",
            "127.9.8.7",
            "::1",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "10.0.0.1",
            "0.0.0.0",
            "[::]",
            "[::2]",
            "localhost.example",
            "example.com",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
