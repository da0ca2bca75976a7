//! The kernel's socket table, asked through `NETLINK_SOCK_DIAG` (`sock_diag(7)`): who owns the
//! TCP socket at one end of a connection of this network namespace.
//!
//! One exact lookup per question (`SOCK_DIAG_BY_FAMILY` without `NLM_F_DUMP`, the connection's
//! four-tuple in `inet_diag_req_v2`), so the answer is the one socket the kernel would deliver
//! that connection's packets to, or `ENOENT`. Requests and answers are plain byte layouts
//! (`linux/inet_diag.h`) built and read here with `nix`'s safe socket calls: no `unsafe`.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

/// `SOCK_DIAG_BY_FAMILY` (`linux/sock_diag.h`).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR` (`linux/netlink.h`).
const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 1;
/// `struct nlmsghdr` bytes.
const NLMSG_HEADER_BYTES: usize = 16;
/// `struct inet_diag_req_v2` bytes.
const REQUEST_BYTES: usize = 56;
/// `struct inet_diag_msg` bytes (attributes may follow; none are asked for).
const MESSAGE_BYTES: usize = 72;
/// Largest answer read: one `inet_diag_msg` and its header, with room to spare.
const ANSWER_BUFFER_BYTES: usize = 8192;
/// How long to wait for the kernel's answer. The kernel answers inside `sendto`; this only
/// bounds a kernel that does not (the caller then fails closed).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// `INET_DIAG_NOCOOKIE`: look the socket up by its addresses alone.
const NO_COOKIE: u32 = u32::MAX;

/// What the kernel says of one TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocketOwner {
    /// The socket's owner (`sk_uid`: the file-system uid of the process that created it), as
    /// seen from this process's user namespace.
    pub uid: u32,
    /// Its inode number on sockfs; 0 when no process holds it any more (an orphaned or
    /// time-wait socket, whose reported uid means nothing).
    pub inode: u32,
    /// Its TCP state (`TCP_ESTABLISHED` is 1).
    pub state: u8,
}

/// `TCP_ESTABLISHED` (`include/net/tcp_states.h`).
pub const TCP_ESTABLISHED: u8 = 1;

/// Why the socket table could not answer.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    /// The netlink socket could not be opened or used (no `NETLINK_SOCK_DIAG` here: a kernel
    /// without `inet_diag`, a seccomp filter, an LSM).
    #[error("NETLINK_SOCK_DIAG is unavailable ({operation}: {source})")]
    Unavailable {
        /// The call that failed.
        operation: &'static str,
        /// Its errno.
        source: nix::Error,
    },
    /// The kernel has no socket with these addresses (its owner closed it already).
    #[error("the kernel has no TCP socket {local} connected to {remote}")]
    NotFound {
        /// The socket's own address.
        local: SocketAddr,
        /// The address it is connected to.
        remote: SocketAddr,
    },
    /// The kernel refused the request (another errno than `ENOENT`).
    #[error("the kernel refused the sock_diag request: {0}")]
    Refused(nix::Error),
    /// The answer is not an `inet_diag_msg`.
    #[error("unexpected sock_diag answer ({0})")]
    Malformed(&'static str),
}

/// The netlink socket lookups share: opened by the first lookup and kept, so a lookup needs no
/// new descriptor (a server that ran out of descriptors still learns who its next client is
/// when one frees up: without this, the client accepted on that one descriptor was refused,
/// its owner unknown). Dropped after any round trip that did not end in a whole answer, so a
/// late answer can never be read as the next lookup's.
static NETLINK: std::sync::Mutex<Option<OwnedFd>> = std::sync::Mutex::new(None);

/// Opens the shared netlink socket now rather than at the first lookup, so a TCP listener
/// holds every descriptor it will keep from the moment it is bound (the first client does not
/// change the server's descriptor count). A failure is left for the lookups to report.
pub fn open_shared() {
    let mut shared = NETLINK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if shared.is_none() {
        *shared = open_netlink().ok();
    }
}

/// The owner of the TCP socket whose own address is `local` and which is connected to `remote`,
/// in this process's network namespace. Both addresses must be of one family; an IPv4-mapped
/// IPv6 address is looked up as the IPv4 address it maps.
///
/// Blocking (one netlink round trip, answered inside the kernel's `sendto`); lookups take turns.
///
/// # Errors
/// [`SockDiagError`]: unavailable, no such socket, or a refused or malformed answer.
pub fn tcp_socket_owner(
    local: SocketAddr,
    remote: SocketAddr,
) -> Result<TcpSocketOwner, SockDiagError> {
    let (local, remote) = (unmapped(local), unmapped(remote));
    let request = request_bytes(local, remote)?;
    let mut shared = NETLINK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let netlink = match shared.take() {
        Some(netlink) => netlink,
        None => open_netlink()?,
    };
    let answer = round_trip(&netlink, &request)?;
    let owner = parse_answer(&answer, local, remote);
    // A whole answer was read (an owner, or the kernel's "no such socket"): the socket is clean
    // for the next lookup.
    if matches!(owner, Ok(_) | Err(SockDiagError::NotFound { .. })) {
        *shared = Some(netlink);
    }
    owner
}

fn unavailable(operation: &'static str) -> impl Fn(nix::Error) -> SockDiagError {
    move |source| SockDiagError::Unavailable { operation, source }
}

/// A `NETLINK_SOCK_DIAG` socket whose answers wait at most [`ANSWER_TIMEOUT`].
fn open_netlink() -> Result<OwnedFd, SockDiagError> {
    let netlink: OwnedFd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(unavailable("socket(AF_NETLINK, NETLINK_SOCK_DIAG)"))?;
    let timeout = TimeVal::new(
        i64::try_from(ANSWER_TIMEOUT.as_secs()).unwrap_or(1),
        i64::from(ANSWER_TIMEOUT.subsec_micros()),
    );
    setsockopt(&netlink, sockopt::ReceiveTimeout, &timeout)
        .map_err(unavailable("setsockopt(SO_RCVTIMEO)"))?;
    Ok(netlink)
}

/// Sends `request`, returns the answer's bytes.
fn round_trip(netlink: &OwnedFd, request: &[u8]) -> Result<Vec<u8>, SockDiagError> {
    sendto(
        netlink.as_raw_fd(),
        request,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(unavailable("sendto"))?;
    let mut answer = vec![0u8; ANSWER_BUFFER_BYTES];
    let length =
        recv(netlink.as_raw_fd(), &mut answer, MsgFlags::empty()).map_err(unavailable("recv"))?;
    answer.truncate(length);
    Ok(answer)
}

/// An IPv4-mapped IPv6 address as its IPv4 address (a dual-stack listener sees IPv4 peers so;
/// their sockets are IPv4 sockets).
fn unmapped(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), address.port()),
            None => address,
        },
        IpAddr::V4(_) => address,
    }
}

/// The 16 address bytes of `inet_diag_sockid` (network order; IPv4 in the first four).
fn address_bytes(ip: IpAddr) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes = v6.octets(),
    }
    bytes
}

/// `nlmsghdr` + `inet_diag_req_v2` asking for the socket `local` -> `remote`.
fn request_bytes(local: SocketAddr, remote: SocketAddr) -> Result<Vec<u8>, SockDiagError> {
    let family = match (local, remote) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => libc::AF_INET,
        (SocketAddr::V6(_), SocketAddr::V6(_)) => libc::AF_INET6,
        _ => {
            return Err(SockDiagError::Malformed(
                "the two addresses differ in family",
            ));
        }
    };
    let total = NLMSG_HEADER_BYTES + REQUEST_BYTES;
    let mut bytes = Vec::with_capacity(total);
    // nlmsghdr: length, type, flags, sequence, port id (0: the kernel).
    bytes.extend_from_slice(&u32::try_from(total).unwrap_or(0).to_ne_bytes());
    bytes.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    bytes.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    bytes.extend_from_slice(&1u32.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, extensions, pad, states (all).
    bytes.push(u8::try_from(family).unwrap_or(0));
    bytes.push(u8::try_from(libc::IPPROTO_TCP).unwrap_or(0));
    bytes.push(0);
    bytes.push(0);
    bytes.extend_from_slice(&u32::MAX.to_ne_bytes());
    // inet_diag_sockid: sport, dport (network order), src, dst, interface, cookie.
    bytes.extend_from_slice(&local.port().to_be_bytes());
    bytes.extend_from_slice(&remote.port().to_be_bytes());
    bytes.extend_from_slice(&address_bytes(local.ip()));
    bytes.extend_from_slice(&address_bytes(remote.ip()));
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    bytes.extend_from_slice(&NO_COOKIE.to_ne_bytes());
    debug_assert_eq!(bytes.len(), total);
    Ok(bytes)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// Read the kernel's answer: an `inet_diag_msg` for exactly the socket asked about, or an
/// `NLMSG_ERROR`.
fn parse_answer(
    answer: &[u8],
    local: SocketAddr,
    remote: SocketAddr,
) -> Result<TcpSocketOwner, SockDiagError> {
    let malformed = SockDiagError::Malformed;
    let message_type = u16_at(answer, 4).ok_or(malformed("shorter than a netlink header"))?;
    let body = &answer[NLMSG_HEADER_BYTES.min(answer.len())..];
    if message_type == NLMSG_ERROR {
        let errno = u32_at(body, 0).ok_or(malformed("truncated netlink error"))?;
        // The kernel sends -errno.
        let errno = i32::from_ne_bytes(errno.to_ne_bytes()).wrapping_neg();
        return Err(match nix::Error::from_raw(errno) {
            nix::Error::ENOENT => SockDiagError::NotFound { local, remote },
            other => SockDiagError::Refused(other),
        });
    }
    if message_type != SOCK_DIAG_BY_FAMILY || body.len() < MESSAGE_BYTES {
        return Err(malformed("not an inet_diag_msg"));
    }
    // The kernel answers an exact lookup for that socket only; check it anyway, so an answer
    // about another socket can never name an owner.
    let same = body[4..6] == local.port().to_be_bytes()
        && body[6..8] == remote.port().to_be_bytes()
        && body[8..24] == address_bytes(local.ip())
        && body[24..40] == address_bytes(remote.ip());
    if !same {
        return Err(malformed("the answer is about another socket"));
    }
    Ok(TcpSocketOwner {
        state: body[1],
        uid: u32_at(body, 64).ok_or(malformed("truncated inet_diag_msg"))?,
        inode: u32_at(body, 68).ok_or(malformed("truncated inet_diag_msg"))?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn owner_of_a_fresh_connection(listen: &str) -> Option<(TcpSocketOwner, TcpSocketOwner)> {
        let listener = std::net::TcpListener::bind(listen).ok()?;
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_end, peer) = listener.accept().unwrap();
        let client_side = tcp_socket_owner(peer, server_end.local_addr().unwrap()).unwrap();
        let server_side = tcp_socket_owner(
            server_end.local_addr().unwrap(),
            client.local_addr().unwrap(),
        )
        .unwrap();
        Some((client_side, server_side))
    }

    #[test]
    fn the_owner_of_a_loopback_connection_is_this_process_uid_v4_and_v6() {
        let uid = nix::unistd::geteuid().as_raw();
        let (client, server) = owner_of_a_fresh_connection("127.0.0.1:0").unwrap();
        for end in [client, server] {
            assert_eq!(end.uid, uid);
            assert_eq!(end.state, TCP_ESTABLISHED);
            assert_ne!(end.inode, 0);
        }
        // ::1 exists on most hosts; where it does not, v6 has nothing to look up.
        if let Some((client, _)) = owner_of_a_fresh_connection("[::1]:0") {
            assert_eq!(client.uid, uid);
            assert_eq!(client.state, TCP_ESTABLISHED);
        }
    }

    #[test]
    fn a_socket_that_does_not_exist_is_not_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let error = tcp_socket_owner(nobody, listener.local_addr().unwrap()).unwrap_err();
        assert!(matches!(error, SockDiagError::NotFound { .. }), "{error:?}");
    }

    #[test]
    fn mapped_addresses_are_looked_up_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(unmapped(mapped), "127.0.0.1:80".parse().unwrap());
        let request = request_bytes(unmapped(mapped), "127.0.0.1:9".parse().unwrap()).unwrap();
        assert_eq!(request.len(), NLMSG_HEADER_BYTES + REQUEST_BYTES);
        assert_eq!(request[16], u8::try_from(libc::AF_INET).unwrap());
        // sport 80, dport 9 in network order, then 127.0.0.1.
        assert_eq!(&request[24..30], &[0, 80, 0, 9, 127, 0][..]);
    }
}
