//! What an environment registers as and with which credential: [`RemoteEnvironmentConfig`]
//! (token file or environment variable, persistent identity key) and [`RemoteError`], why
//! remote mode cannot start.

use std::path::PathBuf;

use base64::Engine as _;
use proto::relay::noise::StaticKeypair;

use crate::relay::EXECUTOR_TOKEN_ENV;
use crate::relay::registry::RegistryError;

/// Where and as what an environment registers.
#[derive(Clone)]
pub struct RemoteEnvironmentConfig {
    /// `https://HOST:PORT` of the registry (`http://` to a loopback host only).
    pub registry_url: String,
    /// The environment id harnesses connect to.
    pub environment_id: String,
    /// Display name.
    pub name: String,
    /// The executor credential for the registry and the rendezvous.
    pub bearer_token: String,
    /// The persistent identity file (created 0600 if missing); `None`: a fresh key per run,
    /// which a registry that bound the id to an earlier key refuses.
    pub identity_file: Option<PathBuf>,
    /// Extra trusted CA certificates (PEM) besides the system's.
    pub ca_file: Option<PathBuf>,
    /// The Noise ciphers harnesses may open streams with (default: ChaCha20-Poly1305, and
    /// AES-256-GCM when this CPU has AES instructions).
    pub ciphers: proto::relay::CipherPolicy,
}

impl std::fmt::Debug for RemoteEnvironmentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEnvironmentConfig")
            .field("registry_url", &self.registry_url)
            .field("environment_id", &self.environment_id)
            .field("name", &self.name)
            .field("bearer_token", &"<redacted>")
            .field("identity_file", &self.identity_file)
            .field("ca_file", &self.ca_file)
            .field("ciphers", &self.ciphers)
            .finish()
    }
}

/// Why remote mode cannot start.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No executor credential.
    #[error(
        "remote mode needs the executor credential: pass --token-file FILE or set ${EXECUTOR_TOKEN_ENV}"
    )]
    MissingToken,
    /// The token file is unreadable or empty.
    #[error("--token-file {path}: {reason}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Bad environment id.
    #[error(transparent)]
    EnvironmentId(#[from] crate::relay::registry::InvalidEnvironmentId),
    /// The identity file is unusable.
    #[error(transparent)]
    Identity(#[from] crate::relay::identity::IdentityError),
    /// The registry URL or TLS settings are unusable.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The static key could not be generated.
    #[error(transparent)]
    Noise(#[from] proto::relay::noise::NoiseError),
    /// The local server could not start.
    #[error(transparent)]
    Server(#[from] crate::server::ExecServerError),
}

impl RemoteEnvironmentConfig {
    /// A config with an explicit token (for embedding and tests); the name defaults to the id,
    /// no identity file (a fresh key), system roots.
    pub fn with_bearer_token(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        bearer_token: impl Into<String>,
    ) -> Self {
        let environment_id = environment_id.into();
        Self {
            registry_url: registry_url.into(),
            name: environment_id.clone(),
            environment_id,
            bearer_token: bearer_token.into(),
            identity_file: None,
            ca_file: None,
            ciphers: proto::relay::CipherPolicy::default(),
        }
    }

    /// A config whose token is `token_file`'s content (surrounding whitespace removed), or else
    /// `$EXECWARD_EXECUTOR_TOKEN`'s.
    ///
    /// # Errors
    /// [`RemoteError::TokenFile`] for an unreadable or empty file, [`RemoteError::MissingToken`]
    /// when there is no token at all.
    pub fn from_token_source(
        registry_url: impl Into<String>,
        environment_id: impl Into<String>,
        name: Option<String>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Self, RemoteError> {
        let token = match token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| RemoteError::TokenFile {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
                let token = text.trim().to_owned();
                if token.is_empty() {
                    return Err(RemoteError::TokenFile {
                        path: path.to_owned(),
                        reason: "the file is empty".into(),
                    });
                }
                token
            }
            None => {
                let token = std::env::var(EXECUTOR_TOKEN_ENV).unwrap_or_default();
                let token = token.trim().to_owned();
                if token.is_empty() {
                    return Err(RemoteError::MissingToken);
                }
                token
            }
        };
        let mut config = Self::with_bearer_token(registry_url, environment_id, token);
        if let Some(name) = name {
            config.name = name;
        }
        Ok(config)
    }

    /// The keypair: the identity file's (created if missing), or a fresh one.
    ///
    /// # Errors
    /// [`RemoteError::Identity`] or [`RemoteError::Noise`].
    pub fn keypair(&self) -> Result<StaticKeypair, RemoteError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        match &self.identity_file {
            Some(path) => {
                let (keypair, created) = crate::relay::identity::load_or_create(path)?;
                tracing::info!(
                    path = %path.display(),
                    created,
                    public_key = %b64.encode(keypair.public()),
                    "executor identity"
                );
                Ok(keypair)
            }
            None => {
                let keypair = StaticKeypair::generate()?;
                tracing::warn!(
                    public_key = %b64.encode(keypair.public()),
                    "no --identity-file: this executor's key changes on every start, so a restart cannot re-register the same environment id"
                );
                Ok(keypair)
            }
        }
    }
}
