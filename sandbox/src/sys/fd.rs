//! Descriptor-level raw calls: the standard descriptors, `dup2` onto them, `fork`, `splice`
//! and the terminal ioctls the crate needs that `nix` does not wrap for a `BorrowedFd`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::unistd::Pid;

/// `TIOCSPTLCK`: lock or unlock a pseudo-terminal's slave.
const TIOCSPTLCK: libc::c_ulong = 0x4004_5431;

/// One of the standard descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stdio {
    /// Descriptor 0.
    In = 0,
    /// Descriptor 1.
    Out = 1,
    /// Descriptor 2.
    Err = 2,
}

impl Stdio {
    /// Descriptors 0, 1 and 2, in that order.
    pub const ALL: [Stdio; 3] = [Stdio::In, Stdio::Out, Stdio::Err];

    /// The descriptor, borrowed for the life of the process.
    pub fn fd(self) -> BorrowedFd<'static> {
        // SAFETY: this crate never closes 0-2; it only replaces them with `dup2`
        // ([`replace_stdio`]), which keeps the number open throughout. A process started with
        // one of them closed gets EBADF from every call on it, which reads and writes nothing.
        unsafe { BorrowedFd::borrow_raw(self as i32) }
    }
}

/// Makes standard descriptor `target` a copy of `fd` (`dup2(2)`): the number stays open
/// throughout, so a [`Stdio::fd`] borrowed earlier now names the new file.
///
/// # Errors
/// The OS error of `dup2(2)`.
pub fn replace_stdio(fd: BorrowedFd<'_>, target: Stdio) -> io::Result<()> {
    // SAFETY: dup2 onto 0-2 closes and replaces only that number atomically; no owned
    // descriptor of this process holds 0-2 (they are only ever borrowed, see `Stdio::fd`).
    if unsafe { libc::dup2(fd.as_raw_fd(), target as i32) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `fork(2)`: returns `None` in the child and the child's pid in the parent.
///
/// Only for a process that is single-threaded when it calls this (`sandbox-run` and the
/// notification holder start no thread): the child is then a complete copy of the caller, with
/// no lock held by a thread that does not exist in it, so any code may run in it. That is the
/// decision the crate relies on; a caller with threads must use
/// [`super::spawn_sharing_memory_and_descriptors`] (whose child only sets up and execs) instead.
///
/// # Errors
/// The OS error of `fork(2)`.
pub fn fork_single_threaded() -> io::Result<Option<Pid>> {
    // SAFETY: the caller is single-threaded (above), so the child's copy of the address space is
    // consistent and every function is safe to call in it.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => Ok(None),
        nix::unistd::ForkResult::Parent { child } => Ok(Some(child)),
    }
}

/// Unlocks the slave of the pseudo-terminal `master` (`TIOCSPTLCK` with 0).
///
/// # Errors
/// The OS error of the ioctl.
pub fn unlock_pty(master: BorrowedFd<'_>) -> io::Result<()> {
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the pointer, which points at a live local.
    if unsafe { libc::ioctl(master.as_raw_fd(), TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The window size of terminal `fd` (`TIOCGWINSZ`).
///
/// # Errors
/// The OS error of the ioctl (`ENOTTY` when `fd` is not a terminal).
pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<libc::winsize> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer, which points at the live local.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Sets the window size of terminal `fd` (`TIOCSWINSZ`).
///
/// # Errors
/// The OS error of the ioctl.
pub fn set_window_size(fd: BorrowedFd<'_>, size: &libc::winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, a live reference.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
