//! The only unsafe code of the process module: the hook that runs in the forked child between
//! `fork` and `execve`. It may only make async-signal-safe calls (raw libc, no allocation).

use tokio::process::Command;

/// `close_range(2)` flag: mark the range close-on-exec instead of closing it (closing would also
/// close the pipe std uses to report exec failures, which is already close-on-exec).
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Configure `command` so that its child:
/// - starts a new session (so it is the leader of its own process group, and signals to the
///   group reach its whole tree),
/// - gets SIGKILL if the server dies (`PR_SET_PDEATHSIG`), failing the spawn if the server is
///   already gone,
/// - inherits no descriptor beyond 0-2 (everything above is marked close-on-exec),
/// - when `controlling_tty` is set, makes its stdin (a PTY slave) its controlling terminal.
pub fn isolate_child(command: &mut Command, controlling_tty: bool) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child after fork and before exec; it only calls
    // async-signal-safe libc functions (setsid, prctl, getppid, syscall, fcntl, ioctl), touches
    // no locks and allocates nothing. `parent` is a plain integer copied into the closure.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                // The server died between fork and prctl: do not outlive it.
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            if libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ) < 0
            {
                for fd in 3..4096 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            if controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Duplicate a descriptor known only by number (portable-pty exposes its PTY master as a raw fd).
///
/// # Errors
/// The `fcntl(F_DUPFD_CLOEXEC)` error.
pub fn duplicate_raw_fd(raw: std::os::fd::RawFd) -> std::io::Result<std::os::fd::OwnedFd> {
    // SAFETY: callers pass a descriptor owned by an object that outlives this call; we only
    // borrow it long enough to duplicate it into a new owned descriptor.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    borrowed.try_clone_to_owned()
}

/// Register an owned descriptor with the tokio reactor.
///
/// # Errors
/// The reactor's registration error.
pub fn register_async_fd(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor that stays open, and always reports the same
    // number, for as long as it is owned — here, for the whole life of the AsyncFd.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|error| error.into_parts().1)
}
