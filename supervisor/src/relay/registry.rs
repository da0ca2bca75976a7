//! The registry's two calls, over plain HTTP/1.1 (`http://HOST:PORT`), bounded in size and time.
//!
//! - `POST /v1/environments/{id}` `{"name", "publicKey"}` → `{"rendezvousUrl"}` (executor).
//! - `POST /v1/environments/{id}/connect` → `{"rendezvousUrl", "publicKey", "name"}` (harness).
//!
//! Both carry `Authorization: Bearer <token>`. The public key is base64 (standard alphabet).

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{MAX_REGISTRY_RESPONSE_BYTES, REGISTRY_TIMEOUT};

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
    /// [`RegistryError::Response`] when it is not base64.
    pub fn public_key_bytes(&self) -> Result<Vec<u8>, RegistryError> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.public_key)
            .map_err(|e| RegistryError::Response(format!("publicKey is not base64: {e}")))
    }
}

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The URL is not `http://HOST:PORT[/...]`, or the environment id is unusable.
    #[error("{0}")]
    Url(String),
    /// Connecting or exchanging failed.
    #[error("registry {url}: {source}")]
    Io {
        /// The URL.
        url: String,
        /// The error.
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("registry {0} did not answer within {REGISTRY_TIMEOUT:?}")]
    Timeout(String),
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
    /// An unreadable response.
    #[error("registry response unreadable: {0}")]
    Response(String),
}

/// Register an environment.
///
/// # Errors
/// [`RegistryError`] for a bad URL, an I/O failure, a non-200 answer or an unreadable body.
pub async fn register(
    registry_url: &str,
    environment_id: &str,
    request: &RegisterRequest,
    token: &str,
) -> Result<RegisterResponse, RegistryError> {
    let body = serde_json::to_vec(request).map_err(|e| RegistryError::Response(e.to_string()))?;
    validate_environment_id(environment_id).map_err(RegistryError::Url)?;
    let path = format!("/v1/environments/{environment_id}");
    post(registry_url, &path, &body, token).await
}

/// Look up an environment to connect to.
///
/// # Errors
/// [`RegistryError`] as for [`register`]; 404 when the environment is not registered.
pub async fn connect(
    registry_url: &str,
    environment_id: &str,
    token: &str,
) -> Result<ConnectResponse, RegistryError> {
    validate_environment_id(environment_id).map_err(RegistryError::Url)?;
    let path = format!("/v1/environments/{environment_id}/connect");
    post(registry_url, &path, b"{}", token).await
}

/// Longest environment id, in bytes.
pub const MAX_ENVIRONMENT_ID_BYTES: usize = 128;

/// Check an environment id: 1..=[`MAX_ENVIRONMENT_ID_BYTES`] of `A-Z a-z 0-9 . _ -`, so it is a
/// URL path segment as it stands.
///
/// # Errors
/// A message saying what is expected.
pub fn validate_environment_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ENVIRONMENT_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "environment id must be 1..={MAX_ENVIRONMENT_ID_BYTES} characters of A-Z a-z 0-9 . _ - (got {id:?})"
        ))
    }
}

fn bad_url(url: &str) -> impl FnOnce() -> RegistryError + '_ {
    move || {
        RegistryError::Url(format!(
            "registry URL must look like http://HOST:PORT (got {url:?})"
        ))
    }
}

fn host_port(url: &str) -> Result<String, RegistryError> {
    let rest = url.strip_prefix("http://").ok_or_else(bad_url(url))?;
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() || !host.contains(':') {
        return Err(bad_url(url)());
    }
    Ok(host.to_owned())
}

async fn post<T: for<'de> Deserialize<'de>>(
    registry_url: &str,
    path: &str,
    body: &[u8],
    token: &str,
) -> Result<T, RegistryError> {
    let host = host_port(registry_url)?;
    let io = |source| RegistryError::Io {
        url: registry_url.to_owned(),
        source,
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(&host).await.map_err(io)?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        stream.write_all(body).await.map_err(io)?;
        let mut response = Vec::new();
        let mut limited = (&mut stream).take(MAX_REGISTRY_RESPONSE_BYTES as u64 + 1);
        limited.read_to_end(&mut response).await.map_err(io)?;
        Ok::<_, RegistryError>(response)
    };
    let response = tokio::time::timeout(REGISTRY_TIMEOUT, exchange)
        .await
        .map_err(|_| RegistryError::Timeout(registry_url.to_owned()))??;
    if response.len() > MAX_REGISTRY_RESPONSE_BYTES {
        return Err(RegistryError::Response(format!(
            "larger than {MAX_REGISTRY_RESPONSE_BYTES} bytes"
        )));
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Response::new(&mut headers);
    let head_len = match parsed.parse(&response) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Err(RegistryError::Response("truncated".into())),
        Err(e) => return Err(RegistryError::Response(e.to_string())),
    };
    let status = parsed.code.unwrap_or(0);
    let body = &response[head_len..];
    if status != 200 {
        // Characters, not bytes: a byte cut could split one (and `String::truncate` would panic).
        let text: String = String::from_utf8_lossy(body)
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
    serde_json::from_slice(body).map_err(|e| RegistryError::Response(e.to_string()))
}
