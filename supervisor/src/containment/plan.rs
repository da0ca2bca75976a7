//! Pure decisions, no I/O: which mechanism enforces each limit on this host, the limits of
//! `--default-limits`, and why a process ended.

use std::time::Duration;

use proto::methods::process::{
    AppliedLimit, AppliedLimits, Enforcement, ExitReason, LimitName, LimitScope, Limits,
};
use sandbox::limits::CommandLimits;

use crate::limits::MAX_WALL_SECONDS;

/// A cgroup hierarchy version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The unified hierarchy.
    V2,
    /// A per-controller v1 hierarchy.
    V1,
}

impl CgroupVersion {
    fn enforcement(self) -> Enforcement {
        match self {
            CgroupVersion::V2 => Enforcement::CgroupV2,
            CgroupVersion::V1 => Enforcement::CgroupV1,
        }
    }
}

/// What the host offers for limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Each process gets a cgroup v2 leaf (so its `cpu.stat` measures the tree's CPU).
    pub tracking: bool,
    /// Where a memory controller can bound a tree.
    pub memory: Option<CgroupVersion>,
    /// Where a pids controller can bound a tree.
    pub pids: Option<CgroupVersion>,
}

/// How one start's limits are enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// What the result reports.
    pub applied: AppliedLimits,
    /// The memory controller and its limit.
    pub memory: Option<(CgroupVersion, u64)>,
    /// The pids controller and its limit.
    pub pids: Option<(CgroupVersion, u64)>,
    /// The command's rlimits (and, for `sandbox-run`, its wall clock).
    pub rlimits: CommandLimits,
    /// Wall-clock limit the server enforces.
    pub wall: Option<Duration>,
    /// CPU budget of the whole tree, measured in its cgroup.
    pub cpu_budget: Option<Duration>,
    /// Best effort was asked: a limit nothing enforces is reported, not refused.
    pub best_effort: bool,
}

impl Plan {
    /// Whether a tree made for `other` is the tree this plan makes: the same controllers with
    /// the same limits (the rest of a plan is enforced outside the cgroups).
    pub fn same_cgroups(&self, other: &Plan) -> bool {
        self.memory == other.memory && self.pids == other.pids
    }
}

/// Why a start's limits were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A limit of 0.
    #[error("limits.{limit} must be at least 1 (got 0)")]
    Zero {
        /// The limit.
        limit: LimitName,
    },
    /// Longer than [`MAX_WALL_SECONDS`].
    #[error("limits.wallSeconds must be at most {max} (MAX_WALL_SECONDS, 365 days; got {value})")]
    WallTooLong {
        /// What was asked.
        value: u64,
        /// The cap.
        max: u64,
    },
    /// Nothing on this host can enforce it and best effort was not asked.
    #[error(
        "limits.{limit} ({value}) cannot be enforced on this host: {reason}; pass \
         limits.bestEffort: true to start without it (the result then says what was applied)"
    )]
    Unenforceable {
        /// The limit.
        limit: LimitName,
        /// What was asked.
        value: u64,
        /// What is missing.
        reason: String,
    },
}

fn applied(
    value: u64,
    enforcement: Enforcement,
    scope: LimitScope,
    detail: String,
) -> AppliedLimit {
    AppliedLimit {
        value,
        enforcement,
        scope,
        detail,
    }
}

/// Decide how `limits` are enforced with `caps`.
///
/// # Errors
/// [`PlanError`] for a zero or too long limit, or one nothing here enforces (without best
/// effort).
pub fn plan(limits: &Limits, caps: Capabilities) -> Result<Plan, PlanError> {
    use Enforcement::{Rlimit, Timer};
    use LimitScope::{Process, Tree};
    for name in LimitName::ALL {
        if limits.get(name) == Some(0) {
            return Err(PlanError::Zero { limit: name });
        }
    }
    let mut plan = Plan {
        best_effort: limits.best_effort,
        ..Plan::default()
    };
    if let Some(bytes) = limits.memory_bytes {
        let detail = match caps.memory {
            Some(version @ CgroupVersion::V2) => {
                plan.memory = Some((version, bytes));
                applied(
                    bytes,
                    version.enforcement(),
                    Tree,
                    "memory.max + memory.swap.max".into(),
                )
            }
            Some(version @ CgroupVersion::V1) => {
                plan.memory = Some((version, bytes));
                let detail = "memory.limit_in_bytes + memory.memsw.limit_in_bytes";
                applied(bytes, version.enforcement(), Tree, detail.into())
            }
            None if limits.best_effort => {
                plan.rlimits.address_space_bytes = Some(bytes);
                let detail = "RLIMIT_AS: address space of each process (no memory cgroup here)";
                applied(bytes, Rlimit, Process, detail.into())
            }
            None => {
                return Err(PlanError::Unenforceable {
                    limit: LimitName::MemoryBytes,
                    value: bytes,
                    reason: "no memory cgroup controller is available to this server (neither \
                             a v2 controller delegated to its cgroup nor a v1 hierarchy it may \
                             write)"
                        .into(),
                });
            }
        };
        plan.applied.set(LimitName::MemoryBytes, detail);
    }
    if let Some(count) = limits.processes {
        let detail = match caps.pids {
            Some(version) => {
                plan.pids = Some((version, count));
                applied(count, version.enforcement(), Tree, "pids.max".into())
            }
            None if limits.best_effort => applied(
                count,
                Enforcement::None,
                Tree,
                "not enforced: no pids cgroup here".into(),
            ),
            None => {
                return Err(PlanError::Unenforceable {
                    limit: LimitName::Processes,
                    value: count,
                    reason: "no pids cgroup controller is available to this server (RLIMIT_NPROC \
                             counts every process of the user and does not bind root)"
                        .into(),
                });
            }
        };
        plan.applied.set(LimitName::Processes, detail);
    }
    if let Some(seconds) = limits.cpu_seconds {
        plan.rlimits.cpu_seconds = Some(seconds);
        let detail = if caps.tracking {
            plan.cpu_budget = Some(Duration::from_secs(seconds));
            applied(
                seconds,
                Enforcement::CgroupV2,
                Tree,
                "RLIMIT_CPU on each process, and the tree is killed once its cgroup's cpu.stat \
                 usage reaches it"
                    .into(),
            )
        } else {
            applied(
                seconds,
                Rlimit,
                Process,
                "RLIMIT_CPU (SIGXCPU, SIGKILL a second later)".into(),
            )
        };
        plan.applied.set(LimitName::CpuSeconds, detail);
    }
    if let Some(seconds) = limits.wall_seconds {
        if seconds > MAX_WALL_SECONDS {
            return Err(PlanError::WallTooLong {
                value: seconds,
                max: MAX_WALL_SECONDS,
            });
        }
        plan.wall = Some(Duration::from_secs(seconds));
        plan.rlimits.wall_seconds = Some(seconds);
        let detail = "the server kills the tree when it runs out";
        plan.applied.set(
            LimitName::WallSeconds,
            applied(seconds, Timer, Tree, detail.into()),
        );
    }
    if let Some(bytes) = limits.file_size_bytes {
        plan.rlimits.file_size_bytes = Some(bytes);
        let detail = applied(
            bytes,
            Rlimit,
            Process,
            "RLIMIT_FSIZE (writes past it fail with EFBIG)".into(),
        );
        plan.applied.set(LimitName::FileSizeBytes, detail);
    }
    if let Some(count) = limits.open_files {
        plan.rlimits.open_files = Some(count);
        let detail = applied(count, Rlimit, Process, "RLIMIT_NOFILE".into());
        plan.applied.set(LimitName::OpenFiles, detail);
    }
    plan_pools(limits, &mut plan);
    Ok(plan)
}

/// The bounds on kernel pools the host shares, which the sandbox holds (its user namespace's
/// inotify maxima, its devpts instance, its rlimit shares), each clamped there to the sandbox's
/// share ([`sandbox::limits::PoolLimits`]). A start without a sandbox has none of these:
/// [`Plan::without_sandbox`].
fn plan_pools(limits: &Limits, plan: &mut Plan) {
    let pools = &mut plan.rlimits.pools;
    for name in LimitName::POOLS {
        let Some(value) = limits.get(name) else {
            continue;
        };
        let (slot, detail) = match name {
            LimitName::InotifyInstances => (
                &mut pools.inotify_instances,
                "the sandbox's user namespace max_inotify_instances",
            ),
            LimitName::InotifyWatches => (
                &mut pools.inotify_watches,
                "the sandbox's user namespace max_inotify_watches",
            ),
            LimitName::PendingSignals => (
                &mut pools.pending_signals,
                "RLIMIT_SIGPENDING, queued signals and POSIX timers counted per sandbox",
            ),
            LimitName::MessageQueueBytes => (
                &mut pools.message_queue_bytes,
                "RLIMIT_MSGQUEUE, counted per sandbox",
            ),
            _ => (&mut pools.ptys, "max= of the sandbox's devpts instance"),
        };
        *slot = Some(value);
        let detail = format!(
            "{detail}; never above the sandbox's share of the host's pool (a request above it \
             gets the share)"
        );
        plan.applied.set(
            name,
            applied(value, Enforcement::Sandbox, LimitScope::Tree, detail),
        );
    }
}

impl Plan {
    /// For a sandboxed start that sets no `processes` (nor does `--default-limits`): `share`
    /// processes (the sandbox's share of the host's tasks, `sandbox::limits::processes_share`),
    /// so a fork bomb in one sandbox leaves the host and other sandboxes room. Held by the
    /// tree's pids cgroup where there is one; else by `RLIMIT_NPROC`, which the kernel counts in
    /// the sandbox's own user namespace (so the share is this sandbox's) and does not apply to
    /// uid 0. A start's own `processes` is left as it is.
    pub fn for_sandbox(&mut self, caps: Capabilities, share: u64) {
        if self.applied.get(LimitName::Processes).is_some() {
            return;
        }
        let detail = match caps.pids {
            Some(version) => {
                self.pids = Some((version, share));
                applied(
                    share,
                    version.enforcement(),
                    LimitScope::Tree,
                    "pids.max: the sandbox's default share of the host's tasks".into(),
                )
            }
            None => {
                self.rlimits.processes = Some(share);
                applied(
                    share,
                    Enforcement::Rlimit,
                    LimitScope::Tree,
                    "RLIMIT_NPROC counted in the sandbox's user namespace: the sandbox's default \
                     share of the host's tasks (no pids cgroup here; the kernel does not apply it \
                     to uid 0)"
                        .into(),
                )
            }
        };
        self.applied.set(LimitName::Processes, detail);
    }

    /// For a start without a sandbox: the pool bounds have nothing to hold them (no user
    /// namespace, devpts instance or share of its own), so they refuse the start unless best
    /// effort was asked, which reports them as not enforced.
    ///
    /// # Errors
    /// [`PlanError::Unenforceable`] naming the first pool bound.
    pub fn without_sandbox(&mut self) -> Result<(), PlanError> {
        let best_effort = self.best_effort;
        for name in LimitName::POOLS {
            let Some(value) = self.applied.get(name).map(|applied| applied.value) else {
                continue;
            };
            if !best_effort {
                return Err(PlanError::Unenforceable {
                    limit: name,
                    value,
                    reason: "it bounds what a sandbox takes of a pool the host shares, and this \
                             start has no sandbox"
                        .into(),
                });
            }
            self.applied.set(
                name,
                applied(
                    value,
                    Enforcement::None,
                    LimitScope::Tree,
                    "not enforced: no sandbox".into(),
                ),
            );
        }
        self.rlimits.pools = sandbox::limits::PoolLimits::default();
        Ok(())
    }
}

/// What enforces each limit here, for `environment/info` (a start without best effort fails
/// for a limit reported as `none`).
pub fn support(caps: Capabilities) -> proto::methods::environment::LimitsSupport {
    let cgroup = |version: Option<CgroupVersion>| {
        version.map_or(Enforcement::None, CgroupVersion::enforcement)
    };
    proto::methods::environment::LimitsSupport {
        memory_bytes: cgroup(caps.memory),
        processes: cgroup(caps.pids),
        cpu_seconds: if caps.tracking {
            Enforcement::CgroupV2
        } else {
            Enforcement::Rlimit
        },
        wall_seconds: Enforcement::Timer,
        file_size_bytes: Enforcement::Rlimit,
        open_files: Enforcement::Rlimit,
        // Held by a sandbox only (`Plan::without_sandbox`).
        inotify_instances: Enforcement::None,
        inotify_watches: Enforcement::None,
        pending_signals: Enforcement::None,
        message_queue_bytes: Enforcement::None,
        ptys: Enforcement::None,
    }
}

/// Why `--default-limits` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--default-limits: {item:?} {problem}; expected comma-separated NAME=VALUE items with NAME \
     one of memoryBytes, processes, cpuSeconds, wallSeconds, fileSizeBytes, openFiles, \
     inotifyInstances, inotifyWatches, pendingSignals, messageQueueBytes, ptys (byte sizes may \
     end in K, M or G), and optionally bestEffort, e.g. \
     memoryBytes=2G,processes=512,wallSeconds=3600"
)]
pub struct DefaultLimitsError {
    /// The item.
    pub item: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// Parse `--default-limits` (`memoryBytes=2G,processes=512,bestEffort`).
///
/// # Errors
/// [`DefaultLimitsError`] naming the item.
pub fn parse_default_limits(text: &str) -> Result<Limits, DefaultLimitsError> {
    let mut limits = Limits::default();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let error = |problem| DefaultLimitsError {
            item: item.to_owned(),
            problem,
        };
        if item == "bestEffort" {
            limits.best_effort = true;
            continue;
        }
        let (name, value) = item.split_once('=').ok_or_else(|| error("has no '='"))?;
        let name = LimitName::ALL
            .into_iter()
            .find(|known| known.as_str() == name.trim())
            .ok_or_else(|| error("names no limit"))?;
        let sized = matches!(
            name,
            LimitName::MemoryBytes | LimitName::FileSizeBytes | LimitName::MessageQueueBytes
        );
        let value = parse_number(value.trim(), sized).ok_or_else(|| error("is not a number"))?;
        if value == 0 {
            return Err(error("is zero"));
        }
        limits.set(name, Some(value));
    }
    Ok(limits)
}

fn parse_number(text: &str, sized: bool) -> Option<u64> {
    let (digits, unit) = match text.as_bytes().last() {
        Some(b'K' | b'k') if sized => (&text[..text.len() - 1], 1u64 << 10),
        Some(b'M' | b'm') if sized => (&text[..text.len() - 1], 1 << 20),
        Some(b'G' | b'g') if sized => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// What is known about a process when it has exited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitFacts {
    /// Exit code (128+n for signal n).
    pub code: i32,
    /// The killing signal.
    pub signal: Option<i32>,
    /// `process/terminate`, session expiry or shutdown asked for it.
    pub terminated: bool,
    /// The server's wall-clock timer killed the tree.
    pub wall_fired: bool,
    /// The tree's CPU budget ran out and the server killed it.
    pub cpu_budget_fired: bool,
    /// OOM kills in the tree's memory cgroup.
    pub oom_kills: u64,
    /// CPU time of the process and its reaped descendants.
    pub cpu_used: Duration,
    /// `cpuSeconds`, when set.
    pub cpu_limit: Option<Duration>,
    /// Time since the start.
    pub elapsed: Duration,
    /// `wallSeconds`, when set.
    pub wall_limit: Option<Duration>,
}

/// Why a process ended. What the server did itself comes first; then what the kernel says
/// (an OOM kill in the tree unless the process still succeeded, SIGXCPU, a SIGKILL past the CPU
/// rlimit); a SIGKILL after the wall-clock limit is `sandbox-run`'s own timer.
pub fn exit_reason(facts: &ExitFacts) -> ExitReason {
    let killed = facts.signal == Some(libc::SIGKILL);
    if facts.terminated {
        ExitReason::Terminated
    } else if facts.wall_fired {
        ExitReason::WallTimeout
    } else if facts.cpu_budget_fired {
        ExitReason::CpuLimit
    } else if facts.oom_kills > 0 && !(facts.signal.is_none() && facts.code == 0) {
        ExitReason::Oom
    } else if facts.signal == Some(libc::SIGXCPU)
        || (killed && facts.cpu_limit.is_some_and(|limit| facts.cpu_used >= limit))
    {
        ExitReason::CpuLimit
    } else if killed && facts.wall_limit.is_some_and(|limit| facts.elapsed >= limit) {
        ExitReason::WallTimeout
    } else if facts.signal.is_some() {
        ExitReason::Signal
    } else {
        ExitReason::Exit
    }
}

#[cfg(test)]
mod tests;
