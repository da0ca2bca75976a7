//! Retained process output, charged before it is held.
//!
//! Each process keeps the newest [`OUTPUT_RETENTION_BYTES`] of its output for `process/read`
//! ([`OutputLog`]). That alone let one session hold 1,200 processes' worth (1.2 GiB, charged to
//! nothing). Here every chunk is charged, before the log takes it, to its session
//! ([`SessionRetention`]) and to the server's [`RetentionPool`], whose cap
//! (`--retained-output-bytes`, default [`RETAINED_OUTPUT_BUDGET_BYTES`]) bounds what all
//! sessions retain together. A chunk costs its bytes plus [`RETAINED_CHUNK_OVERHEAD_BYTES`].
//!
//! At the cap the oldest retained output of the session holding the most goes (never a process:
//! the process keeps running, and its reader sees the gap: `outputDropped`, `firstRetainedSeq`,
//! `outputDroppedBytes`, `outputDroppedChunks`). A session is charged for its own output, so a
//! session flooding output loses its own oldest output first, not another session's.
//!
//! Each session keeps its chunks in arrival order (process, seq) to find its oldest one. Within
//! a process arrival order is seq order, so what any cap drops of a process is always a prefix
//! of its output, and its log's gap report stays exact.
//!
//! Locks: a session's order, then a log; never two orders, never a log and then an order. A
//! log's own bookkeeping when it is dropped touches only counters.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio_tungstenite::tungstenite::Bytes;

use proto::methods::process::OutputStream;

pub use super::output::chunk_cost;
use super::output::{OutputLog, RetentionCharge};
#[cfg(any(doc, test))]
use crate::limits::RETAINED_OUTPUT_BUDGET_BYTES;
#[cfg(doc)]
use crate::limits::{OUTPUT_RETENTION_BYTES, RETAINED_CHUNK_OVERHEAD_BYTES};

/// A process's log, shared with its session's retention order.
pub type SharedLog = Arc<Mutex<OutputLog>>;

/// Lock a log, whatever a panicking holder left.
pub fn lock(log: &Mutex<OutputLog>) -> MutexGuard<'_, OutputLog> {
    log.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The server-wide cap on retained output, and the sessions charged against it.
#[derive(Debug)]
pub struct RetentionPool {
    cap: usize,
    held: AtomicUsize,
    sessions: Mutex<Vec<Weak<SessionRetention>>>,
}

impl RetentionPool {
    /// A pool retaining at most `cap` bytes (chunks and their overhead) across all sessions.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: AtomicUsize::new(0),
            sessions: Mutex::new(Vec::new()),
        })
    }

    /// Bytes retained now, server-wide.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// A new session's share.
    pub fn session(self: &Arc<Self>) -> Arc<SessionRetention> {
        let session = Arc::new(SessionRetention {
            pool: self.clone(),
            held: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            order: Mutex::new(VecDeque::new()),
        });
        let mut sessions = self.lock_sessions();
        sessions.retain(|session| session.strong_count() > 0);
        sessions.push(Arc::downgrade(&session));
        session
    }

    fn lock_sessions(&self) -> MutexGuard<'_, Vec<Weak<SessionRetention>>> {
        self.sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The session retaining the most now.
    fn largest(&self) -> Option<Arc<SessionRetention>> {
        self.lock_sessions()
            .iter()
            .filter_map(Weak::upgrade)
            .max_by_key(|session| session.held())
    }

    /// Drop the oldest output of the largest sessions until the pool is within its cap (or
    /// nothing more can go: what is over it then is chunks being added right now).
    fn enforce_cap(&self) {
        while self.held() > self.cap {
            let Some(victim) = self.largest() else {
                return;
            };
            if !victim.drop_oldest() {
                return;
            }
        }
    }
}

/// One retained chunk, in a session's arrival order.
#[derive(Debug)]
struct Entry {
    log: Weak<Mutex<OutputLog>>,
    seq: u64,
}

/// Order entries kept beyond twice the live chunks before the order is compacted (entries of
/// chunks a process's own retention dropped, or of processes forgotten, are skipped lazily).
const COMPACTION_SLACK: usize = 1024;

/// One session's retained output: what it is charged, and its chunks oldest first.
#[derive(Debug)]
pub struct SessionRetention {
    pool: Arc<RetentionPool>,
    held: AtomicUsize,
    /// Chunks retained now (the order may hold more entries: stale ones).
    live: AtomicUsize,
    order: Mutex<VecDeque<Entry>>,
}

impl SessionRetention {
    /// Bytes this session retains now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// An empty log for a new process of this session, keeping at most `per_process` bytes of
    /// output itself.
    pub fn new_log(self: &Arc<Self>, per_process: usize) -> SharedLog {
        Arc::new(Mutex::new(OutputLog::charged(per_process, self.clone())))
    }

    fn lock_order(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        self.order
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn charge(&self, cost: usize) {
        self.held.fetch_add(cost, Ordering::Relaxed);
        self.pool.held.fetch_add(cost, Ordering::Relaxed);
    }

    /// Charge `len` bytes to this session (dropping the oldest output past the server's cap),
    /// then append to `log` the `len` bytes `data` makes given their seq; returns the seq.
    pub fn push(
        &self,
        log: &SharedLog,
        stream: OutputStream,
        len: usize,
        data: impl FnOnce(u64) -> Bytes,
    ) -> u64 {
        self.charge(chunk_cost(len));
        self.pool.enforce_cap();
        let mut order = self.lock_order();
        // Counted live first: the log may let chunks go (and count them off) as it takes this one.
        self.live.fetch_add(1, Ordering::Relaxed);
        let seq = lock(log).push_output_with(stream, |seq| {
            let data = data(seq);
            debug_assert_eq!(data.len(), len, "charged for other bytes than retained");
            data
        });
        order.push_back(Entry {
            log: Arc::downgrade(log),
            seq,
        });
        let live = self.live.load(Ordering::Relaxed);
        if order.len() > live.saturating_mul(2).saturating_add(COMPACTION_SLACK) {
            order.retain(|entry| {
                entry
                    .log
                    .upgrade()
                    .is_some_and(|log| lock(&log).retains(entry.seq))
            });
        }
        seq
    }

    /// Drop this session's oldest retained chunk; `false` when it retains none.
    fn drop_oldest(&self) -> bool {
        let mut order = self.lock_order();
        while let Some(entry) = order.pop_front() {
            let Some(log) = entry.log.upgrade() else {
                continue;
            };
            // The log gives the chunk's cost back itself (`OutputLog::drop_oldest_if`).
            if lock(&log).drop_oldest_if(entry.seq) {
                return true;
            }
        }
        false
    }
}

impl RetentionCharge for SessionRetention {
    fn release(&self, cost: usize, chunks: usize) {
        self.held.fetch_sub(cost, Ordering::Relaxed);
        self.pool.held.fetch_sub(cost, Ordering::Relaxed);
        self.live.fetch_sub(chunks, Ordering::Relaxed);
    }
}

/// `--retained-output-bytes`: at least one process's own retention.
///
/// # Errors
/// [`SizeOptionError`](crate::limits::SizeOptionError).
pub fn parse_retained_output_bytes(text: &str) -> Result<usize, crate::limits::SizeOptionError> {
    crate::limits::parse_size(
        text,
        "one process's retention (OUTPUT_RETENTION_BYTES)",
        crate::limits::OUTPUT_RETENTION_BYTES,
    )
}

/// The default cap, as `--retained-output-bytes` shows it ([`RETAINED_OUTPUT_BUDGET_BYTES`];
/// a unit test keeps the two equal).
pub const DEFAULT_RETAINED_OUTPUT_BYTES: &str = "256M";

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn push(session: &SessionRetention, log: &SharedLog, len: usize) -> u64 {
        session.push(log, OutputStream::Stdout, len, |_| vec![b'x'; len].into())
    }

    #[test]
    fn every_chunk_is_charged_to_its_session_and_the_pool_and_given_back_with_its_log() {
        let pool = RetentionPool::new(1 << 30);
        let session = pool.session();
        let log = session.new_log(1 << 20);
        push(&session, &log, 1000);
        push(&session, &log, 24);
        assert_eq!(session.held(), chunk_cost(1000) + chunk_cost(24));
        assert_eq!(pool.held(), session.held());
        drop(log);
        assert_eq!((session.held(), pool.held()), (0, 0));
    }

    #[test]
    fn a_process_past_its_own_retention_gives_back_what_it_dropped() {
        let pool = RetentionPool::new(1 << 30);
        let session = pool.session();
        let log = session.new_log(100);
        for _ in 0..10 {
            push(&session, &log, 60);
        }
        // The log keeps its newest chunk past the limit; only that one is still charged.
        assert_eq!(session.held(), chunk_cost(60));
        assert_eq!(pool.held(), chunk_cost(60));
    }

    #[test]
    fn at_the_cap_the_oldest_output_of_the_largest_session_goes_and_is_reported() {
        let cost = chunk_cost(1000);
        let pool = RetentionPool::new(10 * cost);
        let quiet = pool.session();
        let quiet_log = quiet.new_log(1 << 20);
        push(&quiet, &quiet_log, 1000);
        push(&quiet, &quiet_log, 1000);
        let flood = pool.session();
        let logs: Vec<SharedLog> = (0..4).map(|_| flood.new_log(1 << 20)).collect();
        for round in 0..5 {
            for log in &logs {
                push(&flood, log, 1000);
            }
            assert!(pool.held() <= pool.cap(), "round {round}: {}", pool.held());
        }
        // The flooding session lost its own oldest chunks; the quiet one kept all of its own.
        assert_eq!(quiet.held(), 2 * cost);
        assert_eq!(flood.held(), 8 * cost);
        // Twelve of its twenty chunks went: the first three rounds, of every process.
        let first = lock(&logs[0]).read(0, u64::MAX);
        assert_eq!(
            first.dropped,
            Some(4),
            "chunks 1 to 3 of the first process went"
        );
        assert_eq!(lock(&logs[0]).dropped(), (3, 3000));
        let last = lock(&logs[3]).read(0, u64::MAX);
        assert_eq!(
            last.dropped,
            Some(4),
            "and of the last one, in arrival order"
        );
        assert_eq!(lock(&quiet_log).read(0, u64::MAX).dropped, None);
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let pool = RetentionPool::new(1 << 30);
        let session = pool.session();
        let log = session.new_log(10);
        for _ in 0..10 * COMPACTION_SLACK {
            push(&session, &log, 20);
        }
        assert!(session.lock_order().len() <= 2 + COMPACTION_SLACK + 1);
    }

    #[test]
    fn sizes_parse_with_units_and_are_at_least_one_process_retention() {
        assert_eq!(
            parse_retained_output_bytes(DEFAULT_RETAINED_OUTPUT_BYTES).unwrap(),
            RETAINED_OUTPUT_BUDGET_BYTES
        );
        assert_eq!(parse_retained_output_bytes("2g").unwrap(), 2 << 30);
        assert_eq!(parse_retained_output_bytes("1048576").unwrap(), 1 << 20);
        assert!(matches!(
            parse_retained_output_bytes("1K"),
            Err(crate::limits::SizeOptionError::TooSmall { .. })
        ));
        assert!(matches!(
            parse_retained_output_bytes("lots"),
            Err(crate::limits::SizeOptionError::NotASize(_))
        ));
    }
}
