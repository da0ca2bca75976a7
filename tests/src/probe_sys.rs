//! The probe's raw system calls (the `sys` module of `probe`): each probe operation that must
//! reach the kernel exactly as a sandboxed program would, with the arguments it chooses, lives
//! here behind a function returning `io::Result`. The only module of the probe allowed unsafe
//! code; each block says why it is sound (`// SAFETY:`).

use serde_json::{Value, json};

/// `TCGETS` on `path` opened for reading: a device that is not a terminal answers `ENOTTY`
/// (the call was made); Landlock without `IoctlDev` on it answers `EACCES`.
pub(crate) fn ioctl_tcgets(path: &str) -> Result<Value, std::io::Error> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
    // SAFETY: TCGETS writes at most one termios into the buffer given.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(Value::Null)
    }
}

pub(crate) fn syscall_result(rc: libc::c_long) -> Result<Value, std::io::Error> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(json!(rc))
    }
}

pub(crate) fn io_uring_setup() -> Result<Value, std::io::Error> {
    // 120 bytes: sizeof(struct io_uring_params); zeroed is a valid request.
    let mut params = [0u8; 120];
    // SAFETY: the kernel writes at most sizeof(struct io_uring_params) into `params`.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    syscall_result(rc)
}

pub(crate) fn ptrace_attach(pid: i32) -> Result<Value, std::io::Error> {
    // SAFETY: PTRACE_ATTACH takes no pointers; addr and data are ignored.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_ATTACH,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    syscall_result(rc)
}

pub(crate) fn clone_newuser() -> Result<Value, std::io::Error> {
    let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: a fork-like clone without CLONE_VM: the child gets its own copy of memory and
    // leaves at once through _exit.
    let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if rc == 0 {
        // SAFETY: ends the cloned child immediately.
        unsafe { libc::_exit(0) };
    }
    if rc > 0 {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(rc as i32), None);
    }
    syscall_result(rc)
}

pub(crate) fn tiocsti(high_bits: bool) -> Result<Value, std::io::Error> {
    #[allow(clippy::useless_conversion)] // c_ulong is u64 only on 64-bit targets
    let mut request: u64 = libc::TIOCSTI.into();
    if high_bits {
        request |= 1 << 32;
    }
    let byte: u8 = b'#';
    // SAFETY: the third argument points at one valid byte, as TIOCSTI expects. On a non-tty
    // fd an allowed call fails with ENOTTY; a filtered one with EPERM.
    let rc = unsafe { libc::syscall(libc::SYS_ioctl, 0, request, &byte as *const u8) };
    syscall_result(rc)
}

pub(crate) fn x32_getpid() -> Result<Value, std::io::Error> {
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    // SAFETY: getpid takes no arguments and touches no memory.
    let rc = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) };
    syscall_result(rc)
}

/// Sets `user.probe` on `path`.
pub(crate) fn set_user_xattr(path: &str) -> Result<Value, std::io::Error> {
    let path = std::ffi::CString::new(path)?;
    // SAFETY: valid C strings and a 1-byte value, alive for the call.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.probe".as_ptr(),
            b"x".as_ptr().cast(),
            1,
            0,
        )
    };
    syscall_result(libc::c_long::from(rc))
}

/// `socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0)` (SOCK_RAW for AF_PACKET), closed at once.
pub(crate) fn open_socket(family: libc::c_int) -> Result<Value, std::io::Error> {
    let kind = if family == libc::AF_PACKET {
        libc::SOCK_RAW
    } else {
        libc::SOCK_DGRAM
    };
    // SAFETY: integer arguments; the descriptor is closed right away.
    let fd = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, 0) };
    if fd >= 0 {
        // SAFETY: our own descriptor, just created.
        unsafe { libc::close(fd) };
    }
    syscall_result(libc::c_long::from(fd))
}

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of a mount, the first step of making a
/// read-only mount writable again.
pub(crate) fn open_tree_clone(path: &str) -> Result<Value, std::io::Error> {
    let path = std::ffi::CString::new(path)?;
    // SAFETY: `path` is a valid C string; OPEN_TREE_CLONE (1) | O_CLOEXEC asks for a descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            1u32 | libc::O_CLOEXEC as u32,
        )
    };
    syscall_result(rc)
}

/// Syscall `nr` with arguments that make any real call fail harmlessly (bad pointers and
/// descriptors), so the errno tells "refused by the filter" from "reached the kernel".
pub(crate) fn raw_syscall(nr: libc::c_long) -> Result<Value, std::io::Error> {
    const JUNK: libc::c_long = -1;
    // SAFETY: every argument is -1: an invalid descriptor, pid, flag set and a pointer to the
    // last page of the address space, which the kernel rejects with EFAULT before touching it.
    let rc = unsafe { libc::syscall(nr, JUNK, JUNK, JUNK, JUNK, JUNK, JUNK) };
    syscall_result(rc)
}

/// Opens `path` for reading with the raw `openat` (and, on x86_64, `open`) system call, passing
/// octal `mode` as the third argument although `O_CREAT` is not set: what callers that invoke
/// `syscall(SYS_open, path, flags)` with two arguments leave in that register (jemalloc does).
pub(crate) fn open_read_with_mode(path: &str, mode: &str) -> Result<Value, std::io::Error> {
    let mode = libc::c_long::from_str_radix(mode, 8).map_err(std::io::Error::other)?;
    let path = std::ffi::CString::new(path)?;
    let flags = libc::c_long::from(libc::O_RDONLY | libc::O_CLOEXEC);
    let mut calls = vec![libc::SYS_openat];
    #[cfg(target_arch = "x86_64")]
    calls.push(libc::SYS_open);
    for number in calls {
        // SAFETY: a valid C string; the kernel ignores the mode argument without O_CREAT.
        let fd = unsafe {
            if number == libc::SYS_openat {
                libc::syscall(number, libc::AT_FDCWD, path.as_ptr(), flags, mode)
            } else {
                libc::syscall(number, path.as_ptr(), flags, mode)
            }
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just returned to us and is closed once.
        unsafe { libc::close(fd as libc::c_int) };
    }
    Ok(Value::Null)
}

/// Gives `path` a file capability (`security.capability`, CAP_SETUID permitted+effective).
pub(crate) fn set_file_capability(path: &str) -> Result<Value, std::io::Error> {
    // struct vfs_cap_data v2: magic_etc (VFS_CAP_REVISION_2 | EFFECTIVE), then
    // {permitted, inheritable} for the low and high 32 capabilities; CAP_SETUID is bit 7.
    let mut value = Vec::new();
    value.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    value.extend_from_slice(&(1u32 << 7).to_le_bytes());
    value.extend_from_slice(&0u32.to_le_bytes());
    value.extend_from_slice(&0u32.to_le_bytes());
    value.extend_from_slice(&0u32.to_le_bytes());
    let path = std::ffi::CString::new(path)?;
    // SAFETY: valid C strings and a buffer of the given length, all alive for the call.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    syscall_result(libc::c_long::from(rc))
}

pub(crate) fn prlimit_cpu(pid: libc::pid_t) -> Result<Value, std::io::Error> {
    let limit = libc::rlimit64 {
        rlim_cur: 1,
        rlim_max: 1,
    };
    // SAFETY: `limit` is a valid rlimit64 for the duration of the call; no old value asked.
    let rc = unsafe { libc::prlimit64(pid, libc::RLIMIT_CPU, &limit, std::ptr::null_mut()) };
    syscall_result(libc::c_long::from(rc))
}

pub(crate) fn set_priority(pid: libc::id_t) -> Result<Value, std::io::Error> {
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, 19) };
    syscall_result(libc::c_long::from(rc))
}

pub(crate) fn sched_setaffinity(pid: libc::pid_t) -> Result<Value, std::io::Error> {
    // SAFETY: a zeroed cpu_set_t with CPU 0 set, valid for the call.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    syscall_result(libc::c_long::from(rc))
}

pub(crate) fn ioprio_set(pid: libc::c_int) -> Result<Value, std::io::Error> {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_IDLE: libc::c_int = 3 << 13;
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE) };
    syscall_result(rc)
}

/// Attaches the System V shared memory segment with `key` and returns its first bytes.
pub(crate) fn shm_read(key: libc::key_t) -> Result<Value, std::io::Error> {
    // SAFETY: shmget takes integers; shmat maps the segment read-only at a kernel-chosen address
    // which is read within its 64 bytes and detached.
    unsafe {
        let id = libc::shmget(key, 0, 0);
        if id < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let addr = libc::shmat(id, std::ptr::null(), libc::SHM_RDONLY);
        if addr as isize == -1 {
            return Err(std::io::Error::last_os_error());
        }
        let bytes = std::slice::from_raw_parts(addr.cast::<u8>(), 16).to_vec();
        libc::shmdt(addr);
        Ok(json!(
            String::from_utf8_lossy(&bytes).trim_end_matches('\0')
        ))
    }
}

/// `getpid` through the i386 entry (`int 0x80`, syscall 20): the foreign-architecture path the
/// x32 guard kills.
#[cfg(target_arch = "x86_64")]
pub(crate) fn int80_getpid() -> Result<Value, std::io::Error> {
    let mut ret: i64 = 20;
    // SAFETY: i386 getpid takes no arguments and touches no memory; int 0x80 clobbers nothing
    // but eax on return.
    unsafe { std::arch::asm!("int 0x80", inlateout("rax") ret, options(nostack)) };
    syscall_result(ret as libc::c_long)
}

/// Stacks a Landlock domain of its own that refuses every file read, with logging of this
/// exec's denials off (`LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF`, or no flag before ABI 7):
/// what a command hiding its denials from the audit would do.
pub(crate) fn landlock_nest() -> Result<Value, std::io::Error> {
    const LANDLOCK_ACCESS_FS_READ_FILE: u64 = 1 << 2;
    const LOG_SAME_EXEC_OFF: u32 = 1 << 0;
    let attr: [u64; 1] = [LANDLOCK_ACCESS_FS_READ_FILE];
    // SAFETY: `attr` is a valid `struct landlock_ruleset_attr` prefix (handled_access_fs) of
    // the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: restrict_self takes a ruleset descriptor and flags, no pointers.
    let mut rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, LOG_SAME_EXEC_OFF) };
    if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) };
    }
    let result = syscall_result(rc);
    // SAFETY: `fd` is the ruleset descriptor created above, closed once.
    unsafe { libc::close(fd as i32) };
    result
}

/// Installs a seccomp filter of its own, without `SECCOMP_FILTER_FLAG_LOG`, that answers
/// `socket()` with `EACCES` (through `seccomp(2)` or `prctl(PR_SET_SECCOMP)`): its refusals
/// would win over the sandbox's and leave no record.
pub(crate) fn seccomp_nest(through_prctl: bool) -> Result<Value, std::io::Error> {
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x15;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut program = [
        insn(BPF_LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        insn(BPF_JEQ_K, 0, 1, libc::SYS_socket as u32),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EACCES as u32),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    let rc = if through_prctl {
        // SAFETY: `prog` points at `program`, valid for the call; the kernel copies it.
        unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            )
        }
        .into()
    } else {
        // SAFETY: as above, through seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog).
        unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0u32,
                &prog as *const libc::sock_fprog,
            )
        }
    };
    syscall_result(rc)
}
