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
#![deny(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

#[path = "../probe_net.rs"]
// Raw socket calls, each probing one way out of the network sandbox: a `sys` module of the probe.
#[allow(unsafe_code)]
pub mod net;
#[path = "../probe_sys.rs"]
#[allow(unsafe_code)]
mod sys;
use sys::*;

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

#[cfg(not(target_arch = "x86_64"))]
fn int80_getpid() -> Result<Value, std::io::Error> {
    Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
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
