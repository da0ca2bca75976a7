//! The cluster's registry: key bindings and leases in JetStream key-value buckets.
//!
//! A binding is written only by compare-and-set: `create` when the key is absent, `update` at
//! the revision just read otherwise. Two nodes registering the same environment at once cannot
//! both win; the loser reads again and sees the winner's key. So "the first registration binds
//! the id; another key is refused while the binding stands" holds whatever node each attempt
//! reaches, exactly as on one node.

use async_nats::jetstream::kv;
use serde::{Deserialize, Serialize};
use tokio_tungstenite::tungstenite::Bytes;

use super::bus::NODE_LANE;
use super::{Cluster, Control};
use crate::rendezvous::registration::RegisterError;

/// Attempts at a compare-and-set before giving up (each lost race means another node wrote the
/// same binding in between; more than a few means something is wrong).
const CAS_ATTEMPTS: usize = 8;

/// A binding as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// Display name.
    pub name: String,
    /// The bound public key (base64).
    pub public_key: String,
}

/// A lease as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Lease {
    node: String,
}

/// Why the cluster registry could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterRegistryError {
    /// The registration is refused (as on a single node).
    #[error(transparent)]
    Refused(#[from] RegisterError),
    /// NATS or JetStream failed.
    #[error("the cluster registry is unavailable: {0}")]
    Unavailable(String),
}

fn unavailable(error: impl std::fmt::Display) -> ClusterRegistryError {
    ClusterRegistryError::Unavailable(error.to_string())
}

/// What a registration did.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// The binding stands (created, or the same key again).
    Bound,
    /// An operator's pin displaced a binding to another key.
    Displaced,
}

impl Cluster {
    /// Register `id` with `binding` (already validated): create the binding, or confirm it,
    /// by compare-and-set; a new id only while fewer than `max_environments` are bound
    /// cluster-wide. A registration with the `pinned` key displaces a binding to another
    /// key (and tells the node holding the old executor socket to close it).
    ///
    /// # Errors
    /// `RegisterError::KeyConflict` when the id is bound to another key;
    /// `ClusterRegistryError::Unavailable` when JetStream does not answer.
    pub async fn register(
        &self,
        id: &str,
        binding: &Binding,
        pinned: Option<&str>,
        max_environments: usize,
    ) -> Result<Registered, ClusterRegistryError> {
        let token = self.token(id);
        let value = Bytes::from(serde_json::to_vec(binding).map_err(unavailable)?);
        for _ in 0..CAS_ATTEMPTS {
            let current = self
                .bindings
                .entry(token.clone())
                .await
                .map_err(unavailable)?;
            let current = current.filter(|entry| entry.operation == kv::Operation::Put);
            let Some(entry) = current else {
                if self.bound_environments().await? >= max_environments {
                    return Err(RegisterError::Full {
                        limit: max_environments,
                    }
                    .into());
                }
                match self.bindings.create(&token, value.clone()).await {
                    Ok(_) => return Ok(Registered::Bound),
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(unavailable(e)),
                }
            };
            let stored: Binding = serde_json::from_slice(&entry.value).map_err(unavailable)?;
            let displaced = stored.public_key != binding.public_key;
            if displaced && pinned != Some(binding.public_key.as_str()) {
                return Err(RegisterError::KeyConflict { id: id.to_owned() }.into());
            }
            if stored == *binding {
                return Ok(Registered::Bound);
            }
            match self
                .bindings
                .update(&token, value.clone(), entry.revision)
                .await
            {
                Ok(_) if displaced => {
                    self.publish_release(id);
                    return Ok(Registered::Displaced);
                }
                Ok(_) => return Ok(Registered::Bound),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(unavailable(e)),
            }
        }
        Err(ClusterRegistryError::Unavailable(format!(
            "the binding changed under {CAS_ATTEMPTS} compare-and-set attempts in a row"
        )))
    }

    /// Environments bound cluster-wide (live keys of the bindings bucket): a new id is refused
    /// at the bound (`--max-environments`), as on one node, so an executor credential granted `"*"` cannot
    /// fill JetStream with ids. Registrations of new ids racing through different nodes may pass
    /// the bound by at most their number (each counts before it creates).
    async fn bound_environments(&self) -> Result<usize, ClusterRegistryError> {
        use futures_util::TryStreamExt;
        let keys = self.bindings.keys().await.map_err(unavailable)?;
        keys.try_fold(0usize, |count, _| async move { Ok(count + 1) })
            .await
            .map_err(unavailable)
    }

    /// The binding of `id`, if any.
    ///
    /// # Errors
    /// `ClusterRegistryError::Unavailable` when JetStream does not answer.
    pub async fn lookup(&self, id: &str) -> Result<Option<Binding>, ClusterRegistryError> {
        let Some(value) = self
            .bindings
            .get(self.token(id))
            .await
            .map_err(unavailable)?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&value)
            .map(Some)
            .map_err(unavailable)
    }

    /// Release `id`'s binding (an operator's DELETE); the node holding its executor socket
    /// closes it. Returns whether it was bound.
    ///
    /// # Errors
    /// `ClusterRegistryError::Unavailable` when JetStream does not answer.
    pub async fn release(&self, id: &str) -> Result<bool, ClusterRegistryError> {
        if self.lookup(id).await?.is_none() {
            return Ok(false);
        }
        self.bindings
            .delete(self.token(id))
            .await
            .map_err(unavailable)?;
        self.publish_release(id);
        Ok(true)
    }

    fn publish_release(&self, id: &str) {
        let subject = async_nats::Subject::from(self.executor_subject(id));
        let _ = self
            .publisher()
            .try_publish(NODE_LANE, &subject, Control::Release.encode());
    }

    /// Write (or renew) the lease saying this node holds `id`'s executor socket.
    pub async fn renew_lease(&self, id: &str) {
        let lease = Lease {
            node: self.node.clone(),
        };
        let Ok(value) = serde_json::to_vec(&lease) else {
            return;
        };
        if let Err(error) = self.leases.put(self.token(id), Bytes::from(value)).await {
            tracing::warn!(%error, environment = id, "lease not renewed");
        }
    }

    /// Drop this node's lease on `id` (its executor socket closed), unless another node holds
    /// it by now.
    pub async fn drop_lease(&self, id: &str) {
        let token = self.token(id);
        let Ok(Some(entry)) = self.leases.entry(token.clone()).await else {
            return;
        };
        let ours = serde_json::from_slice::<Lease>(&entry.value)
            .is_ok_and(|lease| lease.node == self.node);
        if ours && entry.operation == kv::Operation::Put {
            let _ = self
                .leases
                .delete_expect_revision(&token, Some(entry.revision))
                .await;
        }
    }

    /// The node holding `id`'s executor socket, per its lease.
    ///
    /// # Errors
    /// `ClusterRegistryError::Unavailable` when JetStream does not answer.
    pub async fn lease_holder(&self, id: &str) -> Result<Option<String>, ClusterRegistryError> {
        let Some(value) = self.leases.get(self.token(id)).await.map_err(unavailable)? else {
            return Ok(None);
        };
        Ok(serde_json::from_slice::<Lease>(&value)
            .ok()
            .map(|lease| lease.node))
    }
}
