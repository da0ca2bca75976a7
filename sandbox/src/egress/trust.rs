//! The per-sandbox inspection CA, installed inside the sandbox (`inspect=true`).
//!
//! ```text
//! egress-proxy ── CA pipe (--ca-fd) ──▶ outer sandbox-run ── egress socket ──▶ PID 1
//!  makes the CA (key in its memory)      relays the message      writes the bundle, sets
//!                                                                 the variables, execs
//! ```
//!
//! The message is an [`InspectionCa`] (JSON, the sender then closes its end): the CA's public
//! certificate only. PID 1 accepts it only when it is made of `CERTIFICATE` blocks and nothing
//! else (a private key, or anything that is not PEM, is refused), writes the host's bundle
//! followed by it to [`BUNDLE_NAME`] in a private directory of the sandbox (bound read-only
//! onto itself), and points [`TRUST_VARIABLES`] at it. The proxy's key never leaves the
//! proxy's memory.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// The CA certificate, as it travels from the proxy to PID 1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InspectionCa {
    /// The CA's certificate, PEM (`CERTIFICATE` blocks only).
    pub certificate_pem: String,
}

/// Largest message accepted (a CA certificate is about 600 bytes of PEM).
pub const MAX_MESSAGE_BYTES: u64 = 64 * 1024;

/// Largest host bundle copied into the sandbox's (Debian's is about 220 KiB).
pub const MAX_HOST_BUNDLE_BYTES: u64 = 8 * 1024 * 1024;

/// The host's bundle, copied first into the sandbox's.
pub const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The bundle's file name, in the sandbox's private `/tmp` (or its private `$TMPDIR`).
pub const BUNDLE_NAME: &str = "execward-ca-bundle.pem";

/// The variables pointed at the bundle in the command's environment (OpenSSL and Go,
/// Python `requests`, Node, curl, git). They replace the caller's values: the inspected
/// destinations only answer with the CA's certificates, and the bundle keeps the host's
/// roots for the rest.
pub const TRUST_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
];

/// Why a CA message was refused.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Reading or writing the channel failed.
    #[error("relaying the inspection CA failed: {0}")]
    Io(#[from] std::io::Error),
    /// Larger than [`MAX_MESSAGE_BYTES`].
    #[error("the inspection CA message is larger than {MAX_MESSAGE_BYTES} bytes")]
    TooLarge,
    /// The channel closed without a message (the proxy did not start).
    #[error("the inspection CA never arrived")]
    Missing,
    /// Not the JSON of an [`InspectionCa`].
    #[error("the inspection CA message is malformed: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The PEM holds something other than certificates.
    #[error("the inspection CA message holds something other than certificates ({0})")]
    NotCertificates(String),
}

impl InspectionCa {
    /// Writes the message and closes `to` (its end of the channel).
    ///
    /// # Errors
    /// [`TrustError::Io`].
    pub fn send(&self, mut to: impl Write) -> Result<(), TrustError> {
        to.write_all(&serde_json::to_vec(self)?)?;
        to.flush()?;
        Ok(())
    }

    /// Reads one message, to the end of `from`, and checks it holds certificates only.
    ///
    /// # Errors
    /// [`TrustError`].
    pub fn receive(from: impl Read) -> Result<Self, TrustError> {
        let mut text = Vec::new();
        from.take(MAX_MESSAGE_BYTES + 1).read_to_end(&mut text)?;
        if text.is_empty() {
            return Err(TrustError::Missing);
        }
        if text.len() as u64 > MAX_MESSAGE_BYTES {
            return Err(TrustError::TooLarge);
        }
        let ca: Self = serde_json::from_slice(&text)?;
        ca.check()?;
        Ok(ca)
    }

    /// Only `CERTIFICATE` blocks, at least one, nothing between them but whitespace.
    fn check(&self) -> Result<(), TrustError> {
        let mut rest = self.certificate_pem.trim();
        let mut blocks = 0;
        while !rest.is_empty() {
            let Some(body) = rest.strip_prefix("-----BEGIN CERTIFICATE-----") else {
                return Err(TrustError::NotCertificates(
                    "text outside a CERTIFICATE block".to_owned(),
                ));
            };
            let Some((inner, after)) = body.split_once("-----END CERTIFICATE-----") else {
                return Err(TrustError::NotCertificates(
                    "an unterminated block".to_owned(),
                ));
            };
            if inner.contains('-') {
                return Err(TrustError::NotCertificates("a nested block".to_owned()));
            }
            blocks += 1;
            rest = after.trim_start();
        }
        if blocks == 0 {
            return Err(TrustError::NotCertificates("no certificate".to_owned()));
        }
        Ok(())
    }

    /// The sandbox's bundle: `host` (the host's bundle, when readable) then the CA.
    pub fn bundle(&self, host: Option<&str>) -> String {
        let mut bundle = host.unwrap_or_default().to_owned();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str("# execward per-sandbox inspection CA\n");
        bundle.push_str(self.certificate_pem.trim());
        bundle.push('\n');
        bundle
    }
}

/// The host's bundle ([`HOST_BUNDLE`]) when present and readable, bounded.
pub fn host_bundle() -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(HOST_BUNDLE)
        .ok()?
        .take(MAX_HOST_BUNDLE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// `mount_setattr(2)` attribute: read-only.
#[cfg(target_os = "linux")]
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;

/// PID 1's side, before it confines itself: writes `bundle` to [`BUNDLE_NAME`] in `dir` (a
/// private directory of the sandbox's mount namespace: nothing reaches the host), mode 0444,
/// and binds it read-only onto itself, so the command can neither rewrite nor replace it (it
/// has no capability left to unmount it). Descriptors, not paths: the directory is opened
/// once without following symlinks, the file created in it with `O_EXCL`.
///
/// # Errors
/// The OS error of the step that failed.
#[cfg(target_os = "linux")]
pub fn install(dir: &std::path::Path, bundle: &str) -> std::io::Result<std::path::PathBuf> {
    use std::os::fd::AsFd;

    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;

    let name = std::path::Path::new(BUNDLE_NAME);
    let dir_fd = crate::sys::open_no_symlinks(None, dir)?;
    let file = nix::fcntl::openat(
        &dir_fd,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o444),
    )?;
    let mut file = std::fs::File::from(file);
    file.write_all(bundle.as_bytes())?;
    drop(file);
    let target = crate::sys::open_no_symlinks(Some(dir_fd.as_fd()), name)?;
    let tree = crate::sys::clone_mount_tree(target.as_fd())?;
    crate::sys::mount_setattr_fd(tree.as_fd(), false, MOUNT_ATTR_RDONLY, 0)?;
    crate::sys::attach_mount(tree.as_fd(), target.as_fd())?;
    Ok(dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::{InspectionCa, TrustError};

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn a_certificate_travels_and_anything_else_is_refused() {
        let ca = InspectionCa {
            certificate_pem: CERT.to_owned(),
        };
        let mut wire = Vec::new();
        ca.send(&mut wire).unwrap();
        assert_eq!(InspectionCa::receive(&wire[..]).unwrap(), ca);
        for bad in [
            "",
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
            &format!("{CERT}-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"),
            &format!("{CERT}junk"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n",
        ] {
            let mut wire = Vec::new();
            InspectionCa {
                certificate_pem: bad.to_owned(),
            }
            .send(&mut wire)
            .unwrap();
            assert!(
                matches!(
                    InspectionCa::receive(&wire[..]),
                    Err(TrustError::NotCertificates(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            InspectionCa::receive(&b""[..]),
            Err(TrustError::Missing)
        ));
        assert!(matches!(
            InspectionCa::receive(&br#"{"certificatePem":"x","key":"k"}"#[..]),
            Err(TrustError::Malformed(_))
        ));
    }

    #[test]
    fn the_bundle_is_the_hosts_then_the_ca() {
        let ca = InspectionCa {
            certificate_pem: CERT.to_owned(),
        };
        let bundle = ca.bundle(Some("HOST ROOTS"));
        assert!(bundle.starts_with("HOST ROOTS\n"), "{bundle}");
        assert!(bundle.ends_with(CERT), "{bundle}");
        assert!(ca.bundle(None).ends_with(CERT));
    }
}
