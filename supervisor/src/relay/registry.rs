//! The registry's two calls through one shared HTTP client ([`RegistryClient`], reqwest over
//! rustls), bounded in size and time:
//!
//! - `POST /v1/environments/{id}` `{"name", "publicKey"}` → `{"rendezvousUrl"}` (executor).
//! - `POST /v1/environments/{id}/connect` → `{"rendezvousUrl", "publicKey", "name"}` (harness).
//!
//! Both carry `Authorization: Bearer <token>`, so the URL must be `https://` unless its host is
//! loopback ([`super::tls::check_url`]); redirects are never followed. The public key is base64
//! (standard alphabet).

use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::tls::{Scheme, check_url};
use super::{MAX_REGISTRY_RESPONSE_BYTES, REGISTRY_TIMEOUT};
use crate::error_text::error_chain;

/// Characters of an error response's body kept in [`RegistryError::Status`] (enough for a
/// message, not a page).
pub const MAX_STATUS_BODY_CHARS: usize = 512;

/// Body of a registration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterRequest {
    /// Display name.
    pub name: String,
    /// The environment's Noise static public key, base64.
    pub public_key: String,
}

/// Answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterResponse {
    /// Where the executor's websocket goes.
    pub rendezvous_url: String,
}

/// Answer to a harness's connect.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectResponse {
    /// Where the harness's websocket goes.
    pub rendezvous_url: String,
    /// The environment's Noise static public key, base64.
    pub public_key: String,
    /// The environment's display name.
    pub name: String,
}

impl ConnectResponse {
    /// The decoded public key.
    ///
    /// # Errors
    /// [`RegistryError::PublicKey`] when it is not base64 or not a key's length.
    pub fn public_key_bytes(&self) -> Result<Vec<u8>, RegistryError> {
        Ok(decode_public_key(&self.public_key)?)
    }
}

/// Why a Noise public key (`publicKey`, `--executor-key`, a pinned key) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum PublicKeyError {
    /// It is not base64.
    #[error("publicKey must be base64: {0}")]
    Base64(#[source] base64::DecodeError),
    /// It decodes to the wrong length.
    #[error("publicKey must be {expected} bytes (got {length})")]
    Length {
        /// The decoded length, in bytes.
        length: usize,
        /// The length of a key ([`proto::relay::noise::PUBLIC_KEY_BYTES`]).
        expected: usize,
    },
}

/// Decode a base64 Noise public key and check its length.
///
/// # Errors
/// [`PublicKeyError`] saying what is expected.
pub fn decode_public_key(text: &str) -> Result<Vec<u8>, PublicKeyError> {
    use proto::relay::noise::PUBLIC_KEY_BYTES;
    let key = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(PublicKeyError::Base64)?;
    if key.len() != PUBLIC_KEY_BYTES {
        return Err(PublicKeyError::Length {
            length: key.len(),
            expected: PUBLIC_KEY_BYTES,
        });
    }
    Ok(key)
}

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The URL is unusable (or plain text to a non-loopback host).
    #[error(transparent)]
    Url(super::tls::TlsError),
    /// The environment id is unusable.
    #[error(transparent)]
    EnvironmentId(#[from] InvalidEnvironmentId),
    /// TLS settings are unusable.
    #[error(transparent)]
    Tls(#[from] super::tls::TlsError),
    /// Connecting or exchanging failed.
    #[error("registry {url}: {}", error_chain(source))]
    Http {
        /// The URL.
        url: String,
        /// The error (its causes are part of the message).
        #[source]
        source: reqwest::Error,
    },
    /// No answer in time.
    #[error("registry {url} did not answer within {REGISTRY_TIMEOUT:?}")]
    Timeout {
        /// The registry URL.
        url: String,
    },
    /// A non-200 status.
    #[error("registry answered {status} to {path}: {body}")]
    Status {
        /// Status code.
        status: u16,
        /// Request path.
        path: String,
        /// Response body (truncated).
        body: String,
    },
    /// The request body could not be encoded.
    #[error("cannot encode the registry request: {0}")]
    Encode(#[source] serde_json::Error),
    /// The response is larger than its limit.
    #[error("registry response unreadable: larger than {limit} bytes")]
    TooLarge {
        /// The limit ([`MAX_REGISTRY_RESPONSE_BYTES`]).
        limit: usize,
    },
    /// The response is not the JSON expected.
    #[error("registry response unreadable: {source}")]
    Response {
        /// The request path.
        path: String,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// The public key in a response is unusable.
    #[error("registry response unreadable: {0}")]
    PublicKey(#[from] PublicKeyError),
}

impl RegistryError {
    /// Whether another node of a cluster may answer where this one failed: it could not be
    /// reached, timed out, or answered 5xx (it lost its cluster link).
    pub fn is_node_failure(&self) -> bool {
        match self {
            Self::Http { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// Whether waiting may change the answer: the environment is not registered yet (404), or
    /// nothing listens at the registry's address yet (connection refused, as when the
    /// rendezvous and `exec --remote` are started at the same moment). Every other failure
    /// (TLS, credentials, timeouts) is final.
    pub fn is_not_yet(&self) -> bool {
        match self {
            Self::Status { status, .. } => *status == 404,
            Self::Http { source, .. } => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
                while let Some(error) = cause {
                    if let Some(io) = error.downcast_ref::<std::io::Error>()
                        && io.kind() == std::io::ErrorKind::ConnectionRefused
                    {
                        return true;
                    }
                    cause = error.source();
                }
                false
            }
            _ => false,
        }
    }
}

/// The registry's HTTP client: one reqwest client (connection pool, TLS settings) for every
/// call to one registry, or to the nodes of a rendezvous cluster (`URL1,URL2,...`): a call
/// goes to the node that answered last and moves on to the next when that one cannot be
/// reached or answers 5xx (a node that lost its cluster link). Cheap to clone; clones share
/// the current node.
#[derive(Clone)]
pub struct RegistryClient {
    bases: Arc<[String]>,
    current: Arc<std::sync::atomic::AtomicUsize>,
    http: reqwest::Client,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("bases", &self.bases)
            .finish()
    }
}

impl RegistryClient {
    /// A client for the registry at `registry_url` (`https://HOST:PORT`, or `http://` to a
    /// loopback host), trusting `tls`'s roots.
    ///
    /// # Errors
    /// [`RegistryError::Url`] for a URL that is not allowed, [`RegistryError::Http`] when the
    /// client cannot be built.
    pub fn new(registry_url: &str, tls: &Arc<rustls::ClientConfig>) -> Result<Self, RegistryError> {
        let bases: Vec<String> = registry_url
            .split(',')
            .map(|url| url.trim().trim_end_matches('/').to_owned())
            .collect();
        for base in &bases {
            check_url(base, ["http", "https"]).map_err(RegistryError::Url)?;
        }
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(rustls::ClientConfig::clone(tls))
            .timeout(REGISTRY_TIMEOUT)
            .connect_timeout(REGISTRY_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|source| RegistryError::Http {
                url: registry_url.to_owned(),
                source,
            })?;
        Ok(Self {
            bases: bases.into(),
            current: Arc::default(),
            http,
        })
    }

    /// Whether the registry is reached over TLS (every URL, when there are several).
    pub fn is_tls(&self) -> bool {
        self.bases
            .iter()
            .all(|base| matches!(check_url(base, ["http", "https"]), Ok(Scheme::Tls)))
    }

    /// The registry URL in use (the one that answered last).
    pub fn url(&self) -> &str {
        let current = self.current.load(std::sync::atomic::Ordering::Relaxed);
        self.bases
            .get(current)
            .or_else(|| self.bases.first())
            .map_or("", String::as_str)
    }

    /// Register an environment.
    ///
    /// # Errors
    /// [`RegistryError`] for an I/O failure, a non-200 answer (401 unknown token, 403 a
    /// credential that may not register this id, 409 the id is bound to another key) or an
    /// unreadable body.
    pub async fn register(
        &self,
        environment_id: &str,
        request: &RegisterRequest,
        token: &str,
    ) -> Result<RegisterResponse, RegistryError> {
        let body = serde_json::to_vec(request).map_err(RegistryError::Encode)?;
        validate_environment_id(environment_id)?;
        self.post(&format!("/v1/environments/{environment_id}"), body, token)
            .await
    }

    /// Look up an environment to connect to.
    ///
    /// # Errors
    /// [`RegistryError`] as for [`Self::register`]; 404 when the environment is not registered.
    pub async fn connect(
        &self,
        environment_id: &str,
        token: &str,
    ) -> Result<ConnectResponse, RegistryError> {
        validate_environment_id(environment_id)?;
        self.post(
            &format!("/v1/environments/{environment_id}/connect"),
            b"{}".to_vec(),
            token,
        )
        .await
    }

    /// POST to the current node; on a failure another node may not have (unreachable, timed
    /// out, 5xx), to the next one, each node once.
    async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: Vec<u8>,
        token: &str,
    ) -> Result<T, RegistryError> {
        let count = self.bases.len();
        let start = self.current.load(std::sync::atomic::Ordering::Relaxed);
        let mut last = None;
        for step in 0..count {
            let index = (start + step) % count;
            let Some(base) = self.bases.get(index) else {
                continue;
            };
            match self.post_to(base, path, body.clone(), token).await {
                Err(error) if step + 1 < count && error.is_node_failure() => {
                    tracing::info!(registry = %base, %error, "registry node failed; trying the next");
                    last = Some(error);
                }
                result => {
                    self.current
                        .store(index, std::sync::atomic::Ordering::Relaxed);
                    return result;
                }
            }
        }
        Err(last.unwrap_or(RegistryError::Timeout {
            url: self.url().to_owned(),
        }))
    }

    async fn post_to<T: for<'de> Deserialize<'de>>(
        &self,
        base: &str,
        path: &str,
        body: Vec<u8>,
        token: &str,
    ) -> Result<T, RegistryError> {
        let url = format!("{base}{path}");
        let failed = |source: reqwest::Error| {
            if source.is_timeout() {
                RegistryError::Timeout {
                    url: base.to_owned(),
                }
            } else {
                RegistryError::Http {
                    url: base.to_owned(),
                    source,
                }
            }
        };
        let mut response = self
            .http
            .post(&url)
            .bearer_auth(token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(failed)?;
        let status = response.status().as_u16();
        // Chunked or not, read at most MAX_REGISTRY_RESPONSE_BYTES.
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if bytes.len() + chunk.len() > MAX_REGISTRY_RESPONSE_BYTES {
                return Err(RegistryError::TooLarge {
                    limit: MAX_REGISTRY_RESPONSE_BYTES,
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if status != 200 {
            // Characters, not bytes: a byte cut could split one.
            let text: String = String::from_utf8_lossy(&bytes)
                .trim_end()
                .chars()
                .take(MAX_STATUS_BODY_CHARS)
                .collect();
            return Err(RegistryError::Status {
                status,
                path: path.to_owned(),
                body: text,
            });
        }
        serde_json::from_slice(&bytes).map_err(|source| RegistryError::Response {
            path: path.to_owned(),
            source,
        })
    }
}

/// Longest environment id, in bytes.
pub const MAX_ENVIRONMENT_ID_BYTES: usize = 128;

/// Check an environment id: 1..=[`MAX_ENVIRONMENT_ID_BYTES`] of `A-Z a-z 0-9 . _ -`, so it is a
/// URL path segment as it stands.
///
/// # Errors
/// [`InvalidEnvironmentId`] saying what is expected.
pub fn validate_environment_id(id: &str) -> Result<(), InvalidEnvironmentId> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ENVIRONMENT_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(InvalidEnvironmentId { id: id.to_owned() })
    }
}

/// An environment id that is not 1..=[`MAX_ENVIRONMENT_ID_BYTES`] of `A-Z a-z 0-9 . _ -`.
#[derive(Debug, thiserror::Error)]
#[error(
    "environment id must be 1..={MAX_ENVIRONMENT_ID_BYTES} characters of A-Z a-z 0-9 . _ - (got {id:?})"
)]
pub struct InvalidEnvironmentId {
    /// The id given.
    pub id: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_public_key_is_refused_for_its_encoding_or_its_length() {
        assert!(matches!(
            decode_public_key("not base64!"),
            Err(PublicKeyError::Base64(_))
        ));
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 3]);
        match decode_public_key(&short) {
            Err(PublicKeyError::Length { length, expected }) => {
                assert_eq!(length, 3);
                assert_eq!(expected, proto::relay::noise::PUBLIC_KEY_BYTES);
            }
            other => panic!("expected a length error, got {other:?}"),
        }
        let key = base64::engine::general_purpose::STANDARD
            .encode([7u8; proto::relay::noise::PUBLIC_KEY_BYTES]);
        assert_eq!(
            decode_public_key(&key).unwrap().len(),
            proto::relay::noise::PUBLIC_KEY_BYTES
        );
    }

    #[test]
    fn an_environment_id_is_refused_naming_the_id_and_the_accepted_form() {
        for bad in ["", "a/b", "a b", &"x".repeat(MAX_ENVIRONMENT_ID_BYTES + 1)] {
            let error = validate_environment_id(bad).unwrap_err();
            assert_eq!(error.id, bad);
            assert!(error.to_string().contains("A-Z a-z 0-9 . _ -"), "{error}");
        }
        validate_environment_id("env-1.prod_x").unwrap();
    }
}
