//! Who a connection belongs to, for caps that must hold per client rather than per connection
//! (a client opens as many connections as it likes): the detached sessions it may keep.
//!
//! The server has one bearer token for everyone, so the token does not tell clients apart. What
//! the kernel knows does:
//! - a unix socket peer: its user id (`SO_PEERCRED`);
//! - a loopback TCP peer: the user id that owns the peer's socket (the kernel's socket table,
//!   asked through `sock_diag` from the server's own network namespace), while a process holds
//!   that socket open;
//! - either, of the server's own user but in another user namespace (a sandbox, a container):
//!   confined, never taken for the server's user (`sys::user_namespace`);
//! - any other TCP peer (or a loopback one whose socket is gone already): its address, an IPv6
//!   /64 counting as one (a host controls a whole /64);
//! - a relay stream: the harness the rendezvous says it comes from.

use std::net::SocketAddr;

use super::admission::Source;

/// The client a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientIdentity {
    /// A local peer (unix socket or loopback TCP), by user id.
    Uid(u32),
    /// A local peer of the server's own user whose process runs in another user namespace (a
    /// sandbox of another server, a container), or whose process cannot be examined.
    Confined(u32),
    /// A TCP peer by address (IPv6: its /64).
    Address(Source),
    /// A relay stream, by the rendezvous's id of the harness connection it comes from.
    Relay(u64),
}

impl std::fmt::Display for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uid(uid) => write!(f, "uid {uid}"),
            Self::Confined(uid) => write!(f, "uid {uid} in another user namespace"),
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
        if same_host
            && let Some((uid, inode)) = local.and_then(|local| loopback_socket_owner(peer, local))
        {
            return Self::local(uid, || {
                crate::sys::user_namespace::socket_holders_in_own_user_namespace(inode)
            });
        }
        Self::Address(Source::of(peer))
    }

    /// A local peer of `uid`: [`Self::Confined`] when it is the server's own user and
    /// `in_own_namespace` does not vouch for its process, else [`Self::Uid`]. Root is judged by
    /// its uid alone (a server of another user may not examine root's processes); another user
    /// needs the token whatever namespace it runs in.
    pub fn local(uid: u32, in_own_namespace: impl FnOnce() -> bool) -> Self {
        if uid == nix::unistd::geteuid().as_raw() && !in_own_namespace() {
            Self::Confined(uid)
        } else {
            Self::Uid(uid)
        }
    }
}

/// Logged once: the host cannot tell who owns a loopback peer's socket.
static SOCK_DIAG_UNAVAILABLE_LOGGED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The uid owning the live socket bound to `peer` and connected to `local`, from the kernel's
/// socket table of the server's network namespace (`sock_diag`). `None` when the kernel cannot
/// say (no `NETLINK_SOCK_DIAG`), has no such socket (the peer closed it already), or reports a
/// socket no process holds any more (orphaned or in time-wait: the kernel reports uid 0 for
/// those, which must never pass for root), or one that is not established.
fn loopback_socket_owner(peer: SocketAddr, local: SocketAddr) -> Option<(u32, u32)> {
    use crate::sys::sock_diag::{SockDiagError, TCP_ESTABLISHED, tcp_socket_owner};
    match tcp_socket_owner(peer, local) {
        Ok(owner) if owner.state == TCP_ESTABLISHED && owner.inode != 0 => {
            Some((owner.uid, owner.inode))
        }
        Ok(owner) => {
            tracing::debug!(%peer, ?owner, "the peer's socket is no longer held open: owner unknown");
            None
        }
        Err(error @ SockDiagError::Unavailable { .. }) => {
            if !SOCK_DIAG_UNAVAILABLE_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    %error,
                    "cannot learn who owns loopback peers' sockets: every loopback TCP client \
                     must present the bearer token (the unix socket still admits this user)"
                );
            }
            None
        }
        Err(error) => {
            tracing::debug!(%peer, %error, "the owner of a loopback peer's socket is unknown");
            None
        }
    }
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
    fn a_closed_peer_socket_names_no_owner_even_in_time_wait() {
        use crate::sys::sock_diag::tcp_socket_owner;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (server_end, peer) = listener.accept().unwrap();
        // The client closes first, so its socket ends in time-wait, held by no process.
        drop(client);
        drop(server_end);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let owner = loop {
            match tcp_socket_owner(peer, local) {
                Ok(owner) if owner.state == 6 => break owner, // TCP_TIME_WAIT
                _ if std::time::Instant::now() > deadline => {
                    panic!("the closed socket never reached time-wait")
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        };
        // The kernel still has the socket and reports an owner (uid 0 for time-wait)...
        assert_eq!((owner.uid, owner.inode), (0, 0));
        // ...which must not pass for root.
        assert_eq!(
            ClientIdentity::of_tcp(peer, Some(local)),
            ClientIdentity::Address(Source::of(peer))
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
}
