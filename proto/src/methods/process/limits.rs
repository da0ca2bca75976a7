//! `limits` of `process/start` and how each limit is enforced: the requested [`Limits`], the
//! limit names, and the [`AppliedLimits`] a start reports.

use serde::{Deserialize, Serialize};

use super::is_false;

/// `limits` of `process/start`: bounds on the whole process tree the command starts. Every
/// field is optional; unknown fields are refused (a misspelt limit must not silently not
/// apply).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// Memory of the whole tree, swap included (cgroup `memory.max` + `memory.swap.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Processes (and threads) alive at once in the tree (cgroup `pids.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// CPU time: each process gets `RLIMIT_CPU` (SIGXCPU, then SIGKILL a second later), and
    /// where the tree's usage is measurable the whole tree is killed once it used this much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// Wall-clock time from the start; then the whole tree is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<u64>,
    /// Largest file a process may write (`RLIMIT_FSIZE`; a write past it fails with `EFBIG`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// Open descriptors per process (`RLIMIT_NOFILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
    /// Inotify instances the sandbox may hold (its user namespace's `max_inotify_instances`);
    /// at most its share of the host uid's. Sandboxed starts only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_instances: Option<u64>,
    /// Inotify watches the sandbox may hold (`max_inotify_watches`); at most its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_watches: Option<u64>,
    /// Queued signals and POSIX timers (`RLIMIT_SIGPENDING`, counted per sandbox); at most its
    /// share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_signals: Option<u64>,
    /// POSIX message-queue bytes (`RLIMIT_MSGQUEUE`, counted per sandbox); at most its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_queue_bytes: Option<u64>,
    /// Pseudo-terminals of the sandbox's own devpts instance (its `max=`); at most 64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptys: Option<u64>,
    /// Start even when a limit cannot be enforced on this host; the result says what was
    /// applied. Without it such a start fails, naming the limit.
    #[serde(default, skip_serializing_if = "is_false")]
    pub best_effort: bool,
}

/// The limits `process/start` can set, by their wire names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum LimitName {
    /// `memoryBytes`.
    MemoryBytes,
    /// `processes`.
    Processes,
    /// `cpuSeconds`.
    CpuSeconds,
    /// `wallSeconds`.
    WallSeconds,
    /// `fileSizeBytes`.
    FileSizeBytes,
    /// `openFiles`.
    OpenFiles,
    /// `inotifyInstances`.
    InotifyInstances,
    /// `inotifyWatches`.
    InotifyWatches,
    /// `pendingSignals`.
    PendingSignals,
    /// `messageQueueBytes`.
    MessageQueueBytes,
    /// `ptys`.
    Ptys,
}

impl LimitName {
    /// Every limit, in wire order.
    pub const ALL: [LimitName; 11] = [
        LimitName::MemoryBytes,
        LimitName::Processes,
        LimitName::CpuSeconds,
        LimitName::WallSeconds,
        LimitName::FileSizeBytes,
        LimitName::OpenFiles,
        LimitName::InotifyInstances,
        LimitName::InotifyWatches,
        LimitName::PendingSignals,
        LimitName::MessageQueueBytes,
        LimitName::Ptys,
    ];

    /// The limits that bound what a sandbox takes of a kernel pool the host shares: they hold
    /// for sandboxed starts only.
    pub const POOLS: [LimitName; 5] = [
        LimitName::InotifyInstances,
        LimitName::InotifyWatches,
        LimitName::PendingSignals,
        LimitName::MessageQueueBytes,
        LimitName::Ptys,
    ];

    /// The wire name (`memoryBytes`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            LimitName::MemoryBytes => "memoryBytes",
            LimitName::Processes => "processes",
            LimitName::CpuSeconds => "cpuSeconds",
            LimitName::WallSeconds => "wallSeconds",
            LimitName::FileSizeBytes => "fileSizeBytes",
            LimitName::OpenFiles => "openFiles",
            LimitName::InotifyInstances => "inotifyInstances",
            LimitName::InotifyWatches => "inotifyWatches",
            LimitName::PendingSignals => "pendingSignals",
            LimitName::MessageQueueBytes => "messageQueueBytes",
            LimitName::Ptys => "ptys",
        }
    }
}

impl std::fmt::Display for LimitName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Limits {
    /// The value of one limit.
    pub fn get(&self, name: LimitName) -> Option<u64> {
        match name {
            LimitName::MemoryBytes => self.memory_bytes,
            LimitName::Processes => self.processes,
            LimitName::CpuSeconds => self.cpu_seconds,
            LimitName::WallSeconds => self.wall_seconds,
            LimitName::FileSizeBytes => self.file_size_bytes,
            LimitName::OpenFiles => self.open_files,
            LimitName::InotifyInstances => self.inotify_instances,
            LimitName::InotifyWatches => self.inotify_watches,
            LimitName::PendingSignals => self.pending_signals,
            LimitName::MessageQueueBytes => self.message_queue_bytes,
            LimitName::Ptys => self.ptys,
        }
    }

    /// Set one limit.
    pub fn set(&mut self, name: LimitName, value: Option<u64>) {
        let slot = match name {
            LimitName::MemoryBytes => &mut self.memory_bytes,
            LimitName::Processes => &mut self.processes,
            LimitName::CpuSeconds => &mut self.cpu_seconds,
            LimitName::WallSeconds => &mut self.wall_seconds,
            LimitName::FileSizeBytes => &mut self.file_size_bytes,
            LimitName::OpenFiles => &mut self.open_files,
            LimitName::InotifyInstances => &mut self.inotify_instances,
            LimitName::InotifyWatches => &mut self.inotify_watches,
            LimitName::PendingSignals => &mut self.pending_signals,
            LimitName::MessageQueueBytes => &mut self.message_queue_bytes,
            LimitName::Ptys => &mut self.ptys,
        };
        *slot = value;
    }

    /// `self` laid over `defaults`: each limit `self` sets wins, the others come from
    /// `defaults`; best effort when either asks for it.
    pub fn over(&self, defaults: &Limits) -> Limits {
        let mut merged = defaults.clone();
        for name in LimitName::ALL {
            if let Some(value) = self.get(name) {
                merged.set(name, Some(value));
            }
        }
        merged.best_effort = self.best_effort || defaults.best_effort;
        merged
    }

    /// No limit is set.
    pub fn is_empty(&self) -> bool {
        LimitName::ALL.iter().all(|name| self.get(*name).is_none())
    }
}

/// What enforces a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Enforcement {
    /// A cgroup v2 controller of the process's own cgroup.
    CgroupV2,
    /// A cgroup v1 controller (hosts that mount the controllers as v1 beside an empty v2).
    CgroupV1,
    /// A resource limit (`setrlimit`) of each process.
    Rlimit,
    /// The server's own timer, which kills the tree.
    Timer,
    /// The sandbox itself: its user namespace's maxima, its devpts instance, its rlimit shares.
    Sandbox,
    /// Nothing: the host cannot enforce it (only with `bestEffort`).
    None,
}

/// What a limit bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum LimitScope {
    /// The whole process tree together.
    Tree,
    /// Each process on its own (rlimits are per process and inherited).
    Process,
}

/// How one limit of a start is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AppliedLimit {
    /// The limit in force.
    pub value: u64,
    /// What enforces it.
    pub enforcement: Enforcement,
    /// What it bounds.
    pub scope: LimitScope,
    /// The mechanism in words (`memory.max + memory.swap.max`, `RLIMIT_CPU`, ...).
    pub detail: String,
}

/// How each limit in force is enforced (absent: not set).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AppliedLimits {
    /// `memoryBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<AppliedLimit>,
    /// `processes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<AppliedLimit>,
    /// `cpuSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<AppliedLimit>,
    /// `wallSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<AppliedLimit>,
    /// `fileSizeBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<AppliedLimit>,
    /// `openFiles`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<AppliedLimit>,
    /// `inotifyInstances`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_instances: Option<AppliedLimit>,
    /// `inotifyWatches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inotify_watches: Option<AppliedLimit>,
    /// `pendingSignals`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_signals: Option<AppliedLimit>,
    /// `messageQueueBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_queue_bytes: Option<AppliedLimit>,
    /// `ptys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptys: Option<AppliedLimit>,
}

impl AppliedLimits {
    /// How one limit is applied.
    pub fn get(&self, name: LimitName) -> Option<&AppliedLimit> {
        match name {
            LimitName::MemoryBytes => self.memory_bytes.as_ref(),
            LimitName::Processes => self.processes.as_ref(),
            LimitName::CpuSeconds => self.cpu_seconds.as_ref(),
            LimitName::WallSeconds => self.wall_seconds.as_ref(),
            LimitName::FileSizeBytes => self.file_size_bytes.as_ref(),
            LimitName::OpenFiles => self.open_files.as_ref(),
            LimitName::InotifyInstances => self.inotify_instances.as_ref(),
            LimitName::InotifyWatches => self.inotify_watches.as_ref(),
            LimitName::PendingSignals => self.pending_signals.as_ref(),
            LimitName::MessageQueueBytes => self.message_queue_bytes.as_ref(),
            LimitName::Ptys => self.ptys.as_ref(),
        }
    }

    /// Record how one limit is applied.
    pub fn set(&mut self, name: LimitName, applied: AppliedLimit) {
        let slot = match name {
            LimitName::MemoryBytes => &mut self.memory_bytes,
            LimitName::Processes => &mut self.processes,
            LimitName::CpuSeconds => &mut self.cpu_seconds,
            LimitName::WallSeconds => &mut self.wall_seconds,
            LimitName::FileSizeBytes => &mut self.file_size_bytes,
            LimitName::OpenFiles => &mut self.open_files,
            LimitName::InotifyInstances => &mut self.inotify_instances,
            LimitName::InotifyWatches => &mut self.inotify_watches,
            LimitName::PendingSignals => &mut self.pending_signals,
            LimitName::MessageQueueBytes => &mut self.message_queue_bytes,
            LimitName::Ptys => &mut self.ptys,
        };
        *slot = Some(applied);
    }
}
