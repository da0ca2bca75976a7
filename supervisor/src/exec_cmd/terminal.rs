//! The local terminal of `exec-server exec --tty`: raw mode (restored on drop, also on panic
//! unwinding) and the window size. The one raw call (the `TIOCGWINSZ` ioctl, which `nix` has
//! no safe wrapper for) is here behind a safe function.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::termios::{self, SetArg, Termios};

/// Puts a terminal in raw mode until dropped (no echo, no line editing, no signal keys: Ctrl-C
/// reaches the remote terminal as a byte, whose line discipline turns it into SIGINT there).
pub struct RawModeGuard {
    fd: std::os::fd::OwnedFd,
    original: Termios,
}

impl RawModeGuard {
    /// Switch `terminal` to raw mode.
    ///
    /// # Errors
    /// The `tcgetattr`/`tcsetattr` error (e.g. `ENOTTY` when it is not a terminal).
    pub fn enable(terminal: BorrowedFd<'_>) -> nix::Result<Self> {
        let fd = terminal
            .try_clone_to_owned()
            .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)))?;
        let original = termios::tcgetattr(&fd)?;
        let mut raw = original.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(&fd, SetArg::TCSANOW, &raw)?;
        Ok(Self { fd, original })
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(&self.fd, SetArg::TCSANOW, &self.original);
    }
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    termios::tcgetattr(fd).is_ok()
}

/// The window size of terminal `fd` as `(cols, rows)`; `None` when it is not a terminal or
/// reports a zero size.
pub fn window_size(fd: impl AsFd) -> Option<(u16, u16)> {
    crate::sys::terminal_window_size(fd.as_fd())
}
