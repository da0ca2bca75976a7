//! The executor's persistent Noise identity (`--identity-file`): created with mode 0600 on
//! first start, read on every later one, so the key the registry binds to an environment id
//! survives restarts and harnesses can pin it.
//!
//! ```toml
//! # execward executor identity: the Noise static key of one executor. Keep it private.
//! private_key = "base64"
//! public_key = "base64"
//! ```
//!
//! Rules: an existing file readable or writable by group or others is refused (like ssh's keys);
//! the file is created with `O_EXCL`, so two executors starting at once do not overwrite each
//! other's key; the private half is never logged.

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use proto::relay::noise::StaticKeypair;
use serde::{Deserialize, Serialize};

/// Largest identity file read, in bytes (a real one is under 200).
pub const MAX_IDENTITY_FILE_BYTES: u64 = 4096;

/// Why the identity cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or creating failed.
    #[error("identity file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Group or others may read or write it.
    #[error(
        "identity file {path} has mode {mode:o}: it holds a private key, so only its owner may read it (chmod 600 {path})"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Not an identity file.
    #[error("identity file {path} is not valid: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never key material).
        reason: String,
    },
    /// A new key could not be generated.
    #[error(transparent)]
    Noise(#[from] proto::relay::noise::NoiseError),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    private_key: String,
    public_key: String,
}

/// Read the identity at `path`, or create it (mode 0600) when there is none. Returns the
/// keypair and whether it was created now.
///
/// # Errors
/// [`IdentityError`] naming the file and what is wrong with it.
pub fn load_or_create(path: &Path) -> Result<(StaticKeypair, bool), IdentityError> {
    let io = |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(_) => return load(path).map(|keypair| (keypair, false)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(error)),
    }
    let keypair = StaticKeypair::generate()?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let stored = Stored {
        private_key: b64.encode(keypair.private_for_storage()),
        public_key: b64.encode(keypair.public()),
    };
    let body = toml::to_string(&stored).map_err(|e| IdentityError::Invalid {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        // Another executor created it first: use that one.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            return load(path).map(|keypair| (keypair, false));
        }
        Err(error) => return Err(io(error)),
    };
    file.write_all(
        format!(
            "# execward executor identity: the Noise static key of one executor. Keep it private.\n{body}"
        )
        .as_bytes(),
    )
    .and_then(|()| file.sync_all())
    .map_err(io)?;
    Ok((keypair, true))
}

fn load(path: &Path) -> Result<StaticKeypair, IdentityError> {
    let io = |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    };
    let invalid = |reason: String| IdentityError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io)?;
    let metadata = file.metadata().map_err(io)?;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(IdentityError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    if metadata.len() > MAX_IDENTITY_FILE_BYTES {
        return Err(invalid(format!(
            "larger than {MAX_IDENTITY_FILE_BYTES} bytes"
        )));
    }
    let text = std::io::read_to_string(file).map_err(io)?;
    let stored: Stored = toml::from_str(&text).map_err(|e| {
        invalid(format!(
            "expected private_key and public_key (base64): {}",
            e.message()
        ))
    })?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let private = b64
        .decode(stored.private_key.trim())
        .map_err(|_| invalid("private_key is not base64".into()))?;
    let public = b64
        .decode(stored.public_key.trim())
        .map_err(|_| invalid("public_key is not base64".into()))?;
    StaticKeypair::from_stored(private, public).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_created_private_and_read_back_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity");
        let (first, created) = load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let (again, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(first.public(), again.public());
    }

    #[test]
    fn a_readable_or_edited_identity_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("identity");
        load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(error.contains("chmod 600"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let other = StaticKeypair::generate().unwrap();
        let public = base64::engine::general_purpose::STANDARD.encode(other.public());
        let edited: String = text
            .lines()
            .map(|line| {
                if line.starts_with("public_key") {
                    format!("public_key = \"{public}\"\n")
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        std::fs::write(&path, edited).unwrap();
        let error = load_or_create(&path).unwrap_err().to_string();
        assert!(error.contains("does not belong"), "{error}");
    }
}
