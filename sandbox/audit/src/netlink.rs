//! The audit netlink socket: status get/set, syscall-exit rules, user messages, and the
//! read-only multicast group (`AUDIT_NLGRP_READLOG`) that delivers a copy of every record.
//!
//! Message encoding and decoding are pure functions ([`encode`], [`decode`], the payload
//! builders) tested without a kernel; the socket wrappers use `nix`.
//!
//! Privileges: reading the multicast group needs `CAP_AUDIT_READ`; `AUDIT_SET`, rules and user
//! messages need `CAP_AUDIT_CONTROL` / `CAP_AUDIT_WRITE`, all in the initial user namespace.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    setsockopt, socket, sockopt,
};

/// `AUDIT_GET`: read the status.
pub const AUDIT_GET: u16 = 1000;
/// `AUDIT_SET`: change the status.
pub const AUDIT_SET: u16 = 1001;
/// `AUDIT_ADD_RULE`: add a rule (`struct audit_rule_data`).
pub const AUDIT_ADD_RULE: u16 = 1011;
/// `AUDIT_DEL_RULE`: delete a rule (the same bytes as when it was added).
pub const AUDIT_DEL_RULE: u16 = 1012;
/// `NLMSG_ERROR`: an acknowledgement (error 0) or an error.
const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST | NLM_F_ACK`.
const NLM_F_REQUEST_ACK: u16 = 0x1 | 0x4;
/// `AUDIT_NLGRP_READLOG`, as a group bitmask for `bind`.
const READLOG_GROUP_MASK: u32 = 1 << 0;
/// `AUDIT_STATUS_ENABLED` in `audit_status.mask`.
const AUDIT_STATUS_ENABLED: u32 = 0x1;
/// Size of `struct nlmsghdr`.
const NLMSG_HDR_BYTES: usize = 16;
/// A datagram holds at most one `MAX_AUDIT_MESSAGE_LENGTH` (8970) record; leave headroom.
pub const RECV_BUFFER_BYTES: usize = 16 * 1024;
/// Socket receive buffer of the multicast reader: a burst of denials must not overflow it
/// while the collector is busy (records dropped there are reported as lost).
const MULTICAST_RCVBUF_BYTES: usize = 8 * 1024 * 1024;
/// How long a control request may wait for the kernel's answer.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);
/// `AUDIT_FILTER_EXIT`: rules evaluated at syscall exit.
const AUDIT_FILTER_EXIT: u32 = 0x04;
/// `AUDIT_ALWAYS`: emit the record.
const AUDIT_ALWAYS: u32 = 2;
/// `AUDIT_BITMASK_SIZE`: 32-bit words of the syscall mask.
const AUDIT_BITMASK_WORDS: usize = 64;
/// `AUDIT_MAX_FIELDS`.
const AUDIT_MAX_FIELDS: usize = 64;
/// `AUDIT_SESSIONID` rule field.
const AUDIT_SESSIONID: u32 = 25;
/// `AUDIT_EXIT` rule field (the syscall's return value).
const AUDIT_EXIT: u32 = 103;
/// `AUDIT_EQUAL` rule operator.
const AUDIT_EQUAL: u32 = 0x4000_0000;

/// Why an audit netlink operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// Creating the socket failed (no audit in this kernel, or not allowed).
    #[error("opening the audit netlink socket failed: {source}")]
    Open {
        /// The OS error.
        source: nix::Error,
    },
    /// Joining the read-only multicast group failed (needs CAP_AUDIT_READ).
    #[error("joining the audit multicast group failed (needs CAP_AUDIT_READ): {source}")]
    JoinMulticast {
        /// The OS error.
        source: nix::Error,
    },
    /// Sending a request failed.
    #[error("sending audit request {kind} failed: {source}")]
    Send {
        /// The message type.
        kind: u16,
        /// The OS error.
        source: nix::Error,
    },
    /// Receiving failed (timeouts included).
    #[error("receiving the answer to audit request {kind} failed: {source}")]
    Receive {
        /// The message type asked.
        kind: u16,
        /// The OS error.
        source: nix::Error,
    },
    /// The kernel refused the request.
    #[error("the kernel refused audit request {kind}: {errno}")]
    Refused {
        /// The message type.
        kind: u16,
        /// The error the kernel returned.
        errno: nix::Error,
    },
    /// The answer was shorter than the structure it should hold.
    #[error("malformed answer to audit request {kind}")]
    Malformed {
        /// The message type asked.
        kind: u16,
    },
}

/// One decoded netlink message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// The payload after the header.
    pub payload: Vec<u8>,
}

/// Encodes one netlink message.
pub fn encode(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDR_BYTES + payload.len();
    let mut out = Vec::with_capacity(len.next_multiple_of(4));
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(len.next_multiple_of(4), 0);
    out
}

/// Decodes the messages in one datagram. Audit records sent to the multicast group carry a
/// `nlmsg_len` that may not count padding; a truncated length ends the datagram.
pub fn decode(mut buf: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR_BYTES {
        let u32_at = |i: usize| u32::from_ne_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let len = usize::try_from(u32_at(0)).unwrap_or(usize::MAX);
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let seq = u32_at(8);
        let end = len.clamp(NLMSG_HDR_BYTES, buf.len());
        out.push(Message {
            kind,
            seq,
            payload: buf[NLMSG_HDR_BYTES..end].to_vec(),
        });
        let next = len.next_multiple_of(4);
        if len < NLMSG_HDR_BYTES || next >= buf.len() {
            break;
        }
        buf = &buf[next..];
    }
    out
}

/// The `struct audit_status` fields the collector uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// 0 off, 1 on, 2 on and locked.
    pub enabled: u32,
    /// The pid of the audit daemon (0: none).
    pub daemon_pid: u32,
    /// Records per second above which the kernel drops records (0: no limit).
    pub rate_limit: u32,
    /// Records the kernel lost so far (any process's).
    pub lost: u32,
    /// How long a process that logs waits for room in the backlog before its record is
    /// dropped (jiffies; 0: never waits). `None` on kernels whose status lacks it.
    pub backlog_wait_time: Option<u32>,
}

impl Status {
    /// Decodes a `struct audit_status` payload (`mask, enabled, failure, pid, rate_limit,
    /// backlog_limit, lost, backlog, version, backlog_wait_time, ...`).
    pub fn decode(payload: &[u8]) -> Option<Self> {
        let word = |i: usize| {
            payload
                .get(i * 4..i * 4 + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        Some(Self {
            enabled: word(1)?,
            daemon_pid: word(3)?,
            rate_limit: word(4)?,
            lost: word(6)?,
            backlog_wait_time: word(9),
        })
    }

    /// Whether the kernel may drop a record of a process that can wait (the command tree's):
    /// only with a rate limit, or when loggers never wait for room in the backlog. Otherwise
    /// `lost` grows only for records nobody waits for (or that no daemon takes), never ours.
    pub fn may_drop_waiting_records(&self) -> bool {
        self.rate_limit != 0 || self.backlog_wait_time.is_none_or(|wait| wait == 0)
    }
}

/// The `AUDIT_SET` payload that turns auditing on (`1`) or off (`0`).
pub fn set_enabled_payload(enabled: u32) -> Vec<u8> {
    let mut words = [0u32; 11];
    words[0] = AUDIT_STATUS_ENABLED;
    words[1] = enabled;
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// The `struct audit_rule_data` of an exit rule: every syscall of audit session `session`
/// whose return value is `-errno`.
pub fn session_exit_rule(session: u32, errno: i32) -> Vec<u8> {
    let mut words = Vec::with_capacity(4 + AUDIT_BITMASK_WORDS + 3 * AUDIT_MAX_FIELDS);
    words.push(AUDIT_FILTER_EXIT);
    words.push(AUDIT_ALWAYS);
    words.push(2); // field_count
    words.extend(std::iter::repeat_n(u32::MAX, AUDIT_BITMASK_WORDS));
    let mut fields = [0u32; AUDIT_MAX_FIELDS];
    let mut values = [0u32; AUDIT_MAX_FIELDS];
    let mut flags = [0u32; AUDIT_MAX_FIELDS];
    fields[0] = AUDIT_SESSIONID;
    values[0] = session;
    flags[0] = AUDIT_EQUAL;
    fields[1] = AUDIT_EXIT;
    values[1] = errno.wrapping_neg().cast_unsigned();
    flags[1] = AUDIT_EQUAL;
    words.extend(fields);
    words.extend(values);
    words.extend(flags);
    words.push(0); // buflen
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// A socket subscribed to the read-only multicast group: receives a copy of every record.
#[derive(Debug)]
pub struct MulticastReader {
    fd: OwnedFd,
}

impl MulticastReader {
    /// Opens the socket and joins `AUDIT_NLGRP_READLOG`.
    ///
    /// # Errors
    /// [`NetlinkError::Open`] or [`NetlinkError::JoinMulticast`].
    pub fn open() -> Result<Self, NetlinkError> {
        let fd = audit_socket(SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK)?;
        // A larger buffer is best effort; overflow is detected (ENOBUFS) and reported.
        if setsockopt(&fd, sockopt::RcvBufForce, &MULTICAST_RCVBUF_BYTES).is_err() {
            let _ = setsockopt(&fd, sockopt::RcvBuf, &MULTICAST_RCVBUF_BYTES);
        }
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, READLOG_GROUP_MASK))
            .map_err(|source| NetlinkError::JoinMulticast { source })?;
        Ok(Self { fd })
    }

    /// Receives the next datagram without blocking. `Ok(None)`: nothing queued.
    /// `Err(ENOBUFS)` means records were dropped because the buffer overflowed.
    ///
    /// # Errors
    /// The OS error of `recv`.
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<Option<Vec<Message>>, nix::Error> {
        match recv(self.fd.as_raw_fd(), buf, MsgFlags::empty()) {
            Ok(n) => Ok(Some(decode(&buf[..n]))),
            Err(nix::Error::EAGAIN) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

impl AsFd for MulticastReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A unicast socket for requests to the kernel's audit subsystem.
#[derive(Debug)]
pub struct Control {
    fd: OwnedFd,
    seq: u32,
}

impl Control {
    /// Opens the socket (with a receive timeout, so a silent kernel cannot hang the caller).
    ///
    /// # Errors
    /// [`NetlinkError::Open`].
    pub fn open() -> Result<Self, NetlinkError> {
        let fd = audit_socket(SockFlag::SOCK_CLOEXEC)?;
        let timeout =
            nix::sys::time::TimeVal::new(i64::try_from(CONTROL_TIMEOUT.as_secs()).unwrap_or(2), 0);
        setsockopt(&fd, sockopt::ReceiveTimeout, &timeout)
            .map_err(|source| NetlinkError::Open { source })?;
        Ok(Self { fd, seq: 0 })
    }

    /// Reads the audit status.
    ///
    /// # Errors
    /// [`NetlinkError`] when the request fails or the answer is malformed.
    pub fn status(&mut self) -> Result<Status, NetlinkError> {
        let seq = self.send(AUDIT_GET, &[])?;
        loop {
            for msg in self.recv(AUDIT_GET)? {
                if msg.seq != seq {
                    continue;
                }
                match msg.kind {
                    AUDIT_GET => {
                        return Status::decode(&msg.payload)
                            .ok_or(NetlinkError::Malformed { kind: AUDIT_GET });
                    }
                    NLMSG_ERROR => check_ack(AUDIT_GET, &msg.payload)?,
                    _ => {}
                }
            }
        }
    }

    /// Turns auditing on or off (`AUDIT_SET`, needs `CAP_AUDIT_CONTROL`).
    ///
    /// # Errors
    /// [`NetlinkError::Refused`] with the kernel's errno.
    pub fn set_enabled(&mut self, enabled: bool) -> Result<(), NetlinkError> {
        self.request(AUDIT_SET, &set_enabled_payload(u32::from(enabled)))
    }

    /// Adds a rule built by [`session_exit_rule`].
    ///
    /// # Errors
    /// [`NetlinkError::Refused`] with the kernel's errno.
    pub fn add_rule(&mut self, rule: &[u8]) -> Result<(), NetlinkError> {
        self.request(AUDIT_ADD_RULE, rule)
    }

    /// Deletes a rule added with [`Control::add_rule`].
    ///
    /// # Errors
    /// [`NetlinkError::Refused`] with the kernel's errno.
    pub fn delete_rule(&mut self, rule: &[u8]) -> Result<(), NetlinkError> {
        self.request(AUDIT_DEL_RULE, rule)
    }

    /// Sends a user-space record of type `kind` with `text` (needs `CAP_AUDIT_WRITE`).
    ///
    /// # Errors
    /// [`NetlinkError::Refused`] with the kernel's errno.
    pub fn send_user(&mut self, kind: u16, text: &str) -> Result<(), NetlinkError> {
        let mut payload = text.as_bytes().to_vec();
        payload.push(0);
        self.request(kind, &payload)
    }

    fn request(&mut self, kind: u16, payload: &[u8]) -> Result<(), NetlinkError> {
        let seq = self.send(kind, payload)?;
        loop {
            for msg in self.recv(kind)? {
                if msg.seq == seq && msg.kind == NLMSG_ERROR {
                    return check_ack(kind, &msg.payload);
                }
            }
        }
    }

    fn send(&mut self, kind: u16, payload: &[u8]) -> Result<u32, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let bytes = encode(kind, NLM_F_REQUEST_ACK, self.seq, payload);
        sendto(
            self.fd.as_raw_fd(),
            &bytes,
            &NetlinkAddr::new(0, 0),
            MsgFlags::empty(),
        )
        .map_err(|source| NetlinkError::Send { kind, source })?;
        Ok(self.seq)
    }

    fn recv(&mut self, kind: u16) -> Result<Vec<Message>, NetlinkError> {
        let mut buf = vec![0u8; RECV_BUFFER_BYTES];
        let n = recv(self.fd.as_raw_fd(), &mut buf, MsgFlags::empty())
            .map_err(|source| NetlinkError::Receive { kind, source })?;
        Ok(decode(&buf[..n]))
    }
}

fn audit_socket(flags: SockFlag) -> Result<OwnedFd, NetlinkError> {
    socket(
        AddressFamily::Netlink,
        SockType::Raw,
        flags,
        SockProtocol::NetlinkAudit,
    )
    .map_err(|source| NetlinkError::Open { source })
}

fn check_ack(kind: u16, payload: &[u8]) -> Result<(), NetlinkError> {
    let code = payload
        .get(..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(NetlinkError::Malformed { kind })?;
    if code == 0 {
        Ok(())
    } else {
        Err(NetlinkError::Refused {
            kind,
            errno: nix::Error::from_raw(code.wrapping_neg()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_encode_and_decode() {
        let bytes = encode(AUDIT_GET, NLM_F_REQUEST_ACK, 7, b"abcde");
        assert_eq!(bytes.len(), 24);
        let msgs = decode(&bytes);
        assert_eq!(
            msgs,
            vec![Message {
                kind: AUDIT_GET,
                seq: 7,
                payload: b"abcde\0\0\0".to_vec()[..5].to_vec(),
            }]
        );
    }

    #[test]
    fn two_messages_in_one_datagram_are_both_decoded() {
        let mut bytes = encode(1300, 0, 1, b"audit(1.0:1): a=1");
        bytes.extend(encode(1320, 0, 2, b""));
        let kinds: Vec<u16> = decode(&bytes).iter().map(|m| m.kind).collect();
        assert_eq!(kinds, vec![1300, 1320]);
    }

    #[test]
    fn session_rule_has_the_kernel_layout() {
        let rule = session_exit_rule(42, 30);
        assert_eq!(rule.len(), 4 * (3 + 64 + 3 * 64 + 1));
        let word = |i: usize| u32::from_ne_bytes(rule[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(
            (word(0), word(1), word(2)),
            (AUDIT_FILTER_EXIT, AUDIT_ALWAYS, 2)
        );
        let fields = 3 + 64;
        assert_eq!(
            (word(fields), word(fields + 1)),
            (AUDIT_SESSIONID, AUDIT_EXIT)
        );
        assert_eq!(word(fields + 64), 42);
        assert_eq!(word(fields + 65) as i32, -30);
    }

    #[test]
    fn status_decodes_enabled_pid_limits_and_lost() {
        let mut payload = set_enabled_payload(1);
        payload[12..16].copy_from_slice(&77u32.to_ne_bytes());
        payload[24..28].copy_from_slice(&5u32.to_ne_bytes());
        payload[36..40].copy_from_slice(&60_000u32.to_ne_bytes());
        let status = Status::decode(&payload).unwrap();
        assert_eq!((status.enabled, status.daemon_pid, status.lost), (1, 77, 5));
        assert_eq!(status.backlog_wait_time, Some(60_000));
        assert!(!status.may_drop_waiting_records());
        let limited = Status {
            rate_limit: 100,
            ..status
        };
        assert!(limited.may_drop_waiting_records());
        let old_kernel = Status::decode(&payload[..36]).unwrap();
        assert!(old_kernel.may_drop_waiting_records());
    }
}
