//! The event log of one process: output chunks, exit and close share one sequence counter that
//! starts at 1. Output is retained up to a byte budget (oldest chunks dropped first); exit and
//! close are never dropped. Pure data, no I/O, so the read rules are unit-tested directly.
//!
//! A log made with [`OutputLog::charged`] belongs to a session's retained output
//! ([`super::retention`]): the session charges each chunk before the log takes it, and the log
//! gives back the cost of every chunk it lets go (its own retention, the server's cap, or the
//! log itself dropped with its process).

use std::collections::VecDeque;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::Bytes;

use proto::methods::process::OutputStream;

use crate::limits::RETAINED_CHUNK_OVERHEAD_BYTES;

/// Who is charged for a log's retained chunks (a session's retained output,
/// `process::retention`): told of every chunk the log lets go.
pub trait RetentionCharge: Send + Sync + std::fmt::Debug {
    /// `cost` bytes of `chunks` chunks are no longer retained.
    fn release(&self, cost: usize, chunks: usize);
}

/// What a retained chunk of `len` bytes costs: its bytes and [`RETAINED_CHUNK_OVERHEAD_BYTES`].
pub fn chunk_cost(len: usize) -> usize {
    len + RETAINED_CHUNK_OVERHEAD_BYTES
}

/// One retained chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Event sequence number.
    pub seq: u64,
    /// Which stream.
    pub stream: OutputStream,
    /// Raw bytes (for a client taking binary frames, a slice of the frame that carried them).
    pub data: Bytes,
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Event sequence number.
    pub seq: u64,
    /// Exit code, 128+n when killed by signal n.
    pub code: i32,
    /// The killing signal, if any.
    pub signal: Option<i32>,
    /// Why it ended.
    pub reason: Option<proto::methods::process::ExitReason>,
}

/// A read of the log after a cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    /// Chunks after the cursor.
    pub chunks: Vec<Chunk>,
    /// One past the last event covered.
    pub next_seq: u64,
    /// The exit, if its event is covered.
    pub exit: Option<Exit>,
    /// The close seq, if covered.
    pub closed_seq: Option<u64>,
    /// Output after the cursor was dropped; holds the oldest seq still retained.
    pub dropped: Option<u64>,
    /// Output chunks and bytes of the process dropped so far (all before the oldest retained).
    pub dropped_total: (u64, u64),
}

/// The log.
#[derive(Debug)]
pub struct OutputLog {
    next_seq: u64,
    chunks: VecDeque<Chunk>,
    retained_bytes: usize,
    retention_bytes: usize,
    /// Highest seq of a dropped chunk (0: nothing dropped).
    dropped_through: u64,
    /// Chunks and bytes dropped so far.
    dropped_chunks: u64,
    dropped_bytes: u64,
    exit: Option<Exit>,
    closed_seq: Option<u64>,
    /// Who is charged for the retained chunks, if anyone.
    charged_to: Option<Arc<dyn RetentionCharge>>,
}

impl Drop for OutputLog {
    fn drop(&mut self) {
        if let Some(session) = &self.charged_to {
            let cost = self
                .chunks
                .iter()
                .map(|chunk| chunk_cost(chunk.data.len()))
                .sum();
            session.release(cost, self.chunks.len());
        }
    }
}

impl OutputLog {
    /// An empty log keeping at most `retention_bytes` of output.
    pub fn new(retention_bytes: usize) -> Self {
        Self {
            next_seq: 1,
            chunks: VecDeque::new(),
            retained_bytes: 0,
            retention_bytes,
            dropped_through: 0,
            dropped_chunks: 0,
            dropped_bytes: 0,
            exit: None,
            closed_seq: None,
            charged_to: None,
        }
    }

    /// An empty log keeping at most `retention_bytes` of output, whose chunks `session` is
    /// charged for (see the module docs).
    pub fn charged(retention_bytes: usize, session: Arc<dyn RetentionCharge>) -> Self {
        let mut log = Self::new(retention_bytes);
        log.charged_to = Some(session);
        log
    }

    /// Let the oldest retained chunk go (and give its cost back).
    fn drop_front(&mut self) -> Option<Chunk> {
        let dropped = self.chunks.pop_front()?;
        self.retained_bytes -= dropped.data.len();
        self.dropped_through = dropped.seq;
        self.dropped_chunks += 1;
        self.dropped_bytes += dropped.data.len() as u64;
        if let Some(session) = &self.charged_to {
            session.release(chunk_cost(dropped.data.len()), 1);
        }
        Some(dropped)
    }

    /// Drop the oldest retained chunk if it is the one numbered `seq` (the server's cap on
    /// retained output takes it); whether it was.
    pub fn drop_oldest_if(&mut self, seq: u64) -> bool {
        if self.chunks.front().is_some_and(|chunk| chunk.seq == seq) {
            self.drop_front();
            true
        } else {
            false
        }
    }

    /// Whether the chunk numbered `seq` is still retained (chunks go oldest first, so any seq
    /// from the oldest retained one on is).
    pub fn retains(&self, seq: u64) -> bool {
        self.chunks
            .front()
            .is_some_and(|chunk| chunk.seq <= seq && seq < self.next_seq)
    }

    /// Output chunks and bytes dropped so far.
    pub fn dropped(&self) -> (u64, u64) {
        (self.dropped_chunks, self.dropped_bytes)
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Append output; returns its seq. Drops the oldest chunks beyond the budget (the newest
    /// chunk is kept even when it alone exceeds it).
    pub fn push_output(&mut self, stream: OutputStream, data: Vec<u8>) -> u64 {
        self.push_output_with(stream, |_| Bytes::from(data))
    }

    /// [`Self::push_output`] of the bytes `data` makes once it knows their seq (a binary
    /// frame's header carries it; the frame and the log then share the bytes).
    pub fn push_output_with(
        &mut self,
        stream: OutputStream,
        data: impl FnOnce(u64) -> Bytes,
    ) -> u64 {
        let seq = self.take_seq();
        let data = data(seq);
        self.retained_bytes += data.len();
        self.chunks.push_back(Chunk { seq, stream, data });
        while self.retained_bytes > self.retention_bytes && self.chunks.len() > 1 {
            self.drop_front();
        }
        seq
    }

    /// Record the exit; returns it with its seq.
    pub fn push_exit(
        &mut self,
        code: i32,
        signal: Option<i32>,
        reason: Option<proto::methods::process::ExitReason>,
    ) -> Exit {
        let exit = Exit {
            seq: self.take_seq(),
            code,
            signal,
            reason,
        };
        self.exit = Some(exit);
        exit
    }

    /// Record the close; returns its seq.
    pub fn push_closed(&mut self) -> u64 {
        let seq = self.take_seq();
        self.closed_seq = Some(seq);
        seq
    }

    /// The exit, if the process exited.
    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }

    /// Whether the close event exists.
    pub fn is_closed(&self) -> bool {
        self.closed_seq.is_some()
    }

    /// The seq of the newest event (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Bytes of the retained output after `after_seq`.
    pub fn bytes_after(&self, after_seq: u64) -> u64 {
        self.chunks
            .iter()
            .rev()
            .take_while(|chunk| chunk.seq > after_seq)
            .map(|chunk| chunk.data.len() as u64)
            .sum()
    }

    /// Events after `after_seq`, chunks bounded by `max_bytes` (at least one chunk if any).
    pub fn read(&self, after_seq: u64, max_bytes: u64) -> LogRead {
        let mut chunks = Vec::new();
        let mut bytes = 0u64;
        let mut truncated_at = None;
        for chunk in self.chunks.iter().filter(|chunk| chunk.seq > after_seq) {
            let len = chunk.data.len() as u64;
            if !chunks.is_empty() && bytes + len > max_bytes {
                truncated_at = Some(chunk.seq);
                break;
            }
            bytes += len;
            chunks.push(chunk.clone());
        }
        // Everything before the first chunk we did not return is covered; exit and close events
        // that fall in that range are reported.
        // `afterSeq` comes from the client and may be u64::MAX: saturate instead of overflowing.
        let next_seq = truncated_at
            .unwrap_or(self.next_seq)
            .max(after_seq.saturating_add(1));
        let covered = |seq: u64| seq < next_seq;
        let dropped = (after_seq < self.dropped_through)
            .then(|| self.chunks.front().map_or(self.next_seq, |chunk| chunk.seq));
        LogRead {
            chunks,
            next_seq,
            exit: self.exit.filter(|exit| covered(exit.seq)),
            closed_seq: self.closed_seq.filter(|&seq| covered(seq)),
            dropped,
            dropped_total: self.dropped(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn out(log: &mut OutputLog, bytes: &[u8]) -> u64 {
        log.push_output(OutputStream::Stdout, bytes.to_vec())
    }

    #[test]
    fn output_exit_and_close_share_one_counter_from_one() {
        let mut log = OutputLog::new(100);
        assert_eq!(out(&mut log, b"a"), 1);
        assert_eq!(log.push_output(OutputStream::Stderr, b"b".to_vec()), 2);
        assert_eq!(log.push_exit(0, None, None).seq, 3);
        assert_eq!(log.push_closed(), 4);
        let read = log.read(0, 1000);
        assert_eq!(
            read.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(read.next_seq, 5);
        assert_eq!(read.exit.map(|e| e.seq), Some(3));
        assert_eq!(read.closed_seq, Some(4));
        assert_eq!(read.dropped, None);
    }

    #[test]
    fn max_bytes_returns_at_least_one_chunk_and_does_not_report_later_exit() {
        let mut log = OutputLog::new(100);
        out(&mut log, b"0123456789");
        out(&mut log, b"abc");
        log.push_exit(1, None, None);
        let read = log.read(0, 4);
        assert_eq!(read.chunks.len(), 1);
        assert_eq!(read.next_seq, 2);
        assert_eq!(read.exit, None, "exit is after the truncation point");
        let rest = log.read(read.next_seq - 1, 4);
        assert_eq!(rest.chunks[0].data, b"abc"[..]);
        assert_eq!(rest.exit.map(|e| e.code), Some(1));
        assert_eq!(rest.next_seq, 4);
    }

    #[test]
    fn retention_drops_oldest_and_reports_the_gap() {
        let mut log = OutputLog::new(10);
        out(&mut log, b"aaaaaa");
        out(&mut log, b"bbbbbb");
        out(&mut log, b"cc");
        let read = log.read(0, 1000);
        assert_eq!(read.dropped, Some(2));
        assert_eq!(
            read.chunks.iter().map(|c| c.seq).collect::<Vec<_>>(),
            vec![2, 3]
        );
        let after_gap = log.read(1, 1000);
        assert_eq!(
            after_gap.dropped, None,
            "reading from seq 1 on misses nothing"
        );
    }

    #[test]
    fn a_single_oversized_chunk_is_kept() {
        let mut log = OutputLog::new(4);
        out(&mut log, b"0123456789");
        assert_eq!(log.read(0, 1).chunks.len(), 1);
    }

    #[test]
    fn cursor_at_u64_max_returns_nothing_without_overflowing() {
        let mut log = OutputLog::new(10);
        out(&mut log, b"a");
        log.push_exit(0, None, None);
        let read = log.read(u64::MAX, 10);
        assert!(read.chunks.is_empty());
        assert_eq!((read.next_seq, read.dropped), (u64::MAX, None));
    }

    #[test]
    fn cursor_past_the_end_returns_nothing_and_keeps_position() {
        let mut log = OutputLog::new(10);
        out(&mut log, b"a");
        let read = log.read(5, 10);
        assert!(read.chunks.is_empty());
        assert_eq!(read.next_seq, 6);
    }
}
