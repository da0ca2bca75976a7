//! The only unsafe code of `bench`: raw calls, each behind a safe wrapper.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/PID/stat`'s CPU times.
pub(crate) fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    hz as f64
}

/// Moves up to `len` bytes from `from` to `to` with `splice(2)` (no offsets, no flags): one of
/// them must be a pipe. `Ok(0)` at end of file.
///
/// # Errors
/// The OS error of `splice(2)`.
pub(crate) fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are borrowed for the call; null offsets make the kernel use no
    // memory of ours.
    let moved = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            0,
        )
    };
    usize::try_from(moved).map_err(|_| io::Error::last_os_error())
}
