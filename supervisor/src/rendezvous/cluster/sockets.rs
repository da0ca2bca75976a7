//! Per-credential socket counts across the cluster (`--max-sockets-per-credential` per cluster,
//! not per node: a credential cannot multiply its share by spreading over nodes).
//!
//! [`SOCKETS_BUCKET`] holds one entry per credential (key: a keyed hash of its token): each
//! node's open sockets of that credential and when the node last vouched for the count. Every
//! change is a compare-and-set of the whole entry, so two nodes admitting the last socket at
//! once cannot both succeed; a node makes its own changes of one entry one at a time (a lock per
//! credential), so only other nodes' writes make it retry. A node rewrites its own counts every
//! [`LEASE_RENEW_INTERVAL`] from what it really holds; a count not
//! vouched for within [`LEASE_TTL`] (a dead node's) is not counted.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use tokio_tungstenite::tungstenite::Bytes;

use super::registry::ClusterRegistryError;
use super::{Cluster, LEASE_RENEW_INTERVAL, LEASE_TTL};

/// Bucket of per-credential socket counts.
pub const SOCKETS_BUCKET: &str = "EXECWARD_SOCKETS";
/// Compare-and-set attempts before a count change gives up (and the socket is refused).
const CAS_ATTEMPTS: usize = 16;

/// One node's part of a credential's count.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeCount {
    open: usize,
    /// Unix milliseconds of the node's last write.
    renewed: u64,
}

/// A credential's entry: node name → its count.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Counts {
    nodes: BTreeMap<String, NodeCount>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Counts {
    /// Sockets counted cluster-wide: this node's, plus every node's vouched for lately.
    fn live_total(&self, node: &str, now: u64) -> usize {
        let ttl = u64::try_from(LEASE_TTL.as_millis()).unwrap_or(u64::MAX);
        self.nodes
            .iter()
            .filter(|(name, count)| *name == node || count.renewed.saturating_add(ttl) >= now)
            .map(|(_, count)| count.open)
            .sum()
    }
}

/// A socket counted against its credential cluster-wide until dropped.
pub struct ClusterSocketSlot {
    cluster: Arc<Cluster>,
    key: String,
}

impl Drop for ClusterSocketSlot {
    fn drop(&mut self) {
        let cluster = self.cluster.clone();
        let key = std::mem::take(&mut self.key);
        tokio::spawn(async move {
            if let Err(error) = cluster.change_count(&key, -1, usize::MAX).await {
                tracing::warn!(%error, "socket count not released; the node's next renewal corrects it");
            }
        });
    }
}

/// The pause before compare-and-set attempt `attempt` (from 1): growing with the attempt, with
/// jitter from the clock so nodes that collided do not collide again.
fn cas_backoff(attempt: usize) -> Duration {
    let ceiling = 2 * u32::try_from(attempt).unwrap_or(u32::MAX);
    let jitter = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        % (ceiling * 1000);
    Duration::from_micros(u64::from(jitter))
}

impl Cluster {
    fn credential_key(&self, token: &[u8]) -> String {
        super::keyed_token(&self.key, b"credential", token)
    }

    /// Count one more socket of the credential `token`, unless it holds `max` across the
    /// cluster already (`None`).
    ///
    /// # Errors
    /// `ClusterRegistryError::Unavailable` when JetStream does not answer.
    pub async fn take_socket(
        self: &Arc<Self>,
        token: &[u8],
        max: usize,
    ) -> Result<Option<ClusterSocketSlot>, ClusterRegistryError> {
        let key = self.credential_key(token);
        if !self.change_count(&key, 1, max).await? {
            return Ok(None);
        }
        Ok(Some(ClusterSocketSlot {
            cluster: self.clone(),
            key,
        }))
    }

    /// Add `delta` to this node's count of `key`, refusing (`false`) when an increment would
    /// pass `max` cluster-wide.
    async fn change_count(
        &self,
        key: &str,
        delta: isize,
        max: usize,
    ) -> Result<bool, ClusterRegistryError> {
        let unavailable =
            |e: &dyn std::fmt::Display| ClusterRegistryError::Unavailable(e.to_string());
        let lock = self.count_lock(key);
        let _one_at_a_time = lock.lock().await;
        for attempt in 0..CAS_ATTEMPTS {
            if attempt > 0 {
                // Another node wrote meanwhile: back off a little, differently on each node.
                tokio::time::sleep(cas_backoff(attempt)).await;
            }
            let entry = self
                .sockets
                .entry(key.to_owned())
                .await
                .map_err(|e| unavailable(&e))?
                .filter(|entry| entry.operation == kv::Operation::Put);
            let mut counts: Counts = entry
                .as_ref()
                .and_then(|entry| serde_json::from_slice(&entry.value).ok())
                .unwrap_or_default();
            let now = now_ms();
            if delta > 0 && counts.live_total(&self.node, now) >= max {
                return Ok(false);
            }
            let mine = counts.nodes.entry(self.node.clone()).or_insert(NodeCount {
                open: 0,
                renewed: now,
            });
            mine.open = mine.open.saturating_add_signed(delta);
            mine.renewed = now;
            let open = mine.open;
            let value = Bytes::from(serde_json::to_vec(&counts).map_err(|e| unavailable(&e))?);
            let written = match &entry {
                Some(entry) => self
                    .sockets
                    .update(key, value, entry.revision)
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::UpdateErrorKind::WrongLastRevision,
                            e.to_string(),
                        )
                    }),
                None => self
                    .sockets
                    .create(key, value)
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        (
                            e.kind() == kv::CreateErrorKind::AlreadyExists,
                            e.to_string(),
                        )
                    }),
            };
            match written {
                Ok(()) => {
                    let mut local = self.local_sockets();
                    if open == 0 {
                        local.remove(key);
                    } else {
                        local.insert(key.to_owned(), open);
                    }
                    return Ok(true);
                }
                Err((true, _)) => continue,
                Err((false, reason)) => return Err(ClusterRegistryError::Unavailable(reason)),
            }
        }
        Err(ClusterRegistryError::Unavailable(format!(
            "socket count changed under {CAS_ATTEMPTS} compare-and-set attempts in a row"
        )))
    }

    fn count_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.count_locks.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(locks.entry(key.to_owned()).or_default())
    }

    fn local_sockets(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.local_sockets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rewrite this node's counts every [`LEASE_RENEW_INTERVAL`] (they expire from the
    /// cluster's view after [`LEASE_TTL`] otherwise). Runs until the node stops.
    pub async fn renew_socket_counts(self: Arc<Self>) {
        let mut tick = tokio::time::interval(LEASE_RENEW_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let keys: Vec<String> = self.local_sockets().keys().cloned().collect();
            for key in keys {
                if let Err(error) = self.change_count(&key, 0, usize::MAX).await {
                    tracing::debug!(%error, "socket count not renewed");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
}
