//! `exec-guardian`: kills what the server started once the server is gone, however it died,
//! and never anything else.
//!
//! The server starts the guardian with one end of a `SOCK_SEQPACKET` socket pair as its
//! stdin and sends it one record per message:
//!
//! | record | meaning |
//! |---|---|
//! | `k` + path | at the server's death, `cgroup.kill` this cgroup v2 directory (the server's base: every process tree at once), then remove it |
//! | `r` + path | at the server's death, remove this v1 directory and its children (limits on hybrid hosts) |
//! | `+` + pid (4 bytes LE) with a pidfd (`SCM_RIGHTS`) | without a cgroup: at the server's death, SIGKILL this leader's process group through its pidfd |
//! | `-` + pid | the leader was reaped: close its pidfd |
//!
//! When the socket reaches end of file (the server exited, crashed or was SIGKILLed), the
//! guardian acts. Kills go through a cgroup or a pidfd, never a bare pid: a pidfd names one
//! process for its whole life, so a leader that was reaped and whose pid was recycled by an
//! unrelated process can never be hit (the pidfd then fails with `ESRCH`).

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

use crate::containment::cgroupfs::CgroupDir;

/// Largest record (a cgroup path).
const MAX_RECORD_BYTES: usize = 4096 + 1;

/// A running guardian (the server's side).
pub struct Guardian {
    socket: Mutex<OwnedFd>,
}

impl Guardian {
    /// Start the guardian binary in its own process group (so a signal to the server's group
    /// does not take it down first), telling it the server's cgroup directories.
    ///
    /// # Errors
    /// The socket or spawn error.
    pub fn start(binary: &Path, kill: Option<&Path>, remove: &[PathBuf]) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        let child = Command::new(binary)
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()?;
        // The guardian outlives us on purpose; it is reaped by init after it acts.
        drop(child);
        let guardian = Self {
            socket: Mutex::new(ours),
        };
        if let Some(dir) = kill {
            guardian.send(b'k', dir.as_os_str().as_bytes(), None);
        }
        for dir in remove {
            guardian.send(b'r', dir.as_os_str().as_bytes(), None);
        }
        Ok(guardian)
    }

    fn send(&self, op: u8, payload: &[u8], fd: Option<&OwnedFd>) {
        let mut record = Vec::with_capacity(1 + payload.len());
        record.push(op);
        record.extend_from_slice(payload);
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let fds: Vec<i32> = fd.iter().map(|fd| fd.as_raw_fd()).collect();
        let rights = [ControlMessage::ScmRights(&fds)];
        let control: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
        let sent = sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(&record)],
            control,
            MsgFlags::empty(),
            None,
        );
        if let Err(error) = sent {
            tracing::warn!(%error, "exec-guardian is gone; children will not be killed if the server dies");
        }
    }

    /// Kill this leader's process group if the server dies (used without a cgroup).
    pub fn register(&self, pid: i32, pidfd: &OwnedFd) {
        self.send(b'+', &pid.to_le_bytes(), Some(pidfd));
    }

    /// Forget this leader (it was reaped).
    pub fn unregister(&self, pid: i32) {
        self.send(b'-', &pid.to_le_bytes(), None);
    }
}

/// What the guardian was told to do.
#[derive(Default)]
struct Duties {
    kill: Vec<PathBuf>,
    remove: Vec<PathBuf>,
    leaders: HashMap<i32, OwnedFd>,
}

/// Ignore the terminal's signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT), so that a Ctrl-C reaches
/// the server, which shuts down in order first; the guardian acts when its socket ends.
pub fn ignore_terminal_signals() {
    use nix::sys::signal::Signal;
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // These four can always be ignored.
        let _ = crate::sys::ignore_signal(signal);
    }
}

/// The guardian's whole life (`exec-guardian`'s main): read records from `socket` until end of
/// file, then kill and clean up.
pub fn serve(socket: &impl AsFd) {
    let mut duties = Duties::default();
    let mut buffer = vec![0u8; MAX_RECORD_BYTES];
    loop {
        let mut control = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut buffer)];
        let received = recvmsg::<()>(
            socket.as_fd().as_raw_fd(),
            &mut iov,
            Some(&mut control),
            MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let (length, mut fds) = match received {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
            Ok(message) => {
                let mut fds = Vec::new();
                if let Ok(cmsgs) = message.cmsgs() {
                    for cmsg in cmsgs {
                        if let ControlMessageOwned::ScmRights(received) = cmsg {
                            fds.extend(
                                received
                                    .into_iter()
                                    .map(crate::sys::owned_fd_from_scm_rights),
                            );
                        }
                    }
                }
                (message.bytes, fds)
            }
        };
        if length == 0 {
            break;
        }
        let record = &buffer[..length];
        let pid = || {
            record
                .get(1..5)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_le_bytes)
        };
        let path = || PathBuf::from(std::ffi::OsString::from_vec(record[1..].to_vec()));
        match record[0] {
            b'k' => duties.kill.push(path()),
            b'r' => duties.remove.push(path()),
            b'+' => {
                if let (Some(pid), Some(pidfd)) = (pid(), fds.pop()) {
                    duties.leaders.insert(pid, pidfd);
                }
            }
            b'-' => {
                if let Some(pid) = pid() {
                    duties.leaders.remove(&pid);
                }
            }
            _ => {}
        }
    }
    act(&duties);
}

/// The server is gone: kill every tree, wait (bounded) for them to empty, remove the cgroups.
fn act(duties: &Duties) {
    let trees: Vec<CgroupDir> = duties.kill.iter().cloned().map(CgroupDir::at).collect();
    for tree in &trees {
        let _ = tree.kill();
    }
    for pidfd in duties.leaders.values() {
        let _ = crate::sys::pidfd_send_signal(pidfd, libc::SIGKILL, true);
    }
    let deadline = std::time::Instant::now() + crate::limits::CGROUP_EMPTY_DEADLINE;
    let dirs: Vec<CgroupDir> = trees
        .into_iter()
        .chain(duties.remove.iter().cloned().map(CgroupDir::at))
        .collect();
    for dir in &dirs {
        while dir.remove_tree().is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(crate::limits::CGROUP_EMPTY_POLL);
        }
    }
}
