//! Pathname unix sockets: a sandboxed command reaches one only inside its writable roots or
//! when the policy names it (`allowUnixSockets`).
//!
//! Landlock mediates connecting to a pathname socket from ABI 9
//! (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`, part of every write right there, so a writable root
//! grants it and a named socket gets a rule of its own). Before ABI 9 this module enforces the
//! same rule with seccomp user notification:
//!
//! - The command's process, before it execs, installs a small filter of its own
//!   ([`command_filter`]) with a listener: `connect` notifies; `socket`/`socketpair` of
//!   `AF_UNIX` datagram sockets are refused with `EACCES` (a datagram socket is the only unix
//!   socket that can send to a pathname named in the send call, and a send cannot be performed
//!   on the command's behalf without a time-of-check gap; stream and seqpacket sockets ignore
//!   or refuse an address on send); `pidfd_getfd` is refused. It shares its parent's
//!   descriptor table (`CLONE_FILES`) while it installs it, so the listener lands in the
//!   parent's table, then takes a private table and execs. The parent (the sandbox's PID 1, or
//!   the holder without namespaces) holds the listener; the command never does.
//! - The holder answers every `connect` itself and never lets the kernel continue the call
//!   (the command could swap the descriptor or rewrite the address after the check): it reads
//!   the address from the caller's memory, checks the notification is still valid, takes the
//!   caller's socket with `pidfd_getfd`, and connects *that* socket to its copy of the address.
//!   A pathname is first opened `O_PATH` relative to the caller's working directory: that
//!   descriptor is the resolution (symlinks followed once, as `connect` would); it is allowed
//!   when its inode is a named socket (pinned by device and inode when the sandbox started) or
//!   its path lies in a writable root (on an overlaid `/tmp`'s own mount: only when the inode
//!   lives in the command's upper layer; the host's sockets seen through the lower layer are
//!   refused whatever their path), and then the socket is connected to
//!   `/proc/self/fd/N`, the pinned inode, so nothing swapped in since can receive the
//!   connection. Otherwise the call fails with `EACCES` and the refusal is reported: as a
//!   denial record on the refusal channel when the denial audit runs, else one line on the
//!   holder's stderr ([`super::unix_refusals`]).
//! - Sockets of other families are connected the same way (on the caller's socket, in the
//!   holder, which is in the same Landlock domain, seccomp filter and network namespace as the
//!   command, so Landlock's TCP rule still decides); a blocking one in a short-lived child of
//!   the holder, so a slow TCP handshake stalls nothing else.
//!
//! The holder must not be the command: PID 1 (its handler runs in its supervision loop) or,
//! without namespaces, the `sandbox-run` process that stays the command's parent. If the holder
//! is gone, every notified call fails (`ENOSYS`): the rule fails closed.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::Pid;
use serde::Serialize;

use crate::policy::ResolvedPolicy;
use crate::sys;

/// The Landlock ABI whose `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` mediates pathname sockets.
pub const LANDLOCK_UNIX_ABI: i32 = 9;
/// Largest socket address a `connect` may pass (`sizeof(struct sockaddr_storage)`); the kernel
/// refuses longer ones with `EINVAL`.
const MAX_ADDRESS_BYTES: usize = 128;
/// `SECCOMP_RET_USER_NOTIF`.
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// `SECCOMP_RET_ALLOW`.
const RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO`.
const RET_ERRNO: u32 = 0x0005_0000;
/// The socket type bits of `socket(2)`'s type argument (the rest are `SOCK_NONBLOCK`,
/// `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u32 = 0xf;
/// `PIDFD_THREAD` (`O_EXCL`): a pidfd for a thread that is not its group's leader (6.9).
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// How this host keeps a sandbox's pathname-socket rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// Landlock ABI 9 and later (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`).
    Landlock,
    /// seccomp user notification handled by the sandbox's PID 1 (or holder).
    SeccompNotify,
}

impl Mechanism {
    /// The mechanism for a kernel of Landlock ABI `abi`.
    pub fn for_abi(abi: i32) -> Self {
        if abi >= LANDLOCK_UNIX_ABI {
            Mechanism::Landlock
        } else {
            Mechanism::SeccompNotify
        }
    }

    /// The mechanism of the running kernel.
    pub fn of_this_host() -> Self {
        Self::for_abi(sys::landlock_abi())
    }
}

/// Whether a command under `policy` gets the notifier on this host: its filesystem is
/// restricted (an unrestricted one makes every path a writable root) and Landlock cannot keep
/// the rule.
pub fn needs_notifier(policy: &ResolvedPolicy) -> bool {
    policy.restricts_filesystem() && Mechanism::of_this_host() == Mechanism::SeccompNotify
}

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
    let arch = super::seccomp_policy::audit_arch(std::env::consts::ARCH).unwrap_or(0);
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
    super::seccomp::disassemble(&program)
}

/// The filters a command's process installs on itself before it execs, built before it starts
/// (installing them allocates nothing).
pub struct CommandFilters {
    own: Vec<libc::sock_filter>,
    own_flags: libc::c_ulong,
    main: super::seccomp::Prepared,
}

impl CommandFilters {
    /// The command's own filter (with a listener when `notify`) and the sandbox's main filter.
    pub fn new(notify: bool, main: super::seccomp::Prepared) -> Self {
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
    pub fn main(&self) -> &super::seccomp::Prepared {
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
/// listener when `gate` is given (see [`needs_notifier`]). Landlock must be in place.
///
/// # Errors
/// [`SandboxError`] when the command's process cannot be made,
/// or the caller's own filter cannot be installed (the command is killed then).
pub(crate) fn start_command(
    main: super::seccomp::Prepared,
    gate: Option<Gate>,
    start: &mut dyn FnMut(),
) -> Result<(Pid, Option<Notifier>), super::SandboxError> {
    let filters = CommandFilters::new(gate.is_some(), main);
    let (child, listener) =
        spawn_command(&filters, start).map_err(|source| super::SandboxError::Spawn { source })?;
    if let Err(source) = filters.main().install_on_current_thread() {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        return Err(super::SandboxError::HolderSeccomp { source });
    }
    Ok((child, listener.zip(gate).map(|(l, g)| Notifier::new(l, g))))
}

fn setup_failed(what: &str, err: &std::io::Error) -> ! {
    eprintln!("sandbox-run: {what} failed: {err}");
    sys::exit_now(i32::from(crate::exit::EXIT_SETUP_FAILED))
}

/// A socket the policy names, pinned when the sandbox started.
struct Named {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

/// What the holder allows: the policy's writable roots and its named sockets.
pub struct Gate {
    policy: ResolvedPolicy,
    named: Vec<Named>,
    reporter: super::unix_refusals::Reporter,
    overlays: Vec<Overlay>,
}

/// An overlaid directory (`/tmp`): a socket on the overlay's mount lies in a writable root
/// only when its inode lives in the command's own upper layer; one of the host's, seen through
/// the lower layer, is refused whatever its path. (Sockets on mounts bound into it, a writable
/// root or a named socket, are judged as anywhere else.)
struct Overlay {
    path: PathBuf,
    /// The overlay's mount id (`None`: not identifiable, every socket on it is refused).
    mount: Option<u64>,
    upper: OwnedFd,
}

/// The decision about one pathname.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Denied(PathBuf),
}

impl Gate {
    /// The gate of a command under `policy` when this host needs the notifier for it
    /// ([`needs_notifier`]); see [`Self::open`]. `overlays`: the overlaid directories of the
    /// command's mount namespace and their upper layers ([`super::mounts::Applied::overlays`]).
    pub fn for_policy(
        policy: &ResolvedPolicy,
        overlays: Vec<(PathBuf, OwnedFd)>,
        warnings: &mut Vec<String>,
    ) -> Option<Self> {
        needs_notifier(policy).then(|| {
            let mut gate = Self::open(policy, warnings);
            for (path, upper) in overlays {
                let mount = sys::open_no_symlinks(None, &path)
                    .ok()
                    .and_then(|fd| mount_id(fd.as_fd()));
                gate.overlays.push(Overlay { path, mount, upper });
            }
            gate
        })
    }

    /// Pins the policy's named sockets (`allowUnixSockets`) by device and inode, opening each
    /// without following any symlink: one swapped in since the policy was resolved names
    /// nothing (reported in `warnings`). Call it in the sandbox's mount namespace.
    pub fn open(policy: &ResolvedPolicy, warnings: &mut Vec<String>) -> Self {
        let mut named = Vec::new();
        for path in &policy.unix_sockets {
            if denied_explicitly(policy, path) {
                // A hidden path (a server's socket) or a deny entry wins over a name.
                warnings.push(format!(
                    "allowed unix socket {} is hidden or denied by the policy; it stays \
                     unreachable",
                    path.display()
                ));
                continue;
            }
            let pinned = sys::open_no_symlinks(None, path)
                .and_then(|fd| nix::sys::stat::fstat(&fd).map_err(std::io::Error::from));
            match pinned {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFSOCK => named.push(Named {
                    path: path.clone(),
                    dev: st.st_dev,
                    ino: st.st_ino,
                }),
                Ok(_) => warnings.push(format!(
                    "allowed unix socket {} is not a socket; it stays unreachable",
                    path.display()
                )),
                Err(err) => warnings.push(format!(
                    "allowed unix socket {} cannot be opened without following a symlink \
                     ({err}); it stays unreachable",
                    path.display()
                )),
            }
        }
        Self {
            policy: policy.clone(),
            named,
            reporter: super::unix_refusals::Reporter::new(None),
            overlays: Vec::new(),
        }
    }

    /// Refusals go to `channel` (the outer's refusal channel, when the denial audit runs)
    /// instead of stderr.
    pub fn report_to(mut self, channel: Option<OwnedFd>) -> Self {
        self.reporter = super::unix_refusals::Reporter::new(channel);
        self
    }

    /// Refusals go as one line to `stderr` (a copy of the command's stderr) instead of the
    /// holder's own.
    pub fn report_on(mut self, stderr: OwnedFd) -> Self {
        self.reporter = self.reporter.with_stderr(stderr);
        self
    }

    /// The descriptors the gate owns (its overlays' upper layers, its reporter's channel and
    /// stderr copy): a holder that closes what it inherited must keep these, or their owners
    /// would close them a second time.
    pub fn descriptors(&self) -> Vec<RawFd> {
        self.overlays
            .iter()
            .map(|overlay| overlay.upper.as_raw_fd())
            .chain(self.reporter.descriptors())
            .collect()
    }

    /// Whether the socket `target` (an `O_PATH` descriptor of it) may be connected to.
    fn verdict(&self, target: BorrowedFd<'_>, st: &libc::stat) -> Verdict {
        if self
            .named
            .iter()
            .any(|named| named.dev == st.st_dev && named.ino == st.st_ino)
        {
            return Verdict::Allowed;
        }
        let link = format!("/proc/self/fd/{}", target.as_raw_fd());
        let Ok(path) = std::fs::read_link(&link) else {
            return Verdict::Denied(PathBuf::from("(unknown path)"));
        };
        let deleted = path.as_os_str().as_bytes().ends_with(b" (deleted)");
        if !deleted
            && path.is_absolute()
            && self.policy.can_write(&path)
            && self.own_if_overlaid(target, &path)
        {
            Verdict::Allowed
        } else {
            Verdict::Denied(path)
        }
    }

    /// False when `target` is on an overlay's own mount and no socket lives at its place in
    /// the command's upper layer: it is the host's, seen through the lower layer.
    fn own_if_overlaid(&self, target: BorrowedFd<'_>, path: &Path) -> bool {
        let on = mount_id(target);
        let Some(overlay) = self
            .overlays
            .iter()
            .find(|o| path.starts_with(&o.path) && (o.mount.is_none() || o.mount == on))
        else {
            return true;
        };
        let Ok(relative) = path.strip_prefix(&overlay.path) else {
            return false;
        };
        open_beneath_no_symlinks(overlay.upper.as_fd(), relative)
            .and_then(|fd| nix::sys::stat::fstat(&fd).map_err(std::io::Error::from))
            .is_ok_and(|own| own.st_mode & libc::S_IFMT == libc::S_IFSOCK)
    }

    /// The sockets it pins, for the report.
    pub fn named_paths(&self) -> Vec<&Path> {
        self.named.iter().map(|n| n.path.as_path()).collect()
    }
}

/// The holder's end: the listener and the gate.
pub struct Notifier {
    listener: OwnedFd,
    gate: Gate,
}

impl Notifier {
    /// A notifier answering on `listener` by `gate`.
    pub fn new(listener: OwnedFd, gate: Gate) -> Self {
        Self { listener, gate }
    }

    /// The listener, to poll (readable: a notification is waiting; hang-up: no process of
    /// the sandbox is left that could notify).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// Receives and answers one notification.
    pub fn handle_one(&self) {
        let Ok(notification) = sys::receive_notification(self.fd()) else {
            // The caller was interrupted or killed before we got to it.
            return;
        };
        let answer = if i64::from(notification.data.nr) == libc::SYS_connect {
            match self.connect(&notification) {
                Some(answer) => answer,
                // Answered by a worker, or the caller is gone.
                None => return,
            }
        } else {
            Err(libc::ENOSYS)
        };
        let _ = sys::answer_notification(self.fd(), notification.id, answer);
    }

    /// `connect(fd, address, length)` on the caller's behalf. `None` when there is nothing
    /// (more) to answer.
    fn connect(&self, notification: &sys::Notification) -> Option<Result<i64, i32>> {
        let args = notification.data.args;
        // The kernel takes the descriptor as an int.
        let fd = args[0] as i32;
        let length = args[2] as u32 as usize;
        if length > MAX_ADDRESS_BYTES {
            return Some(Err(libc::EINVAL));
        }
        let mut address = vec![0u8; length];
        match sys::read_memory(notification.pid, args[1], &mut address) {
            Ok(read) if read == length => {}
            Ok(_) => return Some(Err(libc::EFAULT)),
            Err(_) => return Some(Err(libc::EACCES)),
        }
        let pidfd = open_caller(notification.pid).ok();
        // Everything read so far (memory, the pidfd) belongs to the caller only if it is
        // still waiting in this very call.
        if !sys::notification_valid(self.fd(), notification.id) {
            return None;
        }
        let Some(pidfd) = pidfd else {
            return Some(Err(libc::EACCES));
        };
        let socket = match sys::pidfd_getfd(pidfd.as_fd(), fd) {
            Ok(socket) => socket,
            Err(err) => return Some(Err(err.raw_os_error().unwrap_or(libc::EBADF))),
        };
        let domain = match sys::socket_domain(socket.as_fd()) {
            Ok(domain) => domain,
            Err(err) => return Some(Err(err.raw_os_error().unwrap_or(libc::ENOTSOCK))),
        };
        if domain != libc::AF_UNIX {
            return self.connect_elsewhere(notification.id, &socket, &address);
        }
        match pathname(&address) {
            Some(path) => Some(self.connect_pathname(notification.pid, &socket, path)),
            // Abstract (Landlock's scope and the network namespace decide), unnamed, or not
            // AF_UNIX at all (the kernel says why).
            None => Some(result_of(sys::connect_raw(socket.as_fd(), &address))),
        }
    }

    fn connect_pathname(&self, caller: u32, socket: &OwnedFd, path: &OsStr) -> Result<i64, i32> {
        let path = Path::new(path);
        let target = if path.is_absolute() {
            open_following(None, path)
        } else {
            open_following(None, Path::new(&format!("/proc/{caller}/cwd")))
                .and_then(|cwd| open_following(Some(cwd.as_fd()), path))
        };
        let target = target.map_err(|err| err.raw_os_error().unwrap_or(libc::ENOENT))?;
        let st = nix::sys::stat::fstat(&target).map_err(|errno| errno as i32)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(libc::ECONNREFUSED);
        }
        match self.gate.verdict(target.as_fd(), &st) {
            Verdict::Allowed => {
                let pinned = format!("/proc/self/fd/{}", target.as_raw_fd());
                result_of(sys::connect_raw(
                    socket.as_fd(),
                    &unix_address(pinned.as_bytes()),
                ))
            }
            Verdict::Denied(resolved) => {
                self.gate
                    .reporter
                    .report(super::unix_refusals::Refusal::new(
                        caller,
                        &path.to_string_lossy(),
                        &resolved.to_string_lossy(),
                        libc::EACCES,
                    ));
                Err(libc::EACCES)
            }
        }
    }

    /// A socket of another family: connected here when it does not block, else in a child of
    /// the holder that answers the notification itself.
    fn connect_elsewhere(
        &self,
        id: u64,
        socket: &OwnedFd,
        address: &[u8],
    ) -> Option<Result<i64, i32>> {
        let blocking = nix::fcntl::fcntl(socket, nix::fcntl::FcntlArg::F_GETFL)
            .map(|flags| flags & libc::O_NONBLOCK == 0)
            .unwrap_or(false);
        if !blocking {
            return Some(result_of(sys::connect_raw(socket.as_fd(), address)));
        }
        // The holder is single-threaded; the child only connects, answers and leaves through
        // _exit.
        match sys::fork_single_threaded() {
            Ok(None) => {
                let _ = sys::set_parent_death_signal(libc::SIGKILL);
                let answer = result_of(sys::connect_raw(socket.as_fd(), address));
                let _ = sys::answer_notification(self.fd(), id, answer);
                sys::exit_now(0)
            }
            Ok(Some(_)) => None,
            Err(err) => Some(Err(err.raw_os_error().unwrap_or(libc::EAGAIN))),
        }
    }
}

/// Whether `path` lies at or below a path the policy hides (a server's socket, token, ...) or
/// whose most specific rule is a deny entry. A path no rule covers is not "explicitly" denied:
/// naming a socket is how a policy that cannot read its directory reaches it.
fn denied_explicitly(policy: &ResolvedPolicy, path: &Path) -> bool {
    if policy
        .hidden_paths()
        .iter()
        .any(|hidden| path.starts_with(hidden))
    {
        return true;
    }
    policy
        .rules()
        .iter()
        .filter(|rule| path.starts_with(&rule.path))
        .max_by_key(|rule| (rule.path.components().count(), rule.access))
        .is_some_and(|rule| rule.access == crate::policy::Access::Deny)
}

/// The id of the mount `fd` lies on (`mnt_id` of `/proc/self/fdinfo`).
fn mount_id(fd: BorrowedFd<'_>) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("mnt_id:"))
        .and_then(|id| id.trim().parse().ok())
}

/// A pidfd of the calling thread: a thread pidfd where the kernel has them (6.9), else one of
/// its thread group (the descriptor table it uses is the group's).
fn open_caller(tid: u32) -> std::io::Result<OwnedFd> {
    let tid =
        libc::pid_t::try_from(tid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    sys::pidfd_open_with_flags(tid, PIDFD_THREAD).or_else(|_| {
        let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
        let tgid = status
            .lines()
            .find_map(|line| line.strip_prefix("Tgid:"))
            .and_then(|value| value.trim().parse::<libc::pid_t>().ok())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        sys::pidfd_open(Pid::from_raw(tgid))
    })
}

/// The path of a pathname `AF_UNIX` address (up to its first NUL), or `None` for any other
/// address.
fn pathname(address: &[u8]) -> Option<&OsStr> {
    if address.len() <= 2 || u16::from_ne_bytes([address[0], address[1]]) != libc::AF_UNIX as u16 {
        return None;
    }
    let path = &address[2..];
    if path[0] == 0 {
        return None;
    }
    let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
    Some(OsStr::from_bytes(&path[..end]))
}

/// A pathname `AF_UNIX` address of `path`.
fn unix_address(path: &[u8]) -> Vec<u8> {
    let mut address = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    address.extend_from_slice(path);
    address.push(0);
    address
}

/// `O_PATH` open of `path` (relative to `dir`), following symlinks as `connect` would.
/// `relative` (normal components only) opened `O_PATH` below `dir` one component at a time,
/// following no symlink: with `openat` (the holder's seccomp filter refuses `openat2`).
fn open_beneath_no_symlinks(dir: BorrowedFd<'_>, relative: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    let mut current: Option<OwnedFd> = None;
    for component in relative.components() {
        let std::path::Component::Normal(name) = component else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let base = current.as_ref().map_or(dir, AsFd::as_fd);
        let next = nix::fcntl::openat(base, name, flags, nix::sys::stat::Mode::empty())?;
        current = Some(next);
    }
    current.ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn open_following(dir: Option<BorrowedFd<'_>>, path: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let mode = nix::sys::stat::Mode::empty();
    match dir {
        Some(dir) => nix::fcntl::openat(dir, path, flags, mode),
        None => nix::fcntl::open(path, flags, mode),
    }
    .map_err(std::io::Error::from)
}

fn result_of(result: std::io::Result<()>) -> Result<i64, i32> {
    result
        .map(|()| 0)
        .map_err(|err| err.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pathname_address_is_told_from_abstract_and_unnamed_ones() {
        assert_eq!(
            pathname(&unix_address(b"/var/tmp/s")),
            Some(OsStr::new("/var/tmp/s"))
        );
        let mut abstract_address = unix_address(b"\0name");
        abstract_address.pop();
        assert_eq!(pathname(&abstract_address), None);
        assert_eq!(pathname(&(libc::AF_UNIX as u16).to_ne_bytes()), None);
        let mut inet = unix_address(b"/x");
        inet[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        assert_eq!(pathname(&inet), None);
        // No NUL at the end (a 108-byte path): the whole rest is the path.
        let mut full = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
        full.extend_from_slice(b"rel/sock");
        assert_eq!(pathname(&full), Some(OsStr::new("rel/sock")));
    }

    #[test]
    fn a_hidden_or_denied_socket_is_denied_explicitly_and_an_uncovered_one_is_not() {
        use crate::policy::{Access, FilesystemPolicy, PathRule};
        let rules = vec![
            PathRule {
                path: PathBuf::from("/"),
                access: Access::Read,
            },
            PathRule {
                path: PathBuf::from("/srv/denied"),
                access: Access::Deny,
            },
        ];
        let policy = ResolvedPolicy::new(FilesystemPolicy::Restricted { rules }, false)
            .with_hidden_path(Path::new("/run/exec.sock"));
        assert!(denied_explicitly(&policy, Path::new("/srv/denied/a.sock")));
        assert!(denied_explicitly(&policy, Path::new("/run/exec.sock")));
        assert!(!denied_explicitly(&policy, Path::new("/srv/agent.sock")));
        let minimal = ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: vec![PathRule {
                    path: PathBuf::from("/usr"),
                    access: Access::Read,
                }],
            },
            false,
        );
        assert!(!denied_explicitly(
            &minimal,
            Path::new("/run/user/1000/agent.sock")
        ));
    }

    #[test]
    fn the_mechanism_is_landlock_from_abi_9() {
        assert_eq!(Mechanism::for_abi(7), Mechanism::SeccompNotify);
        assert_eq!(Mechanism::for_abi(8), Mechanism::SeccompNotify);
        assert_eq!(Mechanism::for_abi(9), Mechanism::Landlock);
    }
}
