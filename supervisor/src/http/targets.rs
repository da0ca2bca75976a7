//! Which addresses an `http/request` may connect to.
//!
//! Refused unless the request explicitly allows them:
//! - link-local addresses (169.254.0.0/16, fe80::/10), which hold the cloud metadata services,
//!   and the metadata addresses outside that range ([`METADATA_ADDRESSES`]); NAT64
//!   (64:ff9b::/96) and IPv4-mapped forms are looked through;
//! - the server's own listeners: the same port on the listening address, on any address of this
//!   host when the listener is bound to the unspecified address, and on `0.0.0.0`/`::` (which
//!   Linux connects to loopback);
//! - every other execward server's listeners: a TCP port an entry of the registry of servers
//!   ([`sandbox::servers`], the one that narrows every sandbox) names, on loopback, the
//!   unspecified address or any address of this host. Without it the server would be a way for
//!   a request into its neighbour, which admits the server's user from its user namespace
//!   without a token: its `/status` (every session's processes) answered 200. When the registry
//!   cannot be read, this host's addresses are refused (fail closed).
//!
//! Everything else stays reachable, loopback included (local services are a legitimate target).
//! Names are resolved here, every address is checked, and the connection is pinned to the
//! checked addresses ([`super::client`]), so a name that resolves differently the second time
//! (DNS rebinding) cannot slip past the check.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Cloud metadata services outside the link-local ranges: AWS's IPv6 endpoint and Alibaba
/// Cloud's. Refused like link-local addresses.
pub const METADATA_ADDRESSES: &[IpAddr] = &[
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
];

/// Why an address was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A link-local or metadata address.
    LinkLocal,
    /// One of the server's own listeners.
    OwnListener,
    /// A port another registered execward server listens on, at an address of this host.
    ServerListener,
    /// An address of this host while the registry of servers could not be read.
    ServersUnknown,
    /// A loopback, private, link-local or this host's own address the request's network
    /// allowlist does not name.
    NotNamed,
}

impl Refusal {
    /// What was refused and which param allows it.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::LinkLocal => {
                "a link-local or cloud metadata address (allowed only with allowLinkLocal: true)"
            }
            Refusal::OwnListener => {
                "this exec-server's own listener (allowed only with allowOwnListeners: true)"
            }
            Refusal::ServerListener => {
                "another execward server's listener on this host (a port the registry of servers \
                 names; allowed only with allowOwnListeners: true)"
            }
            Refusal::ServersUnknown => {
                "an address of this host while the registry of execward servers cannot be read \
                 to tell which of its ports are servers' listeners (allowed only with \
                 allowOwnListeners: true)"
            }
            Refusal::NotNamed => {
                "a loopback, private, link-local or this host's own address the sandbox's network \
                 allowlist does not name (allow the address itself, e.g. \"127.0.0.1:8080\")"
            }
        }
    }
}

/// The checks of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPolicy {
    /// Allow link-local and metadata addresses.
    pub allow_link_local: bool,
    /// Allow the server's own listeners and every other registered server's.
    pub allow_own_listeners: bool,
    /// The sandbox's network allowlist: names are checked against it on every hop, and a
    /// special address only when a pattern names it.
    pub egress: Option<sandbox::EgressRules>,
}

/// What the policy needs to know about this host.
pub trait HostFacts {
    /// The server's TCP listeners.
    fn own_listeners(&self) -> &[SocketAddr];
    /// Whether `ip` is an address of this host (loopback is checked separately).
    fn is_host_address(&self, ip: IpAddr) -> bool;
    /// The TCP ports the registry of servers names (this server's among them); `None` when it
    /// cannot be read.
    fn servers_ports(&self) -> Option<Vec<u16>>;
}

impl TargetPolicy {
    /// `Err` when `target` may not be connected to.
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn check(&self, target: SocketAddr, host: &impl HostFacts) -> Result<(), Refusal> {
        let ip = canonical(target.ip());
        if !self.allow_link_local && is_link_local_or_metadata(ip) {
            return Err(Refusal::LinkLocal);
        }
        if !self.allow_own_listeners {
            if is_own_listener(ip, target.port(), host) {
                return Err(Refusal::OwnListener);
            }
            if is_this_host(ip, host) {
                match host.servers_ports() {
                    Some(ports) if ports.contains(&target.port()) => {
                        return Err(Refusal::ServerListener);
                    }
                    Some(_) => {}
                    None => return Err(Refusal::ServersUnknown),
                }
            }
        }
        if let Some(rules) = &self.egress
            && !rules.address_allowed(ip, target.port(), &|ip| host.is_host_address(ip))
        {
            return Err(Refusal::NotNamed);
        }
        Ok(())
    }
}

/// Embedded IPv4 forms as the IPv4 address they carry: the egress proxy's function, so both
/// check one form.
fn canonical(ip: IpAddr) -> IpAddr {
    sandbox::policy::network::canonical_ip(ip)
}

fn is_link_local_or_metadata(ip: IpAddr) -> bool {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    link_local || METADATA_ADDRESSES.contains(&ip)
}

/// Linux connects to loopback when asked for the unspecified address.
fn effective(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    }
}

/// Loopback, the unspecified address (which Linux connects to loopback) or an address of this
/// host: where another server of this host may listen.
fn is_this_host(ip: IpAddr, host: &impl HostFacts) -> bool {
    let target = effective(ip);
    target.is_loopback() || host.is_host_address(target)
}

fn is_own_listener(ip: IpAddr, port: u16, host: &impl HostFacts) -> bool {
    let target = effective(ip);
    host.own_listeners().iter().any(|listener| {
        if listener.port() != port {
            return false;
        }
        let bound = canonical(listener.ip());
        if bound.is_unspecified() {
            target.is_loopback() || host.is_host_address(target)
        } else {
            effective(bound) == target
        }
    })
}

/// The running host: the server's listeners, the interface addresses from `getifaddrs` and the
/// registry of servers (both read at each check: addresses come and go, servers start).
#[derive(Debug, Default)]
pub struct RunningHost {
    listeners: Vec<SocketAddr>,
    servers: sandbox::servers::RegistryReader,
}

impl RunningHost {
    /// A host whose server listens on `listeners`.
    pub fn new(listeners: Vec<SocketAddr>) -> Self {
        Self {
            listeners,
            servers: sandbox::servers::RegistryReader::new(),
        }
    }
}

impl HostFacts for RunningHost {
    fn own_listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    fn is_host_address(&self, ip: IpAddr) -> bool {
        let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
            // Unknown: count it as ours, so a listener on the unspecified address stays
            // unreachable (fail closed).
            return true;
        };
        interfaces
            .filter_map(|interface| interface.address)
            .any(|address| {
                let found = address
                    .as_sockaddr_in()
                    .map(|v4| IpAddr::V4(v4.ip()))
                    .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())));
                found.is_some_and(|found| canonical(found) == ip)
            })
    }

    fn servers_ports(&self) -> Option<Vec<u16>> {
        match self.servers.current() {
            Ok(registered) => Some(registered.tcp_ports),
            Err(error) => {
                tracing::warn!(%error, "http/request: the registry of servers cannot be read");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeHost {
        listeners: Vec<SocketAddr>,
        addresses: Vec<IpAddr>,
        servers: Option<Vec<u16>>,
    }

    impl HostFacts for FakeHost {
        fn own_listeners(&self) -> &[SocketAddr] {
            &self.listeners
        }
        fn is_host_address(&self, ip: IpAddr) -> bool {
            self.addresses.contains(&ip)
        }
        fn servers_ports(&self) -> Option<Vec<u16>> {
            self.servers.clone()
        }
    }

    fn strict() -> TargetPolicy {
        TargetPolicy {
            allow_link_local: false,
            allow_own_listeners: false,
            egress: None,
        }
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn host(listener: &str) -> FakeHost {
        FakeHost {
            listeners: vec![addr(listener)],
            addresses: vec!["10.0.0.5".parse().unwrap()],
            // The own listener's checks alone (a real registry names its port too).
            servers: Some(Vec::new()),
        }
    }

    /// `policy` checks every one of `targets` on `host` as `expected`.
    fn assert_checks(
        policy: &TargetPolicy,
        host: &FakeHost,
        targets: &[&str],
        expected: Result<(), Refusal>,
    ) {
        for target in targets {
            assert_eq!(policy.check(addr(target), host), expected, "{target}");
        }
    }

    #[test]
    fn link_local_and_metadata_addresses_are_refused_in_every_spelling() {
        let host = host("127.0.0.1:4000");
        for target in [
            "169.254.169.254:80",
            "169.254.0.1:8080",
            "[fe80::1]:80",
            "[::ffff:169.254.169.254]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "[fd00:ec2::254]:80",
            "100.100.100.200:80",
        ] {
            assert_eq!(
                strict().check(addr(target), &host),
                Err(Refusal::LinkLocal),
                "{target}"
            );
            let allowed = TargetPolicy {
                allow_link_local: true,
                ..strict()
            };
            assert_eq!(allowed.check(addr(target), &host), Ok(()), "{target}");
        }
    }

    #[test]
    fn with_an_allowlist_special_addresses_are_reached_only_when_named() {
        let host = host("127.0.0.1:4000");
        let rules = sandbox::EgressRules::parse(&["127.0.0.1:8080".to_owned()], &[]).unwrap();
        let policy = TargetPolicy {
            egress: Some(rules),
            ..strict()
        };
        assert_eq!(policy.check(addr("127.0.0.1:8080"), &host), Ok(()));
        assert_eq!(
            policy.check(addr("127.0.0.1:8081"), &host),
            Err(Refusal::NotNamed)
        );
        assert_eq!(
            policy.check(addr("10.1.2.3:443"), &host),
            Err(Refusal::NotNamed)
        );
        assert_eq!(policy.check(addr("93.184.216.34:443"), &host), Ok(()));
    }

    #[test]
    fn with_an_allowlist_the_hosts_own_addresses_are_reached_only_when_named() {
        let host = FakeHost {
            listeners: vec![addr("127.0.0.1:4000")],
            addresses: vec![
                "11.22.33.5".parse().unwrap(),
                "2606:4700::5".parse().unwrap(),
            ],
            servers: Some(vec![4000]),
        };
        let rules = sandbox::EgressRules::parse(&["11.22.33.5:8080".to_owned()], &[]).unwrap();
        let policy = TargetPolicy {
            egress: Some(rules),
            ..strict()
        };
        assert_checks(
            &policy,
            &host,
            &[
                "11.22.33.5:443",
                "[::ffff:11.22.33.5]:443",
                "[2606:4700::5]:443",
            ],
            Err(Refusal::NotNamed),
        );
        assert_eq!(policy.check(addr("11.22.33.5:8080"), &host), Ok(()));
        assert_eq!(policy.check(addr("11.22.33.6:443"), &host), Ok(()));
    }

    #[test]
    fn a_loopback_listener_is_refused_on_its_port_only() {
        let host = host("127.0.0.1:4000");
        assert_checks(
            &strict(),
            &host,
            &["127.0.0.1:4000", "0.0.0.0:4000", "[::ffff:127.0.0.1]:4000"],
            Err(Refusal::OwnListener),
        );
        assert_checks(
            &strict(),
            &host,
            &[
                "127.0.0.1:4001",
                "127.0.0.2:4000",
                "10.0.0.5:4000",
                "[::1]:4000",
                "93.184.216.34:4000",
            ],
            Ok(()),
        );
        let allowed = TargetPolicy {
            allow_own_listeners: true,
            ..strict()
        };
        assert_eq!(allowed.check(addr("127.0.0.1:4000"), &host), Ok(()));
    }

    #[test]
    fn an_unspecified_listener_is_refused_on_every_local_address() {
        let host = host("0.0.0.0:4000");
        assert_checks(
            &strict(),
            &host,
            &[
                "127.0.0.1:4000",
                "127.8.9.10:4000",
                "10.0.0.5:4000",
                "0.0.0.0:4000",
                "[::1]:4000",
            ],
            Err(Refusal::OwnListener),
        );
        assert_checks(
            &strict(),
            &host,
            &["10.0.0.6:4000", "10.0.0.5:4001"],
            Ok(()),
        );
    }

    #[test]
    fn the_running_host_knows_its_loopback_interface() {
        assert!(RunningHost::default().is_host_address("127.0.0.1".parse().unwrap()));
        assert!(!RunningHost::default().is_host_address("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn another_servers_port_is_refused_on_every_address_of_this_host_only() {
        let host = FakeHost {
            servers: Some(vec![4000, 4100]),
            ..host("127.0.0.1:4000")
        };
        assert_checks(
            &strict(),
            &host,
            &[
                "127.0.0.1:4100",
                "127.0.0.2:4100",
                "0.0.0.0:4100",
                "[::1]:4100",
                "[::]:4100",
                "[::ffff:127.0.0.1]:4100",
                "10.0.0.5:4100",
            ],
            Err(Refusal::ServerListener),
        );
        assert_checks(
            &strict(),
            &host,
            &["127.0.0.1:4101", "10.0.0.5:4101", "93.184.216.34:4100"],
            Ok(()),
        );
        let allowed = TargetPolicy {
            allow_own_listeners: true,
            ..strict()
        };
        assert_eq!(allowed.check(addr("127.0.0.1:4100"), &host), Ok(()));

        let unreadable = FakeHost {
            servers: None,
            ..host
        };
        assert_checks(
            &strict(),
            &unreadable,
            &["127.0.0.1:4101", "10.0.0.5:80"],
            Err(Refusal::ServersUnknown),
        );
        assert_eq!(
            strict().check(addr("93.184.216.34:80"), &unreadable),
            Ok(())
        );
    }
}
