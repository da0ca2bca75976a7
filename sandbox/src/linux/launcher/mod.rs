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

//!
//! The messages and their encoding are in `wire`, PID 1's side in `pid1`, the errors in `error`.

mod error;
mod pid1;
mod wire;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

pub use error::{FailureKind, LaunchFailure, LauncherError, Pid1SetupError};
pub use wire::{
    MAX_CGROUPS, MAX_MESSAGE_BYTES, MAX_MESSAGE_FDS, MOUNT_NAMESPACE, NEXT_PID_1_DELAY, Reply,
    START, STATUS_BYTES, StartCommand, decode_status, encode_status, receive, send,
};

use super::mounts::{self, MountOp};
use super::{init, namespaces};
use crate::launch::{LaunchRequest, read_json};
use crate::policy::ResolvedPolicy;
use pid1::{Warm, start};

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
        // Torn down (each close waits for an RCU grace period, milliseconds) only at the end of
        // this turn: after the next PID 1 is cloned and after a waiting start is answered.
        let _released = reap_children(&mut held);
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
/// and returns its mount namespace (taken from `held`), which is torn down when the caller
/// drops it, after the server has seen the command end.
fn reap_children(held: &mut Vec<(Pid, OwnedFd)>) -> Vec<OwnedFd> {
    let mut released = Vec::new();
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
        if let Some(pid) = status.pid()
            && let Some(at) = held.iter().position(|(running, _)| *running == pid)
        {
            released.push(held.swap_remove(at).1);
        }
    }
    released
}

#[cfg(test)]
mod tests {
    use super::*;

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
