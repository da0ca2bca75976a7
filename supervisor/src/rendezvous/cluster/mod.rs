//! Cluster mode (`exec-rendezvous --cluster nats://HOST:PORT[,...] --node-name NAME`): several
//! rendezvous nodes share their state through NATS instead of memory. Without `--cluster` none of
//! this runs and the node is the single process it always was.
//!
//! What lives where:
//! - The registry (module `registry`) is two JetStream key-value buckets: [`BINDINGS_BUCKET`]
//!   (environment → name and bound public key; no expiry, written by compare-and-set so the key
//!   binding holds whatever node a registration reaches) and [`LEASES_BUCKET`] (environment →
//!   the node holding its executor socket; every entry expires after [`LEASE_TTL`] unless the
//!   node renews it, so a dead node's leases go with it).
//! - Frames travel on subjects (module `bus`): `execward.x.TOKEN` reaches the node holding an
//!   environment's executor socket, `execward.h.TOKEN` one harness socket. Tokens are opaque: an
//!   environment's is an HMAC-SHA256 of its id under the cluster's key (created once, at random,
//!   in [`CLUSTER_BUCKET`] by whichever node starts first), a harness socket's is random. No
//!   environment or stream id appears in a subject or a bucket key.
//! - The node holding an environment's executor socket keeps that environment's stream table
//!   (`router.rs`): every harness frame of the environment passes through it, so the
//!   per-credential stream quota of an environment counts across the cluster.
//!
//! Ordering rules: a node proves an executor socket before it subscribes to the environment's
//! subject; once subscribed it announces a takeover there, and any other node holding an executor
//! socket of that environment closes it (the executor reconnected elsewhere). A node that loses its
//! NATS link closes every socket it holds (the endpoints move to another node) and answers 503
//! until the link is back.

pub(crate) mod bus;
pub(crate) mod pieces;
pub(crate) mod registry;
pub(crate) mod seat;
pub(crate) mod sockets;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use tokio::sync::watch;

pub(crate) use bus::{Control, Publisher};

/// Bucket of key bindings: environment token → `{"name","publicKey"}`. No expiry.
pub const BINDINGS_BUCKET: &str = "EXECWARD_BINDINGS";
/// Bucket of leases: environment token → `{"node"}` of the node holding its executor socket.
pub const LEASES_BUCKET: &str = "EXECWARD_LEASES";
/// Bucket of the cluster's own settings: `subject-key`, the HMAC key of every opaque token.
pub const CLUSTER_BUCKET: &str = "EXECWARD_CLUSTER";
/// Key of the subject key in [`CLUSTER_BUCKET`].
const SUBJECT_KEY: &str = "subject-key";
/// How long a lease outlives the last renewal: the longest a lease may name a dead node.
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// How often a node renews the leases of the executor sockets it holds (a third of the TTL, so
/// two renewals may be lost before a live lease expires).
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(5);
/// Longest pause between attempts to reach NATS again after the link dropped: short, because
/// a node without NATS serves nothing.
pub const NATS_RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);
/// Time to reach NATS (each attempt).
pub const NATS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a node joins the cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `nats://HOST:PORT` or `tls://HOST:PORT`, one or more.
    pub urls: Vec<String>,
    /// This node's name (in leases and logs).
    pub node_name: String,
    /// A NATS credentials file (JWT and nkey seed), if the NATS server wants one.
    pub creds_file: Option<PathBuf>,
    /// Extra CA certificates (PEM) for `tls://` URLs.
    pub ca_file: Option<PathBuf>,
}

/// Why a node cannot join the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A `--cluster` URL is unusable.
    #[error("--cluster {url:?}: expected nats://HOST:PORT or tls://HOST:PORT")]
    Url {
        /// The URL.
        url: String,
    },
    /// `--cluster` named nothing.
    #[error("--cluster needs at least one nats://HOST:PORT")]
    NoUrl,
    /// The node name is empty or too long.
    #[error("--node-name must be 1 to 64 bytes of A-Z a-z 0-9 . _ - (got {name:?})")]
    NodeName {
        /// The name.
        name: String,
    },
    /// The credentials file is unusable.
    #[error("--nats-creds {path}: {source}")]
    Creds {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS settings are unusable.
    #[error(transparent)]
    Tls(#[from] crate::relay::tls::TlsError),
    /// NATS could not be reached.
    #[error("cannot connect to NATS at {urls}: {source}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// Why.
        source: async_nats::ConnectError,
    },
    /// A bucket could not be opened or created (JetStream off: start nats-server with -js).
    #[error("JetStream bucket {bucket}: {reason} (is JetStream on? nats-server -js)")]
    Bucket {
        /// The bucket.
        bucket: &'static str,
        /// Why.
        reason: String,
    },
}

/// A node's link to the cluster: the NATS client, the buckets, the subject key.
pub struct Cluster {
    client: async_nats::Client,
    node: String,
    key: ring::hmac::Key,
    bindings: kv::Store,
    leases: kv::Store,
    sockets: kv::Store,
    /// This node's open sockets per credential key (what it vouches for in `sockets`).
    local_sockets: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    /// One lock per credential key: this node's changes of one count go one at a time, so its
    /// own concurrent admissions never race each other's compare-and-set (only other nodes'
    /// writes can, a few at most).
    count_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    publisher: Publisher,
    linked: watch::Receiver<bool>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connect to NATS, open (or create) the buckets and read (or create) the subject key.
    ///
    /// # Errors
    /// [`ClusterError`] naming what failed.
    pub async fn join(options: &ClusterOptions) -> Result<Arc<Self>, ClusterError> {
        if options.urls.is_empty() {
            return Err(ClusterError::NoUrl);
        }
        let name_ok = !options.node_name.is_empty()
            && options.node_name.len() <= 64
            && options
                .node_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !name_ok {
            return Err(ClusterError::NodeName {
                name: options.node_name.clone(),
            });
        }
        let mut addresses = Vec::new();
        let mut tls = false;
        for url in &options.urls {
            let scheme_tls = match url.split_once("://") {
                Some(("nats", _)) => false,
                Some(("tls", _)) => true,
                _ => return Err(ClusterError::Url { url: url.clone() }),
            };
            tls |= scheme_tls;
            let address: async_nats::ServerAddr = url
                .parse()
                .map_err(|_| ClusterError::Url { url: url.clone() })?;
            addresses.push(address);
        }
        let (link, linked) = watch::channel(true);
        let mut connect = async_nats::ConnectOptions::new()
            .name(format!("exec-rendezvous {}", options.node_name))
            .connection_timeout(NATS_CONNECT_TIMEOUT)
            .reconnect_delay_callback(|attempts| {
                (Duration::from_millis(100) * u32::try_from(attempts).unwrap_or(u32::MAX))
                    .min(NATS_RECONNECT_MAX_DELAY)
            })
            .event_callback(move |event| {
                let link = link.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!("NATS link up");
                            link.send_replace(true);
                        }
                        async_nats::Event::Disconnected | async_nats::Event::Closed => {
                            tracing::warn!("NATS link down: closing every socket of this node");
                            link.send_replace(false);
                        }
                        other => tracing::info!(event = %other, "NATS event"),
                    }
                }
            });
        if let Some(path) = &options.creds_file {
            connect =
                connect
                    .credentials_file(path)
                    .await
                    .map_err(|source| ClusterError::Creds {
                        path: path.clone(),
                        source,
                    })?;
        }
        if tls {
            let config = crate::relay::tls::client_config(options.ca_file.as_deref())?;
            let mut config = rustls::ClientConfig::clone(&config);
            config.alpn_protocols.clear();
            connect = connect.require_tls(true).tls_client_config(config);
        }
        let client = connect
            .connect(addresses)
            .await
            .map_err(|source| ClusterError::Connect {
                urls: options.urls.join(","),
                source,
            })?;
        let jetstream = jetstream::new(client.clone());
        let bindings = bucket(&jetstream, BINDINGS_BUCKET, Duration::ZERO).await?;
        let leases = bucket(&jetstream, LEASES_BUCKET, LEASE_TTL).await?;
        let sockets = bucket(&jetstream, sockets::SOCKETS_BUCKET, Duration::ZERO).await?;
        let settings = bucket(&jetstream, CLUSTER_BUCKET, Duration::ZERO).await?;
        let key = subject_key(&settings).await?;
        let publisher = Publisher::start(client.clone());
        Ok(Arc::new(Self {
            client,
            node: options.node_name.clone(),
            key,
            bindings,
            leases,
            sockets,
            local_sockets: std::sync::Mutex::default(),
            count_locks: std::sync::Mutex::default(),
            publisher,
            linked,
        }))
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether the NATS link is up now.
    pub fn is_linked(&self) -> bool {
        *self.linked.borrow()
    }

    /// Changes of the NATS link (true: up).
    pub fn link(&self) -> watch::Receiver<bool> {
        self.linked.clone()
    }

    /// The opaque token of an environment id: HMAC-SHA256 under the cluster key, 128 bits in hex.
    pub fn token(&self, environment: &str) -> String {
        keyed_token(&self.key, b"environment", environment.as_bytes())
    }

    /// The party id of a credential, equal on every node of the cluster (keyed by the cluster
    /// key, so it says nothing about the token).
    pub(crate) fn party(&self, token: &[u8]) -> u64 {
        let tag = ring::hmac::sign(&self.key, &[b"party\0".as_slice(), token].concat());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&tag.as_ref()[..8]);
        u64::from_be_bytes(bytes)
    }

    /// The subject reaching the node that holds `environment`'s executor socket.
    pub fn executor_subject(&self, environment: &str) -> String {
        format!("execward.x.{}", self.token(environment))
    }

    /// A fresh subject for one harness socket (random: it names nothing).
    pub fn harness_subject(&self) -> String {
        format!("execward.h.{}", random_hex())
    }

    /// The NATS client.
    pub(crate) fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The node's publishing queue.
    pub(crate) fn publisher(&self) -> &Publisher {
        &self.publisher
    }
}

/// Hex of the first 128 bits of HMAC-SHA256(key, domain || 0 || data).
fn keyed_token(key: &ring::hmac::Key, domain: &[u8], data: &[u8]) -> String {
    let tag = ring::hmac::sign(key, &[domain, b"\0", data].concat());
    hex(&tag.as_ref()[..16])
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn random_hex() -> String {
    let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
    format!("{a:016x}{b:016x}")
}

/// Open a bucket, creating it when absent (another node may create it at the same moment).
///
/// The bucket's stream is created here with the key-value conventions (`KV_` name, `$KV.`
/// subjects, rollups, direct gets) rather than through `create_key_value`, which first reads the
/// account's info in a form newer than the distribution's nats-server 2.9 sends.
async fn bucket(
    jetstream: &jetstream::Context,
    name: &'static str,
    max_age: Duration,
) -> Result<kv::Store, ClusterError> {
    if let Ok(store) = jetstream.get_key_value(name).await {
        return Ok(store);
    }
    let created = jetstream
        .create_stream(jetstream::stream::Config {
            name: format!("KV_{name}"),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: 1,
            max_age,
            storage: jetstream::stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            num_replicas: 1,
            discard: jetstream::stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await;
    let failed = |reason: String| ClusterError::Bucket {
        bucket: name,
        reason,
    };
    if let Err(error) = &created {
        tracing::debug!(%error, bucket = name, "bucket not created (another node may have)");
    }
    jetstream
        .get_key_value(name)
        .await
        .map_err(|error| match created {
            Err(created) => failed(created.to_string()),
            Ok(_) => failed(error.to_string()),
        })
}

/// The cluster's HMAC key: created at random by the first node (create-if-absent), read by the
/// others.
async fn subject_key(settings: &kv::Store) -> Result<ring::hmac::Key, ClusterError> {
    let failed = |reason: String| ClusterError::Bucket {
        bucket: CLUSTER_BUCKET,
        reason,
    };
    let mut fresh = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut fresh)
        .map_err(|_| failed("no randomness for the subject key".to_owned()))?;
    match settings
        .create(
            SUBJECT_KEY,
            tokio_tungstenite::tungstenite::Bytes::copy_from_slice(&fresh),
        )
        .await
    {
        Ok(_) => Ok(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &fresh)),
        Err(error) if error.kind() == kv::CreateErrorKind::AlreadyExists => {
            let stored = settings
                .get(SUBJECT_KEY)
                .await
                .map_err(|e| failed(e.to_string()))?
                .ok_or_else(|| failed("the subject key vanished".to_owned()))?;
            if stored.len() != 32 {
                return Err(failed(format!(
                    "the subject key is {} bytes, expected 32",
                    stored.len()
                )));
            }
            Ok(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &stored))
        }
        Err(error) => Err(failed(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_keyed_and_name_nothing() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[7; 32]);
        let other = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[8; 32]);
        let token = keyed_token(&key, b"environment", b"env-a");
        assert_eq!(token.len(), 32);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!token.contains("env"));
        assert_ne!(token, keyed_token(&other, b"environment", b"env-a"));
        assert_ne!(token, keyed_token(&key, b"environment", b"env-b"));
        assert_eq!(token, keyed_token(&key, b"environment", b"env-a"));
    }
}
