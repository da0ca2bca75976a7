//! Per-process event ordering, sans I/O: live notifications and `process/read` results go in,
//! events in seq order come out, each exactly once.
//!
//! Output, exit and close share one sequence per process. Events are published only when every
//! lower seq has been published; early ones wait in a buffer, repeats are dropped. After a
//! reconnect the client reads from the last published seq and merges the result here:
//! retained chunks by seq, exit and close at `exitSeq` / `closedSeq`. If the read leaves a hole
//! below its `nextSeq`, the missing events were output the server no longer retains: a
//! [`CatchUpGap`], and that process fails alone.
//!
//! Denial records (processes started with `auditDenials`) have a numbering of their own: each
//! is published once, in number order, as soon as every lower number was; a hole the server's
//! retention made (a read answers with later records only) is skipped, never waited on.

use std::collections::BTreeMap;

use proto::methods::process::{ExitReason, OutputStream, ReadResult};

/// One event of a process, in seq order (denials in their own order, between them).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessEvent {
    /// Bytes the process wrote.
    Output {
        /// Event sequence number.
        seq: u64,
        /// `stdout`, `stderr`, or `pty`.
        stream: OutputStream,
        /// The bytes.
        data: Vec<u8>,
    },
    /// The process exited (output of grandchildren may still follow).
    Exited {
        /// Event sequence number.
        seq: u64,
        /// Exit code; 128+n when killed by signal n.
        exit_code: i32,
        /// The signal that killed it, if one did.
        signal: Option<i32>,
        /// Why it ended, when the server says (`oom`, `wallTimeout`, ...).
        reason: Option<ExitReason>,
    },
    /// The sandbox denied the process something (a process started with `auditDenials`): one
    /// record of the denial audit, as `process/denied` carries it (see docs/audit.md). Not in
    /// the seq order; every record arrives before [`ProcessEvent::Closed`].
    Denied {
        /// The record's number, from 1, in this process's denial numbering.
        number: u64,
        /// The record (`kind`, `operation`, `path`, `allow_rule`, ...).
        record: serde_json::Value,
    },
    /// Exited and every output stream reached end of file: the last event.
    Closed {
        /// Event sequence number.
        seq: u64,
    },
    /// The client can no longer follow this process (its missed output is gone, it vanished
    /// from the server, or recovery failed). The last event.
    Failed {
        /// Why.
        error: super::ExecServerError,
    },
}

impl ProcessEvent {
    /// The event's seq (`None` for [`ProcessEvent::Failed`] and [`ProcessEvent::Denied`]).
    pub fn seq(&self) -> Option<u64> {
        match self {
            ProcessEvent::Output { seq, .. }
            | ProcessEvent::Exited { seq, .. }
            | ProcessEvent::Closed { seq } => Some(*seq),
            ProcessEvent::Failed { .. } | ProcessEvent::Denied { .. } => None,
        }
    }

    /// Bytes this event holds while it waits unread in a client's queue (output and denial
    /// records; counted against `CLIENT_EVENT_BUFFER_BYTES`).
    pub fn buffered_bytes(&self) -> usize {
        match self {
            ProcessEvent::Output { data, .. } => data.len(),
            // Records are at most MAX_DENIAL_RECORD_BYTES of JSON; their text is their weight.
            ProcessEvent::Denied { record, .. } => record.to_string().len(),
            _ => 0,
        }
    }

    /// Whether nothing follows this event.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ProcessEvent::Closed { .. } | ProcessEvent::Failed { .. }
        )
    }
}

/// A `process/read` could not fill the hole after the last published event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUpGap {
    /// First seq the client is missing.
    pub missing_from: u64,
    /// First seq the server still had (its `firstRetainedSeq`, if reported).
    pub first_retained: Option<u64>,
}

/// Orders one process's events.
#[derive(Debug, Default)]
pub struct EventSequencer {
    published: u64,
    pending: BTreeMap<u64, ProcessEvent>,
    finished: bool,
    /// Number of the last denial record published (0 before the first).
    denials_published: u64,
    pending_denials: BTreeMap<u64, serde_json::Value>,
}

impl EventSequencer {
    /// The seq of the last published event (0 before the first).
    pub fn last_published(&self) -> u64 {
        self.published
    }

    /// The number of the last denial record published (0 before the first): what a resuming
    /// `process/read` passes as `afterDenial`.
    pub fn last_denial(&self) -> u64 {
        self.denials_published
    }

    /// Offer denial record `number`; returns the denials that became publishable, in number
    /// order. Repeats and records after the end are dropped.
    pub fn offer_denial(&mut self, number: u64, record: serde_json::Value) -> Vec<ProcessEvent> {
        if self.finished || number <= self.denials_published {
            return Vec::new();
        }
        self.pending_denials.entry(number).or_insert(record);
        let mut out = Vec::new();
        self.drain_denials(&mut out, false);
        out
    }

    /// Publishes the pending denials that follow the last published one; with `skip_holes`,
    /// every pending one (in order), the missing numbers being gone for good.
    fn drain_denials(&mut self, out: &mut Vec<ProcessEvent>, skip_holes: bool) {
        while let Some(entry) = self.pending_denials.first_entry() {
            let number = *entry.key();
            if !skip_holes && number != self.denials_published + 1 {
                break;
            }
            let record = entry.remove();
            self.denials_published = number;
            out.push(ProcessEvent::Denied { number, record });
        }
    }

    /// Whether events wait for a lower seq.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether the last event (closed or failed) was published.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Offer one event; returns the events that became publishable, in order. Repeats and
    /// events after the end are dropped.
    pub fn offer(&mut self, event: ProcessEvent) -> Vec<ProcessEvent> {
        let mut out = Vec::new();
        self.insert(event);
        self.drain(&mut out);
        out
    }

    fn insert(&mut self, event: ProcessEvent) {
        let Some(seq) = event.seq() else {
            return;
        };
        if self.finished || seq <= self.published {
            return;
        }
        self.pending.entry(seq).or_insert(event);
    }

    fn drain(&mut self, out: &mut Vec<ProcessEvent>) {
        while !self.finished {
            let Some(event) = self.pending.remove(&(self.published + 1)) else {
                break;
            };
            self.published += 1;
            if event.is_terminal() {
                // Every denial precedes `closed`: one still waiting for a lower number waits
                // for a record that is gone.
                self.drain_denials(out, true);
                self.finished = true;
            }
            out.push(event);
        }
        if self.finished {
            self.pending.clear();
            self.pending_denials.clear();
        }
    }

    /// Merge a `process/read` result (whatever cursor it was read from).
    ///
    /// # Errors
    /// [`CatchUpGap`] when events below the read's `nextSeq` are neither in the read nor
    /// already known: they were dropped by the server's retention.
    pub fn merge_read(
        &mut self,
        read: &ReadResult,
        decode: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Vec<ProcessEvent>, CatchUpGap> {
        for chunk in &read.chunks {
            // An undecodable chunk is left out; the hole check below reports it.
            if let Some(data) = decode(&chunk.chunk) {
                self.insert(ProcessEvent::Output {
                    seq: chunk.seq,
                    stream: chunk.stream,
                    data,
                });
            }
        }
        if let (true, Some(seq), Some(exit_code)) = (read.exited, read.exit_seq, read.exit_code) {
            self.insert(ProcessEvent::Exited {
                seq,
                exit_code,
                signal: read.signal,
                reason: read.exit_reason,
            });
        }
        if let (true, Some(seq)) = (read.closed, read.closed_seq) {
            self.insert(ProcessEvent::Closed { seq });
        }
        let mut out = Vec::new();
        if let Some(next) = read.next_denial {
            // The records are consecutive and end just below `nextDenial`; anything between
            // the last published and the first returned was dropped by retention.
            let first = next.saturating_sub(read.denials.len() as u64);
            if !self.finished {
                for (number, record) in (first..).zip(&read.denials) {
                    if number > self.denials_published {
                        self.pending_denials
                            .entry(number)
                            .or_insert_with(|| record.clone());
                    }
                }
                self.denials_published = self.denials_published.max(first.saturating_sub(1));
                self.drain_denials(&mut out, false);
            }
        }
        self.drain(&mut out);
        if !self.finished && self.published + 1 < read.next_seq {
            return Err(CatchUpGap {
                missing_from: self.published + 1,
                first_retained: read.first_retained_seq,
            });
        }
        Ok(out)
    }

    /// Publish a failure: nothing is published after it.
    pub fn fail(&mut self) {
        self.finished = true;
        self.pending.clear();
        self.pending_denials.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proto::methods::process::OutputChunk;

    fn out(seq: u64, text: &str) -> ProcessEvent {
        ProcessEvent::Output {
            seq,
            stream: OutputStream::Stdout,
            data: text.as_bytes().to_vec(),
        }
    }

    fn seqs(events: &[ProcessEvent]) -> Vec<u64> {
        events.iter().filter_map(ProcessEvent::seq).collect()
    }

    fn read(chunks: &[(u64, &str)], next_seq: u64) -> ReadResult {
        ReadResult {
            chunks: chunks
                .iter()
                .map(|(seq, text)| OutputChunk {
                    seq: *seq,
                    stream: OutputStream::Stdout,
                    chunk: (*text).to_owned(),
                })
                .collect(),
            next_seq,
            exited: false,
            exit_code: None,
            signal: None,
            exit_reason: None,
            exit_seq: None,
            closed: false,
            closed_seq: None,
            failure: None,
            output_dropped: false,
            first_retained_seq: None,
            denials: Vec::new(),
            denials_dropped: 0,
            next_denial: None,
        }
    }

    fn identity(text: &str) -> Option<Vec<u8>> {
        Some(text.as_bytes().to_vec())
    }

    #[test]
    fn in_order_events_are_published_at_once_and_repeats_dropped() {
        let mut sequencer = EventSequencer::default();
        assert_eq!(seqs(&sequencer.offer(out(1, "a"))), vec![1]);
        assert_eq!(seqs(&sequencer.offer(out(2, "b"))), vec![2]);
        assert_eq!(sequencer.offer(out(2, "b")), vec![]);
        assert_eq!(sequencer.last_published(), 2);
    }

    #[test]
    fn early_events_wait_for_the_gap_to_fill() {
        let mut sequencer = EventSequencer::default();
        sequencer.offer(out(1, "a"));
        assert_eq!(sequencer.offer(out(4, "d")), vec![]);
        assert!(sequencer.has_pending());
        let merged = sequencer
            .merge_read(&read(&[(2, "b"), (3, "c"), (4, "d")], 5), identity)
            .unwrap();
        assert_eq!(seqs(&merged), vec![2, 3, 4]);
        assert!(!sequencer.has_pending());
    }

    #[test]
    fn exit_and_close_are_reconstructed_in_their_seq_positions() {
        let mut sequencer = EventSequencer::default();
        sequencer.offer(out(1, "a"));
        let mut result = read(&[(2, "b"), (4, "late")], 6);
        result.exited = true;
        result.exit_code = Some(3);
        result.exit_seq = Some(3);
        result.closed = true;
        result.closed_seq = Some(5);
        let merged = sequencer.merge_read(&result, identity).unwrap();
        assert_eq!(
            merged,
            vec![
                out(2, "b"),
                ProcessEvent::Exited {
                    seq: 3,
                    exit_code: 3,
                    signal: None,
                    reason: None,
                },
                out(4, "late"),
                ProcessEvent::Closed { seq: 5 },
            ]
        );
        assert!(sequencer.is_finished());
        assert_eq!(sequencer.offer(out(6, "x")), vec![], "nothing after closed");
    }

    fn denied(number: u64) -> ProcessEvent {
        ProcessEvent::Denied {
            number,
            record: serde_json::json!({ "n": number }),
        }
    }

    fn offer_denial(sequencer: &mut EventSequencer, number: u64) -> Vec<ProcessEvent> {
        sequencer.offer_denial(number, serde_json::json!({ "n": number }))
    }

    #[test]
    fn denials_are_published_once_in_number_order_beside_the_seq_events() {
        let mut sequencer = EventSequencer::default();
        assert_eq!(offer_denial(&mut sequencer, 1), vec![denied(1)]);
        assert_eq!(offer_denial(&mut sequencer, 1), vec![], "a repeat");
        assert_eq!(offer_denial(&mut sequencer, 3), vec![], "waits for 2");
        assert_eq!(seqs(&sequencer.offer(out(1, "a"))), vec![1]);
        assert_eq!(offer_denial(&mut sequencer, 2), vec![denied(2), denied(3)]);
        assert_eq!(sequencer.last_denial(), 3);
    }

    #[test]
    fn a_resuming_read_fills_the_missed_denials_and_skips_what_retention_dropped() {
        let mut sequencer = EventSequencer::default();
        offer_denial(&mut sequencer, 1);
        // Live records 6 and 7 arrived on the new connection before the catch-up read.
        assert_eq!(offer_denial(&mut sequencer, 7), vec![]);
        // The read after denial 1 starts at 4: 2 and 3 were dropped by retention.
        let mut result = read(&[], 1);
        result.denials = (4..=6).map(|n| serde_json::json!({ "n": n })).collect();
        result.next_denial = Some(7);
        let merged = sequencer.merge_read(&result, identity).unwrap();
        assert_eq!(merged, vec![denied(4), denied(5), denied(6), denied(7)]);
        // A read answered again changes nothing.
        assert_eq!(sequencer.merge_read(&result, identity).unwrap(), vec![]);
    }

    #[test]
    fn closed_publishes_the_denials_still_waiting_and_nothing_follows() {
        let mut sequencer = EventSequencer::default();
        assert_eq!(offer_denial(&mut sequencer, 2), vec![]);
        let events = sequencer.offer(ProcessEvent::Closed { seq: 1 });
        assert_eq!(events, vec![denied(2), ProcessEvent::Closed { seq: 1 }]);
        assert_eq!(offer_denial(&mut sequencer, 3), vec![], "after the end");
    }

    #[test]
    fn a_hole_below_next_seq_is_a_gap() {
        let mut sequencer = EventSequencer::default();
        sequencer.offer(out(1, "a"));
        let mut result = read(&[(5, "e")], 6);
        result.output_dropped = true;
        result.first_retained_seq = Some(5);
        assert_eq!(
            sequencer.merge_read(&result, identity),
            Err(CatchUpGap {
                missing_from: 2,
                first_retained: Some(5)
            })
        );
    }

    #[test]
    fn a_dropped_chunk_already_received_live_is_not_a_gap() {
        let mut sequencer = EventSequencer::default();
        sequencer.offer(out(1, "a"));
        sequencer.offer(out(2, "b"));
        let mut result = read(&[(3, "c")], 4);
        result.output_dropped = true;
        result.first_retained_seq = Some(3);
        assert_eq!(
            seqs(&sequencer.merge_read(&result, identity).unwrap()),
            vec![3]
        );
    }

    #[test]
    fn a_read_overlapping_published_events_publishes_only_new_ones() {
        let mut sequencer = EventSequencer::default();
        sequencer.offer(out(1, "a"));
        sequencer.offer(out(2, "b"));
        let merged = sequencer
            .merge_read(&read(&[(1, "a"), (2, "b"), (3, "c")], 4), identity)
            .unwrap();
        assert_eq!(merged, vec![out(3, "c")]);
    }
}
