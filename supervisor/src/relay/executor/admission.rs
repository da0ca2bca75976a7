//! Handshake admission: each harness socket's token bucket of handshake attempts, and the
//! limits on pending (unconfirmed) handshakes, per source and in all.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Executor, StreamHandle};

/// Why a new stream's handshake was refused before it started.
#[derive(Debug, thiserror::Error)]
pub(super) enum HandshakeRefused {
    /// The harness connection (relay `source`) already holds its share of pending handshakes.
    #[error(
        "too many handshakes pending on this connection: MAX_PENDING_HANDSHAKES_PER_SOURCE ({limit})"
    )]
    ConnectionFull {
        /// The relay `source` of the harness connection.
        connection: u64,
        /// The limit.
        limit: usize,
    },
    /// Every pending slot is taken and this connection holds no more than the others.
    #[error("{HANDSHAKES_BUSY} ({limit}) handshakes pending")]
    AllFull {
        /// The limit ([`MAX_PENDING_HANDSHAKES`]).
        limit: usize,
    },
}
use crate::relay::{
    HANDSHAKES_BUSY, HANDSHAKES_PER_SOURCE_BURST, HANDSHAKES_PER_SOURCE_PER_SECOND,
    MAX_PENDING_HANDSHAKES, MAX_PENDING_HANDSHAKES_PER_SOURCE,
};

/// Handshake attempts of one harness socket (token bucket).
pub(super) struct SourceBudget {
    pub(super) tokens: f64,
    refilled: Instant,
    refused: u64,
}

impl Executor {
    /// Take one handshake attempt from `source`'s budget; false when it is spent.
    pub(super) fn spend_handshake(&mut self, source: u64, now: Instant) -> bool {
        let budget = self.budgets.entry(source).or_insert(SourceBudget {
            tokens: HANDSHAKES_PER_SOURCE_BURST,
            refilled: now,
            refused: 0,
        });
        let elapsed = now.saturating_duration_since(budget.refilled);
        budget.refilled = now;
        budget.tokens = (budget.tokens + elapsed.as_secs_f64() * HANDSHAKES_PER_SOURCE_PER_SECOND)
            .min(HANDSHAKES_PER_SOURCE_BURST);
        if budget.tokens < 1.0 {
            budget.refused += 1;
            if budget.refused.is_power_of_two() {
                tracing::warn!(
                    source,
                    refused = budget.refused,
                    "a harness socket exceeds its handshake rate; dropping its handshakes"
                );
            }
            return false;
        }
        budget.tokens -= 1.0;
        true
    }

    fn pending(&self) -> impl Iterator<Item = (&String, &StreamHandle)> {
        self.streams
            .iter()
            .filter(|(_, s)| !s.confirmed.load(Ordering::Relaxed))
    }

    /// Make room for one more pending handshake from `source`: refuse when the source is at its
    /// own limit, or evict the oldest pending handshake of the source holding the most when
    /// everything is full.
    ///
    /// # Errors
    /// [`HandshakeRefused`], whose text is the reset reason the harness sees.
    pub(super) fn admit_pending(&mut self, source: u64) -> Result<(), HandshakeRefused> {
        let mut per_source: HashMap<u64, usize> = HashMap::new();
        for (_, handle) in self.pending() {
            *per_source.entry(handle.source).or_default() += 1;
        }
        let own = per_source.get(&source).copied().unwrap_or(0);
        if own >= MAX_PENDING_HANDSHAKES_PER_SOURCE {
            return Err(HandshakeRefused::ConnectionFull {
                connection: source,
                limit: MAX_PENDING_HANDSHAKES_PER_SOURCE,
            });
        }
        let total: usize = per_source.values().sum();
        if total < MAX_PENDING_HANDSHAKES {
            return Ok(());
        }
        let Some((&busiest, &count)) = per_source.iter().max_by_key(|(_, count)| **count) else {
            return Ok(());
        };
        if count <= own + 1 {
            return Err(HandshakeRefused::AllFull {
                limit: MAX_PENDING_HANDSHAKES,
            });
        }
        let oldest = self
            .pending()
            .filter(|(_, handle)| handle.source == busiest)
            .min_by_key(|(_, handle)| handle.opened)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest {
            self.drop_stream(
                &id,
                "handshake evicted: this connection holds the most pending handshakes".into(),
            );
        }
        Ok(())
    }
}
