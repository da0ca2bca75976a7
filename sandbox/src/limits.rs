//! Resource limits of a sandboxed command: the rlimits its process gets right before `execve`
//! (and every process it starts inherits), and the wall-clock time after which `sandbox-run`
//! ends the whole sandbox.
//!
//! Under exec-server, memory and process counts are bounded by the command's cgroup, which the
//! server sets up before it spawns `sandbox-run`; the server hands `sandbox-run` only what a
//! cgroup cannot do (CPU time, file size, open files, the wall clock). Run by hand,
//! `sandbox-run --memory` and `--pids` fall back to `RLIMIT_AS` and `RLIMIT_NPROC`, which bound
//! each process's address space and the sandbox user's process count (see `--help`).

use serde::{Deserialize, Serialize};

/// Limits of the command (every field optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandLimits {
    /// `RLIMIT_CPU`: seconds of CPU per process (SIGXCPU, then SIGKILL one second later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file a process may write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// `RLIMIT_NOFILE`: open descriptors per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// `RLIMIT_AS`: address space per process (a stand-in for a memory cgroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_NPROC`: processes of the sandbox's user (a stand-in for a pids cgroup; the
    /// kernel does not apply it to uid 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// Wall-clock seconds after which `sandbox-run` kills the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<u64>,
}

/// The resources [`CommandLimits`] sets, as `setrlimit` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rlimit {
    /// `RLIMIT_CPU`.
    Cpu,
    /// `RLIMIT_FSIZE`.
    FileSize,
    /// `RLIMIT_NOFILE`.
    OpenFiles,
    /// `RLIMIT_AS`.
    AddressSpace,
    /// `RLIMIT_NPROC`.
    Processes,
}

/// Grace between the soft and hard `RLIMIT_CPU`: SIGXCPU at the limit, SIGKILL one CPU second
/// later for a process that handles or ignores SIGXCPU.
pub const CPU_HARD_LIMIT_GRACE_SECONDS: u64 = 1;

impl CommandLimits {
    /// No limit is set.
    pub fn is_empty(&self) -> bool {
        self == &CommandLimits::default()
    }

    /// The rlimits to set, as (resource, soft, hard).
    pub fn rlimits(&self) -> Vec<(Rlimit, u64, u64)> {
        let mut limits = Vec::new();
        if let Some(seconds) = self.cpu_seconds {
            let hard = seconds.saturating_add(CPU_HARD_LIMIT_GRACE_SECONDS);
            limits.push((Rlimit::Cpu, seconds, hard));
        }
        let same = |resource, value: Option<u64>| value.map(|v| (resource, v, v));
        limits.extend(same(Rlimit::FileSize, self.file_size_bytes));
        limits.extend(same(Rlimit::OpenFiles, self.open_files));
        limits.extend(same(Rlimit::AddressSpace, self.address_space_bytes));
        limits.extend(same(Rlimit::Processes, self.processes));
        limits
    }

    /// Sets the rlimits on the calling process (they survive `execve` and are inherited).
    /// Irreversible for the hard limits it lowers.
    ///
    /// # Errors
    /// The resource and the OS error of the first `setrlimit` that failed.
    #[cfg(target_os = "linux")]
    pub fn apply_rlimits_to_current_process(&self) -> Result<(), LimitError> {
        use nix::sys::resource::{Resource, setrlimit};
        for (resource, soft, hard) in self.rlimits() {
            let kernel = match resource {
                Rlimit::Cpu => Resource::RLIMIT_CPU,
                Rlimit::FileSize => Resource::RLIMIT_FSIZE,
                Rlimit::OpenFiles => Resource::RLIMIT_NOFILE,
                Rlimit::AddressSpace => Resource::RLIMIT_AS,
                Rlimit::Processes => Resource::RLIMIT_NPROC,
            };
            setrlimit(kernel, soft, hard).map_err(|source| LimitError::Set {
                resource,
                value: soft,
                source: source.into(),
            })?;
        }
        Ok(())
    }
}

/// What one sandbox may take of a kernel pool its host shares: a sandbox's user namespace maps
/// the server's uid, so per-uid counters (inotify instances and watches, queued signals, POSIX
/// message-queue bytes) are charged to that host uid, and the devpts pool is host-wide. Each
/// sandbox gets at most this fraction of what the host grants the uid, so one sandbox holding
/// all it can leaves the host and other sandboxes working.
pub const POOL_SHARE_DIVISOR: u64 = 8;

/// Pseudo-terminals one sandbox's devpts instance may hold (`max=` of its mount). The host's
/// instances other than its own share `kernel.pty.max` minus `kernel.pty.reserve` (3,072 by
/// default): 48 sandboxes at this bound before the pool is empty, and the host's own devpts
/// keeps its reserve whatever they hold.
pub const SANDBOX_PTYS: u64 = 64;

/// Most queued signals and POSIX timers (`RLIMIT_SIGPENDING`) one sandbox may hold whatever
/// the host's limit is (an unlimited one included).
pub const MAX_SANDBOX_PENDING_SIGNALS: u64 = 1 << 16;

/// Most POSIX message-queue bytes (`RLIMIT_MSGQUEUE`) one sandbox may hold whatever the
/// host's limit is.
pub const MAX_SANDBOX_MESSAGE_QUEUE_BYTES: u64 = 8 << 20;

/// Most locked memory (`RLIMIT_MEMLOCK`: `mlock` per process, `SHM_LOCK` per uid) one sandbox
/// may hold whatever the host's limit is.
pub const MAX_SANDBOX_LOCKED_BYTES: u64 = 64 << 20;

/// [`POOL_SHARE_DIVISOR`] of `host`, at least 1 and at most `cap`.
pub fn pool_share(host: u64, cap: u64) -> u64 {
    (host / POOL_SHARE_DIVISOR).clamp(1, cap)
}

/// Sets `RLIMIT_SIGPENDING`, `RLIMIT_MSGQUEUE` and `RLIMIT_MEMLOCK` (soft and hard) of the
/// calling process to its share of what it has now ([`pool_share`]): a sandboxed command's
/// queued signals, POSIX timers, message-queue bytes and `SHM_LOCK`ed bytes are counted per user namespace against these, while what it
/// adds to the host uid's count is checked against the limits the sandbox's user namespace was
/// created with (the host's). Lowering those instead (in the process that creates the
/// namespace) would cap the host uid's whole count at one share, so a second sandbox would get
/// nothing while the first holds its share. Irreversible; call it right before `execve`.
///
/// # Errors
/// The resource and the OS error of the `setrlimit` that failed.
#[cfg(target_os = "linux")]
pub fn apply_pool_rlimits_to_current_process() -> Result<(), LimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    for (kernel, name, cap) in [
        (
            Resource::RLIMIT_SIGPENDING,
            "RLIMIT_SIGPENDING",
            MAX_SANDBOX_PENDING_SIGNALS,
        ),
        (
            Resource::RLIMIT_MSGQUEUE,
            "RLIMIT_MSGQUEUE",
            MAX_SANDBOX_MESSAGE_QUEUE_BYTES,
        ),
        (
            Resource::RLIMIT_MEMLOCK,
            "RLIMIT_MEMLOCK",
            MAX_SANDBOX_LOCKED_BYTES,
        ),
    ] {
        let (soft, _) = getrlimit(kernel).map_err(|source| LimitError::SetShare {
            resource: name,
            value: 0,
            source: source.into(),
        })?;
        let share = pool_share(soft, cap);
        setrlimit(kernel, share, share).map_err(|source| LimitError::SetShare {
            resource: name,
            value: share,
            source: source.into(),
        })?;
    }
    Ok(())
}

/// Why a limit could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// Reading or setting a pool share's rlimit failed.
    #[error("setting {resource} to its share {value} failed: {source}")]
    SetShare {
        /// The resource, as `setrlimit` names it.
        resource: &'static str,
        /// The share (0 when reading the current limit failed).
        value: u64,
        /// The OS error.
        source: std::io::Error,
    },
    /// `setrlimit` failed.
    #[error("setting {resource:?} to {value} failed: {source}")]
    Set {
        /// The resource.
        resource: Rlimit,
        /// The soft limit asked for.
        value: u64,
        /// The OS error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn cpu_gets_a_hard_limit_one_second_above_the_soft_one() {
        let limits = CommandLimits {
            cpu_seconds: Some(3),
            open_files: Some(64),
            ..CommandLimits::default()
        };
        assert_eq!(
            limits.rlimits(),
            vec![(Rlimit::Cpu, 3, 4), (Rlimit::OpenFiles, 64, 64)]
        );
        assert!(CommandLimits::default().rlimits().is_empty());
        assert!(CommandLimits::default().is_empty() && !limits.is_empty());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let parsed = serde_json::from_str::<CommandLimits>(r#"{"cpu_secs": 1}"#);
        assert!(
            parsed.is_err(),
            "a misspelt limit must not silently not apply"
        );
    }
}
