//! The limits the server enforces itself, one task per limited process, each ending with the
//! process: the wall clock, and the CPU budget of a whole tree (rlimits only bound each
//! process; the tree's cgroup measures all of them together).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::managed::ManagedProcess;
use crate::limits::CPU_BUDGET_MIN_CHECK;

/// Kill the tree if it is still running `after` its start. The cause is recorded first, so
/// the exit reason says `wallTimeout`.
pub fn watch_wall_clock(process: Arc<ManagedProcess>, after: Duration) {
    tokio::spawn(async move {
        let left = after.saturating_sub(process.started.elapsed());
        if process.wait_exit(left).await {
            return;
        }
        process.kills.wall.store(true, Ordering::Relaxed);
        process.kill_tree().await;
    });
}

/// Kill the tree once its cgroup's CPU usage reaches `budget`. Checks only when the budget
/// could have run out at the earliest (every CPU busy since the last check), so an idle tree
/// costs a check every few seconds at most.
pub fn watch_cpu_budget(process: Arc<ManagedProcess>, budget: Duration) {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let cpus = u32::try_from(cpus).unwrap_or(1);
    tokio::spawn(async move {
        loop {
            let Some(used) = process.tree().cpu_usage() else {
                return;
            };
            if used >= budget {
                process.kills.cpu.store(true, Ordering::Relaxed);
                process.kill_tree().await;
                return;
            }
            let pause = ((budget - used) / cpus).max(CPU_BUDGET_MIN_CHECK);
            if process.wait_exit(pause).await {
                return;
            }
        }
    });
}
