//! The command's side: the small filter it installs on itself before it execs, and starting
//! it so that the filter's listener lands with the holder.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use nix::unistd::Pid;

use super::gate::Gate;
use super::notifier::Notifier;
use crate::sys;

/// `SECCOMP_RET_USER_NOTIF`.
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// `SECCOMP_RET_ALLOW`.
const RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO`.
const RET_ERRNO: u32 = 0x0005_0000;
/// The socket type bits of `socket(2)`'s type argument (the rest are `SOCK_NONBLOCK`,
/// `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u32 = 0xf;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The command's own filter: with `notify`, `connect` notifies the holder and `AF_UNIX`
/// datagram sockets cannot be made; always, `pidfd_getfd` is refused (the holder uses it, the
/// command may not). Everything else is left to the main filter.
pub fn command_filter(notify: bool) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const AND_K: u16 = 0x54;
    const RET_K: u16 = 0x06;
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    const OFFSET_ARG0_LOW: u32 = 16;
    const OFFSET_ARG1_LOW: u32 = 24;
    let arch = crate::linux::seccomp_policy::audit_arch(std::env::consts::ARCH).unwrap_or(0);
    let nr = |number: libc::c_long| u32::try_from(number).unwrap_or(u32::MAX);
    const JA: u16 = 0x05;
    // Indexes of the datagram check and the returns (every jump goes forward, relative to the
    // next instruction).
    const DGRAM_CHECK: u8 = 8;
    const NOTIFY: u8 = 14;
    const REFUSE_EPERM: u8 = 15;
    const ALLOW: u8 = 16;
    let to = |from: u8, target: u8| target - from - 1;
    let connect_target = if notify { NOTIFY } else { ALLOW };
    let socket_target = if notify { DGRAM_CHECK } else { ALLOW };
    vec![
        insn(LD_W_ABS, 0, 0, OFFSET_ARCH),
        // Another architecture: the main filter kills it.
        insn(JEQ_K, 0, to(1, ALLOW), arch),
        insn(LD_W_ABS, 0, 0, OFFSET_NR),
        insn(JEQ_K, to(3, connect_target), 0, nr(libc::SYS_connect)),
        insn(JEQ_K, to(4, REFUSE_EPERM), 0, nr(libc::SYS_pidfd_getfd)),
        insn(JEQ_K, to(5, socket_target), 0, nr(libc::SYS_socket)),
        insn(JEQ_K, to(6, socket_target), 0, nr(libc::SYS_socketpair)),
        insn(JA, 0, 0, u32::from(to(7, ALLOW))),
        // socket/socketpair: family (argument 0) and type (argument 1) are ints.
        insn(LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),
        insn(JEQ_K, 0, to(9, ALLOW), libc::AF_UNIX as u32),
        insn(LD_W_ABS, 0, 0, OFFSET_ARG1_LOW),
        insn(AND_K, 0, 0, SOCK_TYPE_MASK),
        insn(JEQ_K, 0, to(12, ALLOW), libc::SOCK_DGRAM as u32),
        // 13: an AF_UNIX datagram socket.
        insn(RET_K, 0, 0, RET_ERRNO | libc::EACCES as u32),
        insn(RET_K, 0, 0, RET_USER_NOTIF),
        insn(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32),
        insn(RET_K, 0, 0, RET_ALLOW),
    ]
}

/// [`command_filter`] as reviewers read it (golden-tested).
pub fn render_command_filter(notify: bool) -> String {
    let program: Vec<seccompiler::sock_filter> = command_filter(notify)
        .iter()
        .map(|insn| seccompiler::sock_filter {
            code: insn.code,
            jt: insn.jt,
            jf: insn.jf,
            k: insn.k,
        })
        .collect();
    crate::linux::seccomp::disassemble(&program)
}

/// The filters a command's process installs on itself before it execs, built before it starts
/// (installing them allocates nothing).
pub struct CommandFilters {
    own: Vec<libc::sock_filter>,
    own_flags: libc::c_ulong,
    main: crate::linux::seccomp::Prepared,
}

impl CommandFilters {
    /// The command's own filter (with a listener when `notify`) and the sandbox's main filter.
    pub fn new(notify: bool, main: crate::linux::seccomp::Prepared) -> Self {
        let mut own_flags = 0;
        if notify {
            own_flags |= sys::SECCOMP_FILTER_FLAG_NEW_LISTENER;
        }
        if main.logged() {
            own_flags |= sys::SECCOMP_FILTER_FLAG_LOG;
        }
        Self {
            own: command_filter(notify),
            own_flags,
            main,
        }
    }

    /// The main filter (the holder installs it on itself once the command has started).
    pub fn main(&self) -> &crate::linux::seccomp::Prepared {
        &self.main
    }
}

/// Starts the command's process sharing the caller's memory and descriptor table: it installs
/// `filters` (its own filter's listener lands in the caller's table), takes a private
/// descriptor table, and runs `start`, which must exec or exit. Returns its pid and the
/// listener (when the filters notify). Call it with the process's Landlock domain in place and
/// before the caller installs its own seccomp filter (which, under the denial audit, refuses
/// new filters).
///
/// # Errors
/// The OS error of `clone(2)`.
pub fn spawn_command(
    filters: &CommandFilters,
    start: &mut dyn FnMut(),
) -> std::io::Result<(Pid, Option<OwnedFd>)> {
    let mut listener: RawFd = -1;
    let child = sys::spawn_sharing_memory_and_descriptors(&mut || {
        match sys::install_filter_on_current_thread(&filters.own, filters.own_flags) {
            Ok(Some(fd)) => {
                listener = fd.as_raw_fd();
                // The caller owns it from now on; this process drops its copy below.
                std::mem::forget(fd);
            }
            Ok(None) => {}
            Err(err) => setup_failed("installing the command's own seccomp filter", &err),
        }
        if let Err(err) = sys::unshare_descriptor_table() {
            setup_failed("taking a descriptor table of its own", &err);
        }
        if listener >= 0 {
            // This process's own (now private) copy.
            let _ = nix::unistd::close(listener);
        }
        if let Err(err) = filters.main.install_on_current_thread() {
            setup_failed("installing the seccomp filter", &err);
        }
        start();
    })?;
    let listener = (listener >= 0).then(|| sys::owned_fd(listener));
    Ok((child, listener))
}

/// Starts the command (`start`, which must exec or exit) under the sandbox's seccomp program
/// `main` plus its own filter, then installs `main` on the caller, which holds the
/// listener when `gate` is given (see [`super::needs_notifier`]). Landlock must be in place.
///
/// # Errors
/// [`crate::linux::SandboxError`] when the command's process cannot be made,
/// or the caller's own filter cannot be installed (the command is killed then).
pub(crate) fn start_command(
    main: crate::linux::seccomp::Prepared,
    gate: Option<Gate>,
    start: &mut dyn FnMut(),
) -> Result<(Pid, Option<Notifier>), crate::linux::SandboxError> {
    let filters = CommandFilters::new(gate.is_some(), main);
    let (child, listener) = spawn_command(&filters, start)
        .map_err(|source| crate::linux::SandboxError::Spawn { source })?;
    if let Err(source) = filters.main().install_on_current_thread() {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        return Err(crate::linux::SandboxError::HolderSeccomp { source });
    }
    Ok((child, listener.zip(gate).map(|(l, g)| Notifier::new(l, g))))
}

/// Starts the command (`start`, which must exec or exit) under the seccomp program the caller
/// already installed on itself (the command inherits it) plus the command's own filter, whose
/// listener the child sends back to the caller, which holds it when `gate` is given. Where
/// [`start_command`] has the command install the sandbox's main filter on its way to `execve`
/// and the caller install it after, here the caller installed it while it prepared (a launcher's
/// PID 1, before its command arrived): one `seccomp(2)` of about a third of a millisecond less
/// on every start. The caller's filter must admit `seccomp(2)` (not the denial audit's, which
/// refuses nested filters), and the caller must be single-threaded.
///
/// The order of the filters differs from [`start_command`]'s (the command's own filter is the
/// newer one, so it is consulted first). That would only matter for a call both refuse with
/// different errnos, and there is none: of the calls the own filter refuses, the main filter
/// admits `pidfd_getfd` and `AF_UNIX` datagram sockets.
///
/// When the listener does not arrive (the child failed before it could send it, and said why
/// on its stderr), the command is killed and no notifier is returned: its exit status tells.
///
/// # Errors
/// [`crate::linux::SandboxError`] when the channel for the listener or the command's process cannot be made.
pub(crate) fn start_command_under_installed_filter(
    gate: Option<Gate>,
    start: &mut dyn FnMut(),
) -> Result<(Pid, Option<Notifier>), crate::linux::SandboxError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let notify = gate.is_some();
    let own = command_filter(notify);
    let flags = if notify {
        sys::SECCOMP_FILTER_FLAG_NEW_LISTENER
    } else {
        0
    };
    let spawn_error = |source| crate::linux::SandboxError::Spawn { source };
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|errno| spawn_error(errno.into()))?;
    let child = sys::spawn_sharing_memory(&mut || {
        match sys::install_filter_on_current_thread(&own, flags) {
            Ok(Some(listener)) => {
                // This process's copy of `theirs`, open until it execs.
                let socket = std::os::fd::AsFd::as_fd(&theirs);
                if let Err(err) = sys::send_descriptor(socket, listener.as_raw_fd()) {
                    setup_failed("handing the seccomp listener over", &err);
                }
                drop(listener);
            }
            Ok(None) => {}
            Err(err) => setup_failed("installing the command's own seccomp filter", &err),
        }
        start();
    })
    .map_err(spawn_error)?;
    // The child has exec'd or exited: the listener, if it made one, is queued.
    drop(theirs);
    let listener = if notify {
        match sys::receive_descriptor(std::os::fd::AsFd::as_fd(&ours)) {
            Ok(Some(listener)) => Some(listener),
            Ok(None) | Err(_) => {
                // It failed before (and said why on its stderr), or the listener was lost:
                // without it the gate would hold the command's connects for ever.
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                None
            }
        }
    } else {
        None
    };
    Ok((child, listener.zip(gate).map(|(l, g)| Notifier::new(l, g))))
}

fn setup_failed(what: &str, err: &std::io::Error) -> ! {
    eprintln!("sandbox-run: {what} failed: {err}");
    sys::exit_now(i32::from(crate::exit::code::EXIT_SETUP_FAILED))
}
