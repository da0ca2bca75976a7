//! Process-level raw calls: `clone` into new namespaces, dropping every capability, the parent
//! death signal, dumpability and opening a pseudo-terminal's peer. Each behind a typed safe
//! wrapper with its `// SAFETY:` note.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::unistd::Pid;

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Securebits: root gets no capabilities from exec or set*id, and neither can be undone.
/// `SECBIT_NOROOT | _LOCKED`, `SECBIT_NO_SETUID_FIXUP | _LOCKED`, `SECBIT_KEEP_CAPS_LOCKED`,
/// `SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED`.
const LOCKED_SECUREBITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
/// Upper bound for capability numbers tried when `cap_last_cap` cannot be read (Linux 6.x has
/// 41; dropping an unknown number fails with `EINVAL`, which ends the loop).
const CAP_NUMBER_LIMIT: libc::c_ulong = 64;
/// `TIOCGPTPEER`: open the peer of a pseudo-terminal master.
const TIOCGPTPEER: libc::c_ulong = 0x5441;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `clone(2)` with `flags` (namespace flags) and `SIGCHLD`, on the caller's stack like `fork`
/// (no `CLONE_VM`): returns `None` in the child and the child's pid in the parent.
///
/// Must only be called while the process is single-threaded (`sandbox-run` has no threads):
/// the child is a copy of the caller, so no lock may be held by another thread.
///
/// # Errors
/// The OS error of `clone(2)` (e.g. `EPERM`/`ENOSPC` when a namespace cannot be created).
pub fn clone_into_namespaces(flags: libc::c_int) -> io::Result<Option<Pid>> {
    // SAFETY: a raw clone without CLONE_VM and with a null stack behaves like fork: the child
    // gets a copy-on-write copy of the address space and continues here. The caller is
    // single-threaded, so the copy holds no lock another thread owned; glibc keeps no pid cache
    // to go stale.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::c_ulong::try_from(flags | libc::SIGCHLD).unwrap_or(0),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0usize,
        )
    };
    match rc {
        rc if rc < 0 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some(Pid::from_raw(
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::Other))?,
        ))),
    }
}

/// Stack of a child that shares its parent's memory ([`spawn_sharing_memory_and_descriptors`]),
/// which only sets up and execs.
const SHARED_CHILD_STACK_BYTES: usize = 256 * 1024;

/// Starts `child` in a new process that shares the caller's memory until it execs or exits
/// (`clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does), on a stack of its own, and
/// returns its pid once it has execed or exited. Unlike `fork`, no page table is copied and
/// no page is copied on write afterwards, which is most of what a start costs a large parent.
///
/// `child` must end in `execve` or [`exit_now`] (returning is an exit with 127). It runs while
/// the caller is suspended, in the caller's memory: it must only change its own process state
/// (signals, session, rlimits, descriptors) and leave the caller's data as it found it. The
/// caller must be single-threaded.
///
/// # Errors
/// The OS error of `clone(2)`.
pub fn spawn_sharing_memory(child: &mut dyn FnMut()) -> io::Result<Pid> {
    spawn_sharing(child, 0)
}

/// As `spawn_sharing_memory` (the same `clone`, used by the tests), and the child also shares
/// the caller's descriptor table (`CLONE_FILES`) until it execs or calls
/// [`super::unshare_descriptor_table`]: a descriptor the child creates (a seccomp listener) is
/// the caller's too. The child must not close or replace the caller's descriptors while it
/// shares them; `child` must end in `execve` or [`exit_now`], and the caller must be
/// single-threaded.
///
/// # Errors
/// The OS error of `clone(2)`.
pub fn spawn_sharing_memory_and_descriptors(child: &mut dyn FnMut()) -> io::Result<Pid> {
    spawn_sharing(child, libc::CLONE_FILES)
}

fn spawn_sharing(child: &mut dyn FnMut(), extra_flags: libc::c_int) -> io::Result<Pid> {
    extern "C" fn trampoline(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `&mut &mut dyn FnMut()` below, alive while the caller is
        // suspended (CLONE_VFORK) until this process execs or exits.
        let child = unsafe { &mut *arg.cast::<&mut dyn FnMut()>() };
        child();
        exit_now(127)
    }
    let mut stack = vec![0u8; SHARED_CHILD_STACK_BYTES];
    // The stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let mut child = child;
    // SAFETY: the child runs `trampoline` on `stack`, which outlives it (the caller is
    // suspended until the child execs or exits); it never returns into the caller's frames.
    let rc = unsafe {
        libc::clone(
            trampoline,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | extra_flags,
            (&raw mut child).cast::<libc::c_void>(),
        )
    };
    drop(stack);
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Pid::from_raw(rc))
}

/// Drops every capability of the calling process for good, whatever its uid: locks the
/// securebits that would let uid 0 regain capabilities through `execve` or `set*uid`, empties the
/// bounding and ambient sets, then the effective, permitted and inheritable sets.
///
/// Call it after the last privileged step (mounts), before Landlock and seccomp. Needs
/// `CAP_SETPCAP` in the caller's user namespace for the securebits and the bounding set.
///
/// # Errors
/// The OS error of the step that failed.
pub fn drop_all_capabilities() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only changes the caller's own security state.
    let rc = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(CAP_NUMBER_LIMIT);
    for cap in 0..=last {
        // SAFETY: as above; each call removes one capability from the bounding set.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) && cap > 0 {
                break; // past the kernel's last capability
            }
            return Err(err);
        }
    }
    // SAFETY: as above.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid for the duration of the call; version 3 reads two
    // `CapData` entries.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// For a process that may not hold `CAP_SETPCAP` (unprivileged, outside any user namespace of
/// its own): empties the effective, permitted, inheritable and ambient sets, which needs no
/// privilege, and checks in `/proc/self/status` that they are empty.
///
/// # Errors
/// The OS error of `capset(2)`, or `PermissionDenied` when a set is still not empty.
pub fn require_no_capabilities() -> io::Result<()> {
    let header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: as in `drop_all_capabilities`: valid header and two data entries.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: prctl with integer arguments only changes the caller's own state.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let status = std::fs::read_to_string("/proc/self/status")?;
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if matches!(key, "CapInh" | "CapPrm" | "CapEff" | "CapAmb")
            && u64::from_str_radix(value.trim(), 16).ok() != Some(0)
        {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{key} is still {} after dropping capabilities",
                    value.trim()
                ),
            ));
        }
    }
    Ok(())
}

/// `PR_SET_PDEATHSIG`: the kernel sends `signal` to the caller when its parent thread exits.
///
/// # Errors
/// The OS error of `prctl(2)`.
pub fn set_parent_death_signal(signal: libc::c_int) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only changes the caller's own state.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `PR_SET_DUMPABLE`: whether the caller can be ptraced or have its `/proc` files read by
/// processes of the same uid.
///
/// # Errors
/// The OS error of `prctl(2)`.
pub fn set_dumpable(dumpable: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only changes the caller's own state.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_DUMPABLE,
            libc::c_ulong::from(dumpable),
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens the peer (slave) of the pseudo-terminal `master` by descriptor (`TIOCGPTPEER`), so no
/// path under `/dev/pts` is looked up.
///
/// # Errors
/// The OS error of the ioctl.
pub fn open_pty_peer(master: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes an integer of open flags and returns a new descriptor.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), TIOCGPTPEER, flags) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// Takes ownership of a descriptor the kernel installed for us with `SCM_RIGHTS`.
pub fn owned_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: recvmsg just installed `fd` in our descriptor table for this message; nothing else
    // knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Unblocks every signal and resets every catchable one to its default action: what a program
/// expects to inherit from `execve` (Rust's runtime ignores `SIGPIPE`, and a blocked or ignored
/// disposition would otherwise leak into the command).
pub fn reset_signals_for_exec() {
    // SAFETY: sigprocmask and signal with SIG_DFL only change this process's own signal state;
    // the process is single-threaded and about to exec.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for signal in 1..libc::SIGRTMIN() {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
    }
}

/// Makes `tty` the controlling terminal of the calling session leader (`TIOCSCTTY`).
///
/// # Errors
/// The OS error of the ioctl.
pub fn set_controlling_terminal(tty: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal).
    if unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `execve(2)`: replaces the process image; returns only on failure.
pub fn execve(
    program: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    envp: &[std::ffi::CString],
) -> io::Error {
    let argv: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = envp
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // SAFETY: every pointer points into a NUL-terminated CString that outlives the call, and both
    // arrays end with a null pointer.
    unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::last_os_error()
}

/// Ends the calling process at once with `status`, without running destructors or exit
/// handlers (a forked child must not flush or free its parent's state).
pub fn exit_now(status: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(status) }
}

/// Dies of `signal` as the command did, so our parent sees the same wait status: resets its
/// action to the default, unblocks it, and raises it (core dumps off). Returns if the signal
/// was not fatal.
pub fn die_of_signal(signal: libc::c_int) {
    // SAFETY: setrlimit, signal, sigprocmask and raise only change this process's own state.
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
}

/// Takes ownership of descriptor `fd`, handed to this process at `exec` on purpose (the egress
/// proxy's listener, event pipe and configuration), after checking that it is open.
///
/// # Errors
/// `EBADF` when it is not open.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only reads the descriptor's flags; harmless on any number.
    let rc = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the parent passed this number for this purpose alone and the check above proved
    // it open; the caller takes it once, so this is its only owner. Close-on-exec is set so it
    // never reaches another program.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )?;
    Ok(fd)
}

/// Brings the loopback interface of the caller's network namespace up (`SIOCSIFFLAGS` with
/// `IFF_UP`); the kernel then gives it 127.0.0.1/8 and ::1. Needs `CAP_NET_ADMIN` in the user
/// namespace that owns the network namespace (PID 1 of a sandbox, before it drops everything).
///
/// # Errors
/// The OS error of the socket or the ioctls.
pub fn bring_loopback_up() -> io::Result<()> {
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `request` into it; the
    // pointer is to a live, properly sized ifreq.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member SIOCGIFFLAGS just filled.
    let flags = unsafe { request.ifr_ifru.ifru_flags };
    request.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads `request`; the pointer is to a live ifreq.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A descriptor (close-on-exec) of the calling process's mount namespace: a reference that
/// keeps the namespace, and every mount in it, alive after the last process in it has exited.
/// Through the process's own pidfd (`PIDFD_GET_MNT_NAMESPACE`, Linux 6.11), else
/// `/proc/self/ns/mnt`.
///
/// # Errors
/// The OS error of opening `/proc/self/ns/mnt` when the pidfd way is not there.
pub fn own_mount_namespace() -> io::Result<OwnedFd> {
    /// `_IO(PIDFS_IOCTL_MAGIC, 3)` of `<linux/pidfd.h>`.
    const PIDFD_GET_MNT_NAMESPACE: libc::c_ulong = 0xFF03;
    if let Ok(me) = pidfd_open(nix::unistd::getpid()) {
        // SAFETY: an ioctl without an argument on a descriptor owned here; it returns a new
        // descriptor (close-on-exec) or -1.
        let fd = unsafe { libc::ioctl(me.as_raw_fd(), PIDFD_GET_MNT_NAMESPACE as _, 0) };
        if fd >= 0 {
            return Ok(owned_fd(fd));
        }
    }
    nix::fcntl::open(
        "/proc/self/ns/mnt",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// `pidfd_open(2)` of `pid` (close-on-exec). Call it on an unreaped child of the caller, whose
/// pid cannot be recycled yet.
///
/// # Errors
/// The OS error of `pidfd_open(2)`.
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    Ok(owned_fd(fd))
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::fs::MetadataExt;

    use nix::sys::wait::{WaitStatus, waitpid};

    use super::{execve, exit_now, own_mount_namespace, spawn_sharing_memory};

    #[test]
    fn a_child_sharing_memory_execs_and_its_status_is_the_programs() {
        let program = CString::new("/bin/sh").unwrap();
        let argv = [program.clone(), c"-c".into(), c"exit 7".into()];
        let before = vec![1u8; 4096];
        let child = spawn_sharing_memory(&mut || {
            let _ = execve(&program, &argv, &[]);
            exit_now(99)
        })
        .unwrap();
        assert_eq!(waitpid(child, None).unwrap(), WaitStatus::Exited(child, 7));
        assert!(
            before.iter().all(|b| *b == 1),
            "the parent's memory changed"
        );
    }

    #[test]
    fn a_child_sharing_memory_that_returns_exits_127_and_one_that_exits_keeps_its_status() {
        let returned = spawn_sharing_memory(&mut || {}).unwrap();
        assert_eq!(
            waitpid(returned, None).unwrap(),
            WaitStatus::Exited(returned, 127)
        );
        let exited = spawn_sharing_memory(&mut || exit_now(3)).unwrap();
        assert_eq!(
            waitpid(exited, None).unwrap(),
            WaitStatus::Exited(exited, 3)
        );
    }

    #[test]
    fn the_own_mount_namespace_descriptor_is_this_processs_namespace() {
        let held = own_mount_namespace().unwrap();
        let held = std::fs::File::from(held).metadata().unwrap();
        let current = std::fs::metadata("/proc/self/ns/mnt").unwrap();
        assert_eq!((held.dev(), held.ino()), (current.dev(), current.ino()));
    }
}
