//! Which addresses are special (reached only when a pattern names them) and the one form
//! every check compares.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Addresses reached only when an `allow` pattern names them: unspecified, loopback, private
/// (RFC 1918, unique-local), shared (100.64/10), link-local (cloud metadata), multicast,
/// broadcast, documentation and benchmarking ranges; embedded IPv4 forms are looked through
/// ([`canonical_ip`]).
pub fn is_special_address(ip: IpAddr) -> bool {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (segments[0] & 0xfe00) == 0xfc00
                || (segments[0] & 0xffc0) == 0xfe80
                || v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
        }
    }
}

/// The one form of an address every allow and deny check compares: an IPv6 address that
/// carries an IPv4 address the packets end up at is that IPv4 address. Looked through:
/// IPv4-mapped (`::ffff:a.b.c.d`, what a dual-stack socket connects to over IPv4),
/// IPv4-translated (`::ffff:0:a.b.c.d`, SIIT), IPv4-compatible (`::a.b.c.d`, deprecated; not
/// `::` or `::1`), and the NAT64 prefixes with the address in the last 32 bits
/// (`64:ff9b::/96`, RFC 6052, and the local-use `64:ff9b:1::/48`, RFC 8215). Used by the
/// egress proxy and `http/request` alike.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    let s = v6.segments();
    let [.., hi, lo] = s;
    let embedded = IpAddr::V4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
    let compatible = s[..6] == [0; 6] && hi != 0;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    let local_nat64 = s[..3] == [0x64, 0xff9b, 1];
    if mapped || translated || compatible || nat64 || local_nat64 {
        embedded
    } else {
        ip
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}
