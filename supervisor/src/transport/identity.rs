//! Who a connection belongs to, for caps that must hold per client rather than per connection
//! (a client opens as many connections as it likes): the detached sessions it may keep.
//!
//! The server has one bearer token for everyone, so the token does not tell clients apart. What
//! the kernel knows does:
//! - a unix socket peer: its user id (`SO_PEERCRED`);
//! - a loopback TCP peer: the user id that owns the peer's socket (the kernel's socket table,
//!   `/proc/self/net/tcp{,6}`, seen from the server's own network namespace);
//! - any other TCP peer (or a loopback one whose socket is gone already): its address, an IPv6
//!   /64 counting as one (a host controls a whole /64);
//! - a relay stream: the harness the rendezvous says it comes from.

use std::net::{IpAddr, SocketAddr};

use super::admission::Source;

/// The client a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientIdentity {
    /// A local peer (unix socket or loopback TCP), by user id.
    Uid(u32),
    /// A TCP peer by address (IPv6: its /64).
    Address(Source),
    /// A relay stream, by the rendezvous's id of the harness connection it comes from.
    Relay(u64),
}

impl std::fmt::Display for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uid(uid) => write!(f, "uid {uid}"),
            Self::Address(Source::Ip(ip)) => write!(f, "address {ip}"),
            Self::Address(Source::Local) => write!(f, "local peer"),
            Self::Relay(source) => write!(f, "relay source {source}"),
        }
    }
}

impl ClientIdentity {
    /// The identity of a TCP peer `peer` connected to our `local` address: for a loopback peer,
    /// the owner of its socket when the kernel's table has it; otherwise its address.
    pub fn of_tcp(peer: SocketAddr, local: Option<SocketAddr>) -> Self {
        let same_host =
            peer.ip().is_loopback() || local.is_some_and(|local| local.ip() == peer.ip());
        if same_host && let Some(uid) = local.and_then(|local| loopback_socket_owner(peer, local)) {
            return Self::Uid(uid);
        }
        Self::Address(Source::of(peer))
    }
}

/// The uid owning the socket bound to `peer` and connected to `local`, from the kernel's TCP
/// table of the server's network namespace (`None` when not found: the peer already closed).
fn loopback_socket_owner(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let table = match peer {
        SocketAddr::V4(_) => "/proc/self/net/tcp",
        SocketAddr::V6(_) => "/proc/self/net/tcp6",
    };
    let text = std::fs::read_to_string(table).ok()?;
    owner_in_table(&text, peer, local)
}

/// Find the row whose local address is `peer` and remote address `local` (the peer's own
/// socket) in a `/proc/net/tcp` text; its `uid` column.
fn owner_in_table(text: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (want_local, want_remote) = (proc_address(peer), proc_address(local));
    text.lines().skip(1).find_map(|line| {
        let mut columns = line.split_whitespace();
        let _slot = columns.next()?;
        let local_column = columns.next()?;
        let remote_column = columns.next()?;
        if !local_column.eq_ignore_ascii_case(&want_local)
            || !remote_column.eq_ignore_ascii_case(&want_remote)
        {
            return None;
        }
        // st, tx_queue:rx_queue, tr:tm->when, retrnsmt, then uid.
        columns.nth(4)?.parse().ok()
    })
}

/// An address as `/proc/net/tcp` prints it: the address's 32-bit words in host byte order as
/// hex, a colon, the port as hex.
fn proc_address(address: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match address.ip() {
        IpAddr::V4(v4) => vec![v4.octets()],
        IpAddr::V6(v6) => v6
            .octets()
            .chunks_exact(4)
            .map(|chunk| [chunk[0], chunk[1], chunk[2], chunk[3]])
            .collect(),
    };
    let mut text: String = words
        .into_iter()
        .map(|word| format!("{:08X}", u32::from_ne_bytes(word)))
        .collect();
    text.push_str(&format!(":{:04X}", address.port()));
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_loopback_peer_is_identified_by_the_owner_of_its_socket() {
        // A real socket pair on loopback: the client end belongs to us.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server_end, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let local = listener.local_addr().unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        assert_eq!(
            ClientIdentity::of_tcp(peer, Some(local)),
            ClientIdentity::Uid(uid)
        );
    }

    #[test]
    fn a_remote_peer_is_identified_by_its_address() {
        let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let local: SocketAddr = "192.0.2.1:8080".parse().unwrap();
        assert_eq!(
            ClientIdentity::of_tcp(peer, Some(local)),
            ClientIdentity::Address(Source::of(peer))
        );
    }

    #[test]
    fn table_rows_are_matched_on_both_ends() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 1 1\n   \
             1: 0100007F:9C41 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  65534        0 2 1\n";
        let server: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let peer = |port| SocketAddr::new("127.0.0.1".parse().unwrap(), port);
        if cfg!(target_endian = "little") {
            assert_eq!(owner_in_table(table, peer(40000), server), Some(1000));
            assert_eq!(owner_in_table(table, peer(40001), server), Some(65534));
        }
        assert_eq!(owner_in_table(table, peer(40002), server), None);
    }
}
