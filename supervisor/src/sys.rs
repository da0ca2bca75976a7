//! The only unsafe code of the supervisor: raw system calls, each behind a typed safe wrapper —
//! `posix_spawn` with its file actions and attributes, `pidfd_open`, the PTY window-size ioctl,
//! taking ownership of descriptors received with `SCM_RIGHTS`, and the one-time descriptor
//! hygiene at server start.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `close_range(2)` flag: mark the range close-on-exec instead of closing it.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

/// Signals reset to their default action in every child: the server ignores SIGPIPE (Rust's
/// runtime does), and a child must not inherit that or any other ignored disposition.
const SIGNALS_RESET_IN_CHILD: [libc::c_int; 14] = [
    libc::SIGPIPE,
    libc::SIGXFSZ,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGTERM,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGCHLD,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
];

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

/// What `posix_spawn` does in the child before exec, in order.
pub enum FileAction<'a> {
    /// `dup2(fd, target)` (the new descriptor is not close-on-exec).
    Dup(RawFd, RawFd),
    /// `open(path, O_RDWR)` onto `target`.
    OpenReadWrite(RawFd, &'a CStr),
}

/// Spawn `program` with `argv`/`envp` in a new session (`setsid`), with signal mask cleared and
/// [`SIGNALS_RESET_IN_CHILD`] at their defaults, after changing to `cwd` and applying `actions`.
/// glibc reports exec failures (missing program, permission) as the return value.
///
/// # Errors
/// The errno of the failed step, as an I/O error.
pub fn spawn_in_new_session(
    program: &CStr,
    argv: &[CString],
    envp: &[CString],
    cwd: &CStr,
    actions: &[FileAction<'_>],
) -> std::io::Result<libc::pid_t> {
    let argv_ptrs = null_terminated(argv);
    let envp_ptrs = null_terminated(envp);
    let check = |code: libc::c_int| {
        if code == 0 {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(code))
        }
    };
    // SAFETY: the file-actions and attribute objects are initialized before use and destroyed
    // on every path below; all pointers passed (program, argv, envp, cwd, paths) point into
    // NUL-terminated CStrings that outlive the call; argv/envp arrays end with a null pointer.
    unsafe {
        let mut file_actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attributes: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut file_actions))?;
        if let Err(error) = check(libc::posix_spawnattr_init(&mut attributes)) {
            libc::posix_spawn_file_actions_destroy(&mut file_actions);
            return Err(error);
        }
        let result =
            (|| {
                for action in actions {
                    match action {
                        FileAction::Dup(from, to) => check(
                            libc::posix_spawn_file_actions_adddup2(&mut file_actions, *from, *to),
                        )?,
                        FileAction::OpenReadWrite(to, path) => {
                            check(libc::posix_spawn_file_actions_addopen(
                                &mut file_actions,
                                *to,
                                path.as_ptr(),
                                libc::O_RDWR,
                                0,
                            ))?
                        }
                    }
                }
                check(libc::posix_spawn_file_actions_addchdir_np(
                    &mut file_actions,
                    cwd.as_ptr(),
                ))?;
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                let mut defaults: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut defaults);
                for signal in SIGNALS_RESET_IN_CHILD {
                    libc::sigaddset(&mut defaults, signal);
                }
                check(libc::posix_spawnattr_setsigmask(&mut attributes, &empty))?;
                check(libc::posix_spawnattr_setsigdefault(
                    &mut attributes,
                    &defaults,
                ))?;
                let flags = libc::POSIX_SPAWN_SETSID
                    | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short
                    | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
                check(libc::posix_spawnattr_setflags(&mut attributes, flags))?;
                let mut pid: libc::pid_t = 0;
                check(libc::posix_spawn(
                    &mut pid,
                    program.as_ptr(),
                    &file_actions,
                    &attributes,
                    argv_ptrs.as_ptr(),
                    envp_ptrs.as_ptr(),
                ))?;
                Ok(pid)
            })();
        libc::posix_spawnattr_destroy(&mut attributes);
        libc::posix_spawn_file_actions_destroy(&mut file_actions);
        result
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*mut libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
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
