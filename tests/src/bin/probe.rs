//! `probe`: runs *inside* a sandbox, tries exactly one operation and prints one JSON line:
//! `{"op": ..., "ok": bool, "errno": N|null, "error": "EPERM"|null, "blocked": bool, "detail": ...}`.
//!
//! `blocked` follows bubblewrap's try-syscall convention: EPERM, EACCES and EROFS mean the
//! sandbox refused; success, or EFAULT/EBADF/ENOTTY for a call made with a deliberately bad
//! argument, mean the call itself was allowed. The sandbox crate's kernel tests include this
//! file as a module so both use one implementation.
//!
//! Usage: `probe OP [ARGS...]`; ops are listed in [`run_probe`]; `probe sequence OP [ARGS] ; OP
//! [ARGS] ...` runs several in turn. The network ops (Fast Open, other transport protocols, the
//! sweeps of socket protocols, send flags and TCP options) live in `../probe_net.rs`.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

#[path = "../probe_net.rs"]
pub mod net;

/// Errno values that mean "the sandbox refused".
pub const BLOCKED_ERRNOS: &[i32] = &[libc::EPERM, libc::EACCES, libc::EROFS];

/// Runs one probe operation described by `args` (`[OP, ARGS...]`).
pub fn run_probe(args: &[String]) -> Value {
    let op = args.first().map(String::as_str).unwrap_or("");
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let result: Result<Value, std::io::Error> = match op {
        "write" => std::fs::write(arg(1), b"probe\n").map(|()| Value::Null),
        "append" => std::fs::OpenOptions::new()
            .append(true)
            .open(arg(1))
            .and_then(|mut f| f.write_all(b"probe\n"))
            .map(|()| Value::Null),
        "truncate" => std::fs::OpenOptions::new()
            .write(true)
            .open(arg(1))
            .and_then(|f| f.set_len(0))
            .map(|()| Value::Null),
        "read" => {
            let mut text = String::new();
            std::fs::File::open(arg(1))
                .and_then(|mut f| f.read_to_string(&mut text))
                .map(|n| json!(n))
        }
        "truncate-path" => nix::unistd::truncate(arg(1).as_str(), 0)
            .map(|()| Value::Null)
            .map_err(std::io::Error::from),
        "readdir" => std::fs::read_dir(arg(1)).map(|entries| json!(entries.count())),
        "exec" => std::process::Command::new(arg(1))
            .status()
            .map(|status| json!(status.code())),
        "rmdir" => std::fs::remove_dir(arg(1)).map(|()| Value::Null),
        "mkfifo" => nix::unistd::mkfifo(arg(1).as_str(), nix::sys::stat::Mode::S_IRWXU)
            .map(|()| Value::Null)
            .map_err(std::io::Error::from),
        "unix-bind" => std::os::unix::net::UnixListener::bind(arg(1)).map(|_| Value::Null),
        "ioctl-tcgets" => ioctl_tcgets(&arg(1)),
        "mkdir" => std::fs::create_dir(arg(1)).map(|()| Value::Null),
        "unlink" => std::fs::remove_file(arg(1)).map(|()| Value::Null),
        "rename" => std::fs::rename(arg(1), arg(2)).map(|()| Value::Null),
        "link" => std::fs::hard_link(arg(1), arg(2)).map(|()| Value::Null),
        "symlink" => std::os::unix::fs::symlink(arg(1), arg(2)).map(|()| Value::Null),
        "chmod" => std::fs::set_permissions(arg(1), std::fs::Permissions::from_mode(0o600))
            .map(|()| Value::Null),
        "tcp-connect" => std::net::TcpStream::connect(arg(1)).map(|_| Value::Null),
        "udp-socket" => std::net::UdpSocket::bind("127.0.0.1:0").map(|_| Value::Null),
        "sequence" => Ok(sequence(&args[1..])),
        "udp-send" => std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.send_to(b"probe", arg(1)))
            .map(|n| json!(n)),
        "unix-connect" => std::os::unix::net::UnixStream::connect(arg(1)).map(|_| Value::Null),
        "abstract-connect" => abstract_connect(&arg(1)),
        "unix-connect-read" => unix_connect_read(&arg(1)),
        "unix-connect-when" => unix_connect_when(&arg(1), &arg(2), &arg(3)),
        "unix-bind-connect" => unix_bind_connect(&arg(1)),
        "unix-dgram-send" => std::os::unix::net::UnixDatagram::unbound()
            .and_then(|socket| socket.send_to(b"hello", arg(1)))
            .map(|sent| json!(sent)),
        "unix-socket" => unix_socket(&arg(1), false),
        "unix-socketpair" => unix_socket(&arg(1), true),
        "unix-connect-loop" => unix_connect_loop(&arg(1), arg(2).parse().unwrap_or(0)),
        "no-new-privs" => std::fs::read_to_string("/proc/self/status").map(|status| {
            let line = status.lines().find(|l| l.starts_with("NoNewPrivs:"));
            json!(line.map(|l| l.trim_start_matches("NoNewPrivs:").trim()))
        }),
        "uid" => Ok(
            json!({"uid": nix::unistd::getuid().as_raw(), "euid": nix::unistd::geteuid().as_raw()}),
        ),
        "io-uring-setup" => io_uring_setup(),
        "ptrace-attach" => ptrace_attach(arg(1).parse().unwrap_or(1)),
        "kill" => nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(arg(1).parse().unwrap_or(1)),
            None,
        )
        .map(|()| Value::Null)
        .map_err(std::io::Error::from),
        "unshare" => nix::sched::unshare(
            nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
        )
        .map(|()| Value::Null)
        .map_err(std::io::Error::from),
        "mount-bind" => nix::mount::mount(
            Some(arg(1).as_str()),
            arg(2).as_str(),
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map(|()| Value::Null)
        .map_err(std::io::Error::from),
        "clone-newuser" => clone_newuser(),
        "tiocsti" => tiocsti(false),
        "tiocsti-high-bits" => tiocsti(true),
        "x32-getpid" => x32_getpid(),
        "int80-getpid" => int80_getpid(),
        "capabilities" => capabilities(),
        "chown" => nix::unistd::chown(arg(1).as_str(), Some(nix::unistd::getuid()), None)
            .map(|()| Value::Null)
            .map_err(std::io::Error::from),
        "utime" => nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            arg(1).as_str(),
            &nix::sys::time::TimeSpec::new(1, 0),
            &nix::sys::time::TimeSpec::new(1, 0),
            nix::sys::stat::UtimensatFlags::FollowSymlink,
        )
        .map(|()| Value::Null)
        .map_err(std::io::Error::from),
        "setxattr" => set_user_xattr(&arg(1)),
        "socket" => open_socket(arg(1).parse().unwrap_or(-1)),
        "open-tree" => open_tree_clone(&arg(1)),
        "syscall" => raw_syscall(arg(1).parse().unwrap_or(-1)),
        "sweep" => Ok(sweep(&arg(1))),
        "chmod-mode" => u32::from_str_radix(&arg(2), 8)
            .map_err(std::io::Error::other)
            .and_then(|mode| {
                std::fs::set_permissions(arg(1), std::fs::Permissions::from_mode(mode))
            })
            .map(|()| Value::Null),
        "create-mode" => create_with_mode(&arg(1), &arg(2)),
        "tmpfile-mode" => tmpfile_with_mode(&arg(1), &arg(2)),
        "open-read-mode" => open_read_with_mode(&arg(1), &arg(2)),
        "set-file-capability" => set_file_capability(&arg(1)),
        "prlimit" => prlimit_cpu(arg(1).parse().unwrap_or(0)),
        "setpriority" => set_priority(arg(1).parse().unwrap_or(0)),
        "sched-setaffinity" => sched_setaffinity(arg(1).parse().unwrap_or(0)),
        "ioprio-set" => ioprio_set(arg(1).parse().unwrap_or(0)),
        "shm-read" => shm_read(arg(1).parse().unwrap_or(0)),
        "open-tty" => std::fs::OpenOptions::new()
            .read(true)
            .open(arg(1))
            .map(|_| Value::Null),
        "setsid-daemon" => setsid_daemon(&arg(1)),
        "landlock-nest" => landlock_nest(),
        "seccomp-nest" => seccomp_nest(false),
        "prctl-seccomp-nest" => seccomp_nest(true),
        "repeat" => Ok(repeat(arg(1).parse().unwrap_or(0), &args[2..])),
        _ => net::run(op, args)
            .unwrap_or_else(|| Err(std::io::Error::other(format!("unknown probe op {op:?}")))),
    };
    report(op, result)
}

/// `sequence OP [ARGS] ; OP [ARGS] ; ...`: runs each operation in turn (the denial audit's
/// tests use it for a known set of allowed and forbidden operations); one result per op.
fn sequence(args: &[String]) -> Value {
    Value::Array(
        args.split(|arg| arg == ";")
            .filter(|ops| !ops.is_empty())
            .map(run_probe)
            .collect(),
    )
}

/// `TCGETS` on `path` opened for reading: a device that is not a terminal answers `ENOTTY`
/// (the call was made); Landlock without `IoctlDev` on it answers `EACCES`.
fn ioctl_tcgets(path: &str) -> Result<Value, std::io::Error> {
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

fn report(op: &str, result: Result<Value, std::io::Error>) -> Value {
    match result {
        Ok(detail) => {
            json!({"op": op, "ok": true, "errno": null, "error": null, "blocked": false, "detail": detail})
        }
        Err(err) => {
            let errno = err.raw_os_error();
            let name = errno.map(|e| format!("{:?}", nix::errno::Errno::from_raw(e)));
            let blocked = errno.is_some_and(|e| BLOCKED_ERRNOS.contains(&e));
            json!({"op": op, "ok": false, "errno": errno, "error": name, "blocked": blocked, "detail": err.to_string()})
        }
    }
}

fn syscall_result(rc: libc::c_long) -> Result<Value, std::io::Error> {
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(json!(rc))
    }
}

fn io_uring_setup() -> Result<Value, std::io::Error> {
    // 120 bytes: sizeof(struct io_uring_params); zeroed is a valid request.
    let mut params = [0u8; 120];
    // SAFETY: the kernel writes at most sizeof(struct io_uring_params) into `params`.
    let rc = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    syscall_result(rc)
}

fn ptrace_attach(pid: i32) -> Result<Value, std::io::Error> {
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

fn clone_newuser() -> Result<Value, std::io::Error> {
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

fn tiocsti(high_bits: bool) -> Result<Value, std::io::Error> {
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

fn x32_getpid() -> Result<Value, std::io::Error> {
    const X32_SYSCALL_BIT: libc::c_long = 0x4000_0000;
    // SAFETY: getpid takes no arguments and touches no memory.
    let rc = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) };
    syscall_result(rc)
}

/// Sets `user.probe` on `path`.
fn set_user_xattr(path: &str) -> Result<Value, std::io::Error> {
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
fn open_socket(family: libc::c_int) -> Result<Value, std::io::Error> {
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

/// The capability sets of this process (`/proc/self/status`), as hex strings.
fn capabilities() -> Result<Value, std::io::Error> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let mut out = serde_json::Map::new();
    for line in status.lines() {
        if let Some((key, value)) = line.split_once(':')
            && key.starts_with("Cap")
        {
            out.insert(key.to_owned(), json!(value.trim()));
        }
    }
    Ok(Value::Object(out))
}

/// `open_tree(path, OPEN_TREE_CLONE)`: a detached copy of a mount, the first step of making a
/// read-only mount writable again.
fn open_tree_clone(path: &str) -> Result<Value, std::io::Error> {
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
fn raw_syscall(nr: libc::c_long) -> Result<Value, std::io::Error> {
    const JUNK: libc::c_long = -1;
    // SAFETY: every argument is -1: an invalid descriptor, pid, flag set and a pointer to the
    // last page of the address space, which the kernel rejects with EFAULT before touching it.
    let rc = unsafe { libc::syscall(nr, JUNK, JUNK, JUNK, JUNK, JUNK, JUNK) };
    syscall_result(rc)
}

/// Calls every syscall number in `spec` (`FROM-TO` minus a comma list of numbers to skip after
/// `/`), each with junk arguments, and returns `{nr: errno-name}` for those that were not
/// refused with ENOSYS or EPERM (the sandbox's two answers).
fn sweep(spec: &str) -> Value {
    let (range, skip) = spec.split_once('/').unwrap_or((spec, ""));
    let (from, to) = range.split_once('-').unwrap_or(("0", "0"));
    let from: libc::c_long = from.parse().unwrap_or(0);
    let to: libc::c_long = to.parse().unwrap_or(0);
    let skip: Vec<libc::c_long> = skip.split(',').filter_map(|n| n.parse().ok()).collect();
    let mut reached = serde_json::Map::new();
    for nr in from..=to {
        if skip.contains(&nr) {
            continue;
        }
        let outcome = match raw_syscall(nr) {
            Ok(_) => "success".to_owned(),
            Err(err) => match err.raw_os_error() {
                Some(libc::ENOSYS | libc::EPERM) => continue,
                Some(errno) => format!("{:?}", nix::errno::Errno::from_raw(errno)),
                None => "?".to_owned(),
            },
        };
        reached.insert(nr.to_string(), json!(outcome));
    }
    Value::Object(reached)
}

fn create_with_mode(path: &str, mode: &str) -> Result<Value, std::io::Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = u32::from_str_radix(mode, 8).map_err(std::io::Error::other)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map(|_| Value::Null)
}

/// An unnamed file in directory `dir` (`O_TMPFILE`) with octal `mode`, then linked as
/// `dir/tmpfile` (the way an `O_TMPFILE` file gets a name).
fn tmpfile_with_mode(dir: &str, mode: &str) -> Result<Value, std::io::Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = u32::from_str_radix(mode, 8).map_err(std::io::Error::other)?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(mode)
        .open(dir)?;
    let target = format!("{dir}/tmpfile");
    nix::unistd::linkat(
        &file,
        "",
        nix::fcntl::AT_FDCWD,
        target.as_str(),
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    )
    .map(|()| Value::Null)
    .map_err(std::io::Error::from)
}

/// Opens `path` for reading with the raw `openat` (and, on x86_64, `open`) system call, passing
/// octal `mode` as the third argument although `O_CREAT` is not set: what callers that invoke
/// `syscall(SYS_open, path, flags)` with two arguments leave in that register (jemalloc does).
fn open_read_with_mode(path: &str, mode: &str) -> Result<Value, std::io::Error> {
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
fn set_file_capability(path: &str) -> Result<Value, std::io::Error> {
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

fn prlimit_cpu(pid: libc::pid_t) -> Result<Value, std::io::Error> {
    let limit = libc::rlimit64 {
        rlim_cur: 1,
        rlim_max: 1,
    };
    // SAFETY: `limit` is a valid rlimit64 for the duration of the call; no old value asked.
    let rc = unsafe { libc::prlimit64(pid, libc::RLIMIT_CPU, &limit, std::ptr::null_mut()) };
    syscall_result(libc::c_long::from(rc))
}

fn set_priority(pid: libc::id_t) -> Result<Value, std::io::Error> {
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, 19) };
    syscall_result(libc::c_long::from(rc))
}

fn sched_setaffinity(pid: libc::pid_t) -> Result<Value, std::io::Error> {
    // SAFETY: a zeroed cpu_set_t with CPU 0 set, valid for the call.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    syscall_result(libc::c_long::from(rc))
}

fn ioprio_set(pid: libc::c_int) -> Result<Value, std::io::Error> {
    const IOPRIO_WHO_PROCESS: libc::c_int = 1;
    const IOPRIO_IDLE: libc::c_int = 3 << 13;
    // SAFETY: integer arguments only.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE) };
    syscall_result(rc)
}

/// Attaches the System V shared memory segment with `key` and returns its first bytes.
fn shm_read(key: libc::key_t) -> Result<Value, std::io::Error> {
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

/// Starts `sleep MARKER` in a new session in the background (a daemon that would outlive its
/// parent) and returns at once.
fn setsid_daemon(marker: &str) -> Result<Value, std::io::Error> {
    use std::os::unix::process::CommandExt;
    let child = std::process::Command::new("/bin/sleep")
        .arg(marker)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    Ok(json!(child.id()))
}

/// `getpid` through the i386 entry (`int 0x80`, syscall 20): the foreign-architecture path the
/// x32 guard kills.
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> Result<Value, std::io::Error> {
    let mut ret: i64 = 20;
    // SAFETY: i386 getpid takes no arguments and touches no memory; int 0x80 clobbers nothing
    // but eax on return.
    unsafe { std::arch::asm!("int 0x80", inlateout("rax") ret, options(nostack)) };
    syscall_result(ret as libc::c_long)
}

#[cfg(not(target_arch = "x86_64"))]
fn int80_getpid() -> Result<Value, std::io::Error> {
    Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
}

/// Stacks a Landlock domain of its own that refuses every file read, with logging of this
/// exec's denials off (`LANDLOCK_RESTRICT_SELF_LOG_SAME_EXEC_OFF`, or no flag before ABI 7):
/// what a command hiding its denials from the audit would do.
fn landlock_nest() -> Result<Value, std::io::Error> {
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
fn seccomp_nest(through_prctl: bool) -> Result<Value, std::io::Error> {
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

/// `repeat N OP [ARGS]`: runs one operation N times (a flood of denials) and counts the
/// outcomes: `{"runs": N, "outcomes": {"EPERM": N, ...}}` (`ok` for successes).
fn repeat(times: u64, op: &[String]) -> Value {
    let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
    for _ in 0..times {
        let result = run_probe(op);
        let key = result["error"].as_str().unwrap_or("ok").to_owned();
        *outcomes.entry(key).or_default() += 1;
    }
    json!({"runs": times, "outcomes": outcomes})
}

fn abstract_connect(name: &str) -> Result<Value, std::io::Error> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixStream::connect_addr(&addr).map(|_| Value::Null)
}

/// Connects to the pathname socket `path` and returns what the peer sends first (up to 64
/// bytes): which listener answered.
fn unix_connect_read(path: &str) -> Result<Value, std::io::Error> {
    let mut stream = std::os::unix::net::UnixStream::connect(path)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf)?;
    Ok(json!(String::from_utf8_lossy(&buf[..n])))
}

/// Creates `ready`, waits (at most 20 s) until `go` exists, then [`unix_connect_read`]s `path`:
/// lets a test change the host between the sandbox's start and the connect.
fn unix_connect_when(ready: &str, go: &str, path: &str) -> Result<Value, std::io::Error> {
    std::fs::write(ready, b"ready\n")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::path::Path::new(go).exists() {
        if std::time::Instant::now() > deadline {
            return Err(std::io::Error::other("no go signal"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    unix_connect_read(path)
}

/// Binds a stream socket at `path`, connects to it and sends a byte through: a socket the
/// command made itself.
fn unix_bind_connect(path: &str) -> Result<Value, std::io::Error> {
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    let mut client = std::os::unix::net::UnixStream::connect(path)?;
    let (mut server, _) = listener.accept()?;
    client.write_all(b"x")?;
    let mut buf = [0u8; 1];
    server.read_exact(&mut buf)?;
    let _ = std::fs::remove_file(path);
    Ok(Value::Null)
}

/// `socket` (or `socketpair`) of `AF_UNIX` and `kind` (`stream`, `dgram`, `seqpacket`); a pair
/// sends one byte across.
fn unix_socket(kind: &str, pair: bool) -> Result<Value, std::io::Error> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket, socketpair};
    let kind = match kind {
        "stream" => SockType::Stream,
        "dgram" => SockType::Datagram,
        "seqpacket" => SockType::SeqPacket,
        other => {
            return Err(std::io::Error::other(format!(
                "unknown socket type {other}"
            )));
        }
    };
    if !pair {
        return socket(AddressFamily::Unix, kind, SockFlag::SOCK_CLOEXEC, None)
            .map(|_| Value::Null)
            .map_err(std::io::Error::from);
    }
    let (a, b) = socketpair(AddressFamily::Unix, kind, None, SockFlag::SOCK_CLOEXEC)?;
    nix::unistd::write(&a, b"x")?;
    let mut buf = [0u8; 1];
    nix::unistd::read(&b, &mut buf)?;
    Ok(Value::Null)
}

/// Connects to `path` `count` times (each connection closed at once) and returns the
/// microseconds taken: the cost of a connect.
fn unix_connect_loop(path: &str, count: u32) -> Result<Value, std::io::Error> {
    let started = std::time::Instant::now();
    for _ in 0..count {
        std::os::unix::net::UnixStream::connect(path)?;
    }
    Ok(json!(started.elapsed().as_micros() as u64))
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("{}", run_probe(&args));
}
