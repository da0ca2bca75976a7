//! The upstream proxy's credentials (`sandbox-run --upstream-proxy-credentials FILE`): read by
//! the outer `sandbox-run` and handed to the egress proxy in its configuration, which sends them
//! as `Proxy-Authorization` with each `CONNECT` (the `egress` crate's `upstream`).

use std::io::Read;
use std::path::Path;

use base64::Engine;

/// Largest credentials file read (one `USER:PASSWORD` line).
pub const MAX_CREDENTIALS_BYTES: u64 = 4096;

/// What went wrong with the upstream proxy.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The credentials file could not be read.
    #[error("reading the upstream proxy credentials {path}: {source}")]
    ReadCredentials {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The credentials file is not one `USER:PASSWORD` line.
    #[error(
        "the upstream proxy credentials {path} must hold one line USER:PASSWORD (at most \
         MAX_CREDENTIALS_BYTES, {MAX_CREDENTIALS_BYTES} bytes, no control characters)"
    )]
    MalformedCredentials {
        /// The file.
        path: std::path::PathBuf,
    },
}

/// The `Proxy-Authorization` value (`Basic base64(USER:PASSWORD)`) for the credentials in
/// `path`: one line `USER:PASSWORD` (a final newline is ignored).
///
/// # Errors
/// [`UpstreamError`] naming the file.
pub fn authorization_from_file(path: &Path) -> Result<String, UpstreamError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| {
            file.take(MAX_CREDENTIALS_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(|source| UpstreamError::ReadCredentials {
            path: path.to_owned(),
            source,
        })?;
    let line = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    if text.len() as u64 > MAX_CREDENTIALS_BYTES
        || !line.contains(':')
        || line.chars().any(char::is_control)
    {
        return Err(UpstreamError::MalformedCredentials {
            path: path.to_owned(),
        });
    }
    Ok(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(line)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_one_user_password_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "alice:s3cret\n").unwrap();
        assert_eq!(
            authorization_from_file(&path).unwrap(),
            "Basic YWxpY2U6czNjcmV0"
        );
        for bad in ["no-colon\n", "a:b\nc:d\n", ""] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                matches!(
                    authorization_from_file(&path),
                    Err(UpstreamError::MalformedCredentials { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
