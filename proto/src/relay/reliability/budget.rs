//! The receive budget shared by every stream of an endpoint: bytes held that are not whole
//! messages yet (segments out of order, messages in reassembly). Each stream's limits
//! ([`MAX_OUT_OF_ORDER_BYTES`], [`MAX_MESSAGE_BYTES`]) bound one stream; this bounds their sum,
//! so many streams each holding an unfinished message cannot take an executor's memory.
//!
//! Each stream's first `allowance` bytes are its own, outside the budget, so small messages
//! always get through even while other streams hold the whole budget. A segment that the
//! budget cannot take is dropped unacknowledged (the sender retransmits it later), like any
//! segment over a receive limit; a stream that holds an unfinished message longer than
//! [`REASSEMBLY_DEADLINE`] is reset, which gives its share back. What an endpoint holds is thus
//! at most `limit` + streams x `allowance`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(doc)]
use crate::relay::limits::{MAX_MESSAGE_BYTES, MAX_OUT_OF_ORDER_BYTES, REASSEMBLY_DEADLINE};

/// Bytes held by the streams of one endpoint, against a limit. Cheap to clone (one shared
/// counter).
#[derive(Debug, Clone)]
pub struct ReceiveBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
    allowance: usize,
}

impl ReceiveBudget {
    /// A budget of `limit` bytes shared by the streams, beyond each stream's own `allowance`.
    pub fn new(limit: usize, allowance: usize) -> Self {
        Self {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
            allowance,
        }
    }

    /// Bytes charged now, over every stream.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The part of a stream's `held` bytes beyond its allowance (what the budget pays for).
    fn allowance_excess(&self, held: usize) -> usize {
        held.saturating_sub(self.allowance)
    }

    fn try_charge(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(bytes))
            });
    }
}

/// One stream's charge on an optional [`ReceiveBudget`]; given back when dropped.
#[derive(Debug, Default)]
pub(super) struct HeldCharge {
    budget: Option<ReceiveBudget>,
    bytes: usize,
}

impl HeldCharge {
    /// Charge to `budget` from now on; what is held already moves to it (whatever its room:
    /// it is held either way).
    pub(super) fn attach(&mut self, budget: ReceiveBudget) {
        if let Some(old) = self.budget.take() {
            old.release(old.allowance_excess(self.bytes));
        }
        budget
            .used
            .fetch_add(budget.allowance_excess(self.bytes), Ordering::AcqRel);
        self.budget = Some(budget);
    }

    /// Charge `bytes` more; false when the budget cannot take them (nothing is charged then).
    pub(super) fn try_charge(&mut self, bytes: usize) -> bool {
        let total = self.bytes.saturating_add(bytes);
        if let Some(budget) = &self.budget {
            let more = budget.allowance_excess(total) - budget.allowance_excess(self.bytes);
            if more > 0 && !budget.try_charge(more) {
                return false;
            }
        }
        self.bytes = total;
        true
    }

    /// Give back `bytes`.
    pub(super) fn release(&mut self, bytes: usize) {
        let remaining = self.bytes - bytes.min(self.bytes);
        if let Some(budget) = &self.budget {
            budget
                .release(budget.allowance_excess(self.bytes) - budget.allowance_excess(remaining));
        }
        self.bytes = remaining;
    }

    /// Give everything back.
    pub(super) fn release_all(&mut self) {
        self.release(self.bytes);
    }
}

impl Drop for HeldCharge {
    fn drop(&mut self) {
        self.release_all();
    }
}
