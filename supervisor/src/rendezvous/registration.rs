//! What makes a registration acceptable, on one node or in a cluster (a leaf module: the
//! router and the cluster registry both check registrations with it).

use crate::relay::registry::{RegisterRequest, decode_public_key};

/// Default bound of environments bound at once (`exec-rendezvous --max-environments`), on one
/// node or across a cluster.
pub const MAX_ENVIRONMENTS: usize = 1024;
/// Longest display name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The body's public key is unusable.
    #[error(transparent)]
    PublicKey(#[from] crate::relay::registry::PublicKeyError),
    /// The body's display name is longer than [`MAX_NAME_BYTES`].
    #[error("name must be at most {limit} bytes (got {length})")]
    NameTooLong {
        /// Its length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// The id is bound to another key.
    #[error(
        "environment {id:?} is bound to another public key; an operator must release the binding (DELETE /v1/environments/{id} with an admin credential) before a new key can register"
    )]
    KeyConflict {
        /// The environment.
        id: String,
    },
    /// As many environments as the bound are bound already.
    #[error(
        "registry full: {limit} environments are bound (--max-environments, default MAX_ENVIRONMENTS {MAX_ENVIRONMENTS}); an operator releases one with DELETE /v1/environments/ID"
    )]
    Full {
        /// The bound in force.
        limit: usize,
    },
    /// Cluster mode: the cluster registry did not answer.
    #[error("the cluster registry is unavailable: {0}")]
    Unavailable(String),
}

/// Check a registration's key and name, and that it presents the `pinned` key if there is one.
///
/// # Errors
/// [`RegisterError`] naming what is wrong.
pub fn validate_registration(
    id: &str,
    registration: &RegisterRequest,
    pinned: Option<&str>,
) -> Result<(), RegisterError> {
    decode_public_key(&registration.public_key)?;
    if registration.name.len() > MAX_NAME_BYTES {
        return Err(RegisterError::NameTooLong {
            length: registration.name.len(),
            limit: MAX_NAME_BYTES,
        });
    }
    if pinned.is_some_and(|key| key != registration.public_key) {
        return Err(RegisterError::KeyConflict { id: id.to_owned() });
    }
    Ok(())
}
