//! The launcher protocol's messages: the limits on a message, the [`StartCommand`] in a start's
//! memfd, the [`Reply`] to each message, sending and receiving one message with its
//! descriptors, and the status a PID 1 writes when its command has ended.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::FailureKind;
use crate::limits::CommandLimits;
use crate::linux::init;
use crate::linux::spec::Ended;

/// Largest message body on a launcher socket (bodies are a word or a small JSON reply; the
/// command itself travels in a memfd).
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Most cgroups one command joins (the server's containment uses one).
pub const MAX_CGROUPS: usize = 8;
/// Most descriptors in one message: the memfd, stdin, stdout, stderr, the cgroups this
/// command joins as it starts and the cgroups the next command's PID 1 joins ahead.
pub const MAX_MESSAGE_FDS: usize = 4 + 2 * MAX_CGROUPS;
/// The body of a start message; `start:N` when its last N descriptors are the `cgroup.procs`
/// of the cgroups the *next* command's PID 1 joins while it prepares (see [`super::serve`]).
pub const START: &str = "start";
/// How long after a start the launcher waits before it prepares the next command's PID 1,
/// unless a PID 1 exits first (a short command has ended). Preparing it at once (about a
/// millisecond of CPU: namespaces, mounts, Landlock, seccomp) took a core from the command
/// being started on a 2-core host: back-to-back starts measured 1.23-1.43 ms with the delay
/// against 1.43-1.52 ms without. A start that comes sooner prepares its PID 1 itself.
pub const NEXT_PID_1_DELAY: Duration = Duration::from_millis(10);
/// The body of PID 1's one message to the launcher, carrying its mount namespace: the
/// launcher lets go of it once PID 1 is reaped, so the namespace is torn down off the start's
/// path.
pub const MOUNT_NAMESPACE: &[u8] = b"mount-namespace";
/// A status message: kind (1 exited, 2 killed by a signal), the value (i32, little-endian),
/// the CPU time of the command and everything it started (microseconds, u64, little-endian).
pub const STATUS_BYTES: usize = 13;

/// One command for a launcher (in a memfd: argv and environment can be large).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCommand {
    /// Program and arguments (the program is searched in the command's `PATH`).
    pub argv: Vec<String>,
    /// The command's complete environment.
    pub env: Vec<(String, String)>,
    /// The working directory: the launcher's own (its layout carries it).
    pub cwd: PathBuf,
    /// Rlimits, set right before `execve` (the wall clock is the server's to watch).
    #[serde(default)]
    pub limits: CommandLimits,
}

/// A launcher's answer to a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase", deny_unknown_fields)]
pub enum Reply {
    /// Setup done: starts are welcome.
    Ready,
    /// The command's PID 1 runs (pid in the launcher's, i.e. the server's, PID namespace).
    Started {
        /// Its pid.
        pid: i32,
    },
    /// Setup or the start failed.
    Failed {
        /// Why.
        error: String,
        /// The stage that failed.
        kind: FailureKind,
    },
}

/// Sends one message.
///
/// # Errors
/// The OS error of `sendmsg(2)`.
pub fn send(socket: BorrowedFd<'_>, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let control = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(body)],
        &control,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// Receives one message: its body and descriptors (close-on-exec); `None` at end of stream.
///
/// # Errors
/// The OS error of `recvmsg(2)`; `InvalidData` for a message larger than
/// [`MAX_MESSAGE_BYTES`] or with more than [`MAX_MESSAGE_FDS`] descriptors.
pub fn receive(socket: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut body = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = nix::cmsg_space!([RawFd; MAX_MESSAGE_FDS]);
    let (bytes, flags, fds) = {
        let mut iov = [IoSliceMut::new(&mut body)];
        let message = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                fds.extend(received.into_iter().map(crate::sys::owned_fd));
            }
        }
        (message.bytes, message.flags, fds)
    };
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a launcher message larger than {MAX_MESSAGE_BYTES} bytes or with more than \
                 {MAX_MESSAGE_FDS} descriptors"
            ),
        ));
    }
    if bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    body.truncate(bytes);
    Ok(Some((body, fds)))
}

/// The status message for `ended` after `cpu`.
pub fn encode_status(ended: Ended, cpu: Duration) -> [u8; STATUS_BYTES] {
    let (kind, value) = match ended {
        Ended::Exited(code) => (init::STATUS_EXITED, code),
        Ended::Signaled(signal) => (init::STATUS_SIGNALED, signal),
    };
    let mut message = [0u8; STATUS_BYTES];
    message[0] = kind;
    message[1..5].copy_from_slice(&value.to_le_bytes());
    let micros = u64::try_from(cpu.as_micros()).unwrap_or(u64::MAX);
    message[5..].copy_from_slice(&micros.to_le_bytes());
    message
}

/// The inverse of [`encode_status`]; `None` for anything else.
pub fn decode_status(message: &[u8]) -> Option<(Ended, Duration)> {
    let message: &[u8; STATUS_BYTES] = message.try_into().ok()?;
    let value = i32::from_le_bytes(message[1..5].try_into().ok()?);
    let micros = u64::from_le_bytes(message[5..].try_into().ok()?);
    let ended = match message[0] {
        init::STATUS_EXITED => Ended::Exited(value),
        init::STATUS_SIGNALED => Ended::Signaled(value),
        _ => return None,
    };
    Some((ended, Duration::from_micros(micros)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_survives_its_encoding_and_anything_else_is_refused() {
        for ended in [Ended::Exited(0), Ended::Exited(255), Ended::Signaled(9)] {
            let cpu = Duration::from_micros(1_234_567);
            assert_eq!(
                decode_status(&encode_status(ended, cpu)),
                Some((ended, cpu))
            );
        }
        assert_eq!(decode_status(&[]), None);
        let mut bad = encode_status(Ended::Exited(1), Duration::ZERO);
        bad[0] = 7;
        assert_eq!(decode_status(&bad), None);
    }

    #[test]
    fn a_failed_reply_carries_each_kind_across_the_channel() {
        let kinds = [
            FailureKind::Unsupported,
            FailureKind::Confinement,
            FailureKind::Protocol,
            FailureKind::Pid1,
            FailureKind::Handover,
        ];
        // A kind added later must be added above (and to docs/protocol.md).
        for kind in kinds {
            match kind {
                FailureKind::Unsupported
                | FailureKind::Confinement
                | FailureKind::Protocol
                | FailureKind::Pid1
                | FailureKind::Handover => {}
            }
        }
        let names: Vec<String> = kinds
            .iter()
            .map(|kind| {
                serde_json::to_value(kind)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            names,
            ["unsupported", "confinement", "protocol", "pid1", "handover"]
        );
        for kind in kinds {
            let reply = Reply::Failed {
                error: "no_new_privs: EPERM".to_owned(),
                kind,
            };
            let text = serde_json::to_string(&reply).unwrap();
            assert!(text.len() <= MAX_MESSAGE_BYTES, "{text}");
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(value["reply"], "failed", "{text}");
            assert_eq!(value["kind"], serde_json::to_value(kind).unwrap(), "{text}");
            assert_eq!(value["kind"], kind.name(), "{text}");
            assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), reply);
        }
        // An unknown kind is refused, not read as another.
        assert!(
            serde_json::from_str::<Reply>(r#"{"reply":"failed","error":"x","kind":"mounts"}"#)
                .is_err()
        );
    }
}
