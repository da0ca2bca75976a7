//! The only unsafe code of the supervisor: raw system calls, each behind a typed safe wrapper —
//! the child spawn (a `CLONE_VM | CLONE_VFORK` clone, born in its cgroup v2 leaf by `clone3`
//! where it can be, that joins its other cgroups and sets its rlimits before `execve`),
//! `pidfd_open`, `pidfd_send_signal`, `waitid` on a pidfd with the child's
//! CPU time, the PTY window-size ioctls (set for a child's terminal, read for `exec`'s own),
//! ignoring a signal (`exec-guardian`),
//! taking ownership of descriptors received with `SCM_RIGHTS`, and the one-time descriptor
//! hygiene at server start. [`sock_diag`] asks the kernel's socket table who owns a local TCP
//! peer's socket (safe code on `nix`'s netlink calls); [`user_namespace`] whether the peer's
//! process runs in the server's user namespace.

pub mod sock_diag;
mod spawn;
pub mod user_namespace;

pub use spawn::{
    ChildCgroups, ChildRlimit, ChildStep, FileAction, SpawnFailure, spawn_in_new_session,
};

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `close_range(2)` flag: mark the range close-on-exec instead of closing it.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Once at server start: raise the soft descriptor limit to the hard one, make sure descriptors
/// 0-2 exist (so no pipe we create later lands on
/// them) and mark every descriptor above 2 close-on-exec, so nothing the server inherited from
/// its parent can leak into a child.
pub fn prepare_server_descriptors() {
    // Each process holds 3-4 descriptors (pipes or PTY, pidfd) and each connection a socket:
    // raise the soft limit to the hard one so MAX_PROCESSES_PER_SESSION is reachable.
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    for fd in 0..=2 {
        if nix::fcntl::fcntl(borrow(fd), nix::fcntl::FcntlArg::F_GETFD).is_err() {
            // Opened without O_CLOEXEC on purpose: it takes the lowest free number, `fd`, and
            // stays open for the life of the server.
            let _ = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR,
                nix::sys::stat::Mode::empty(),
            )
            .map(std::mem::forget::<OwnedFd>);
        }
    }
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // nothing and touches no memory.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
}

fn borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: only used for fcntl(F_GETFD) probes of 0..=2, which are harmless on a closed number.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// A pidfd for our child `pid` (readable once it exits).
///
/// # Errors
/// The `pidfd_open` errno.
pub fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal` flag (Linux 6.9): signal the process group of the pidfd's process.
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// Send `signal` through `pidfd`: to the process's whole group when `group` is set (where the
/// kernel supports it: Linux 6.9; older kernels signal the process alone). A pidfd names one
/// process for its whole life, so a recycled pid can never be hit; once the process is reaped
/// this fails with `ESRCH`.
///
/// # Errors
/// The `pidfd_send_signal` errno.
pub fn pidfd_send_signal(
    pidfd: &impl AsRawFd,
    signal: libc::c_int,
    group: bool,
) -> std::io::Result<()> {
    let send = |flags: libc::c_uint| {
        // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null siginfo and
        // flags; it touches no memory of ours.
        let result = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                flags,
            )
        };
        if result < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    if !group {
        return send(0);
    }
    match send(PIDFD_SIGNAL_PROCESS_GROUP) {
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => send(0),
        other => other,
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildExit {
    /// Its exit status, or 128 + the signal that killed it.
    pub code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// CPU time (user + system) of the child and every descendant it reaped.
    pub cpu: std::time::Duration,
    /// Peak resident memory of the largest single process among the child and the
    /// descendants it reaped (`ru_maxrss`), where the kernel reported it.
    pub max_rss_bytes: Option<u64>,
}

/// Reap our child through its pidfd if it has exited (`waitid(P_PIDFD, WEXITED | WNOHANG)`
/// with its resource usage); `None` while it runs.
///
/// # Errors
/// The `waitid` errno (`ECHILD` once reaped).
pub fn reap_pidfd(pidfd: &impl AsRawFd) -> std::io::Result<Option<ChildExit>> {
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: siginfo_t and rusage are plain data the kernel fills; waitid writes only into
    // the two locals passed.
    let (info, usage) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let mut usage: libc::rusage = std::mem::zeroed();
        let result = libc::syscall(
            libc::SYS_waitid,
            P_PIDFD,
            pidfd.as_raw_fd(),
            &mut info,
            libc::WEXITED | libc::WNOHANG,
            &mut usage,
        );
        if result < 0 {
            return Err(std::io::Error::last_os_error());
        }
        (info, usage)
    };
    // SAFETY: si_pid and si_status are valid for a SIGCHLD siginfo, which waitid fills (si_pid
    // stays 0 when no child has changed state).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + std::time::Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    let cpu = time(usage.ru_utime) + time(usage.ru_stime);
    // ru_maxrss is in KiB on Linux.
    let max_rss_bytes = u64::try_from(usage.ru_maxrss)
        .ok()
        .filter(|kib| *kib > 0)
        .map(|kib| kib.saturating_mul(1024));
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => ChildExit {
            code: status,
            signal: None,
            cpu,
            max_rss_bytes,
        },
        _ => ChildExit {
            code: 128 + status,
            signal: Some(status),
            cpu,
            max_rss_bytes,
        },
    }))
}

/// Reap `pid` if it is a zombie (`waitpid(pid, WNOHANG)`); true when it was reaped.
pub fn reap_if_exited(pid: libc::pid_t) -> bool {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    matches!(
        waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// Set a terminal's window size (`TIOCSWINSZ`).
///
/// # Errors
/// The ioctl errno.
pub fn set_window_size(terminal: &impl AsRawFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at a live local.
    if unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Register an owned descriptor with the tokio reactor.
///
/// # Errors
/// The reactor's registration error.
pub fn register_async_fd(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor that stays open, and always reports the same
    // number, for as long as it is owned — here, for the whole life of the AsyncFd.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|error| error.into_parts().1)
}

/// Take ownership of a descriptor the kernel installed for us with `SCM_RIGHTS`.
pub fn owned_fd_from_scm_rights(fd: RawFd) -> OwnedFd {
    // SAFETY: recvmsg just installed `fd` in our descriptor table for this message; nothing else
    // knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Lower the scheduling priority of the calling thread (only: on Linux every thread has its own
/// nice value) to `nice`. Irreversible without privilege: call it only on threads that keep
/// this priority for good, and never on a thread that starts children (they inherit it).
pub fn lower_current_thread_priority(nice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: gettid has no preconditions and touches no memory.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid).map_err(|_| std::io::Error::other("bad thread id"))?;
    if lower_thread_priority(tid, nice) {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Set the nice value of thread (or single-threaded process) `tid` to `nice`; whether it
/// worked. Lowering the priority of one's own children needs no privilege.
pub fn lower_thread_priority(tid: libc::id_t, nice: libc::c_int) -> bool {
    // SAFETY: setpriority only changes the scheduling priority of the named thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

/// Set the allocator's thresholds ([`ALLOCATOR_MMAP_THRESHOLD_BYTES`],
/// [`ALLOCATOR_TRIM_THRESHOLD_BYTES`]) so that messages of a few hundred KiB reuse arena
/// memory instead of being mapped, faulted in and unmapped one by one. Call it first in `main`,
/// before any thread exists. Whether both were set (always false off glibc).
///
/// [`ALLOCATOR_MMAP_THRESHOLD_BYTES`]: crate::limits::ALLOCATOR_MMAP_THRESHOLD_BYTES
/// [`ALLOCATOR_TRIM_THRESHOLD_BYTES`]: crate::limits::ALLOCATOR_TRIM_THRESHOLD_BYTES
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use crate::limits::{ALLOCATOR_MMAP_THRESHOLD_BYTES, ALLOCATOR_TRIM_THRESHOLD_BYTES};
        let set = |parameter: libc::c_int, bytes: usize| {
            let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt only changes glibc's allocation parameters.
            unsafe { libc::mallopt(parameter, bytes) == 1 }
        };
        set(libc::M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD_BYTES)
            && set(libc::M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD_BYTES)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Give the allocator's free memory back to the system, now: after a large buffer was freed,
/// glibc keeps it in the freeing thread's arena (above its mmap threshold, which it raises
/// after the first large free), so a burst of large requests would leave the server's RSS at
/// the sum of the arenas' peaks and the memory budget would stop describing the process.
/// `malloc_trim` returns free pages with `madvise`, under the address space's read lock (unlike
/// `munmap`, which would make every thread's page faults wait). Blocking: call it on the
/// blocking pool. Whether memory was released (always false off glibc).
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// The window size of terminal `fd` as `(cols, rows)` (`TIOCGWINSZ`); `None` when it is not a
/// terminal or reports a zero size.
pub fn terminal_window_size(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points at a live,
    // properly aligned local; the descriptor is borrowed for the duration of the call.
    let status = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCGWINSZ,
            &mut size as *mut libc::winsize,
        )
    };
    (status == 0 && size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Ignore `signal` in this process from now on (`SIG_IGN`).
///
/// # Errors
/// The kernel refused the disposition (an invalid signal such as `SIGKILL`).
pub fn ignore_signal(signal: nix::sys::signal::Signal) -> nix::Result<()> {
    // SAFETY: SIG_IGN installs no handler code, so nothing can run in signal context.
    unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigIgn) }.map(|_| ())
}
