//! One running (or recently finished) process: its event log, stdin, PTY control and signals.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Bytes;

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::watch;

use proto::methods::process::{OutputStream, WriteStatus};

use super::ProcessError;
use super::output::{Exit, LogRead, OutputLog};
use super::retention::{SessionRetention, SharedLog};
use super::spawn::Leader;
use crate::budget::DescriptorCharge;
use crate::containment::Tree;
use crate::limits::{
    MAX_DENIAL_BYTES_RETAINED, MAX_DENIALS_RETAINED, OUTPUT_RETENTION_BYTES, TERMINATE_GRACE,
    WRITE_ID_MEMORY,
};
use crate::sys::ChildExit;

/// Where `process/write` bytes go.
pub enum Stdin {
    /// A pipe (`pipeStdin: true`).
    Pipe(pipe::Sender),
    /// The PTY master.
    Pty(Arc<AsyncFd<OwnedFd>>),
    /// No writable stdin (not requested, or closed).
    Unavailable(&'static str),
}

/// A managed process.
pub struct ManagedProcess {
    /// The caller's id.
    pub id: String,
    /// OS pid, also the process group id.
    pub pid: i32,
    /// `id` as a JSON string literal, for notifications written by hand.
    pub id_json: String,
    log: SharedLog,
    /// Its session's retained output, charged for every chunk before the log takes it.
    retention: Arc<SessionRetention>,
    /// Newest event seq; long-polls wait on it.
    events: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Stdin>,
    write_ids: Mutex<WriteIds>,
    /// The PTY master for resizing; taken away when the process closes.
    pty: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    tty: bool,
    denials: Mutex<DenialLog>,
    /// What the running process holds of the server's budgets; given back when it closes.
    charges: Mutex<Option<ProcessCharges>>,
    /// Started with `auditDenials`.
    audited: std::sync::atomic::AtomicBool,
    /// The leader's pidfd, for signals; dropped when the process closes.
    leader: Mutex<Option<Arc<Leader>>>,
    /// Its cgroups (empty without cgroups).
    tree: Arc<Tree>,
    /// When it started (for `wallSeconds`).
    pub started: Instant,
    /// When it started, by the wall clock (for `process/list`).
    started_at: std::time::SystemTime,
    /// What `process/list` reports of how it was started.
    facts: std::sync::OnceLock<StartFacts>,
    /// What its tree used, measured when the leader exited.
    usage: std::sync::OnceLock<proto::methods::process::ResourceUsage>,
    /// Why the server killed it, for the exit reason.
    pub kills: KillCauses,
}

/// What the server did to a process, recorded before it acts so the exit reason can say so.
#[derive(Debug, Default)]
pub struct KillCauses {
    /// `process/terminate`, session expiry or shutdown.
    pub terminated: AtomicBool,
    /// The wall-clock limit ran out.
    pub wall: AtomicBool,
    /// The tree's CPU budget ran out.
    pub cpu: AtomicBool,
}

/// How a process was started, as `process/list` reports it.
#[derive(Debug, Clone, Default)]
pub struct StartFacts {
    /// Under a sandbox.
    pub sandboxed: bool,
    /// The limits in force and how each is enforced.
    pub limits: Option<proto::methods::process::AppliedLimits>,
}

/// The server-wide budget shares of a running process ([`crate::budget`]).
pub struct ProcessCharges {
    /// Its live-process slot.
    pub live: tokio::sync::OwnedSemaphorePermit,
    /// Its pipes, terminal and pidfd.
    pub descriptors: DescriptorCharge,
}

/// Denial records of an audited process, numbered from 1, bounded in count and bytes.
struct DenialLog {
    /// (number, record, its size as received).
    records: VecDeque<(u64, serde_json::Value, usize)>,
    bytes: usize,
    next: u64,
    dropped: u64,
}

impl Default for DenialLog {
    fn default() -> Self {
        Self {
            records: VecDeque::new(),
            bytes: 0,
            next: 1,
            dropped: 0,
        }
    }
}

/// Denial records after a cursor.
#[derive(Debug, Clone, PartialEq)]
pub struct DenialRead {
    /// The records.
    pub records: Vec<serde_json::Value>,
    /// Their sizes, summed.
    pub bytes: u64,
    /// One past the number of the last record covered.
    pub next: u64,
    /// Records dropped so far (count or byte retention).
    pub dropped: u64,
}

impl DenialLog {
    fn push(&mut self, record: serde_json::Value, size: usize) -> u64 {
        let number = self.next;
        self.records.push_back((number, record, size));
        self.next += 1;
        self.bytes += size;
        while self.records.len() > MAX_DENIALS_RETAINED
            || (self.bytes > MAX_DENIAL_BYTES_RETAINED && self.records.len() > 1)
        {
            if let Some((_, _, size)) = self.records.pop_front() {
                self.bytes -= size;
                self.dropped += 1;
            }
        }
        number
    }

    /// Records numbered after `after` whose sizes fit `budget`; the first one even when it does
    /// not, if `at_least_one`.
    fn read(&self, after: u64, budget: u64, at_least_one: bool) -> DenialRead {
        let mut records = Vec::new();
        let mut bytes = 0u64;
        let mut stopped_at = None;
        for (number, record, size) in self.records.iter().filter(|(n, ..)| *n > after) {
            let size = *size as u64;
            let first = records.is_empty() && at_least_one;
            if !first && bytes + size > budget {
                stopped_at = Some(*number);
                break;
            }
            bytes += size;
            records.push(record.clone());
        }
        DenialRead {
            records,
            bytes,
            next: stopped_at.unwrap_or(self.next).max(after.saturating_add(1)),
            dropped: self.dropped,
        }
    }
}

impl ManagedProcess {
    /// A process that just started.
    pub fn new(
        id: String,
        leader: Arc<Leader>,
        pid: i32,
        tree: Arc<Tree>,
        stdin: Stdin,
        pty: Option<Arc<AsyncFd<OwnedFd>>>,
        retention: Arc<SessionRetention>,
    ) -> Self {
        Self {
            log: retention.new_log(OUTPUT_RETENTION_BYTES),
            retention,
            leader: Mutex::new(Some(leader)),
            tree,
            started: Instant::now(),
            started_at: std::time::SystemTime::now(),
            facts: std::sync::OnceLock::new(),
            usage: std::sync::OnceLock::new(),
            kills: KillCauses::default(),
            id_json: serde_json::Value::String(id.clone()).to_string(),
            id,
            pid,
            events: watch::channel(0).0,
            stdin: tokio::sync::Mutex::new(stdin),
            write_ids: Mutex::new(WriteIds::default()),
            tty: pty.is_some(),
            pty: Mutex::new(pty),
            denials: Mutex::new(DenialLog::default()),
            charges: Mutex::new(None),
            audited: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Record that the process was started with `auditDenials`.
    pub fn mark_audited(&self) {
        self.audited
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the process was started with `auditDenials`.
    pub fn audited(&self) -> bool {
        self.audited.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keep `charges` until the process closes ([`Self::release_io`]).
    pub fn hold_charges(&self, charges: ProcessCharges) {
        *self.charges.lock().unwrap_or_else(|p| p.into_inner()) = Some(charges);
    }

    /// Lock the log; `record` publishes the new seq to long-pollers when the guard's work is done.
    pub fn log(&self) -> MutexGuard<'_, OutputLog> {
        super::retention::lock(&self.log)
    }

    /// Append output, charged to the session before the log holds it; returns its seq.
    pub fn push_output(&self, stream: OutputStream, data: Vec<u8>) -> u64 {
        self.push_output_with(stream, data.len(), |_| data.into())
    }

    /// [`Self::push_output`] of the `len` bytes `data` makes once it knows their seq.
    pub fn push_output_with(
        &self,
        stream: OutputStream,
        len: usize,
        data: impl FnOnce(u64) -> Bytes,
    ) -> u64 {
        self.retention.push(&self.log, stream, len, data)
    }

    /// Tell waiters that events up to `seq` exist.
    pub fn publish(&self, seq: u64) {
        self.events.send_replace(seq);
    }

    /// Keep a denial record of `size` bytes (the newest [`MAX_DENIALS_RETAINED`] records and at
    /// most [`MAX_DENIAL_BYTES_RETAINED`] bytes are kept); its number, from 1.
    pub fn record_denial(&self, record: serde_json::Value, size: usize) -> u64 {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record, size)
    }

    /// Denial records numbered after `after`, their sizes within `budget` bytes (the first one
    /// regardless when `at_least_one`).
    pub fn denials_after(&self, after: u64, budget: u64, at_least_one: bool) -> DenialRead {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .read(after, budget, at_least_one)
    }

    /// Bytes of the denial records numbered after `after`.
    pub fn denial_bytes_after(&self, after: u64) -> u64 {
        self.denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .records
            .iter()
            .filter(|(number, ..)| *number > after)
            .map(|(.., size)| *size as u64)
            .sum()
    }

    /// Measure what the tree used, once, as its leader exits (`exit.cpu`, the leader's and
    /// its reaped descendants' CPU time, counts where the tree has no cgroup).
    pub fn measure_usage(&self, exit: &ChildExit) -> proto::methods::process::ResourceUsage {
        *self.usage.get_or_init(|| {
            let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            proto::methods::process::ResourceUsage::new(
                millis(self.tree.cpu_usage().unwrap_or(exit.cpu)),
                millis(self.started.elapsed()),
                self.tree.peak_memory(),
                exit.max_rss_bytes,
            )
        })
    }

    /// Record how it was started (once; later calls change nothing).
    pub fn record_start(&self, facts: StartFacts) {
        let _ = self.facts.set(facts);
    }

    /// Its entry in `process/list` and `GET /status`: state, exit, limits, and, while it runs,
    /// what its tree uses now (read from its cgroups: blocking file reads).
    pub fn info(&self) -> proto::methods::process::ProcessInfo {
        use proto::methods::process::{LiveResources, ProcessInfo, ProcessState};
        let started_at_ms = self
            .started_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        let mut info = ProcessInfo::new(self.id.clone(), self.pid, started_at_ms);
        info.tty = self.tty;
        if let Some(facts) = self.facts.get() {
            info.sandboxed = facts.sandboxed;
            info.limits = facts.limits.clone();
        }
        let (exit, closed) = {
            let log = self.log();
            (log.exit(), log.is_closed())
        };
        match exit {
            None => {
                let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
                let resources = LiveResources::new(
                    self.tree.current_memory(),
                    self.tree.peak_memory(),
                    self.tree.cpu_usage().map(millis),
                );
                info.resources = (resources != LiveResources::default()).then_some(resources);
            }
            Some(exit) => {
                info.state = if closed {
                    ProcessState::Closed
                } else {
                    ProcessState::Exited
                };
                info.exit_code = Some(exit.code);
                info.signal = exit.signal;
                info.reason = exit.reason;
                info.usage = self.usage();
            }
        }
        info
    }

    /// What the tree used, once the leader exited.
    pub fn usage(&self) -> Option<proto::methods::process::ResourceUsage> {
        self.usage.get().copied()
    }

    /// The exit, if the process exited.
    pub fn exit(&self) -> Option<Exit> {
        self.log().exit()
    }

    /// Events after `after_seq`; when there are none yet, wait up to `wait` for one.
    pub async fn read(&self, after_seq: u64, max_bytes: u64, wait: Duration) -> LogRead {
        self.wait_for_events(after_seq, wait).await;
        self.log().read(after_seq, max_bytes)
    }

    /// When no event after `after_seq` exists yet and the process has not closed, wait up to
    /// `wait` for one.
    pub async fn wait_for_events(&self, after_seq: u64, wait: Duration) {
        let mut events = self.events.subscribe();
        // Nothing follows `closed`: a long-poll after it would only hold a request slot.
        let worth_waiting = {
            let log = self.log();
            log.last_seq() <= after_seq && !log.is_closed()
        };
        if !wait.is_zero() && worth_waiting {
            let _ = tokio::time::timeout(wait, events.wait_for(|&last| last > after_seq)).await;
        }
    }

    /// Wait until the process exited, at most `limit`.
    pub async fn wait_exit(&self, limit: Duration) -> bool {
        let mut events = self.events.subscribe();
        let exited = tokio::time::timeout(limit, events.wait_for(|_| self.exit().is_some())).await;
        exited.is_ok()
    }

    /// Its cgroups.
    pub fn tree(&self) -> &Arc<Tree> {
        &self.tree
    }

    /// Send `signal` to the process group (through the leader's pidfd: never once the leader is
    /// reaped). Returns whether the process was still running.
    pub fn signal(&self, signal: Signal) -> bool {
        if self.exit().is_some() {
            return false;
        }
        let leader = self
            .leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        leader.is_some_and(|leader| leader.signal_group(signal))
    }

    /// SIGKILL the whole tree: its cgroup when it has one (descendants that left the group
    /// included), else the process group while the leader is unreaped.
    pub async fn kill_tree(self: &Arc<Self>) {
        let killed = if self.tree.tracked() {
            // `cgroup.kill` takes the kernel's cgroup mutex, which a migration elsewhere can
            // hold for an RCU grace period: not on an async worker.
            let tree = self.tree.clone();
            tokio::task::spawn_blocking(move || tree.kill())
                .await
                .unwrap_or(false)
        } else {
            false
        };
        if !killed {
            self.signal(Signal::SIGKILL);
        }
    }

    /// SIGTERM to the group now; once the leader exits, or after [`TERMINATE_GRACE`] at the
    /// latest, SIGKILL to the whole tree (so what the command left behind goes too). Returns
    /// whether the process was running. An exited process whose tree still holds processes has
    /// them killed as well.
    pub fn terminate(self: &Arc<Self>) -> bool {
        self.kills.terminated.store(true, Ordering::Relaxed);
        if !self.signal(Signal::SIGTERM) {
            if self.tree.tracked() {
                let tree = self.tree.clone();
                tokio::task::spawn_blocking(move || tree.kill());
            }
            return false;
        }
        let process = self.clone();
        tokio::spawn(async move {
            process.wait_exit(TERMINATE_GRACE).await;
            process.kill_tree().await;
        });
        true
    }

    /// Close stdin and the PTY master once the process has closed, so a retained process holds
    /// no descriptor for [`crate::limits::CLOSED_PROCESS_RETENTION`]. A write in progress keeps
    /// stdin (that write fails and marks stdin unavailable itself).
    pub fn release_io(&self) {
        self.pty.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.charges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        self.leader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Ok(mut stdin) = self.stdin.try_lock()
            && !matches!(*stdin, Stdin::Unavailable(_))
        {
            *stdin = Stdin::Unavailable("the process has exited");
        }
    }

    /// Write to stdin (and optionally close it). A repeated `write_id` is applied once (the
    /// last [`WRITE_ID_MEMORY`] ids are remembered). Returns [`WriteStatus::Accepted`], or
    /// [`WriteStatus::StdinClosed`] when stdin cannot take the bytes (never requested, closed
    /// with `close`, closed by the process, or the process exited).
    pub async fn write(&self, data: &[u8], write_id: Option<&str>, close: bool) -> WriteStatus {
        let mut stdin = self.stdin.lock().await;
        if let Some(id) = write_id
            && self
                .write_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(id)
        {
            return WriteStatus::Accepted;
        }
        if self.exit().is_some() && !matches!(*stdin, Stdin::Unavailable(_)) {
            *stdin = Stdin::Unavailable("the process has exited");
        }
        let closed = |reason: &dyn std::fmt::Display| {
            tracing::debug!(process_id = %crate::untrusted::LogField(&self.id), %reason, "process/write: stdin closed");
            WriteStatus::StdinClosed
        };
        match &mut *stdin {
            Stdin::Unavailable(reason) => return closed(reason),
            Stdin::Pipe(pipe) => {
                if let Err(error) = pipe.write_all(data).await {
                    *stdin = Stdin::Unavailable("stdin was closed by the process");
                    return closed(&format!("writing stdin failed: {error}"));
                }
                if close {
                    let _ = pipe.shutdown().await;
                    *stdin = Stdin::Unavailable("stdin was closed with close: true");
                }
            }
            Stdin::Pty(master) => {
                if let Err(error) = write_all_pty(master, data).await {
                    return closed(&format!("writing the terminal failed: {error}"));
                }
                if close {
                    *stdin = Stdin::Unavailable("stdin was closed with close: true");
                }
            }
        }
        if let Some(id) = write_id {
            self.write_ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remember(id);
        }
        WriteStatus::Accepted
    }

    /// Resize the PTY.
    ///
    /// # Errors
    /// [`ProcessError::NotPty`] for pipe-mode processes, [`ProcessError::Resize`] on failure.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ProcessError> {
        if !self.tty {
            return Err(ProcessError::NotPty {
                process_id: self.id.clone(),
            });
        }
        let pty = self.pty.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(pty) = pty else {
            return Err(ProcessError::TerminalClosed {
                process_id: self.id.clone(),
            });
        };
        crate::sys::set_window_size(pty.get_ref(), cols, rows).map_err(|source| {
            ProcessError::Resize {
                process_id: self.id.clone(),
                cols,
                rows,
                source,
            }
        })
    }
}

async fn write_all_pty(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        match guard
            .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
        {
            Ok(Ok(written)) => data = &data[written..],
            Ok(Err(error)) => return Err(error),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// The most recent write ids, bounded in count and, since each is kept as a 128-bit keyed hash
/// (two SipHash values under random keys), in memory whatever the ids' length.
struct WriteIds {
    order: VecDeque<u128>,
    set: HashSet<u128>,
    keys: (RandomState, RandomState),
}

impl Default for WriteIds {
    fn default() -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            keys: (RandomState::new(), RandomState::new()),
        }
    }
}

impl WriteIds {
    fn fingerprint(&self, id: &str) -> u128 {
        (u128::from(self.keys.0.hash_one(id)) << 64) | u128::from(self.keys.1.hash_one(id))
    }

    fn contains(&self, id: &str) -> bool {
        self.set.contains(&self.fingerprint(id))
    }

    fn remember(&mut self, id: &str) {
        let fingerprint = self.fingerprint(id);
        if self.set.insert(fingerprint) {
            self.order.push_back(fingerprint);
            if self.order.len() > WRITE_ID_MEMORY
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests;
