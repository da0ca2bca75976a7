//! Who may do what at the reference rendezvous: the credentials file (TOML), read at start and
//! again on SIGHUP.
//!
//! ```toml
//! # Executors: may register and serve the environment ids listed ("*" = any id).
//! [[executor]]
//! token = "long random secret"
//! environments = ["laptop"]
//!
//! # Harnesses: may look up and connect to the environment ids listed ("*" = any id).
//! [[harness]]
//! token = "another secret"
//! environments = ["laptop"]
//!
//! # Operators: may release an environment's key binding (DELETE /v1/environments/{id}).
//! [[admin]]
//! token = "a third secret"
//!
//! # Optional: pin an environment's key ahead of time (otherwise its first registration binds it).
//! [[environment]]
//! id = "laptop"
//! public_key = "base64 of the executor's 32-byte Noise public key"
//! ```
//!
//! Rules: a token belongs to exactly one role (the same token twice is refused, so a harness
//! secret can never register); tokens are compared in constant time against every entry; tokens
//! never appear in logs or errors. Unknown keys are refused (a typo must not widen access).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::relay::registry::validate_environment_id;

/// Shortest token accepted, in bytes: shorter secrets can be guessed.
pub const MIN_TOKEN_BYTES: usize = 16;
/// Largest credentials file read, in bytes.
pub const MAX_CREDENTIALS_FILE_BYTES: u64 = 1024 * 1024;

/// What a credential may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Register and serve environments.
    Executor,
    /// Look up and connect to environments.
    Harness,
    /// Release key bindings.
    Admin,
}

impl Role {
    /// The role's name in the file and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Role::Executor => "executor",
            Role::Harness => "harness",
            Role::Admin => "admin",
        }
    }
}

/// Why the credentials file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Unreadable.
    #[error("cannot read the credentials file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Too large.
    #[error("the credentials file {path} is over {MAX_CREDENTIALS_FILE_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Not the expected TOML.
    #[error("the credentials file {path} is not valid: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (never a token).
        reason: String,
    },
    /// A semantic problem.
    #[error("the credentials file {path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never a token).
        reason: String,
    },
}

/// The credentials file (`rendezvous.toml`).
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct File {
    /// Executors: may register and serve the environment ids listed.
    #[serde(default)]
    executor: Vec<Entry>,
    /// Harnesses: may look up and connect to the environment ids listed.
    #[serde(default)]
    harness: Vec<Entry>,
    /// Operators: may release an environment's key binding.
    #[serde(default)]
    admin: Vec<AdminEntry>,
    /// Environment keys pinned ahead of time (otherwise the first registration binds one).
    #[serde(default)]
    environment: Vec<PinEntry>,
}

/// An executor or harness credential.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct Entry {
    /// The bearer token (at least 16 bytes; one role per token).
    token: String,
    /// The environment ids it covers (`"*"`: any id).
    environments: Vec<String>,
}

/// An operator credential.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct AdminEntry {
    /// The bearer token.
    token: String,
}

/// A pinned environment key.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
struct PinEntry {
    /// The environment id.
    id: String,
    /// Base64 of the executor's 32-byte Noise public key.
    public_key: String,
}

/// The JSON Schema of the credentials file (`docs/schema/rendezvous.json`), as a root schema of
/// `generator`.
#[cfg(feature = "schema")]
pub fn file_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    generator.root_schema_for::<File>()
}

/// Which environment ids a credential covers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Grant {
    Any,
    Ids(Vec<String>),
}

impl Grant {
    fn covers(&self, id: &str) -> bool {
        match self {
            Grant::Any => true,
            Grant::Ids(ids) => ids.iter().any(|granted| granted == id),
        }
    }
}

struct Credential {
    token: Vec<u8>,
    role: Role,
    grant: Grant,
    /// Index in the file, to tell credentials apart in logs and limits without the token.
    label: String,
}

/// A credential that matched: its role, a log-safe label, and what it covers.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The role.
    pub role: Role,
    /// `executor#0`, `harness#2`, ...: which entry of the file (never the token).
    pub label: String,
    grant: Grant,
    /// The token, kept with each socket it opens so that a reload can check it again.
    pub secret: CredentialSecret,
}

/// A token as a socket keeps it: to check it again after every reload
/// ([`Credentials::grants`]) and to tell parties apart ([`CredentialSecret::party`]) whatever
/// the entry's position in the file. Never formatted.
#[derive(Clone)]
pub struct CredentialSecret {
    token: std::sync::Arc<[u8]>,
    party: u64,
}

impl std::fmt::Debug for CredentialSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialSecret { .. }")
    }
}

impl CredentialSecret {
    fn new(token: &[u8]) -> Self {
        use std::hash::BuildHasher as _;
        // Keyed per process (random SipHash keys), so a party id says nothing about the token.
        static PARTY_KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let party = PARTY_KEYS
            .get_or_init(std::collections::hash_map::RandomState::new)
            .hash_one(token);
        Self {
            token: token.into(),
            party,
        }
    }

    /// The token itself (cluster mode keys a cluster-wide party id with it).
    pub(crate) fn token(&self) -> &[u8] {
        &self.token
    }

    /// The party this token stands for: equal for every socket opened with the same token.
    pub fn party(&self) -> u64 {
        self.party
    }
}

impl Caller {
    /// Whether this caller may act on `environment_id`.
    pub fn covers(&self, environment_id: &str) -> bool {
        self.grant.covers(environment_id)
    }
}

/// The parsed credentials file.
#[derive(Default)]
pub struct Credentials {
    entries: Vec<Credential>,
    pins: HashMap<String, String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("entries", &self.entries.len())
            .field("pins", &self.pins.len())
            .finish()
    }
}

impl Credentials {
    /// Read and check the file.
    ///
    /// # Errors
    /// [`CredentialsError`] naming the file and what is wrong with it.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let read = |source| CredentialsError::Read {
            path: path.to_owned(),
            source,
        };
        let metadata = std::fs::metadata(path).map_err(read)?;
        if metadata.len() > MAX_CREDENTIALS_FILE_BYTES {
            return Err(CredentialsError::TooLarge {
                path: path.to_owned(),
            });
        }
        {
            use std::os::unix::fs::PermissionsExt;
            if metadata.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "the credentials file is readable by other users; chmod 600 it");
            }
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Self::parse(&text).map_err(|(parse, reason)| {
            if parse {
                CredentialsError::Parse {
                    path: path.to_owned(),
                    reason,
                }
            } else {
                CredentialsError::Invalid {
                    path: path.to_owned(),
                    reason,
                }
            }
        })
    }

    /// Parse the file's text; `Err((is_syntax_error, reason))`.
    fn parse(text: &str) -> Result<Self, (bool, String)> {
        let file: File = toml::from_str(text).map_err(|e| (true, e.message().to_owned()))?;
        let mut entries = Vec::new();
        let mut add =
            |role: Role, index: usize, token: String, environments: Option<Vec<String>>| {
                let label = format!("{}#{index}", role.name());
                if token.len() < MIN_TOKEN_BYTES {
                    return Err((
                        false,
                        format!("{label}: token must be at least {MIN_TOKEN_BYTES} bytes"),
                    ));
                }
                let grant = match environments {
                    None => Grant::Any,
                    Some(ids) if ids.iter().any(|id| id == "*") => Grant::Any,
                    Some(ids) => {
                        for id in &ids {
                            validate_environment_id(id)
                                .map_err(|e| (false, format!("{label}: {e}")))?;
                        }
                        Grant::Ids(ids)
                    }
                };
                entries.push(Credential {
                    token: token.into_bytes(),
                    role,
                    grant,
                    label,
                });
                Ok(())
            };
        for (index, entry) in file.executor.into_iter().enumerate() {
            add(Role::Executor, index, entry.token, Some(entry.environments))?;
        }
        for (index, entry) in file.harness.into_iter().enumerate() {
            add(Role::Harness, index, entry.token, Some(entry.environments))?;
        }
        for (index, entry) in file.admin.into_iter().enumerate() {
            add(Role::Admin, index, entry.token, None)?;
        }
        for (i, a) in entries.iter().enumerate() {
            if let Some(b) = entries[i + 1..].iter().find(|b| b.token == a.token) {
                return Err((
                    false,
                    format!(
                        "{} and {} share a token; every credential needs its own secret",
                        a.label, b.label
                    ),
                ));
            }
        }
        let mut pins = HashMap::new();
        for pin in file.environment {
            validate_environment_id(&pin.id).map_err(|e| (false, e.to_string()))?;
            crate::relay::registry::decode_public_key(&pin.public_key)
                .map_err(|e| (false, format!("environment {:?}: {e}", pin.id)))?;
            pins.insert(pin.id, pin.public_key);
        }
        if entries.is_empty() {
            return Err((
                false,
                "no [[executor]] or [[harness]] credentials: nobody could use the rendezvous"
                    .into(),
            ));
        }
        Ok(Self { entries, pins })
    }

    /// The credential holding `token`, compared in constant time against every entry.
    pub fn authenticate(&self, token: &[u8]) -> Option<Caller> {
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.token.as_slice().ct_eq(token)) {
                found = Some(Caller {
                    role: entry.role,
                    label: entry.label.clone(),
                    grant: entry.grant.clone(),
                    secret: CredentialSecret::new(token),
                });
            }
        }
        found
    }

    /// Whether the token in `secret` still holds `role` and covers `environment_id` (checked
    /// again for every open socket after a reload).
    pub fn grants(&self, secret: &CredentialSecret, role: Role, environment_id: &str) -> bool {
        self.authenticate(&secret.token)
            .is_some_and(|caller| caller.role == role && caller.covers(environment_id))
    }

    /// Every pin of the file: (environment id, public key).
    pub fn pins(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pins
            .iter()
            .map(|(id, key)| (id.as_str(), key.as_str()))
    }

    /// The key pinned for `environment_id` in the file, if any.
    pub fn pinned_key(&self, environment_id: &str) -> Option<&str> {
        self.pins.get(environment_id).map(String::as_str)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[executor]]
token = "executor-secret-0123456789"
environments = ["laptop"]

[[harness]]
token = "harness-secret-0123456789"
environments = ["*"]
"#;

    #[test]
    fn each_token_has_its_role_and_grant() {
        let credentials = Credentials::parse(FILE).map_err(|e| e.1).unwrap();
        let executor = credentials
            .authenticate(b"executor-secret-0123456789")
            .unwrap();
        assert_eq!(executor.role, Role::Executor);
        assert!(executor.covers("laptop") && !executor.covers("other"));
        let harness = credentials
            .authenticate(b"harness-secret-0123456789")
            .unwrap();
        assert_eq!(
            (harness.role, harness.label.as_str()),
            (Role::Harness, "harness#0")
        );
        assert!(harness.covers("anything"));
        assert!(
            credentials
                .authenticate(b"harness-secret-012345678")
                .is_none()
        );
        assert!(credentials.authenticate(b"").is_none());
    }

    #[test]
    fn shared_short_or_unknown_entries_are_refused() {
        let shared = FILE.replace("harness-secret", "executor-secret");
        assert!(
            Credentials::parse(&shared)
                .unwrap_err()
                .1
                .contains("share a token")
        );
        let short = FILE.replace("harness-secret-0123456789", "short");
        assert!(
            Credentials::parse(&short)
                .unwrap_err()
                .1
                .contains("at least 16 bytes")
        );
        let typo = FILE.replace("environments = [\"laptop\"]", "environment = [\"laptop\"]");
        assert!(Credentials::parse(&typo).unwrap_err().0);
        assert!(Credentials::parse("").unwrap_err().1.contains("nobody"));
        let bad_id = FILE.replace("[\"laptop\"]", "[\"a b\"]");
        assert!(
            Credentials::parse(&bad_id)
                .unwrap_err()
                .1
                .contains("environment id")
        );
    }

    #[test]
    fn debug_output_never_shows_a_token() {
        let credentials = Credentials::parse(FILE).map_err(|e| e.1).unwrap();
        assert!(!format!("{credentials:?}").contains("secret"));
    }
}
