//! Without a cgroup: the server is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a process
//! whose parent exits is re-parented to the server instead of init. The server reaps such
//! orphans when they exit (no zombies pile up) and kills them at shutdown; what it cannot do
//! without a cgroup is tell which tree an orphan came from, so `process/terminate` and session
//! expiry reach only the process group, and a server killed with SIGKILL leaves orphans that
//! left their group (documented; a sandboxed command is contained by its PID namespace anyway).
//!
//! Orphans are told from the server's own children by their session: every process the server
//! spawns starts a session of its own, and an orphan is either still in such a session or in
//! one it made with `setsid`; the server's helpers (`exec-guardian`, `fs-helper`) stay in the
//! server's session and are never touched here. A spawn holds [`Reaper::spawning`] until its
//! child is known, so a child that exits at once is never mistaken for an orphan.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limits::ORPHAN_KILL_ROUNDS;

/// The server's children that are process leaders it spawned (their exit is reaped by their
/// own pump), and the orphan reaper.
#[derive(Debug)]
pub struct Reaper {
    leaders: Mutex<HashSet<i32>>,
    server_session: i32,
}

impl Reaper {
    /// Make the server a child subreaper and reap orphans on every SIGCHLD. Call inside the
    /// runtime.
    ///
    /// # Errors
    /// `prctl` or signal-handler installation errors.
    pub fn install() -> std::io::Result<Arc<Self>> {
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let reaper = Arc::new(Self {
            leaders: Mutex::new(HashSet::new()),
            server_session: nix::unistd::getsid(None).map_or(0, nix::unistd::Pid::as_raw),
        });
        let mut children = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        let weak = Arc::downgrade(&reaper);
        tokio::spawn(async move {
            while children.recv().await.is_some() {
                let Some(reaper) = weak.upgrade() else {
                    return;
                };
                reaper.reap_orphans();
            }
        });
        Ok(reaper)
    }

    /// Held across a spawn; insert the new leader's pid before releasing it.
    pub fn spawning(&self) -> MutexGuard<'_, HashSet<i32>> {
        self.leaders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The leader was reaped by its pump.
    pub fn forget(&self, pid: i32) {
        self.spawning().remove(&pid);
    }

    /// The server's children that are orphans of its trees.
    fn orphans(&self, leaders: &HashSet<i32>) -> Vec<i32> {
        children_of_self()
            .into_iter()
            .filter(|pid| !leaders.contains(pid))
            .filter(|pid| session_of(*pid).is_some_and(|sid| sid != self.server_session))
            .collect()
    }

    /// Reap every orphan that has exited.
    fn reap_orphans(&self) {
        let leaders = self.spawning();
        for pid in self.orphans(&leaders) {
            crate::sys::reap_if_exited(pid);
        }
    }

    /// Shutdown: kill every orphan (and its process group) through a pidfd; their own orphans
    /// come back to the server in turn, so repeat a bounded number of times.
    pub async fn kill_orphans(&self) {
        for _ in 0..ORPHAN_KILL_ROUNDS {
            let orphans = {
                let leaders = self.spawning();
                self.orphans(&leaders)
            };
            if orphans.is_empty() {
                return;
            }
            for pid in orphans {
                // Our own unreaped child: its pid cannot be recycled under us.
                if let Ok(pidfd) = crate::sys::pidfd_open(pid) {
                    let _ = crate::sys::pidfd_send_signal(&pidfd, libc::SIGKILL, true);
                }
            }
            let _ = super::wait_until(|| {
                self.reap_orphans();
                let leaders = self.spawning();
                self.orphans(&leaders).is_empty()
            })
            .await;
        }
    }
}

/// Children of every thread of this process (`/proc/self/task/*/children`).
fn children_of_self() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            children.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    children
}

/// The session id of `pid` (`/proc/PID/stat` field 6).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    after_comm.split_whitespace().nth(3)?.parse().ok()
}
