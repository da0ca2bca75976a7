//! A terminal of the sandbox's own. When `sandbox-run`'s stdin, stdout or stderr is a terminal,
//! the command does not get that terminal (which other processes of the user's session share,
//! and which a leftover process could keep reading after `sandbox-run` returned): PID 1 opens a
//! fresh pseudo-terminal in the sandbox's private devpts instance, copies the outer terminal's
//! settings and size to it and passes the master to the outer `sandbox-run`, which relays bytes
//! between the two with its own terminal in raw mode (as `script` and `ssh -t` do). Window-size
//! changes follow on `SIGWINCH`.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

/// Bytes read from either side per call.
const RELAY_CHUNK_BYTES: usize = 16 * 1024;
/// Input bytes buffered for the command before the outer stops reading its terminal.
const RELAY_INPUT_BUFFER_BYTES: usize = 64 * 1024;

/// Which of stdin, stdout and stderr are terminals (and get the sandbox's own terminal).
pub fn terminal_fds() -> [bool; 3] {
    crate::sys::Stdio::ALL.map(|fd| nix::unistd::isatty(fd.fd()).unwrap_or(false))
}

/// A fresh pseudo-terminal pair in the sandbox's `/dev/ptmx`, with the settings and size of
/// `like` (the outer terminal).
///
/// # Errors
/// The OS error of the step that failed.
pub fn open_inner(like: BorrowedFd<'_>) -> io::Result<(OwnedFd, OwnedFd)> {
    let master: OwnedFd = nix::fcntl::open(
        "/dev/ptmx",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    crate::sys::unlock_pty(master.as_fd())?;
    let slave = crate::sys::open_pty_peer(master.as_fd())?;
    if let Ok(settings) = tcgetattr(like) {
        tcsetattr(&slave, SetArg::TCSANOW, &settings)?;
    }
    copy_window_size(like, master.as_fd());
    Ok((master, slave))
}

/// Copies the window size of `from` to `to` (best effort: a terminal without a size keeps the
/// default).
pub fn copy_window_size(from: BorrowedFd<'_>, to: BorrowedFd<'_>) {
    if let Ok(size) = crate::sys::window_size(from) {
        let _ = crate::sys::set_window_size(to, &size);
    }
}

/// Sends `fd` over `socket` (`SCM_RIGHTS`).
///
/// # Errors
/// The OS error of `sendmsg(2)`.
pub fn send_fd(socket: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(b"m")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Receives one descriptor from `socket`; `None` when the sender closed without one.
///
/// # Errors
/// The OS error of `recvmsg(2)`.
pub fn receive_fd(socket: &UnixStream) -> io::Result<Option<OwnedFd>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    for cmsg in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(fd) = fds.first()
        {
            return Ok(Some(crate::sys::owned_fd(*fd)));
        }
    }
    Ok(None)
}

/// The outer end of the relay.
pub struct Relay {
    master: OwnedFd,
    /// The outer terminal input is read from (when stdin is one).
    input: Option<BorrowedFd<'static>>,
    /// Where the command's output goes (stdout, or stderr when only that is a terminal).
    output: BorrowedFd<'static>,
    pending: Vec<u8>,
    input_open: bool,
    master_open: bool,
    raw: Option<RawMode>,
}

/// The outer terminal's settings before raw mode, restored on drop.
struct RawMode {
    fd: BorrowedFd<'static>,
    saved: Termios,
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = tcsetattr(self.fd, SetArg::TCSADRAIN, &self.saved);
    }
}

impl Relay {
    /// Starts relaying between the outer terminal (the `relayed` stdio descriptors) and
    /// `master`; puts the outer terminal in raw mode when input is read from it.
    ///
    /// # Errors
    /// The OS error of making `master` non-blocking.
    pub fn new(master: OwnedFd, relayed: [bool; 3]) -> io::Result<Self> {
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        use crate::sys::Stdio;
        let input = relayed[0].then(|| Stdio::In.fd());
        let output = if relayed[1] || !relayed[2] {
            Stdio::Out.fd()
        } else {
            Stdio::Err.fd()
        };
        let raw = input.and_then(|fd| {
            let saved = tcgetattr(fd).ok()?;
            let mut raw = saved.clone();
            cfmakeraw(&mut raw);
            tcsetattr(fd, SetArg::TCSADRAIN, &raw).ok()?;
            Some(RawMode { fd, saved })
        });
        Ok(Self {
            master,
            input,
            output,
            pending: Vec::new(),
            input_open: input.is_some(),
            master_open: true,
            raw,
        })
    }

    /// The master, for window-size changes.
    pub fn master(&self) -> BorrowedFd<'_> {
        self.master.as_fd()
    }

    /// The outer terminal the size is taken from.
    pub fn size_source(&self) -> BorrowedFd<'static> {
        self.input.unwrap_or(self.output)
    }

    /// Whether the command side is still open (output may still come).
    pub fn open(&self) -> bool {
        self.master_open
    }

    /// Descriptors to poll and for what: `(fd, want_read, want_write)`.
    pub fn interests(&self) -> Vec<(BorrowedFd<'_>, bool, bool)> {
        let mut out = Vec::new();
        if self.master_open {
            out.push((self.master.as_fd(), true, !self.pending.is_empty()));
        }
        if let Some(input) = self.input
            && self.input_open
            && self.pending.len() < RELAY_INPUT_BUFFER_BYTES
        {
            out.push((input, true, false));
        }
        out
    }

    /// Moves what is ready in either direction. Never blocks on the master; blocks writing to
    /// the outer terminal (backpressure from whoever reads it).
    pub fn pump(&mut self) {
        let mut buf = [0u8; RELAY_CHUNK_BYTES];
        if let Some(input) = self.input.filter(|_| self.input_open)
            && self.pending.len() < RELAY_INPUT_BUFFER_BYTES
            && poll_ready(input)
        {
            match nix::unistd::read(input, &mut buf) {
                Ok(0) => self.input_open = false,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(_) => self.input_open = false,
            }
        }
        if self.master_open && !self.pending.is_empty() {
            match nix::unistd::write(&self.master, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(_) => self.pending.clear(),
            }
        }
        while self.master_open {
            match nix::unistd::read(&self.master, &mut buf) {
                Ok(0) => self.master_open = false,
                Ok(n) => write_all(self.output, &buf[..n]),
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => {}
                // EIO: every slave descriptor is closed (the sandbox ended).
                Err(_) => self.master_open = false,
            }
        }
    }

    /// Restores the outer terminal now (before `sandbox-run` re-raises a fatal signal).
    pub fn restore_terminal(&mut self) {
        self.raw = None;
    }
}

fn poll_ready(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return,
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => {}
            Err(_) => return,
        }
    }
}
