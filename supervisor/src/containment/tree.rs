//! The cgroups of one process tree: join, kill, measure, remove.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::cgroupfs::CgroupDir;
use super::{ContainmentError, cleanup, wait_until};
use crate::limits::{CGROUP_EMPTY_DEADLINE, CGROUP_EMPTY_POLL, CPU_GROUP_JOIN_PASSES};

/// A tree's cgroups as a child of the server starts in them (see `sys::ChildCgroups`).
#[derive(Debug, Default)]
pub struct ChildCgroupFds {
    /// The v2 leaf: its directory, for the child to be born in, and its `cgroup.procs`, to
    /// join where the kernel cannot place a child at birth.
    pub leaf: Option<(OwnedFd, OwnedFd)>,
    /// `cgroup.procs` of the v1 cgroups the child joins: its leaves and the shared CPU group.
    pub v1: Vec<OwnedFd>,
}

/// The cgroups of one process tree (none without cgroups).
#[derive(Debug, Default)]
pub struct Tree {
    /// Its cgroup v2 leaf (tracking, `cgroup.kill`, CPU usage, v2 limits).
    pub(super) leaf: Option<CgroupDir>,
    /// Its v1 leaves (memory, pids limits on hybrid hosts).
    pub(super) v1: Vec<CgroupDir>,
    /// Where its OOM kills are counted.
    pub(super) oom: Option<(CgroupDir, &'static str)>,
    /// The server's shared CPU group: joined, never removed with the tree.
    pub(super) cpu_group: Option<CgroupDir>,
}

impl Tree {
    /// `cgroup.procs` of every cgroup the child must join before it execs.
    ///
    /// # Errors
    /// [`ContainmentError::Join`].
    pub fn join_fds(&self) -> Result<Vec<OwnedFd>, ContainmentError> {
        self.leaf
            .iter()
            .chain(&self.v1)
            .chain(&self.cpu_group)
            .map(CgroupDir::open_procs)
            .collect()
    }

    /// What a child of the server needs to start in this tree: the leaf to be born in and the
    /// v1 cgroups to join before it execs.
    ///
    /// The shared CPU group is among them only for a tree without a v2 leaf. With one, the tree
    /// joins it just after the start ([`Tree::join_cpu_group`]): every write to a
    /// `cgroup.procs` takes the kernel's cgroup threadgroup lock for writing, which on a host
    /// idle for a few milliseconds first waits for an RCU grace period (measured here: 9-17 ms
    /// on every `process/start` after 50 ms idle, against 1 ms back to back). The CPU group
    /// only weighs the server's processes together against the server; the memory and pids
    /// leaves, which bound the tree, are still joined before `execve`.
    ///
    /// # Errors
    /// [`ContainmentError::Join`].
    pub fn child_cgroups(&self) -> Result<ChildCgroupFds, ContainmentError> {
        let leaf = match &self.leaf {
            Some(leaf) => Some((leaf.open_directory()?, leaf.open_procs()?)),
            None => None,
        };
        let cpu_group = self.cpu_group.as_ref().filter(|_| self.leaf.is_none());
        let v1 = self
            .v1
            .iter()
            .chain(cpu_group)
            .map(CgroupDir::open_procs)
            .collect::<Result<_, _>>()?;
        Ok(ChildCgroupFds { leaf, v1 })
    }

    /// Whether [`Tree::join_cpu_group`] has work to do after a start with
    /// [`Tree::child_cgroups`].
    pub fn joins_cpu_group_after_start(&self) -> bool {
        self.leaf.is_some() && self.cpu_group.is_some()
    }

    /// Move every process of the tree into the server's shared CPU group (blocking: each move
    /// may wait for an RCU grace period). The v2 leaf lists the whole tree, children forked
    /// before their parent moved included; a process moved has its later children born in the
    /// group. So pass after pass moves what the leaf lists that was not moved yet, until a pass
    /// finds nothing new (at most [`CPU_GROUP_JOIN_PASSES`]; a tree that forks faster than it
    /// is moved is logged, and stays bounded by its own limits).
    pub fn join_cpu_group(&self) {
        let (Some(leaf), Some(group)) = (&self.leaf, &self.cpu_group) else {
            return;
        };
        let mut moved = std::collections::HashSet::new();
        for _ in 0..CPU_GROUP_JOIN_PASSES {
            let Ok(members) = leaf.read("cgroup.procs") else {
                return; // the tree is gone
            };
            let new: Vec<&str> = members
                .lines()
                .map(str::trim)
                .filter(|pid| !pid.is_empty() && !moved.contains(*pid))
                .collect();
            if new.is_empty() {
                return;
            }
            for pid in new {
                // A process that exited meanwhile is not an error (ESRCH).
                let _ = group.write("cgroup.procs", pid);
                moved.insert(pid.to_owned());
            }
        }
        tracing::debug!(
            leaf = %leaf.path().display(),
            "the tree kept forking while it joined the CPU group; later children may be outside it"
        );
    }

    /// The tree is tracked by a cgroup v2 leaf.
    pub fn tracked(&self) -> bool {
        self.leaf.is_some()
    }

    /// The leaf's directory.
    pub fn leaf(&self) -> Option<&Path> {
        self.leaf.as_ref().map(CgroupDir::path)
    }

    /// SIGKILL the whole tree (`cgroup.kill`). False without a leaf (the caller kills the
    /// process group through its pidfd instead).
    pub fn kill(&self) -> bool {
        match &self.leaf {
            Some(leaf) => match leaf.kill() {
                Ok(()) => true,
                // Already removed: the tree was empty.
                Err(ContainmentError::Write { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    true
                }
                Err(error) => {
                    tracing::warn!(%error, "cgroup.kill failed");
                    false
                }
            },
            None => false,
        }
    }

    /// Some process of the tree is alive.
    pub fn populated(&self) -> bool {
        self.leaf.as_ref().is_some_and(CgroupDir::populated)
            || self.v1.iter().any(CgroupDir::has_processes)
    }

    /// OOM kills in the tree's memory cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        self.oom
            .as_ref()
            .and_then(|(dir, file)| dir.keyed(file, "oom_kill"))
            .unwrap_or(0)
    }

    /// CPU time the whole tree used so far (cgroup v2 `cpu.stat`, present without the cpu
    /// controller).
    pub fn cpu_usage(&self) -> Option<Duration> {
        let micros = self.leaf.as_ref()?.keyed("cpu.stat", "usage_usec")?;
        Some(Duration::from_micros(micros))
    }

    /// Peak memory of the tree so far: `memory.peak` of its v2 memory cgroup, or
    /// `memory.max_usage_in_bytes` of its v1 one; `None` without a memory cgroup (or on a
    /// kernel before 5.19, which has no `memory.peak`).
    pub fn peak_memory(&self) -> Option<u64> {
        let (dir, file) = match &self.oom {
            Some((dir, "memory.oom_control")) => (dir, "memory.max_usage_in_bytes"),
            Some((dir, _)) => (dir, "memory.peak"),
            // No memory limit: the leaf still has `memory.peak` where its parent enables the
            // memory controller for it.
            None => (self.leaf.as_ref()?, "memory.peak"),
        };
        dir.read(file).ok()?.trim().parse().ok()
    }

    /// Memory charged to the tree now: `memory.current` of its v2 cgroup, or
    /// `memory.usage_in_bytes` of its v1 one; `None` without a memory cgroup.
    pub fn current_memory(&self) -> Option<u64> {
        let (dir, file) = match &self.oom {
            Some((dir, "memory.oom_control")) => (dir, "memory.usage_in_bytes"),
            Some((dir, _)) => (dir, "memory.current"),
            None => (self.leaf.as_ref()?, "memory.current"),
        };
        dir.read(file).ok()?.trim().parse().ok()
    }

    /// Remove the tree's cgroups (they must be empty).
    ///
    /// # Errors
    /// [`ContainmentError::Remove`].
    pub fn remove(&self) -> Result<(), ContainmentError> {
        for dir in self.v1.iter().chain(&self.leaf) {
            dir.remove_tree()?;
        }
        Ok(())
    }

    /// Give up a tree no command of ours runs in (the cgroups a launcher's PID 1 joined ahead
    /// for a command it never got): kill what is in it and remove it once empty, on the
    /// cleanup thread ([`cleanup::in_background`]), since the caller may be an async worker and
    /// the PID 1 takes a moment to die.
    pub fn discard(self) {
        if !self.tracked() && self.v1.is_empty() {
            return;
        }
        cleanup::in_background(move || {
            self.kill();
            let deadline = std::time::Instant::now() + CGROUP_EMPTY_DEADLINE;
            while self.populated() && std::time::Instant::now() < deadline {
                std::thread::sleep(CGROUP_EMPTY_POLL); // polling interval
            }
            if let Err(error) = self.remove() {
                tracing::warn!(%error, "leaving an unused process cgroup behind");
            }
        });
    }

    /// Kill the tree, wait (bounded) until it is empty, and remove its cgroups. The kill and
    /// the removal run on the blocking pool: both take the kernel's cgroup mutex, which a
    /// migration elsewhere can hold for an RCU grace period (tens of milliseconds on an idle
    /// host), and an async worker must not wait for it.
    pub async fn kill_and_remove(self: &Arc<Self>) {
        if !self.tracked() && self.v1.is_empty() {
            return;
        }
        let tree = self.clone();
        let _ = tokio::task::spawn_blocking(move || tree.kill()).await;
        if !wait_until(|| !self.populated()).await {
            tracing::warn!(leaf = ?self.leaf(), "a killed tree did not empty in time");
        }
        let tree = self.clone();
        let removed = tokio::task::spawn_blocking(move || tree.remove()).await;
        if let Ok(Err(error)) = removed {
            tracing::warn!(%error, "leaving a process cgroup behind");
        }
    }
}
