//! A pre-confined launcher: one `sandbox-run --launcher` per (session, policy, working
//! directory) that builds the expensive part of a sandbox once and then starts each command
//! inside it.
//!
//! ```text
//! exec-server ── SOCK_SEQPACKET (stdin) ──┐
//! sandbox-run --launcher   (new user, mount, IPC [, network] namespaces; the policy's mount
//!  │                        layout; keeps its capabilities in its own user namespace only)
//!  └─ PID 1 per command    (clone: new PID, mount and IPC namespaces; fresh /proc, /dev, /tmp,
//!      │                    $TMPDIR, /run; every capability dropped, Landlock, seccomp)
//!      └─ the command      (its own session; stdio as received)
//! ```
//!
//! What is built once: the user namespace (and its id maps), the network namespace, the mount
//! layout, and the exec of `sandbox-run` itself. Each command's PID 1 is prepared ahead (cloned,
//! into the cgroups the server sent for the next command, mounted, confined) once the previous
//! command has ended or [`NEXT_PID_1_DELAY`] after its start, and only waits for its command:
//! a start costs the hand-over, a `clone` that shares PID 1's memory until the command's
//! `execve` (no page table is copied), and the `execve`. What every command still gets of its
//! own, exactly as a one-shot
//! `sandbox-run` gives it: a PID namespace (it cannot see or signal other commands, and
//! everything it leaves behind dies with its PID 1), an IPC namespace,
//! fresh private directories and devpts instance (nothing another command wrote there is
//! visible), its own Landlock domain (signal and abstract-socket scoping separate it from its
//! siblings) and its own seccomp filter, no descriptor but its stdio, and its rlimits.
//!
//! Protocol (one message per `sendmsg`, descriptors as `SCM_RIGHTS`):
//! - setup: body `setup`, descriptors `[memfd, ahead...]`, the memfd holding a
//!   [`LaunchRequest`] (the policy and the working directory; argv and env unused), `ahead` the
//!   `cgroup.procs` of the cgroups the first PID 1 joins while it prepares. Reply
//!   [`Reply::Ready`] or [`Reply::Failed`].
//! - start: body `start:N`, descriptors `[memfd, stdin, stdout, stderr, cgroup.procs...,
//!   next...]`, the memfd holding a [`StartCommand`], then the cgroups this command's PID 1
//!   joins as it starts (none when it joined them ahead), then the N cgroups the next PID 1
//!   joins while it prepares. The launcher passes the message without those N on to the ready
//!   PID 1 and replies [`Reply::Started`] with `[pidfd, status]` (the pidfd of the command's
//!   PID 1 and the read end of its status pipe, which gets [`STATUS_BYTES`] once the command
//!   and everything else in its namespace are gone: the server reports the exit on it, while
//!   PID 1 itself, which holds none of the command's stdio by then, is still exiting; a pipe
//!   that closes without it means PID 1 was killed) or [`Reply::Failed`]. A PID 1 whose own
//!   setup failed reports that on the command's stderr and exits 125, as a one-shot
//!   `sandbox-run` does.
//! - PID 1 to the launcher, once, first thing: body [`MOUNT_NAMESPACE`], the descriptor of its
//!   own mount namespace (none if it could not open it). The launcher reads it before it hands
//!   over the command, and holds the namespace until it reaps that PID 1, so
//!   the namespace is torn down then, in the launcher, and not in PID 1's exit: unmounting
//!   waits for an expedited RCU grace period, which would otherwise come between the command's
//!   exit and the moment its stdio closes for the server.
//!
//! The launcher exits when its socket closes; every PID 1 it started gets `SIGKILL` then
//! (`PR_SET_PDEATHSIG`), which ends its namespace. It never runs code of a command: the
//! commands are its grandchildren, in PID namespaces below it, and hold no descriptor of it.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

pub use super::launcher_error::{FailureKind, LaunchFailure};

use super::init::{self, Exec};
use super::mounts::{self, MountOp};
use super::spec::{Command, Ended};
use super::{EnforceOptions, EnforcementReport, EnvMode, NamespaceMode, landlock, namespaces};
use crate::exit::EXIT_SETUP_FAILED;
use crate::launch::{LaunchRequest, read_json};
use crate::limits::CommandLimits;
use crate::policy::ResolvedPolicy;

/// Largest message body on a launcher socket (bodies are a word or a small JSON reply; the
/// command itself travels in a memfd).
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Most cgroups one command joins (the server's containment uses one).
pub const MAX_CGROUPS: usize = 8;
/// Most descriptors in one message: the memfd, stdin, stdout, stderr, the cgroups this
/// command joins as it starts and the cgroups the next command's PID 1 joins ahead.
pub const MAX_MESSAGE_FDS: usize = 4 + 2 * MAX_CGROUPS;
/// The body of a start message; `start:N` when its last N descriptors are the `cgroup.procs`
/// of the cgroups the *next* command's PID 1 joins while it prepares (see [`serve`]).
pub const START: &str = "start";
/// How long after a start the launcher waits before it prepares the next command's PID 1,
/// unless a PID 1 exits first (a short command has ended). Preparing it at once (about a
/// millisecond of CPU: namespaces, mounts, Landlock, seccomp) took a core from the command
/// being started on a 2-core host: back-to-back starts measured 1.23-1.43 ms with the delay
/// against 1.43-1.52 ms without. A start that comes sooner prepares its PID 1 itself.
pub const NEXT_PID_1_DELAY: Duration = Duration::from_millis(10);
/// The body of PID 1's one message to the launcher, carrying its mount namespace: the
/// launcher lets go of it once PID 1 is reaped, so the namespace is torn down off the start's
/// path.
pub const MOUNT_NAMESPACE: &[u8] = b"mount-namespace";
/// A status message: kind (1 exited, 2 killed by a signal), the value (i32, little-endian),
/// the CPU time of the command and everything it started (microseconds, u64, little-endian).
pub const STATUS_BYTES: usize = 13;

/// One command for a launcher (in a memfd: argv and environment can be large).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCommand {
    /// Program and arguments (the program is searched in the command's `PATH`).
    pub argv: Vec<String>,
    /// The command's complete environment.
    pub env: Vec<(String, String)>,
    /// The working directory: the launcher's own (its layout carries it).
    pub cwd: PathBuf,
    /// Rlimits, set right before `execve` (the wall clock is the server's to watch).
    #[serde(default)]
    pub limits: CommandLimits,
}

/// A launcher's answer to a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase", deny_unknown_fields)]
pub enum Reply {
    /// Setup done: starts are welcome.
    Ready,
    /// The command's PID 1 runs (pid in the launcher's, i.e. the server's, PID namespace).
    Started {
        /// Its pid.
        pid: i32,
    },
    /// Setup or the start failed.
    Failed {
        /// Why.
        error: String,
        /// The stage that failed.
        kind: FailureKind,
    },
}

/// Why the launcher stopped.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// The socket failed.
    #[error("the launcher socket failed: {source}")]
    Socket {
        /// The OS error.
        source: io::Error,
    },
    /// The first message was not a setup with its request.
    #[error("the launcher's first message must be `setup` with a launch request: {reason}")]
    Setup {
        /// What was wrong.
        reason: String,
    },
    /// Blocking or reading `SIGCHLD` failed.
    #[error("watching the launcher's children failed: {source}")]
    Signals {
        /// The OS error.
        source: nix::Error,
    },
}

/// Sends one message.
///
/// # Errors
/// The OS error of `sendmsg(2)`.
pub fn send(socket: BorrowedFd<'_>, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let control = if raw.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(body)],
        &control,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// Receives one message: its body and descriptors (close-on-exec); `None` at end of stream.
///
/// # Errors
/// The OS error of `recvmsg(2)`; `InvalidData` for a message larger than
/// [`MAX_MESSAGE_BYTES`] or with more than [`MAX_MESSAGE_FDS`] descriptors.
pub fn receive(socket: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut body = vec![0u8; MAX_MESSAGE_BYTES];
    let mut space = nix::cmsg_space!([RawFd; MAX_MESSAGE_FDS]);
    let (bytes, flags, fds) = {
        let mut iov = [IoSliceMut::new(&mut body)];
        let message = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                fds.extend(received.into_iter().map(crate::sys::owned_fd));
            }
        }
        (message.bytes, message.flags, fds)
    };
    if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a launcher message larger than {MAX_MESSAGE_BYTES} bytes or with more than \
                 {MAX_MESSAGE_FDS} descriptors"
            ),
        ));
    }
    if bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    body.truncate(bytes);
    Ok(Some((body, fds)))
}

/// The status message for `ended` after `cpu`.
pub fn encode_status(ended: Ended, cpu: Duration) -> [u8; STATUS_BYTES] {
    let (kind, value) = match ended {
        Ended::Exited(code) => (init::STATUS_EXITED, code),
        Ended::Signaled(signal) => (init::STATUS_SIGNALED, signal),
    };
    let mut message = [0u8; STATUS_BYTES];
    message[0] = kind;
    message[1..5].copy_from_slice(&value.to_le_bytes());
    let micros = u64::try_from(cpu.as_micros()).unwrap_or(u64::MAX);
    message[5..].copy_from_slice(&micros.to_le_bytes());
    message
}

/// The inverse of [`encode_status`]; `None` for anything else.
pub fn decode_status(message: &[u8]) -> Option<(Ended, Duration)> {
    let message: &[u8; STATUS_BYTES] = message.try_into().ok()?;
    let value = i32::from_le_bytes(message[1..5].try_into().ok()?);
    let micros = u64::from_le_bytes(message[5..].try_into().ok()?);
    let ended = match message[0] {
        init::STATUS_EXITED => Ended::Exited(value),
        init::STATUS_SIGNALED => Ended::Signaled(value),
        _ => return None,
    };
    Some((ended, Duration::from_micros(micros)))
}

/// What the launcher built once.
struct Setup {
    policy: ResolvedPolicy,
    cwd: PathBuf,
    /// The steps every command redoes in its own mount namespace (fresh `/proc`, `/dev`,
    /// private directories and what is carried into them), in plan order.
    per_command: Vec<MountOp>,
    /// Narrower outcomes of the shared layout, repeated on each command's stderr (as a
    /// one-shot `sandbox-run` prints them).
    warnings: Vec<String>,
}

/// The steps of `plan` that belong to one command: its `/proc` (its PID namespace's), its
/// `/dev` (its devpts instance), its private and overlaid directories and everything mounted
/// inside them.
pub fn per_command_steps(plan: &[MountOp]) -> Vec<MountOp> {
    let fresh: Vec<&Path> = plan
        .iter()
        .filter(|op| op.is_fresh())
        .map(MountOp::path)
        .collect();
    plan.iter()
        .filter(|op| fresh.iter().any(|dir| op.path().starts_with(dir)))
        .cloned()
        .collect()
}

/// The identity (device, inode, file type) or absence of every path the layout of `policy`
/// for `cwd` is built from: its mount steps, and every path a rule names (present or not). A
/// launcher's layout is a snapshot of these; the server serves a start through a launcher only
/// while the fingerprint it was set up with still holds, so a workspace replaced since, a
/// denied path created since, or a pinned directory swapped gets a new layout (as a one-shot
/// `sandbox-run` would build it) instead of the stale one.
pub fn layout_fingerprint(policy: &ResolvedPolicy, cwd: &Path) -> Vec<u8> {
    use std::os::unix::fs::MetadataExt;
    let layout = init::command_layout(policy, cwd);
    let mut paths: Vec<&Path> = Vec::new();
    let plan = mounts::mount_plan(policy, &layout);
    paths.extend(plan.iter().map(MountOp::path));
    paths.extend(policy.rules().iter().map(|rule| rule.path.as_path()));
    paths.extend(policy.hidden_paths().iter().map(PathBuf::as_path));
    paths.extend(policy.read_only_paths().iter().map(PathBuf::as_path));
    paths.extend(layout.carry.iter().map(PathBuf::as_path));
    paths.sort();
    paths.dedup();
    let mut fingerprint = Vec::with_capacity(paths.len() * 20);
    for path in paths {
        match path.symlink_metadata() {
            Ok(meta) => {
                fingerprint.push(1);
                fingerprint.extend_from_slice(&meta.dev().to_le_bytes());
                fingerprint.extend_from_slice(&meta.ino().to_le_bytes());
                fingerprint.extend_from_slice(&(meta.mode() & libc::S_IFMT).to_le_bytes());
            }
            Err(_) => fingerprint.push(0),
        }
    }
    fingerprint
}

impl Setup {
    /// Namespaces and the shared layout, in this process, irreversibly.
    fn build(request: &LaunchRequest) -> Result<Self, LaunchFailure> {
        let policy = &request.policy;
        if policy.is_unrestricted() {
            return Err(LaunchFailure::Unrestricted);
        }
        if policy.egress().is_some() {
            return Err(LaunchFailure::EgressAllowlist);
        }
        nix::sys::prctl::set_no_new_privs().map_err(LaunchFailure::NoNewPrivs)?;
        let entered = namespaces::unshare_for_current_process(policy)?;
        // Only now: a process that is not dumpable cannot write its own /proc/self/uid_map
        // (what an unprivileged launcher does to map itself into its user namespace).
        let _ = crate::sys::set_dumpable(false);
        let full = init::command_layout(policy, &request.cwd);
        // An overlay's lower layer is the host directory: the shared layout leaves it (and
        // what the plan mounts inside it) to each command.
        let shared = mounts::Layout {
            proc: false,
            overlay_dirs: Vec::new(),
            ..full.clone()
        };
        let shared_plan: Vec<MountOp> = mounts::mount_plan(policy, &shared)
            .into_iter()
            .filter(|op| {
                !full
                    .overlay_dirs
                    .iter()
                    .any(|dir| op.path().starts_with(dir))
            })
            .collect();
        let mut warnings = Vec::new();
        if entered.mount {
            let applied = mounts::apply(&shared_plan)?;
            warnings = applied.warnings;
        }
        Ok(Self {
            policy: policy.clone(),
            cwd: request.cwd.clone(),
            per_command: per_command_steps(&mounts::mount_plan(policy, &full)),
            warnings,
        })
    }
}

/// Serves the launcher protocol on `socket` until it closes.
///
/// # Errors
/// [`LauncherError`] when the socket fails, the setup message is wrong, or children cannot
/// be watched. A failed setup is also replied, so the server can say why.
pub fn serve(socket: BorrowedFd<'_>) -> Result<(), LauncherError> {
    let socket_error = |source: io::Error| LauncherError::Socket { source };
    let Some((body, mut fds)) = receive(socket).map_err(socket_error)? else {
        return Ok(());
    };
    if body != b"setup" || fds.is_empty() || fds.len() > 1 + MAX_CGROUPS {
        return Err(LauncherError::Setup {
            reason: format!("got {} with {} descriptors", body.escape_ascii(), fds.len()),
        });
    }
    // After the request: the cgroups the first command's PID 1 joins ahead.
    let mut ahead = fds.split_off(1);
    let request: LaunchRequest = read_json(fds.remove(0)).map_err(|e| LauncherError::Setup {
        reason: e.to_string(),
    })?;
    let setup = match Setup::build(&request) {
        Ok(setup) => setup,
        Err(failure) => {
            reply(socket, &failed(&failure), &[]).map_err(socket_error)?;
            return Ok(());
        }
    };
    reply(socket, &Reply::Ready, &[]).map_err(socket_error)?;
    // Blocked here so that each PID 1 starts with them blocked: a signal the server sends
    // while PID 1 is still setting up waits for it (unblocked, PID 1 of a namespace would
    // ignore it) and is passed on to the command once it runs.
    sigprocmask(
        SigmaskHow::SIG_BLOCK,
        Some(&init::forwarded_signals()),
        None,
    )
    .map_err(|source| LauncherError::Signals { source })?;
    let mut children = SigSet::empty();
    children.add(Signal::SIGCHLD);
    let exits = SignalFd::with_flags(&children, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|source| LauncherError::Signals { source })?;
    let mut warm = Warm::prepare(&setup, &ahead).ok();
    // When the next PID 1 is due to be prepared at the latest (see [`NEXT_PID_1_DELAY`]).
    let mut prepare_by: Option<std::time::Instant> = None;
    // The mount namespaces of the started PID 1s, until they are reaped.
    let mut held: Vec<(Pid, OwnedFd)> = Vec::new();
    loop {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut interests = [
            PollFd::new(socket, PollFlags::POLLIN),
            PollFd::new(exits.as_fd(), PollFlags::POLLIN),
        ];
        let timeout = prepare_by.map_or(PollTimeout::NONE, |by| {
            PollTimeout::try_from(by.saturating_duration_since(std::time::Instant::now()))
                .unwrap_or(PollTimeout::ZERO)
        });
        match poll(&mut interests, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(source) => return Err(LauncherError::Signals { source }),
        }
        let request_waiting = interests[0]
            .revents()
            .is_some_and(|events| !events.is_empty());
        let mut exited = false;
        while let Ok(Some(_)) = exits.read_signal() {
            exited = true;
        }
        reap_children(&mut held);
        // A PID 1 exited (its command ended), or the delay is over: the next one sets up now.
        if prepare_by.is_some_and(|by| exited || std::time::Instant::now() >= by) {
            prepare_by = None;
            if warm.is_none() {
                warm = Warm::prepare(&setup, &ahead).ok();
            }
        }
        if !request_waiting {
            continue;
        }
        let (body, mut fds) = match receive(socket) {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(socket_error(err)),
        };
        let answer = match start_message(&body, fds.len()) {
            Ok(next) => {
                let next_ahead = fds.split_off(fds.len() - next);
                let answer = start(&setup, &mut warm, &ahead, fds);
                // The PID 1 that joined `ahead` has its command now (or the start failed
                // and the server gives those cgroups up): the next one joins the new ones.
                ahead = next_ahead;
                answer
            }
            Err(error) => Err(error),
        };
        let answer = answer.map(|mut started| {
            if let Some(namespace) = started.mount_namespace.take() {
                held.push((started.pid, namespace));
            }
            started
        });
        match answer {
            Ok(started) => reply(
                socket,
                &Reply::Started {
                    pid: started.pid.as_raw(),
                },
                &[started.pidfd.as_fd(), started.status.as_fd()],
            ),
            Err(failure) => reply(socket, &failed(&failure), &[]),
        }
        .map_err(socket_error)?;
        // The next command's PID 1 sets up while nobody waits for it, but not while this
        // command starts (see NEXT_PID_1_DELAY).
        if warm.is_none() {
            prepare_by = Some(std::time::Instant::now() + NEXT_PID_1_DELAY);
        }
    }
}

/// The reply for `failure`: its sentence and its stage.
fn failed(failure: &LaunchFailure) -> Reply {
    Reply::Failed {
        error: failure.to_string(),
        kind: failure.kind(),
    }
}

/// How many of a start message's `count` descriptors are for the next PID 1 (`start:N`).
fn start_message(body: &[u8], count: usize) -> Result<usize, LaunchFailure> {
    let next = match body.strip_prefix(START.as_bytes()) {
        Some(b"") => Some(0),
        Some(rest) => rest
            .strip_prefix(b":")
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<usize>().ok()),
        None => None,
    };
    match next {
        Some(next) if next <= MAX_CGROUPS && next + 4 <= count => Ok(next),
        Some(next) => Err(LaunchFailure::DescriptorsForNext { next, count }),
        None => Err(LaunchFailure::UnknownMessage {
            body: body.escape_ascii().to_string(),
        }),
    }
}

fn reply(socket: BorrowedFd<'_>, reply: &Reply, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let body = serde_json::to_vec(reply).map_err(io::Error::other)?;
    send(socket, &body, fds)
}

/// The mount namespace a ready PID 1 sends of itself ([`MOUNT_NAMESPACE`]) as the first thing
/// it does; `None` when it could not open it, or died before. Every PID 1 sends this message,
/// and it must be read before the launcher closes its end of the channel: a socket closed with
/// a message unread resets the connection, and PID 1 would lose its start.
fn take_mount_namespace(channel: BorrowedFd<'_>) -> Option<OwnedFd> {
    match receive(channel) {
        Ok(Some((body, mut fds))) if body == MOUNT_NAMESPACE && fds.len() <= 1 => fds.pop(),
        _ => None,
    }
}

/// Reaps every PID 1 that has exited (their status went to the server through their pipes),
/// and lets go of its mount namespace (`held`), which is torn down now, after the server has
/// seen the command end.
fn reap_children(held: &mut Vec<(Pid, OwnedFd)>) {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
        if let Some(pid) = status.pid() {
            held.retain(|(running, _)| *running != pid);
        }
    }
}

/// A PID 1 that is ready: in its own PID, mount and IPC namespaces, with its mounts, working
/// directory, Landlock domain and seccomp filter in place, waiting on its channel for the one
/// command it will run. Preparing the next one while the current command runs takes the
/// sandbox's setup off the start's path.
struct Warm {
    pid: Pid,
    pidfd: OwnedFd,
    status: OwnedFd,
    channel: OwnedFd,
    /// Its mount namespace, once it has sent it ([`MOUNT_NAMESPACE`]).
    mount_namespace: Option<OwnedFd>,
}

impl Warm {
    /// Clones the next PID 1, which joins the cgroups `ahead` (their `cgroup.procs`) and
    /// confines itself without waiting for a command.
    fn prepare(setup: &Setup, ahead: &[OwnedFd]) -> Result<Self, LaunchFailure> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (channel, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(LaunchFailure::pid1("PID 1's channel"))?;
        let (status_read, status_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(LaunchFailure::pid1("PID 1's status pipe"))?;
        let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
        match crate::sys::clone_into_namespaces(flags).map_err(|source| LaunchFailure::Pid1 {
            what: "creating the command's PID, mount and IPC namespaces",
            source,
        })? {
            None => {
                drop(channel);
                command_init(setup, &theirs, &status_write, ahead)
            }
            Some(pid) => {
                drop((theirs, status_write));
                let pidfd = crate::sys::pidfd_open(pid).map_err(|source| LaunchFailure::Pid1 {
                    what: "pidfd_open",
                    source,
                })?;
                Ok(Self {
                    pid,
                    pidfd,
                    status: status_read,
                    channel,
                    mount_namespace: None,
                })
            }
        }
    }
}

/// Hands one command to a ready PID 1 (making one now if none is ready, or if the ready one
/// died meanwhile).
fn start(
    setup: &Setup,
    warm: &mut Option<Warm>,
    ahead: &[OwnedFd],
    fds: Vec<OwnedFd>,
) -> Result<Warm, LaunchFailure> {
    if fds.len() < 4 || fds.len() > MAX_MESSAGE_FDS {
        return Err(LaunchFailure::StartDescriptors {
            max: MAX_MESSAGE_FDS,
            count: fds.len(),
        });
    }
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut ready = match warm.take() {
            Some(ready) => ready,
            None => Warm::prepare(setup, ahead)?,
        };
        ready.mount_namespace = take_mount_namespace(ready.channel.as_fd());
        match send(ready.channel.as_fd(), b"start", &borrowed) {
            Ok(()) => return Ok(ready),
            // The ready PID 1 may have died meanwhile: one fresh one is tried.
            Err(source) if attempt == 2 => return Err(LaunchFailure::Handover { source }),
            Err(_) => {}
        }
    }
}

/// PID 1 of one command. Never returns.
///
/// Sets up first (a failure is kept and reported to the command's stderr once it arrives),
/// then waits for its command on `channel`: the memfd with the [`StartCommand`], stdio and the
/// cgroups to join.
fn command_init(setup: &Setup, channel: &OwnedFd, status: &OwnedFd, ahead: &[OwnedFd]) -> ! {
    let _ = crate::sys::set_parent_death_signal(libc::SIGKILL);
    // Nothing of the launcher's: its socket to the server is its stdin.
    if let Ok(null) = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        let _ = crate::sys::replace_stdio(null.as_fd(), crate::sys::Stdio::In);
        let _ = crate::sys::replace_stdio(null.as_fd(), crate::sys::Stdio::Out);
    }
    let keep = [0, 1, 2, channel.as_raw_fd(), status.as_raw_fd()];
    // The launcher holds the namespace from now on, so that PID 1's exit does not tear it
    // down: unmounting waits for an expedited RCU grace period (about 0.1 ms), which would
    // come before the command's stdio closes for the server. Sent even without it: the
    // launcher reads this message before it hands over the command.
    let namespace = crate::sys::own_mount_namespace().ok();
    let _ = send(
        channel.as_fd(),
        MOUNT_NAMESPACE,
        &namespace
            .as_ref()
            .map(AsFd::as_fd)
            .into_iter()
            .collect::<Vec<_>>(),
    );
    drop(namespace);
    // The command's cgroups, joined now: a migration can wait for an RCU grace period
    // (milliseconds on an idle host), which the start then does not pay. The command is born
    // inside them. Joined before the launcher's descriptors are closed, so that closing them
    // closes this process's copies of the cgroups too (`ahead` is never dropped here: this
    // function does not return).
    let joined = join_cgroups(ahead.iter().map(AsFd::as_fd));
    let warm_up = if super::hygiene::close_inherited_fds(&keep).is_err() {
        Err("closing the launcher's descriptors failed".to_owned())
    } else {
        joined.and_then(|()| warm_up(setup))
    };
    let Ok(Some((body, fds))) = receive(channel.as_fd()) else {
        // The launcher is gone (or retired this PID 1 unused).
        crate::sys::exit_now(0)
    };
    if body != b"start" || fds.len() < 4 {
        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
    }
    let mut fds = fds.into_iter();
    let memfd = fds.next();
    let stdio: Vec<OwnedFd> = fds.by_ref().take(3).collect();
    for (target, fd) in crate::sys::Stdio::ALL.into_iter().zip(&stdio) {
        if crate::sys::replace_stdio(fd.as_fd(), target).is_err() {
            setup_failed(status, "placing the command's stdio failed");
        }
    }
    drop(stdio);
    let joining: Vec<OwnedFd> = fds.collect();
    if let Err(message) = join_cgroups(joining.iter().map(AsFd::as_fd)) {
        setup_failed(status, &message);
    }
    drop(joining);
    let WarmedUp {
        signals,
        warnings,
        seccomp,
        gate,
    } = match warm_up {
        Ok(ready) => ready,
        Err(message) => setup_failed(status, &message),
    };
    let command: StartCommand = match memfd.map(read_json) {
        Some(Ok(command)) => command,
        Some(Err(err)) => setup_failed(status, &err.to_string()),
        None => setup_failed(status, "no command"),
    };
    if command.cwd != setup.cwd || command.argv.is_empty() {
        setup_failed(
            status,
            &format!(
                "a launcher for {} got a command for {} (argv {:?})",
                setup.cwd.display(),
                command.cwd.display(),
                command.argv
            ),
        );
    }
    // The channel and anything else left from the launcher; the signalfd and the gate's own
    // descriptors (its overlays' upper layers) stay.
    let mut keep = vec![0, 1, 2, status.as_raw_fd(), signals.as_raw_fd()];
    keep.extend(gate.iter().flat_map(super::unix_sockets::Gate::descriptors));
    if super::hygiene::close_inherited_fds(&keep).is_err() {
        setup_failed(status, "closing the channel failed");
    }
    for warning in setup.warnings.iter().chain(&warnings) {
        eprintln!("sandbox-run: warning: {warning}");
    }
    let exec = Exec::new(
        &Command {
            argv: command.argv.iter().map(Into::into).collect(),
            env: command
                .env
                .iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            cwd: command.cwd.clone(),
            limits: command.limits.clone(),
        },
        None,
        None,
    );
    // Sharing PID 1's memory and descriptors until it has installed its seccomp filters, then
    // its memory until its execve: PID 1 is single-threaded, and the child only resets its own
    // signals, session and rlimits before it execs (its signalfd and the status pipe are
    // close-on-exec) or leaves through _exit. PID 1 installs its own filter after.
    // The gate's refusals go to the command's stderr (PID 1's own is released below), on a
    // copy PID 1 closes as soon as the command has ended.
    let gate = gate.map(|gate| match nix::unistd::dup(std::io::stderr()) {
        Ok(stderr) => {
            let _ = nix::fcntl::fcntl(
                &stderr,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
            gate.report_on(stderr)
        }
        Err(_) => gate,
    });
    let started = super::unix_sockets::start_command(seccomp, gate, &mut || {
        init::start_command(&exec, None, [false; 3]);
    });
    let (child, notifier) = match started {
        Ok(started) => started,
        Err(err) => setup_failed(status, &format!("cannot start the command: {err}")),
    };
    // PID 1 keeps none of the command's stdio: it closes for the server when the command and
    // what it started close it, not when PID 1 is gone.
    release_stdio();
    let (kind, value) = init::supervise(&signals, child, notifier.as_ref());
    // Its copy of the command's stderr closes now, not when PID 1 is gone.
    drop(notifier);
    // What the command left behind dies before its status goes out: the server reports the
    // exit on the status, and nothing of the command outlives that report.
    end_the_rest();
    let ended = if kind == init::STATUS_SIGNALED {
        Ended::Signaled(value)
    } else {
        Ended::Exited(value)
    };
    let cpu = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|usage| {
            let time = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            time(usage.user_time()) + time(usage.system_time())
        })
        .unwrap_or_default();
    let _ = nix::unistd::write(status, &encode_status(ended, cpu));
    crate::sys::exit_now(0)
}

/// Points PID 1's descriptors 0-2 at `/dev/null` (its copies of the command's stdio).
fn release_stdio() {
    if let Ok(null) = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        for target in crate::sys::Stdio::ALL {
            let _ = crate::sys::replace_stdio(null.as_fd(), target);
        }
    }
}

/// Kills every other process of PID 1's namespace (`kill(-1)` from a namespace's init reaches
/// all of them but itself) and reaps them all, killing again after each reap in case one was
/// being forked while the first kill went round.
fn end_the_rest() {
    loop {
        match nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL) {
            // ESRCH: nobody else is left.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            // Not allowed (the command's processes are in this PID 1's Landlock domain and
            // seccomp lets it signal them, so this should not happen): waiting could then
            // never end, and PID 1's own exit ends them instead.
            Err(_) => return,
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}

/// Moves this process into each cgroup (a `cgroup.procs` descriptor).
fn join_cgroups<'a>(cgroups: impl Iterator<Item = BorrowedFd<'a>>) -> Result<(), String> {
    for cgroup in cgroups {
        nix::unistd::write(cgroup, b"0")
            .map_err(|err| format!("joining the command's cgroup failed: {err}"))?;
    }
    Ok(())
}

/// What a PID 1 prepared before its command arrived.
struct WarmedUp {
    signals: SignalFd,
    warnings: Vec<String>,
    /// Its seccomp program, installed once the command has installed its own.
    seccomp: super::seccomp::Prepared,
    /// What it lets the command connect to (when it holds the command's listener).
    gate: Option<super::unix_sockets::Gate>,
}

/// PID 1's own setup, before its command arrives: a session of its own, the per-command
/// mounts, the working directory, the named unix sockets pinned, every capability dropped,
/// Landlock, the seccomp program built, and the signalfd it forwards signals from.
fn warm_up(setup: &Setup) -> Result<WarmedUp, String> {
    let _ = nix::unistd::setsid();
    let applied = mounts::apply(&setup.per_command).map_err(|e| e.to_string())?;
    super::enter_directory(&setup.cwd).map_err(|e| e.to_string())?;
    let _ = crate::sys::set_dumpable(false);
    let mut report = EnforcementReport::default();
    let gate = super::unix_sockets::Gate::for_policy(
        &setup.policy,
        applied.overlays,
        &mut report.warnings,
    );
    let enforce = EnforceOptions {
        best_effort: false,
        keep_fds: Vec::new(),
        env: EnvMode::Keep,
        namespaces: NamespaceMode::Auto,
        audit_log: false,
        egress_port: None,
    };
    report.namespaces.user = true;
    super::confine_but_seccomp(
        &setup.policy,
        &landlock::private_ttys(),
        &enforce,
        &mut report,
    )
    .map_err(|e| e.to_string())?;
    let seccomp = super::seccomp::Prepared::new(super::seccomp_variant(&setup.policy, &enforce))
        .map_err(|e| e.to_string())?;
    let forwarded = init::forwarded_signals();
    let signals = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&forwarded), None)
        .and_then(|()| SignalFd::with_flags(&forwarded, SfdFlags::SFD_CLOEXEC))
        .map_err(|e| format!("signalfd: {e}"))?;
    Ok(WarmedUp {
        signals,
        warnings: report.warnings,
        seccomp,
        gate,
    })
}

/// Says why on the command's stderr, reports exit status 125, and exits.
fn setup_failed(status: &OwnedFd, message: &str) -> ! {
    eprintln!("sandbox-run: {message}");
    let _ = nix::unistd::write(
        status,
        &encode_status(Ended::Exited(i32::from(EXIT_SETUP_FAILED)), Duration::ZERO),
    );
    crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_survives_its_encoding_and_anything_else_is_refused() {
        for ended in [Ended::Exited(0), Ended::Exited(255), Ended::Signaled(9)] {
            let cpu = Duration::from_micros(1_234_567);
            assert_eq!(
                decode_status(&encode_status(ended, cpu)),
                Some((ended, cpu))
            );
        }
        assert_eq!(decode_status(&[]), None);
        let mut bad = encode_status(Ended::Exited(1), Duration::ZERO);
        bad[0] = 7;
        assert_eq!(decode_status(&bad), None);
    }

    #[test]
    fn each_command_redoes_its_proc_dev_and_private_directories_with_what_they_carry() {
        let plan = vec![
            MountOp::ReadOnlyRoot,
            MountOp::PrivateDev,
            MountOp::Proc,
            MountOp::PrivateDir(PathBuf::from("/dev/shm")),
            MountOp::PrivateDir(PathBuf::from("/tmp")),
            MountOp::WritableBind(PathBuf::from("/home/me/work")),
            MountOp::WritableBind(PathBuf::from("/tmp/work")),
            MountOp::MaskFile(PathBuf::from("/tmp/work/.env")),
            MountOp::ReadOnlyBind(PathBuf::from("/home/me/work/.git")),
        ];
        assert_eq!(
            per_command_steps(&plan),
            vec![
                MountOp::PrivateDev,
                MountOp::Proc,
                MountOp::PrivateDir(PathBuf::from("/dev/shm")),
                MountOp::PrivateDir(PathBuf::from("/tmp")),
                MountOp::WritableBind(PathBuf::from("/tmp/work")),
                MountOp::MaskFile(PathBuf::from("/tmp/work/.env")),
            ]
        );
    }
}
