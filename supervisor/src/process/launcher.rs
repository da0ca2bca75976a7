//! Pre-confined launchers for sandboxed `process/start` (see `sandbox::linux::launcher`).
//!
//! One `sandbox-run --launcher` per (session, resolved policy, working directory) builds the
//! user and network namespaces and the mount layout once, and keeps the next command's PID 1
//! ready (in its own PID, mount and IPC namespaces, confined); a start then costs handing the
//! command over, a fork and its `execve` instead of an exec of `sandbox-run` and a new sandbox.
//!
//! - Each launcher's waiting PID 1 has already joined the next command's cgroups (a tree with
//!   the server's default limits, [`Launcher::ahead`]): a cgroup v1 migration after a pause waits
//!   for an RCU grace period while holding the kernel's cgroup mutex, and that wait now happens
//!   before the start, not in it. A start that asks for other memory or process limits runs
//!   one-shot.
//! - Used for pipe-mode starts without the denial audit and without a network allowlist;
//!   terminal, audited and allowlisted starts keep the one-shot `sandbox-run` (which relays
//!   the terminal, collects the audit, runs the egress proxy). `--one-shot-sandbox` keeps the
//!   one-shot path for every start.
//! - Bounded: [`MAX_LAUNCHERS_PER_SESSION`] per session and [`MAX_LAUNCHERS`] in all; past
//!   them a start takes the one-shot path. A launcher with no live command exits after
//!   [`LAUNCHER_IDLE_TIMEOUT`] (closing its socket ends it); one with live commands is kept,
//!   because its commands die with it.
//! - A launcher whose setup fails (no user namespaces here, say) is not retried for its key:
//!   those starts take the one-shot path, which reports the reason or runs best effort.
//! - A launcher that dies or stops answering fails only the start in flight, with its
//!   stderr; the next start gets a fresh one.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox::ResolvedPolicy;

use crate::containment::plan::Plan;
use crate::containment::{Containment, ContainmentError, Tree};
use crate::error_text::StderrTail;
use sandbox::linux::launcher::{self, Reply, StartCommand};

mod setup;

use setup::{Setup, ahead_tree};

/// Launchers one session may hold (one per policy and working directory it uses).
pub const MAX_LAUNCHERS_PER_SESSION: usize = 4;
/// Launchers alive at once, across all sessions.
pub const MAX_LAUNCHERS: usize = 64;
/// A launcher without a live command exits after this long.
pub const LAUNCHER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a launcher's answer (setup builds a mount layout; a start only clones).
pub const LAUNCHER_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a launcher's stderr kept for error reports.
const LAUNCHER_STDERR_BYTES: usize = 4096;

/// Why a start through a launcher failed.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// The launcher could not be started.
    #[error("cannot start the sandbox launcher {binary}: {source}")]
    Spawn {
        /// `sandbox-run`.
        binary: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The request could not be written.
    #[error("cannot pass the command to the sandbox launcher: {0}")]
    Request(#[from] sandbox::launch::LaunchError),
    /// The message could not be sent: the launcher is gone.
    #[error("cannot reach the sandbox launcher ({source}); the next start gets a new one")]
    Send {
        /// The OS error.
        source: std::io::Error,
    },
    /// The socket failed: the launcher died or stopped answering.
    #[error("the sandbox launcher stopped answering ({source}); the next start gets a new one")]
    Socket {
        /// The OS error.
        source: std::io::Error,
    },
    /// The launcher closed its socket before answering.
    #[error("the sandbox launcher exited before answering; the next start gets a new one")]
    Exited,
    /// The launcher answered something else.
    #[error("the sandbox launcher answered {answer}")]
    Unexpected {
        /// What it said.
        answer: String,
    },
    /// The command's cgroups could not be made.
    #[error("cannot make the command's cgroups: {0}")]
    Cgroups(ContainmentError),
    /// The launcher refused the start.
    #[error("the sandbox launcher could not start the command (stage {kind}): {error}")]
    Refused {
        /// Its reason.
        error: String,
        /// The stage that failed.
        kind: launcher::FailureKind,
    },
}

/// A failed start: the error and the launcher's stderr.
#[derive(Debug, thiserror::Error)]
#[error("{error}{}", if stderr.is_empty() { String::new() } else { format!(" (launcher stderr: {stderr})") })]
pub struct LauncherFailure {
    /// What failed.
    pub error: LauncherError,
    /// The launcher's last words.
    pub stderr: String,
}

/// One live launcher.
struct Launcher {
    child: Mutex<Child>,
    /// One exchange at a time.
    socket: Mutex<OwnedFd>,
    stderr: StderrTail,
    live: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// The cgroups its next PID 1 joins (or joined) while it prepares: the next command's
    /// tree. None when they could not be made; that command's PID 1 joins its own as it starts.
    ahead: Mutex<Option<Tree>>,
}

impl Launcher {
    fn stderr_text(&self) -> String {
        self.stderr.text()
    }

    fn idle_for(&self) -> Option<Duration> {
        (self.live.load(Ordering::Acquire) == 0).then(|| {
            self.idle_since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
        })
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // Closing the socket ends it; the kill covers a launcher stuck in a start. The last
        // `Lease` may be dropped on an async worker, so a launcher not reaped yet is reaped on
        // the cleanup thread. Until then it is our unreaped child (a zombie at worst), so its
        // pid cannot have been reused; one already reaped is never waited for again.
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        if let (Ok(None), Ok(pid)) = (child.try_wait(), i32::try_from(child.id())) {
            let pid = nix::unistd::Pid::from_raw(pid);
            crate::containment::cleanup::in_background(move || {
                let _ = nix::sys::wait::waitpid(pid, None);
            });
        }
        // Its waiting PID 1 dies with it (parent-death signal).
        if let Some(tree) = self
            .ahead
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            tree.discard();
        }
    }
}

/// Held by a command started through a launcher: the launcher stays while it lives.
pub struct Lease(Arc<Launcher>);

impl Drop for Lease {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A command a launcher started.
pub struct Launched {
    /// The host pid of its PID 1.
    pub pid: i32,
    /// PID 1's pidfd.
    pub pidfd: OwnedFd,
    /// The read end of PID 1's status pipe.
    pub status: OwnedFd,
    /// Keeps the launcher.
    pub lease: Lease,
}

/// What a launcher serves: one session's starts under one policy in one working directory,
/// while the paths its layout was built from are the same files
/// ([`launcher::layout_fingerprint`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    session: String,
    policy: Vec<u8>,
    cwd: PathBuf,
    layout: Vec<u8>,
}

/// The launchers of every session.
pub struct Launchers {
    sandbox_run: PathBuf,
    one_shot: bool,
    pool: Mutex<HashMap<Key, Arc<Launcher>>>,
    /// Keys whose launcher could not be set up: one-shot from then on.
    unsupported: Mutex<HashSet<Key>>,
}

impl Launchers {
    /// The pool; `one_shot` turns it off. Call inside the runtime (idle launchers are retired
    /// by a task).
    pub fn new(sandbox_run: PathBuf, one_shot: bool) -> Arc<Self> {
        let launchers = Arc::new(Self {
            sandbox_run,
            one_shot,
            pool: Mutex::new(HashMap::new()),
            unsupported: Mutex::new(HashSet::new()),
        });
        let weak = Arc::downgrade(&launchers);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(LAUNCHER_IDLE_TIMEOUT / 4);
            loop {
                tick.tick().await;
                let Some(launchers) = weak.upgrade() else {
                    return;
                };
                let expired = launchers.take_expired();
                if !expired.is_empty() {
                    // Dropping waits for the exit: off the async workers.
                    let _ = tokio::task::spawn_blocking(move || drop(expired)).await;
                }
            }
        });
        launchers
    }

    /// Whether a start with these properties goes through a launcher.
    pub fn eligible(&self, policy: &ResolvedPolicy, pty: bool, audit: bool) -> bool {
        !self.one_shot && !pty && !audit && policy.egress().is_none() && !policy.is_unrestricted()
    }

    /// Retires the launchers of `session_id` (it detached) that run no command; the others
    /// leave by the idle timeout once their commands end.
    pub fn retire_session(&self, session_id: &str) {
        let retired: Vec<Arc<Launcher>> = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<Key> = pool
                .iter()
                .filter(|(key, l)| key.session == session_id && l.idle_for().is_some())
                .map(|(key, _)| key.clone())
                .collect();
            keys.iter().filter_map(|key| pool.remove(key)).collect()
        };
        if !retired.is_empty() {
            // Dropping waits for the exit: off the async workers.
            tokio::task::spawn_blocking(move || drop(retired));
        }
    }

    fn take_expired(&self) -> Vec<Arc<Launcher>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let expired: Vec<Key> = pool
            .iter()
            .filter(|(_, l)| {
                l.idle_for()
                    .is_some_and(|idle| idle >= LAUNCHER_IDLE_TIMEOUT)
            })
            .map(|(key, _)| key.clone())
            .collect();
        expired.iter().filter_map(|key| pool.remove(key)).collect()
    }

    /// Launchers alive now.
    pub fn live(&self) -> usize {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Starts `command` through the launcher of (`session`, `policy`, its cwd), creating it
    /// when needed, in the cgroup tree of `plan`: the one the launcher's PID 1 joined ahead
    /// (made for the server's default limits), or a new one it joins as the command starts.
    /// Blocking. `Ok(None)`: no launcher for this start (bounds reached, launchers cannot be
    /// set up for this policy here, or `plan` asks for other cgroup limits than the default
    /// ones): take the one-shot path.
    ///
    /// # Errors
    /// [`LauncherFailure`] when the launcher failed this start.
    pub fn start(
        &self,
        session: &str,
        policy: &ResolvedPolicy,
        command: &StartCommand,
        stdio: [OwnedFd; 3],
        containment: &Containment,
        plan: &Plan,
    ) -> Result<Option<(Launched, Tree)>, LauncherFailure> {
        let failure = |error: LauncherError, stderr: String| LauncherFailure { error, stderr };
        let Ok(ahead_plan) = containment.plan_sandboxed(None) else {
            return Ok(None);
        };
        if !plan.same_cgroups(&ahead_plan) {
            // Its PID 1 already sits in cgroups with the default limits.
            return Ok(None);
        }
        let began = Instant::now();
        let key = Key {
            session: session.to_owned(),
            policy: serde_json::to_vec(policy).unwrap_or_default(),
            cwd: command.cwd.clone(),
            layout: launcher::layout_fingerprint(policy, &command.cwd),
        };
        let memfd =
            sandbox::launch::write_json(command).map_err(|e| failure(e.into(), String::new()))?;
        // A launcher that died since its last start (killed, or out of memory) never saw this
        // one: one retry with a fresh launcher.
        let mut attempts = 0;
        let exchanged = Instant::now();
        let (launcher, answer, tree) = loop {
            attempts += 1;
            let Some(launcher) = self.launcher_for(&key, policy, containment, &ahead_plan)? else {
                return Ok(None);
            };
            // One start at a time per launcher: the tree its ready PID 1 joined is this
            // command's, and the tree sent along is the next one's.
            let socket = launcher.socket.lock().unwrap_or_else(|p| p.into_inner());
            let joined = launcher
                .ahead
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let (tree, join_now) = match joined {
                Some(tree) => (tree, Vec::new()),
                None => {
                    let tree = containment
                        .create_tree(plan)
                        .map_err(|e| failure(LauncherError::Cgroups(e), String::new()))?;
                    match tree.join_fds() {
                        Ok(fds) => (tree, fds),
                        Err(error) => {
                            let _ = tree.remove();
                            return Err(failure(LauncherError::Cgroups(error), String::new()));
                        }
                    }
                }
            };
            let next = ahead_tree(containment, &ahead_plan);
            let mut fds = vec![memfd.as_fd()];
            fds.extend(stdio.iter().map(AsFd::as_fd));
            fds.extend(join_now.iter().map(AsFd::as_fd));
            let next_fds = next.as_ref().map_or(&[][..], |(_, fds)| fds.as_slice());
            fds.extend(next_fds.iter().map(AsFd::as_fd));
            let body = format!("{}:{}", launcher::START, next_fds.len());
            let answer = exchange(socket.as_fd(), body.as_bytes(), &fds);
            let next = next.map(|(tree, _)| tree);
            if matches!(answer, Ok((Reply::Started { .. }, _))) {
                *launcher.ahead.lock().unwrap_or_else(|p| p.into_inner()) = next;
            } else if let Some(next) = next {
                next.discard();
            }
            drop(socket);
            match answer {
                Err(LauncherError::Send { .. }) if attempts < 2 => {
                    tree.discard();
                    self.discard(&key);
                }
                answer => break (launcher, answer, tree),
            }
        };
        drop((memfd, stdio));
        tracing::debug!(
            prepared_us = (exchanged - began).as_micros() as u64,
            exchange_us = exchanged.elapsed().as_micros() as u64,
            "sandbox launcher start"
        );
        match answer {
            Ok((Reply::Started { pid }, mut fds)) if fds.len() == 2 => {
                let status = fds.pop();
                let pidfd = fds.pop();
                let (Some(pidfd), Some(status)) = (pidfd, status) else {
                    return Err(failure(LauncherError::Exited, String::new()));
                };
                launcher.live.fetch_add(1, Ordering::AcqRel);
                Ok(Some((
                    Launched {
                        pid,
                        pidfd,
                        status,
                        lease: Lease(launcher),
                    },
                    tree,
                )))
            }
            Ok((Reply::Failed { error, kind }, _)) => {
                // Which PID 1 sits in which cgroups is unknown now: a fresh launcher next time.
                tree.discard();
                self.discard(&key);
                Err(failure(
                    LauncherError::Refused { error, kind },
                    String::new(),
                ))
            }
            Ok((other, _)) => {
                tree.discard();
                self.discard(&key);
                Err(failure(
                    LauncherError::Unexpected {
                        answer: format!("{other:?}"),
                    },
                    launcher.stderr_text(),
                ))
            }
            Err(error) => {
                tree.discard();
                self.discard(&key);
                {
                    // Let the launcher finish dying, so its stderr says why.
                    let mut child = launcher.child.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Err(failure(error, launcher.stderr_text()))
            }
        }
    }

    fn discard(&self, key: &Key) {
        let removed = self
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        drop(removed);
    }

    /// The launcher of `key`: pooled, or new within the bounds.
    fn launcher_for(
        &self,
        key: &Key,
        policy: &ResolvedPolicy,
        containment: &Containment,
        ahead_plan: &Plan,
    ) -> Result<Option<Arc<Launcher>>, LauncherFailure> {
        if self
            .unsupported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
        {
            return Ok(None);
        }
        {
            let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(launcher) = pool.get(key) {
                return Ok(Some(launcher.clone()));
            }
            let of_session = pool.keys().filter(|k| k.session == key.session).count();
            if pool.len() >= MAX_LAUNCHERS || of_session >= MAX_LAUNCHERS_PER_SESSION {
                return Ok(None);
            }
        }
        let launcher = match self.spawn(key, policy, containment, ahead_plan) {
            Ok(launcher) => launcher,
            Err(Setup::Unsupported { reason, kind }) => {
                tracing::info!(%reason, ?kind, "sandbox launcher unavailable for this policy; starting one-shot");
                self.unsupported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone());
                return Ok(None);
            }
            Err(Setup::Failed(failure)) => return Err(failure),
        };
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        // Another start may have made one meanwhile: use it, drop ours.
        Ok(Some(pool.entry(key.clone()).or_insert(launcher).clone()))
    }
}

/// One message and its answer.
fn exchange(
    socket: std::os::fd::BorrowedFd<'_>,
    body: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<(Reply, Vec<OwnedFd>), LauncherError> {
    launcher::send(socket, body, fds).map_err(|source| LauncherError::Send { source })?;
    let (body, fds) = launcher::receive(socket)
        .map_err(|source| LauncherError::Socket { source })?
        .ok_or(LauncherError::Exited)?;
    let reply = serde_json::from_slice(&body).map_err(|_| LauncherError::Unexpected {
        answer: String::from_utf8_lossy(&body).into_owned(),
    })?;
    Ok((reply, fds))
}
