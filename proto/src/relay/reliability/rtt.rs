//! Round-trip time estimation and the timers: the retransmission timeout, heartbeats and
//! the liveness deadline.

use std::time::{Duration, Instant};

use super::{ReliableStream, SegmentCipher};
use crate::relay::limits::{
    HEARTBEAT_INTERVAL, INITIAL_RTO, LIVENESS_TIMEOUT, MAX_RTO, MIN_RTO, REASSEMBLY_DEADLINE,
};

#[derive(Debug)]
pub(super) struct RttEstimator {
    pub(super) srtt: Option<Duration>,
    pub(super) rttvar: Duration,
}

impl RttEstimator {
    pub(super) fn rto(&self) -> Duration {
        match self.srtt {
            None => INITIAL_RTO,
            Some(srtt) => (srtt + 4 * self.rttvar).clamp(MIN_RTO, MAX_RTO),
        }
    }

    /// RFC 6298 smoothing.
    pub(super) fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + delta) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }
}

impl<C: SegmentCipher> ReliableStream<C> {
    /// The current retransmission timeout (before any per-segment backoff).
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// When [`Self::handle_timeout`] should next run (absent new frames). Call
    /// [`Self::poll_transmit`] until it returns `None` before sleeping.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let heartbeat = self.last_sent + HEARTBEAT_INTERVAL;
        let liveness = self.last_received + LIVENESS_TIMEOUT;
        let mut next = heartbeat.min(liveness);
        if let Some(retransmit) = self.next_retransmit {
            next = next.min(retransmit);
        }
        if let Some(ack) = self.ack_deadline {
            next = next.min(ack);
        }
        if let Some(since) = self.incomplete_since {
            next = next.min(since + REASSEMBLY_DEADLINE);
        }
        Some(next)
    }

    /// Check the liveness and reassembly deadlines; retransmissions and heartbeats come out of
    /// [`Self::poll_transmit`].
    pub fn handle_timeout(&mut self, now: Instant) {
        if self
            .incomplete_since
            .is_some_and(|since| now >= since + REASSEMBLY_DEADLINE)
        {
            self.fail(
                format!(
                    "an unfinished message was held for REASSEMBLY_DEADLINE ({REASSEMBLY_DEADLINE:?}) with no message completed"
                ),
                false,
            );
            return;
        }
        if self.closed.is_none() && now >= self.last_received + LIVENESS_TIMEOUT {
            self.fail(
                format!("liveness timeout: nothing heard from the peer for {LIVENESS_TIMEOUT:?}"),
                true,
            );
        }
    }
}
