//! seccomp user notification and the calls its handler makes on a notifying process's behalf:
//! installing a filter (with a listener), receiving and answering notifications, taking a
//! process's socket (`pidfd_getfd`) and reading its memory. Each behind a typed safe wrapper
//! with its `// SAFETY:` note.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;

/// `SECCOMP_SET_MODE_FILTER`.
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
/// `SECCOMP_FILTER_FLAG_LOG`: log the filter's non-allow actions to the kernel audit.
pub const SECCOMP_FILTER_FLAG_LOG: libc::c_ulong = 1 << 1;
/// `SECCOMP_FILTER_FLAG_NEW_LISTENER`: return a listener for the filter's `USER_NOTIF` actions.
pub const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_ulong = 1 << 3;
/// `SECCOMP_IOCTL_NOTIF_RECV` (`_IOWR('!', 0, struct seccomp_notif)`).
const SECCOMP_IOCTL_NOTIF_RECV: libc::c_ulong = 0xc050_2100;
/// `SECCOMP_IOCTL_NOTIF_SEND` (`_IOWR('!', 1, struct seccomp_notif_resp)`).
const SECCOMP_IOCTL_NOTIF_SEND: libc::c_ulong = 0xc018_2101;
/// `SECCOMP_IOCTL_NOTIF_ID_VALID` (`_IOW('!', 2, __u64)`).
const SECCOMP_IOCTL_NOTIF_ID_VALID: libc::c_ulong = 0x4008_2102;

/// `struct seccomp_data`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SeccompData {
    /// The syscall number.
    pub nr: i32,
    /// `AUDIT_ARCH_*`.
    pub arch: u32,
    /// The instruction pointer.
    pub instruction_pointer: u64,
    /// The arguments.
    pub args: [u64; 6],
}

/// `struct seccomp_notif`: one intercepted syscall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Notification {
    /// The notification's cookie (answers and validity checks name it).
    pub id: u64,
    /// The calling thread, in the listener's PID namespace.
    pub pid: u32,
    /// Unused (0).
    pub flags: u32,
    /// The call.
    pub data: SeccompData,
}

/// `struct seccomp_notif_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Response {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

/// Installs `program` as a seccomp filter on the calling thread with `flags`
/// (`SECCOMP_FILTER_FLAG_*`); returns the listener when `flags` asks for one. Allocates nothing:
/// safe to call in a child that shares its parent's memory. `no_new_privs` must be set.
///
/// # Errors
/// The OS error of `seccomp(2)`.
pub fn install_filter_on_current_thread(
    program: &[libc::sock_filter],
    flags: libc::c_ulong,
) -> io::Result<Option<OwnedFd>> {
    let prog = libc::sock_fprog {
        len: u16::try_from(program.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, a valid array of `len` instructions that outlives the
    // call; the kernel copies and validates it (it never writes through the pointer).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            flags,
            &prog as *const libc::sock_fprog,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & SECCOMP_FILTER_FLAG_NEW_LISTENER == 0 {
        return Ok(None);
    }
    let fd = RawFd::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this listener (close-on-exec); nothing else owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Receives the next notification (blocks until there is one).
///
/// # Errors
/// The OS error of the ioctl (`ENOENT`: the caller was gone before it could be received).
pub fn receive(listener: BorrowedFd<'_>) -> io::Result<Notification> {
    let mut notification = Notification::default();
    // SAFETY: the ioctl writes one `struct seccomp_notif` (zeroed, as the kernel requires) into
    // `notification`, which is exactly that layout.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            SECCOMP_IOCTL_NOTIF_RECV as _,
            &mut notification as *mut Notification,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(notification)
}

/// Whether notification `id` is still pending (its caller has not been killed or interrupted),
/// so that what was read about the caller (its memory, its pid) is still the caller's.
pub fn still_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the ioctl reads one u64 from `id`.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &id as *const u64,
        )
    };
    rc == 0
}

/// Answers notification `id`: the call returns `value` (`Ok`) or fails with the errno (`Err`).
///
/// # Errors
/// The OS error of the ioctl (`ENOENT`: the caller is gone).
pub fn answer(listener: BorrowedFd<'_>, id: u64, result: Result<i64, i32>) -> io::Result<()> {
    let (val, error) = match result {
        Ok(value) => (value, 0),
        Err(errno) => (0, -errno),
    };
    let response = Response {
        id,
        val,
        error,
        flags: 0,
    };
    // SAFETY: the ioctl reads one `struct seccomp_notif_resp` from `response`.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            SECCOMP_IOCTL_NOTIF_SEND as _,
            &response as *const Response,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `pidfd_getfd(2)`: a duplicate (close-on-exec) of descriptor `target` of the process `pidfd`
/// refers to. Needs ptrace access to it.
///
/// # Errors
/// The OS error of `pidfd_getfd(2)`.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes three integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `pidfd_open(2)` of `pid` with `flags` (`PIDFD_THREAD`: `pid` may be any thread).
///
/// # Errors
/// The OS error of `pidfd_open(2)`.
pub fn pidfd_open_with_flags(pid: libc::pid_t, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads `buf.len()` bytes at `address` of process `pid` through `/proc/PID/mem` (ptrace
/// access needed); returns how many were read (short when the range ends in unmapped memory).
///
/// # Errors
/// The OS error of opening or reading the file.
pub fn read_memory(pid: u32, address: u64, buf: &mut [u8]) -> io::Result<usize> {
    let file = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], address + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if done > 0 => {
                let _ = err;
                break;
            }
            Err(err) => return Err(err),
        }
    }
    Ok(done)
}

/// `connect(2)` of `socket` to the raw socket address `address` (family first).
///
/// # Errors
/// The OS error of `connect(2)`.
pub fn connect_raw(socket: BorrowedFd<'_>, address: &[u8]) -> io::Result<()> {
    let len = libc::socklen_t::try_from(address.len())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `address` is `len` readable bytes; the kernel copies at most `len` of them.
    let rc = unsafe {
        libc::connect(
            socket.as_raw_fd(),
            address.as_ptr().cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The address family of `socket` (`SO_DOMAIN`).
///
/// # Errors
/// The OS error of `getsockopt(2)` (`ENOTSOCK` for a descriptor that is no socket).
pub fn socket_domain(socket: BorrowedFd<'_>) -> io::Result<i32> {
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes (one int) into `domain` and its length
    // into `len`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&raw mut domain).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(domain)
}

/// A control-message buffer for one descriptor, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct OneDescriptor([u8; 32]);

/// Sends descriptor `fd` on `socket` (`SCM_RIGHTS`, with a one-byte body). Allocates nothing:
/// safe to call in a child that shares its parent's memory.
///
/// # Errors
/// The OS error of `sendmsg(2)`.
pub fn send_descriptor(socket: BorrowedFd<'_>, fd: RawFd) -> io::Result<()> {
    let mut body = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr().cast(),
        iov_len: body.len(),
    };
    let mut control = OneDescriptor([0; 32]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as libc::c_uint) };
    // SAFETY: an all-zero msghdr is valid; the fields set point at live locals.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.0.as_mut_ptr().cast();
    message.msg_controllen = space as usize;
    // SAFETY: `control` holds CMSG_SPACE(sizeof(int)) <= 32 bytes, so the first header and its
    // data lie inside it; the kernel reads the message and the descriptor number only.
    let rc = unsafe {
        let header = libc::CMSG_FIRSTHDR(&raw const message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as libc::c_uint) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        libc::sendmsg(socket.as_raw_fd(), &raw const message, libc::MSG_NOSIGNAL)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one descriptor sent with [`send_descriptor`] on `socket` without waiting (close-on-
/// exec); `None` when none is queued (the sender never sent one).
///
/// # Errors
/// The OS error of `recvmsg(2)` (other than "nothing queued").
pub fn receive_descriptor(socket: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut body = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr().cast(),
        iov_len: body.len(),
    };
    let mut control = OneDescriptor([0; 32]);
    // SAFETY: an all-zero msghdr is valid; the fields set point at live locals.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.0.as_mut_ptr().cast();
    message.msg_controllen = control.0.len();
    // SAFETY: the buffers outlive the call; the kernel writes at most their lengths.
    let rc = unsafe {
        libc::recvmsg(
            socket.as_raw_fd(),
            &raw mut message,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if rc < 0 {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(error),
        };
    }
    // SAFETY: the kernel filled `message`; CMSG_FIRSTHDR is null or points inside `control`,
    // and a SCM_RIGHTS header of at least one int's length carries a descriptor it installed
    // for us, which nothing else owns.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&raw const message);
        if header.is_null()
            || (*header).cmsg_level != libc::SOL_SOCKET
            || (*header).cmsg_type != libc::SCM_RIGHTS
            || ((*header).cmsg_len as usize)
                < libc::CMSG_LEN(std::mem::size_of::<RawFd>() as libc::c_uint) as usize
        {
            return Ok(None);
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
        Ok(Some(OwnedFd::from_raw_fd(fd)))
    }
}

/// `unshare(CLONE_FILES)`: the caller stops sharing its descriptor table (a child made with
/// `CLONE_FILES` gets a private copy).
///
/// # Errors
/// The OS error of `unshare(2)`.
pub fn unshare_descriptor_table() -> io::Result<()> {
    // SAFETY: unshare with CLONE_FILES only copies the caller's own descriptor table.
    if unsafe { libc::unshare(libc::CLONE_FILES) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
