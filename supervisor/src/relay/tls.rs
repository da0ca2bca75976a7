//! TLS for remote mode (rustls with the ring provider, no OpenSSL) and the rule for plain text.
//!
//! - Clients trust the system's roots plus an optional `--ca-file` (PEM), for `https://`
//!   registry calls and `wss://` rendezvous sockets alike.
//! - A bearer token never crosses the network in clear: a client refuses `http://` and `ws://`
//!   URLs whose host is not loopback ([`check_url`]), before it connects.
//! - The rendezvous serves TLS from a PEM certificate chain and key ([`server_config`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS setting or a URL is unusable.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("cannot read {what} from {path}: {source}")]
    Pem {
        /// What was expected (certificates, a private key).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A PEM file holds no certificate.
    #[error("cannot read PEM certificates from {path}: no CERTIFICATE block found")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A `--ca-file` certificate cannot be a trust root.
    #[error("cannot read a CA certificate from {path}: {source}")]
    CaCertificate {
        /// The file.
        path: PathBuf,
        /// rustls's refusal.
        #[source]
        source: rustls::Error,
    },
    /// Neither the system store nor `--ca-file` gave a trust root.
    #[error(
        "TLS configuration refused: no trusted root certificates: the system store is empty; pass --ca-file"
    )]
    NoRoots,
    /// rustls refused the configuration.
    #[error("TLS configuration refused: {0}")]
    Config(#[source] rustls::Error),
    /// The URL does not parse.
    #[error("{url:?} is not a URL ({source}); expected {tls}://HOST:PORT or {plain}://HOST:PORT")]
    NotAUrl {
        /// The URL given.
        url: String,
        /// The encrypted scheme expected (`https`, `wss`).
        tls: String,
        /// The plain scheme allowed on loopback (`http`, `ws`).
        plain: String,
        /// Why it does not parse (`url::ParseError`).
        #[source]
        source: <reqwest::Url as std::str::FromStr>::Err,
    },
    /// The URL's scheme is neither of the allowed ones.
    #[error("{url:?} must start with {tls}:// (or {plain}:// on loopback only)")]
    WrongScheme {
        /// The URL given.
        url: String,
        /// The encrypted scheme expected.
        tls: String,
        /// The plain scheme allowed on loopback.
        plain: String,
    },
    /// A plain URL to a host that is not loopback (a bearer token would cross the network in
    /// clear).
    #[error(
        "refusing to send a bearer token over plain {plain}:// to {host:?}, which is not loopback; use {tls}://"
    )]
    PlainToRemote {
        /// The host.
        host: String,
        /// The encrypted scheme to use instead.
        tls: String,
        /// The plain scheme given.
        plain: String,
    },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Read every certificate of a PEM file.
///
/// # Errors
/// [`TlsError::Pem`] when the file is unreadable or holds no certificate.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |source| TlsError::Pem {
        what: "PEM certificates",
        path: path.to_owned(),
        source,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(pem)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem)?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certificates)
}

/// The client's TLS settings: the system's roots plus `ca_file`'s certificates.
///
/// # Errors
/// [`TlsError`] when `ca_file` is unusable or no root at all could be loaded.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "a system root certificate could not be loaded");
    }
    let (_, ignored) = roots.add_parsable_certificates(native.certs);
    if ignored > 0 {
        tracing::debug!(ignored, "system root certificates rustls cannot use");
    }
    if let Some(path) = ca_file {
        for certificate in read_certificates(path)? {
            roots
                .add(certificate)
                .map_err(|source| TlsError::CaCertificate {
                    path: path.to_owned(),
                    source,
                })?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client's TLS settings for a registry URL: [`client_config`], except that a plain
/// (loopback) registry without a `ca_file` gets no roots at all (nothing to verify, and no
/// system store to read).
///
/// # Errors
/// As [`client_config`].
pub fn client_config_for(
    registry_url: &str,
    ca_file: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    // Several URLs (the nodes of a cluster): plain only if every one is.
    let plain = registry_url
        .split(',')
        .all(|url| matches!(check_url(url.trim(), ["http", "https"]), Ok(Scheme::Plain)));
    if plain && ca_file.is_none() {
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        return Ok(Arc::new(config));
    }
    client_config(ca_file)
}

/// The rendezvous's TLS settings from a PEM certificate chain and its PEM private key.
///
/// # Errors
/// [`TlsError`] when either file is unusable or the key does not match the certificate.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certificates = read_certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Pem {
        what: "a PEM private key",
        path: key.to_owned(),
        source,
    })?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Whether a URL is encrypted (`https`/`wss`), plain (`http`/`ws`), or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `https://` or `wss://`.
    Tls,
    /// `http://` or `ws://`.
    Plain,
}

/// Check a registry or rendezvous URL before anything (a token above all) is sent to it: the
/// scheme must be one of `allowed` (`http`/`https` for the registry, `ws`/`wss` for sockets),
/// and a plain one is allowed only towards a loopback host (`localhost`, 127.0.0.0/8, `::1`).
///
/// # Errors
/// [`TlsError::NotAUrl`], [`TlsError::WrongScheme`] or [`TlsError::PlainToRemote`], saying what
/// is wrong and what to use instead.
pub fn check_url(url: &str, allowed: [&str; 2]) -> Result<Scheme, TlsError> {
    let [plain, tls] = allowed.map(str::to_owned);
    let parsed = reqwest::Url::parse(url).map_err(|source| TlsError::NotAUrl {
        url: url.to_owned(),
        tls: tls.clone(),
        plain: plain.clone(),
        source,
    })?;
    let scheme = if parsed.scheme() == allowed[1] {
        Scheme::Tls
    } else if parsed.scheme() == allowed[0] {
        Scheme::Plain
    } else {
        return Err(TlsError::WrongScheme {
            url: url.to_owned(),
            tls,
            plain,
        });
    };
    if scheme == Scheme::Plain && !is_loopback(&parsed) {
        return Err(TlsError::PlainToRemote {
            host: parsed.host_str().unwrap_or_default().to_owned(),
            tls,
            plain,
        });
    }
    Ok(scheme)
}

fn is_loopback(url: &reqwest::Url) -> bool {
    url.host_str()
        .is_some_and(crate::plain_text::is_loopback_host)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plain_urls_are_allowed_only_to_loopback() {
        let http = ["http", "https"];
        for ok in [
            "http://127.0.0.1:7700",
            "http://localhost:1",
            "http://[::1]:9/x",
            "http://127.3.4.5:80",
        ] {
            assert_eq!(check_url(ok, http).unwrap(), Scheme::Plain, "{ok}");
        }
        assert_eq!(
            check_url("https://rendezvous.example:443", http).unwrap(),
            Scheme::Tls
        );
        for refused in [
            "http://10.0.0.1:7700",
            "http://rendezvous.example:80",
            "http://localhost.example:80",
            "http://[::2]:80",
        ] {
            let error = check_url(refused, http).unwrap_err().to_string();
            assert!(error.contains("not loopback"), "{refused}: {error}");
        }
        let ws = ["ws", "wss"];
        assert!(check_url("ws://192.168.1.2:1/v1", ws).is_err());
        assert_eq!(
            check_url("wss://192.168.1.2:1/v1", ws).unwrap(),
            Scheme::Tls
        );
        assert!(check_url("ftp://127.0.0.1:1", http).is_err());
        assert!(check_url("127.0.0.1:7700", http).is_err());
    }
}
