//! Server-wide budgets, reserved before the work they pay for: memory for requests and their
//! answers, descriptors clients make the server hold, live processes, and the blocking work that
//! runs off the async workers.
//!
//! Rules that matter:
//! - **Reserve first.** A request's memory (its payload and the worst case of its answer) is
//!   reserved before it is dispatched; the answer's share travels with the answer and is only
//!   given back once the answer was written to the socket ([`MemoryCharge`]).
//! - **Wait per connection, refuse globally.** Each connection's own limits
//!   ([`MAX_INFLIGHT_BYTES_PER_CONNECTION`], [`MAX_BLOCKING_TASKS_PER_CONNECTION`]) make *its*
//!   requests wait (the reader stops reading: backpressure). The server-wide budgets
//!   ([`MEMORY_BUDGET_BYTES`], descriptors, [`MAX_LIVE_PROCESSES`]) refuse with a retryable
//!   `limitExceeded` instead, so one client's load never queues another's requests behind it.
//! - **Small work is never refused.** Each connection's first [`CONNECTION_MEMORY_ALLOWANCE`]
//!   bytes are its own; only what lies beyond draws on the shared memory budget.
//! - **In flight is not the same as backed.** The reader counts the worst case of an answer in
//!   the connection's in-flight bytes (so one connection holds at most
//!   [`MAX_INFLIGHT_BYTES_PER_CONNECTION`] whatever it pipelines), but memory from the
//!   allowance or the server budget backs only what the work turns out to need (a 4 KiB file's
//!   read is never refused because a 32 MiB one could have been).
//! - **Blocking work is bounded twice.** At most [`MAX_BLOCKING_TASKS`] run server-wide and
//!   [`MAX_BLOCKING_TASKS_PER_CONNECTION`] per connection; CPU-bound work goes to the
//!   low-priority [`CpuPool`] (one thread per core) within the same per-connection slots.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use proto::methods::status::BudgetUse;

use crate::cpu_pool::CpuPool;
use crate::limits::{
    CONNECTION_MEMORY_ALLOWANCE, DESCRIPTOR_RESERVE, MAX_BLOCKING_TASKS,
    MAX_BLOCKING_TASKS_PER_CONNECTION, MAX_BULK_READS, MAX_CLIENT_DESCRIPTORS, MAX_CONNECTIONS,
    MAX_HTTP_REQUESTS, MAX_INFLIGHT_BYTES_PER_CONNECTION, MAX_LIVE_PROCESSES,
    MAX_PENDING_CONNECTIONS, MEMORY_BUDGET_BYTES,
};

/// The smallest client descriptor budget the server starts with, whatever the open-file limit
/// says (below it, the server could not do its job at all).
const MIN_CLIENT_DESCRIPTORS: usize = 256;

/// Why a budget refused.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// The server-wide memory budget cannot take this request now.
    #[error(
        "the server's memory budget ({limit} bytes; MEMORY_BUDGET_BYTES, --memory-budget) has no room for the \
         {needed} bytes this request and its answer need; retry later, or ask for less at once \
         (fs/open + fs/readBlock, a smaller maxBytes)"
    )]
    Memory {
        /// Bytes asked for.
        needed: usize,
        /// The budget.
        limit: usize,
    },
    /// The descriptors clients may make the server hold are all in use.
    #[error(
        "the server already holds its budget of {limit} descriptors for clients (fs handles, \
         process pipes and terminals, helpers); close handles or let processes finish, then retry"
    )]
    Descriptors {
        /// Descriptors asked for.
        needed: usize,
        /// The budget.
        limit: usize,
    },
    /// As many processes as the server runs at once are running.
    #[error(
        "the server already runs {limit} processes (MAX_LIVE_PROCESSES, across all sessions); \
         retry once some have exited"
    )]
    Processes {
        /// The limit.
        limit: usize,
    },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closed,
    /// A blocking task panicked or was cancelled (a bug).
    #[error("a blocking task failed: {0}")]
    TaskFailed(#[source] tokio::task::JoinError),
    /// A CPU pool job panicked, or the pool is gone.
    #[error("a blocking task failed: {0}")]
    CpuJobFailed(#[source] crate::cpu_pool::CpuPoolError),
}

/// The server-wide budgets.
#[derive(Debug)]
pub struct Budgets {
    memory: Arc<Semaphore>,
    memory_limit: usize,
    descriptors: Arc<Semaphore>,
    descriptor_limit: usize,
    processes: Arc<Semaphore>,
    blocking: Arc<Semaphore>,
    bulk_reads: Arc<Semaphore>,
    cpu: CpuPool,
}

impl Budgets {
    /// Budgets sized for `open_file_limit` descriptors of which `open_now` are already in use.
    /// The client descriptor budget is what remains after [`DESCRIPTOR_RESERVE`], two
    /// descriptors per possible connection (pending or not) and one per `http/request`, capped at
    /// [`MAX_CLIENT_DESCRIPTORS`].
    pub fn new(open_file_limit: usize, open_now: usize) -> Self {
        let descriptor_limit = client_descriptor_budget(open_file_limit, open_now);
        Self {
            memory: Arc::new(Semaphore::new(MEMORY_BUDGET_BYTES)),
            memory_limit: MEMORY_BUDGET_BYTES,
            descriptors: Arc::new(Semaphore::new(descriptor_limit)),
            descriptor_limit,
            processes: Arc::new(Semaphore::new(MAX_LIVE_PROCESSES)),
            blocking: Arc::new(Semaphore::new(MAX_BLOCKING_TASKS)),
            bulk_reads: Arc::new(Semaphore::new(MAX_BULK_READS)),
            cpu: CpuPool::new(),
        }
    }

    /// The same budgets with a server-wide memory budget of `bytes` instead of
    /// [`MEMORY_BUDGET_BYTES`] (`--memory-budget`).
    #[must_use]
    pub fn with_memory_limit(mut self, bytes: usize) -> Self {
        self.memory = Arc::new(Semaphore::new(bytes));
        self.memory_limit = bytes;
        self
    }

    /// Budgets for this process: its open-file limit and the descriptors it has open now.
    pub fn for_current_process() -> Self {
        let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| {
                usize::try_from(soft).unwrap_or(usize::MAX)
            });
        let open_now = std::fs::read_dir("/proc/self/fd").map_or(64, Iterator::count);
        Self::new(limit, open_now)
    }

    /// The client descriptor budget.
    pub fn descriptor_limit(&self) -> usize {
        self.descriptor_limit
    }

    /// Descriptors clients make the server hold now.
    pub fn descriptors_in_use(&self) -> usize {
        self.descriptor_limit - self.descriptors.available_permits()
    }

    /// Live-process slots in use (processes running now, across sessions).
    pub fn processes_in_use(&self) -> usize {
        MAX_LIVE_PROCESSES - self.processes.available_permits()
    }

    /// Every server-wide budget with its limit and use, for `GET /status` and `GET /metrics`.
    pub fn usage(&self) -> Vec<BudgetUse> {
        vec![
            in_use("memoryBytes", "bytes", self.memory_limit, &self.memory),
            in_use(
                "clientDescriptors",
                "descriptors",
                self.descriptor_limit,
                &self.descriptors,
            ),
            in_use(
                "liveProcesses",
                "processes",
                MAX_LIVE_PROCESSES,
                &self.processes,
            ),
            in_use("blockingTasks", "tasks", MAX_BLOCKING_TASKS, &self.blocking),
            in_use("bulkReads", "reads", MAX_BULK_READS, &self.bulk_reads),
        ]
    }

    /// Take `count` descriptors from the client budget (refused, not waited for).
    ///
    /// # Errors
    /// [`BudgetError::Descriptors`] when the budget has fewer left.
    pub fn descriptors(&self, count: usize) -> Result<DescriptorCharge, BudgetError> {
        let refused = || BudgetError::Descriptors {
            needed: count,
            limit: self.descriptor_limit,
        };
        let permits = u32::try_from(count).map_err(|_| refused())?;
        let permit = self
            .descriptors
            .clone()
            .try_acquire_many_owned(permits)
            .map_err(|_| refused())?;
        Ok(DescriptorCharge {
            _permit: Some(permit),
        })
    }

    /// Take one live-process slot (refused, not waited for).
    ///
    /// # Errors
    /// [`BudgetError::Processes`] at [`MAX_LIVE_PROCESSES`].
    pub fn process(&self) -> Result<OwnedSemaphorePermit, BudgetError> {
        self.processes
            .clone()
            .try_acquire_owned()
            .map_err(|_| BudgetError::Processes {
                limit: MAX_LIVE_PROCESSES,
            })
    }

    fn reserve_memory(&self, bytes: u32) -> Result<OwnedSemaphorePermit, BudgetError> {
        self.memory
            .clone()
            .try_acquire_many_owned(bytes)
            .map_err(|_| BudgetError::Memory {
                needed: bytes as usize,
                limit: self.memory_limit,
            })
    }
}

/// Descriptors a connection holds: its socket, and the duplicate that watches for its close
/// (`transport::hangup`).
const DESCRIPTORS_PER_CONNECTION: usize = 2;

/// The client descriptor budget for `open_file_limit` with `open_now` in use.
pub fn client_descriptor_budget(open_file_limit: usize, open_now: usize) -> usize {
    open_file_limit
        .saturating_sub(DESCRIPTOR_RESERVE)
        .saturating_sub(DESCRIPTORS_PER_CONNECTION * (MAX_PENDING_CONNECTIONS + MAX_CONNECTIONS))
        .saturating_sub(MAX_HTTP_REQUESTS)
        .saturating_sub(open_now)
        .clamp(MIN_CLIENT_DESCRIPTORS, MAX_CLIENT_DESCRIPTORS)
}

/// Descriptors taken from the client budget; given back on drop.
#[derive(Debug, Default)]
pub struct DescriptorCharge {
    _permit: Option<OwnedSemaphorePermit>,
}

impl DescriptorCharge {
    /// A charge of nothing (for work that holds no descriptor).
    pub fn none() -> Self {
        Self { _permit: None }
    }
}

/// One connection's share: its in-flight bytes, its memory allowance, its blocking slots.
#[derive(Debug, Clone)]
pub struct ConnectionBudget {
    budgets: Arc<Budgets>,
    inflight: Arc<Semaphore>,
    allowance: Arc<Semaphore>,
    blocking: Arc<Semaphore>,
}

impl ConnectionBudget {
    /// A fresh share of `budgets`.
    pub fn new(budgets: Arc<Budgets>) -> Self {
        Self {
            budgets,
            inflight: Arc::new(Semaphore::new(MAX_INFLIGHT_BYTES_PER_CONNECTION)),
            allowance: Arc::new(Semaphore::new(CONNECTION_MEMORY_ALLOWANCE)),
            blocking: Arc::new(Semaphore::new(MAX_BLOCKING_TASKS_PER_CONNECTION)),
        }
    }

    /// This connection's own budgets with their limits and use, for `GET /status`.
    pub fn usage(&self) -> Vec<BudgetUse> {
        vec![
            in_use(
                "inflightBytes",
                "bytes",
                MAX_INFLIGHT_BYTES_PER_CONNECTION,
                &self.inflight,
            ),
            in_use(
                "memoryAllowanceBytes",
                "bytes",
                CONNECTION_MEMORY_ALLOWANCE,
                &self.allowance,
            ),
            in_use(
                "blockingTasks",
                "tasks",
                MAX_BLOCKING_TASKS_PER_CONNECTION,
                &self.blocking,
            ),
        ]
    }

    /// The server-wide budgets.
    pub fn server(&self) -> &Arc<Budgets> {
        &self.budgets
    }

    /// Count `inflight` bytes (at least 1, at most [`MAX_INFLIGHT_BYTES_PER_CONNECTION`]) in the
    /// connection's in-flight bytes, waiting until they fit, and back the first `backed` of them
    /// with memory now: from the connection's allowance or, beyond it, the server's budget.
    /// The rest is backed later, once the work knows what it needs ([`MemoryCharge::back`]).
    ///
    /// # Errors
    /// [`BudgetError::Memory`] when the server's budget cannot take `backed` bytes now;
    /// [`BudgetError::Closed`] when the connection's budget was closed.
    pub async fn reserve(
        &self,
        inflight: usize,
        backed: usize,
    ) -> Result<MemoryCharge, BudgetError> {
        let inflight = self
            .inflight
            .clone()
            .acquire_many_owned(clamp_bytes(inflight))
            .await
            .map_err(|_| BudgetError::Closed)?;
        let mut charge = MemoryCharge {
            inflight: Some(inflight),
            allowance: None,
            server: None,
        };
        charge.back(self, backed)?;
        Ok(charge)
    }

    /// Count `bytes` in the connection's in-flight bytes if they fit now (without backing them
    /// with memory); `None` when they do not.
    pub fn try_count_inflight(&self, bytes: usize) -> Option<MemoryCharge> {
        let inflight = self
            .inflight
            .clone()
            .try_acquire_many_owned(clamp_bytes(bytes))
            .ok()?;
        Some(MemoryCharge {
            inflight: Some(inflight),
            allowance: None,
            server: None,
        })
    }

    /// Back `bytes` with memory now, without counting them in flight and without waiting: for
    /// bytes the server holds before they become a request (an unfinished message).
    ///
    /// # Errors
    /// [`BudgetError::Memory`] when the server's budget cannot take them now.
    pub fn hold(&self, bytes: usize) -> Result<MemoryCharge, BudgetError> {
        self.overdraft(bytes)
    }

    /// Back `bytes` more with memory, without waiting: from the connection's allowance or,
    /// beyond it, the server's memory budget. (Not counted in the in-flight bytes, which only
    /// the reader waits for: waiting here could queue behind it.)
    ///
    /// # Errors
    /// [`BudgetError::Memory`] when the server's budget cannot take them now.
    fn overdraft(&self, bytes: usize) -> Result<MemoryCharge, BudgetError> {
        let refused = || BudgetError::Memory {
            needed: bytes,
            limit: self.budgets.memory_limit,
        };
        let permits = u32::try_from(bytes).map_err(|_| refused())?;
        let (allowance, server) = match self.allowance.clone().try_acquire_many_owned(permits) {
            Ok(permit) => (Some(permit), None),
            Err(_) => (None, Some(self.budgets.reserve_memory(permits)?)),
        };
        Ok(MemoryCharge {
            inflight: None,
            allowance,
            server,
        })
    }

    /// Run `work` on tokio's blocking pool (I/O: filesystem calls, helper exchanges, spawning)
    /// once this connection and the server have a free slot (waits for both).
    ///
    /// # Errors
    /// [`BudgetError::Closed`] at shutdown, [`BudgetError::TaskFailed`] when `work` panicked.
    pub async fn blocking<F, R>(&self, work: F) -> Result<R, BudgetError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let _own = self.own_slot().await?;
        let _server = self
            .budgets
            .blocking
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BudgetError::Closed)?;
        tokio::task::spawn_blocking(work)
            .await
            .map_err(BudgetError::TaskFailed)
    }

    /// Wait for a turn at a bulk read (an `fs/readFile` of at least `BULK_READ_BYTES`): at most
    /// [`MAX_BULK_READS`] are read and encoded at once server-wide. Hold the permit until the
    /// answer is built.
    ///
    /// # Errors
    /// [`BudgetError::Closed`] at shutdown.
    pub async fn bulk_read(&self) -> Result<OwnedSemaphorePermit, BudgetError> {
        self.budgets
            .bulk_reads
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BudgetError::Closed)
    }

    /// Run CPU-bound `work` (parsing, encoding) on the low-priority [`CpuPool`] within this
    /// connection's slots. Never for work that starts a process or touches the filesystem
    /// ([`Self::blocking`]).
    ///
    /// # Errors
    /// [`BudgetError::Closed`] at shutdown, [`BudgetError::CpuJobFailed`] when `work` panicked.
    pub async fn cpu<F, R>(&self, work: F) -> Result<R, BudgetError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let _own = self.own_slot().await?;
        self.budgets
            .cpu
            .run(work)
            .await
            .map_err(BudgetError::CpuJobFailed)
    }

    async fn own_slot(&self) -> Result<OwnedSemaphorePermit, BudgetError> {
        self.blocking
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| BudgetError::Closed)
    }
}

/// The use of a budget kept as `semaphore` of `limit` permits.
pub fn in_use(name: &str, unit: &str, limit: usize, semaphore: &Semaphore) -> BudgetUse {
    BudgetUse::new(
        name,
        unit,
        limit as u64,
        limit.saturating_sub(semaphore.available_permits()) as u64,
    )
}

fn clamp_bytes(bytes: usize) -> u32 {
    // MAX_INFLIGHT_BYTES_PER_CONNECTION is far below u32::MAX.
    bytes.clamp(1, MAX_INFLIGHT_BYTES_PER_CONNECTION) as u32
}

/// Memory reserved on a connection: bytes counted in its in-flight share (what its reader waits
/// for) and bytes backed by its allowance or the server's budget (what the process really may
/// hold). Dropping it gives everything back.
#[derive(Debug)]
pub struct MemoryCharge {
    inflight: Option<OwnedSemaphorePermit>,
    allowance: Option<OwnedSemaphorePermit>,
    server: Option<OwnedSemaphorePermit>,
}

impl MemoryCharge {
    /// A charge of nothing (to be backed or merged into later).
    pub fn none() -> Self {
        Self {
            inflight: None,
            allowance: None,
            server: None,
        }
    }

    /// The bytes backed by memory.
    pub fn bytes(&self) -> usize {
        permits(&self.allowance) + permits(&self.server)
    }

    /// The bytes counted in the connection's in-flight share.
    pub fn inflight_bytes(&self) -> usize {
        permits(&self.inflight)
    }

    /// Make sure at least `bytes` are backed, drawing on `budget` without waiting.
    ///
    /// # Errors
    /// [`BudgetError::Memory`] when the server's budget cannot take the difference now.
    pub fn back(&mut self, budget: &ConnectionBudget, bytes: usize) -> Result<(), BudgetError> {
        let more = bytes.saturating_sub(self.bytes());
        if more > 0 {
            self.merge(budget.overdraft(more)?);
        }
        Ok(())
    }

    /// Split off `bytes` of the in-flight share and `bytes` of the backing (as far as each
    /// holds them) into a charge of their own.
    pub fn split(&mut self, bytes: usize) -> MemoryCharge {
        let inflight = split_permit(&mut self.inflight, bytes);
        // Give back the server's bytes first: the allowance is the connection's own.
        let from_server = permits(&self.server).min(bytes);
        let server = split_permit(&mut self.server, from_server);
        let from_allowance = permits(&self.allowance).min(bytes - from_server);
        let allowance = split_permit(&mut self.allowance, from_allowance);
        MemoryCharge {
            inflight,
            allowance,
            server,
        }
    }

    /// Give back everything beyond `bytes`, of the in-flight share and of the backing.
    pub fn shrink_to(&mut self, bytes: usize) {
        let inflight_excess = self.inflight_bytes().saturating_sub(bytes);
        drop(split_permit(&mut self.inflight, inflight_excess));
        let backing_excess = self.bytes().saturating_sub(bytes);
        let from_server = permits(&self.server).min(backing_excess);
        drop(split_permit(&mut self.server, from_server));
        drop(split_permit(
            &mut self.allowance,
            backing_excess - from_server,
        ));
    }

    /// Add `other`'s bytes to this charge.
    pub fn merge(&mut self, other: MemoryCharge) {
        merge_permit(&mut self.inflight, other.inflight);
        merge_permit(&mut self.allowance, other.allowance);
        merge_permit(&mut self.server, other.server);
    }
}

fn permits(slot: &Option<OwnedSemaphorePermit>) -> usize {
    slot.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
}

fn merge_permit(slot: &mut Option<OwnedSemaphorePermit>, other: Option<OwnedSemaphorePermit>) {
    match (slot.as_mut(), other) {
        (Some(held), Some(other)) => held.merge(other),
        (None, other) => *slot = other,
        (Some(_), None) => {}
    }
}

/// Split `n` permits off `slot` (all of it when it holds no more).
fn split_permit(slot: &mut Option<OwnedSemaphorePermit>, n: usize) -> Option<OwnedSemaphorePermit> {
    let held = permits(slot);
    if n == 0 || held == 0 {
        None
    } else if n >= held {
        slot.take()
    } else {
        slot.as_mut()?.split(n)
    }
}

/// What an answer carrying `data` bytes as base64 costs while it is built: the base64 text
/// once in the answer's value and once serialized, plus the rest of the answer.
pub fn content_answer_bytes(data: u64) -> usize {
    let base64 = usize::try_from(data.div_ceil(3) * 4).unwrap_or(usize::MAX / 4);
    2 * base64 + crate::limits::SMALL_RESPONSE_BYTES
}

#[cfg(test)]
mod tests;
