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
    /// The sandbox's bounds on kernel pools the host shares, below its share.
    #[serde(default, skip_serializing_if = "PoolLimits::is_empty")]
    pub pools: PoolLimits,
}

/// What one sandbox may take of the kernel pools its host shares, when asked for less than its
/// share ([`pool_share`], [`SANDBOX_PTYS`]): each bound is clamped to the share, so no request
/// raises a sandbox above it. Every field optional (absent: the share).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolLimits {
    /// Inotify instances of the sandbox's user namespace (`max_inotify_instances`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_instances: Option<u64>,
    /// Inotify watches of the sandbox's user namespace (`max_inotify_watches`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_watches: Option<u64>,
    /// Queued signals and POSIX timers (`RLIMIT_SIGPENDING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_signals: Option<u64>,
    /// POSIX message-queue bytes (`RLIMIT_MSGQUEUE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_queue_bytes: Option<u64>,
    /// Pseudo-terminals of the sandbox's devpts instance (its `max=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptys: Option<u64>,
}

impl PoolLimits {
    /// No bound is set.
    pub fn is_empty(&self) -> bool {
        self == &PoolLimits::default()
    }

    /// Whether a bound is one the sandbox's mounts hold (its user namespace's inotify maxima,
    /// its devpts instance), built when the sandbox is set up: a launcher, which prepares each
    /// command's sandbox before the command (and its limits) arrives, cannot apply it.
    pub fn set_at_setup(&self) -> bool {
        self.inotify_instances.is_some() || self.inotify_watches.is_some() || self.ptys.is_some()
    }

    /// The `max=` of the sandbox's devpts instance: [`SANDBOX_PTYS`], or less when asked.
    pub fn ptys(&self) -> u64 {
        self.ptys
            .map_or(SANDBOX_PTYS, |asked| asked.clamp(1, SANDBOX_PTYS))
    }

    /// The inotify maximum of the sandbox's user namespace for the host's `host` (instances
    /// when `watches` is false): its share, or less when asked.
    pub fn inotify(&self, host: u64, watches: bool) -> u64 {
        let asked = if watches {
            self.inotify_watches
        } else {
            self.inotify_instances
        };
        bounded_share(host, i32::MAX as u64, asked)
    }
}

/// [`pool_share`] of `host` (at most `cap`), or `asked` when that is less (at least 1).
pub fn bounded_share(host: u64, cap: u64, asked: Option<u64>) -> u64 {
    let share = pool_share(host, cap);
    asked.map_or(share, |asked| asked.clamp(1, share))
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

/// Open descriptors (`RLIMIT_NOFILE`, soft and hard) of every sandboxed process whose start
/// sets no `openFiles` (never more than the server's own soft limit). Besides bounding each
/// process's descriptor table, it is the sandbox's bound on the host uid's descriptors in
/// flight over unix sockets (`SCM_RIGHTS`): the kernel charges those to the sender's uid and
/// refuses a send (`ETOOMANYREFS`) once the uid's count is above the *sender's* soft
/// `RLIMIT_NOFILE`, unless the sender has `CAP_SYS_RESOURCE` or `CAP_SYS_ADMIN` in the initial
/// user namespace (a sandboxed process never does). So a sandbox brings the uid's count to at
/// most this plus [`SCM_MAX_FD`] (765), below [`HOST_DEFAULT_OPEN_FILES`]: a host process of
/// the uid at that default still sends. The count is the uid's, compared with each sender's
/// own limit, so while one sandbox holds all it can, a second sandbox with this same limit is
/// refused: this pool has no per-sandbox share. 512 descriptors per process leave room for a parallel build (compilers and
/// linkers hold tens; a build's processes each have their own table).
pub const SANDBOX_OPEN_FILES: u64 = 512;

/// The `RLIMIT_NOFILE` [`apply_pool_rlimits_to_current_process`] gives a command of `limits`
/// started from this process (None when it cannot be read).
#[cfg(target_os = "linux")]
pub fn open_files_of_current_process(limits: &CommandLimits) -> Option<u64> {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    Some(open_files_share(soft, limits.open_files))
}

/// Most descriptors one `SCM_RIGHTS` message carries (the kernel's `SCM_MAX_FD`): what a send
/// checked just below the limit adds at most.
pub const SCM_MAX_FD: u64 = 253;

/// The soft `RLIMIT_NOFILE` every process starts with (the kernel's `INR_OPEN_CUR`).
pub const HOST_DEFAULT_OPEN_FILES: u64 = 1024;

// A sandbox's descriptors in flight leave room below the host's default soft limit.
const _: () = assert!(SANDBOX_OPEN_FILES + SCM_MAX_FD < HOST_DEFAULT_OPEN_FILES);

/// `RLIMIT_NOFILE` of a sandboxed command whose soft limit is `current` now: what it asked
/// for (`openFiles`), or [`SANDBOX_OPEN_FILES`] (at most `current`) when it asked nothing.
pub fn open_files_share(current: u64, asked: Option<u64>) -> u64 {
    asked.unwrap_or_else(|| current.min(SANDBOX_OPEN_FILES))
}

/// Most processes (threads included) a sandbox gets by default whatever the host allows.
pub const MAX_SANDBOX_PROCESSES: u64 = 8192;

/// The host's process IDs when `/proc/sys/kernel/pid_max` cannot be read (the kernel's
/// `PID_MAX_DEFAULT`).
pub const HOST_PID_MAX_DEFAULT: u64 = 32_768;

/// The processes (threads included) of a sandbox whose start sets no `processes`: its share
/// ([`pool_share`]) of the fewest tasks the host allows the uid: `kernel.pid_max` (process IDs
/// are host-wide: every task of every PID namespace takes one), `kernel.threads-max`, and
/// `uid_nproc`, the soft `RLIMIT_NPROC` of the server's uid (a host process of a uid other than
/// root is refused a fork past it, sandboxes' processes counted). At most
/// [`MAX_SANDBOX_PROCESSES`]. On a host at the default `pid_max` of 32,768 that is 4,096: a fork
/// bomb leaves seven eighths to the host and other sandboxes, and a parallel build (a few
/// processes and threads per job, a job per core) stays in the hundreds.
pub fn processes_share(pid_max: u64, threads_max: u64, uid_nproc: u64) -> u64 {
    pool_share(
        pid_max.min(threads_max).min(uid_nproc),
        MAX_SANDBOX_PROCESSES,
    )
}

/// [`processes_share`] of this host (the calling process's `RLIMIT_NPROC`; a `pid_max` or
/// `threads-max` that cannot be read counts as [`HOST_PID_MAX_DEFAULT`]).
#[cfg(target_os = "linux")]
pub fn host_processes_share() -> u64 {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(HOST_PID_MAX_DEFAULT)
    };
    let nproc = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC)
        .map_or(u64::MAX, |(soft, _)| soft);
    processes_share(
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
        nproc,
    )
}

/// [`POOL_SHARE_DIVISOR`] of `host`, at least 1 and at most `cap`.
pub fn pool_share(host: u64, cap: u64) -> u64 {
    (host / POOL_SHARE_DIVISOR).clamp(1, cap)
}

/// Sets `RLIMIT_SIGPENDING`, `RLIMIT_MSGQUEUE` and `RLIMIT_MEMLOCK` (soft and hard) of the
/// calling process to its share of what it has now ([`pool_share`]), or to the smaller bound
/// `pools` asks for: a sandboxed command's
/// queued signals, POSIX timers, message-queue bytes and `SHM_LOCK`ed bytes are counted per user namespace against these, while what it
/// adds to the host uid's count is checked against the limits the sandbox's user namespace was
/// created with (the host's). Lowering those instead (in the process that creates the
/// namespace) would cap the host uid's whole count at one share, so a second sandbox would get
/// nothing while the first holds its share. Irreversible; call it right before `execve`.
///
/// # Errors
/// The resource and the OS error of the `setrlimit` that failed.
/// Without an `openFiles` of its own, `RLIMIT_NOFILE` too is set to [`SANDBOX_OPEN_FILES`]
/// (see there: the sandbox's bound on the uid's descriptors in flight); an `openFiles` is set
/// by [`CommandLimits::apply_rlimits_to_current_process`] afterwards.
#[cfg(target_os = "linux")]
pub fn apply_pool_rlimits_to_current_process(limits: &CommandLimits) -> Result<(), LimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let pools = &limits.pools;
    if limits.open_files.is_none() {
        let (soft, _) =
            getrlimit(Resource::RLIMIT_NOFILE).map_err(|source| LimitError::SetShare {
                resource: "RLIMIT_NOFILE",
                value: 0,
                source: source.into(),
            })?;
        let share = open_files_share(soft, None);
        setrlimit(Resource::RLIMIT_NOFILE, share, share).map_err(|source| {
            LimitError::SetShare {
                resource: "RLIMIT_NOFILE",
                value: share,
                source: source.into(),
            }
        })?;
    }
    for (kernel, name, cap, asked) in [
        (
            Resource::RLIMIT_SIGPENDING,
            "RLIMIT_SIGPENDING",
            MAX_SANDBOX_PENDING_SIGNALS,
            pools.pending_signals,
        ),
        (
            Resource::RLIMIT_MSGQUEUE,
            "RLIMIT_MSGQUEUE",
            MAX_SANDBOX_MESSAGE_QUEUE_BYTES,
            pools.message_queue_bytes,
        ),
        (
            Resource::RLIMIT_MEMLOCK,
            "RLIMIT_MEMLOCK",
            MAX_SANDBOX_LOCKED_BYTES,
            None,
        ),
    ] {
        let (soft, _) = getrlimit(kernel).map_err(|source| LimitError::SetShare {
            resource: name,
            value: 0,
            source: source.into(),
        })?;
        let share = bounded_share(soft, cap, asked);
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
    fn a_pool_bound_is_clamped_to_the_share() {
        let asked = PoolLimits {
            inotify_instances: Some(3),
            inotify_watches: Some(1 << 40),
            ptys: Some(1000),
            ..PoolLimits::default()
        };
        assert_eq!(asked.inotify(128, false), 3);
        assert_eq!(asked.inotify(128, true), 16, "above the share: the share");
        assert_eq!(asked.ptys(), SANDBOX_PTYS);
        assert_eq!(PoolLimits::default().inotify(128, false), 16);
        assert_eq!(PoolLimits::default().ptys(), SANDBOX_PTYS);
        assert_eq!(bounded_share(1 << 20, 8 << 20, Some(100)), 100);
        assert_eq!(bounded_share(1 << 20, 8 << 20, Some(1 << 30)), 1 << 17);
        assert_eq!(bounded_share(u64::MAX, 8 << 20, None), 8 << 20);
        assert!(asked.set_at_setup());
        let rlimits_only = PoolLimits {
            pending_signals: Some(4),
            ..PoolLimits::default()
        };
        assert!(!rlimits_only.set_at_setup() && !rlimits_only.is_empty());
        let limits = CommandLimits {
            pools: rlimits_only,
            ..CommandLimits::default()
        };
        assert!(
            limits.rlimits().is_empty(),
            "pool bounds are no plain rlimits"
        );
    }

    #[test]
    fn a_sandbox_gets_open_files_below_the_hosts_default_unless_it_asks() {
        assert_eq!(open_files_share(20_000, None), SANDBOX_OPEN_FILES);
        assert_eq!(open_files_share(100, None), 100, "never above the server's");
        assert_eq!(
            open_files_share(20_000, Some(4096)),
            4096,
            "openFiles is the caller's"
        );
    }

    #[test]
    fn a_sandbox_gets_an_eighth_of_the_fewest_tasks_the_host_allows() {
        assert_eq!(processes_share(32_768, 192_730, 96_365), 4096);
        assert_eq!(
            processes_share(32_768, 192_730, 1000),
            125,
            "the uid's RLIMIT_NPROC"
        );
        assert_eq!(
            processes_share(4_194_304, 1 << 22, u64::MAX),
            MAX_SANDBOX_PROCESSES
        );
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
