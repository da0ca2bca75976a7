//! The holder's end: answers every notified `connect` itself, on the caller's own socket.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::unistd::Pid;

use super::gate::{Gate, Verdict, open_following};
use crate::sys;

/// Largest socket address a `connect` may pass (`sizeof(struct sockaddr_storage)`); the kernel
/// refuses longer ones with `EINVAL`.
const MAX_ADDRESS_BYTES: usize = 128;

/// `PIDFD_THREAD` (`O_EXCL`): a pidfd for a thread that is not its group's leader (6.9).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// The holder's end: the listener and the gate.
pub struct Notifier {
    listener: OwnedFd,
    gate: Gate,
}

impl Notifier {
    /// A notifier answering on `listener` by `gate`.
    pub fn new(listener: OwnedFd, gate: Gate) -> Self {
        Self { listener, gate }
    }

    /// The listener, to poll (readable: a notification is waiting; hang-up: no process of
    /// the sandbox is left that could notify).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Receives and answers one notification.
    pub fn handle_one(&self) {
        let Ok(notification) = sys::receive_notification(self.fd()) else {
            // The caller was interrupted or killed before we got to it.
            return;
        };
        let answer = if i64::from(notification.data.nr) == libc::SYS_connect {
            match self.connect(&notification) {
                Some(answer) => answer,
                // Answered by a worker, or the caller is gone.
                None => return,
            }
        } else {
            Err(libc::ENOSYS)
        };
        let _ = sys::answer_notification(self.fd(), notification.id, answer);
    }

    /// `connect(fd, address, length)` on the caller's behalf. `None` when there is nothing
    /// (more) to answer.
    fn connect(&self, notification: &sys::Notification) -> Option<Result<i64, i32>> {
        let args = notification.data.args;
        // The kernel takes the descriptor as an int.
        let fd = args[0] as i32;
        let length = args[2] as u32 as usize;
        if length > MAX_ADDRESS_BYTES {
            return Some(Err(libc::EINVAL));
        }
        let mut address = vec![0u8; length];
        match sys::read_memory(notification.pid, args[1], &mut address) {
            Ok(read) if read == length => {}
            Ok(_) => return Some(Err(libc::EFAULT)),
            Err(_) => return Some(Err(libc::EACCES)),
        }
        let pidfd = open_caller(notification.pid).ok();
        // Everything read so far (memory, the pidfd) belongs to the caller only if it is
        // still waiting in this very call.
        if !sys::notification_valid(self.fd(), notification.id) {
            return None;
        }
        let Some(pidfd) = pidfd else {
            return Some(Err(libc::EACCES));
        };
        let socket = match sys::pidfd_getfd(pidfd.as_fd(), fd) {
            Ok(socket) => socket,
            Err(err) => return Some(Err(err.raw_os_error().unwrap_or(libc::EBADF))),
        };
        let domain = match sys::socket_domain(socket.as_fd()) {
            Ok(domain) => domain,
            Err(err) => return Some(Err(err.raw_os_error().unwrap_or(libc::ENOTSOCK))),
        };
        if domain != libc::AF_UNIX {
            return self.connect_elsewhere(notification.id, &socket, &address);
        }
        match pathname(&address) {
            Some(path) => Some(self.connect_pathname(notification.pid, &socket, path)),
            // Abstract (Landlock's scope and the network namespace decide), unnamed, or not
            // AF_UNIX at all (the kernel says why).
            None => Some(result_of(sys::connect_raw(socket.as_fd(), &address))),
        }
    }

    fn connect_pathname(&self, caller: u32, socket: &OwnedFd, path: &OsStr) -> Result<i64, i32> {
        let path = Path::new(path);
        let target = if path.is_absolute() {
            open_following(None, path)
        } else {
            open_following(None, Path::new(&format!("/proc/{caller}/cwd")))
                .and_then(|cwd| open_following(Some(cwd.as_fd()), path))
        };
        let target = target.map_err(|err| err.raw_os_error().unwrap_or(libc::ENOENT))?;
        let st = nix::sys::stat::fstat(&target).map_err(|errno| errno as i32)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(libc::ECONNREFUSED);
        }
        match self.gate.verdict(target.as_fd(), &st) {
            Verdict::Allowed => {
                let pinned = format!("/proc/self/fd/{}", target.as_raw_fd());
                result_of(sys::connect_raw(
                    socket.as_fd(),
                    &unix_address(pinned.as_bytes()),
                ))
            }
            Verdict::Denied(resolved) => {
                self.gate
                    .reporter
                    .report(crate::linux::unix_refusals::Refusal::new(
                        caller,
                        &path.to_string_lossy(),
                        &resolved.to_string_lossy(),
                        libc::EACCES,
                    ));
                Err(libc::EACCES)
            }
        }
    }

    /// A socket of another family: connected here when it does not block, else in a child of
    /// the holder that answers the notification itself.
    fn connect_elsewhere(
        &self,
        id: u64,
        socket: &OwnedFd,
        address: &[u8],
    ) -> Option<Result<i64, i32>> {
        let blocking = nix::fcntl::fcntl(socket, nix::fcntl::FcntlArg::F_GETFL)
            .map(|flags| flags & libc::O_NONBLOCK == 0)
            .unwrap_or(false);
        if !blocking {
            return Some(result_of(sys::connect_raw(socket.as_fd(), address)));
        }
        // The holder is single-threaded; the child only connects, answers and leaves through
        // _exit.
        match sys::fork_single_threaded() {
            Ok(None) => {
                let _ = sys::set_parent_death_signal(libc::SIGKILL);
                let answer = result_of(sys::connect_raw(socket.as_fd(), address));
                let _ = sys::answer_notification(self.fd(), id, answer);
                sys::exit_now(0)
            }
            Ok(Some(_)) => None,
            Err(err) => Some(Err(err.raw_os_error().unwrap_or(libc::EAGAIN))),
        }
    }
}

/// A pidfd of the calling thread: a thread pidfd where the kernel has them (6.9), else one of
/// its thread group (the descriptor table it uses is the group's).
fn open_caller(tid: u32) -> std::io::Result<OwnedFd> {
    let tid =
        libc::pid_t::try_from(tid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    sys::pidfd_open_with_flags(tid, PIDFD_THREAD).or_else(|_| {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
        let tgid = status
            .lines()
            .find_map(|line| line.strip_prefix("Tgid:"))
            .and_then(|value| value.trim().parse::<libc::pid_t>().ok())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        sys::pidfd_open(Pid::from_raw(tgid))
    })
}

/// The path of a pathname `AF_UNIX` address (up to its first NUL), or `None` for any other
/// address.
pub(super) fn pathname(address: &[u8]) -> Option<&OsStr> {
    if address.len() <= 2 || u16::from_ne_bytes([address[0], address[1]]) != libc::AF_UNIX as u16 {
        return None;
    }
    let path = &address[2..];
    if path[0] == 0 {
        return None;
    }
    let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
    Some(OsStr::from_bytes(&path[..end]))
}

/// A pathname `AF_UNIX` address of `path`.
pub(super) fn unix_address(path: &[u8]) -> Vec<u8> {
    let mut address = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    address.extend_from_slice(path);
    address.push(0);
    address
}

fn result_of(result: std::io::Result<()>) -> Result<i64, i32> {
    result
        .map(|()| 0)
        .map_err(|err| err.raw_os_error().unwrap_or(libc::EIO))
}
