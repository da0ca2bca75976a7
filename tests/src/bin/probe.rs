//! `probe`: runs *inside* a sandbox, tries exactly one operation and prints one JSON line:
//! `{"op": ..., "ok": bool, "errno": N|null, "error": "EPERM"|null, "blocked": bool, "detail": ...}`.
//!
//! `blocked` follows bubblewrap's try-syscall convention: EPERM, EACCES and EROFS mean the
//! sandbox refused; success, or EFAULT/EBADF/ENOTTY for a call made with a deliberately bad
//! argument, mean the call itself was allowed. The sandbox crate's kernel tests include this
//! file as a module so both use one implementation.
//!
//! Usage: `probe OP [ARGS...]`; ops are listed in [`run_probe`]; `probe sequence OP [ARGS] ; OP
//! [ARGS] ...` runs several in turn.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

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
        _ => Err(std::io::Error::other(format!("unknown probe op {op:?}"))),
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

fn abstract_connect(name: &str) -> Result<Value, std::io::Error> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixStream::connect_addr(&addr).map(|_| Value::Null)
}

#[allow(dead_code)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("{}", run_probe(&args));
}
