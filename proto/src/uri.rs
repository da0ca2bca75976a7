//! `file:` URIs, the only way a path travels on the wire.
//!
//! A [`FileUri`] always holds an absolute local path. Any byte that is not safe in a URI path is
//! percent-encoded, so file names that are not UTF-8 round-trip exactly. Native paths
//! (`/tmp/x`), relative paths, other hosts, queries and fragments are rejected with a message
//! that shows the form to use.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use percent_encoding::{AsciiSet, CONTROLS, percent_decode, percent_encode};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes escaped in the path part: controls, space, and every delimiter that would change how
/// the URI parses. Non-ASCII bytes are always escaped.
const PATH_ESCAPES: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'[')
    .add(b'\\')
    .add(b']')
    .add(b'^')
    .add(b'`')
    .add(b'{')
    .add(b'|')
    .add(b'}');

/// Why a string is not an acceptable `file:` URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// A native absolute path was sent where a URI is expected.
    #[error("expected a file: URI such as {suggestion:?} (got the native path {got:?})")]
    NativePath {
        /// The input.
        got: String,
        /// The URI form of the same path.
        suggestion: String,
    },
    /// Not a `file:` URI at all (relative path or another scheme).
    #[error("expected an absolute file: URI such as \"file:///home/user/project\" (got {got:?})")]
    NotFileUri {
        /// The input.
        got: String,
    },
    /// The URI names a host other than `localhost`.
    #[error("file: URIs must not name a host (got {got:?}); use \"file:///path\"")]
    Host {
        /// The input.
        got: String,
    },
    /// The URI has a query or fragment.
    #[error(
        "file: URIs must not carry a query or fragment (got {got:?}); percent-encode '?' as %3F and '#' as %23"
    )]
    QueryOrFragment {
        /// The input.
        got: String,
    },
    /// The path part is not absolute.
    #[error("file: URI path must be absolute (got {got:?})")]
    Relative {
        /// The input.
        got: String,
    },
    /// A `%` escape is malformed.
    #[error(
        "malformed percent-escape in file: URI {got:?}; '%' must be followed by two hex digits"
    )]
    BadEscape {
        /// The input.
        got: String,
    },
    /// The path contains a NUL byte, which no file name can hold.
    #[error("file: URI {got:?} decodes to a path containing a NUL byte")]
    Nul {
        /// The input.
        got: String,
    },
}

/// An absolute local path, written on the wire as a `file:` URI.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileUri(PathBuf);

impl FileUri {
    /// Parse a `file:` URI (`file:///p`, `file://localhost/p` or `file:/p`).
    ///
    /// # Errors
    /// [`UriError`] naming what was wrong and the expected form.
    pub fn parse(input: &str) -> Result<Self, UriError> {
        let got = || input.to_owned();
        let Some(rest) = strip_scheme(input) else {
            if input.starts_with('/') {
                return Err(UriError::NativePath {
                    got: got(),
                    suggestion: encode(input.as_bytes()),
                });
            }
            return Err(UriError::NotFileUri { got: got() });
        };
        if rest.contains('?') || rest.contains('#') {
            return Err(UriError::QueryOrFragment { got: got() });
        }
        let path = if let Some(authority_and_path) = rest.strip_prefix("//") {
            let slash = authority_and_path
                .find('/')
                .unwrap_or(authority_and_path.len());
            let host = &authority_and_path[..slash];
            if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
                return Err(UriError::Host { got: got() });
            }
            &authority_and_path[slash..]
        } else {
            rest
        };
        if !path.starts_with('/') {
            return Err(UriError::Relative { got: got() });
        }
        if !escapes_are_well_formed(path.as_bytes()) {
            return Err(UriError::BadEscape { got: got() });
        }
        let bytes: Vec<u8> = percent_decode(path.as_bytes()).collect();
        if bytes.contains(&0) {
            return Err(UriError::Nul { got: got() });
        }
        Ok(Self(PathBuf::from(OsString::from_vec(bytes))))
    }

    /// Wrap an absolute path.
    ///
    /// # Errors
    /// [`UriError::Relative`] when the path is not absolute, [`UriError::Nul`] for NUL bytes.
    pub fn from_path(path: impl Into<PathBuf>) -> Result<Self, UriError> {
        let path = path.into();
        let got = || path.to_string_lossy().into_owned();
        if !path.is_absolute() {
            return Err(UriError::Relative { got: got() });
        }
        if path.as_os_str().as_bytes().contains(&0) {
            return Err(UriError::Nul { got: got() });
        }
        Ok(Self(path))
    }

    /// The local path.
    pub fn as_path(&self) -> &Path {
        &self.0
    }

    /// The local path, owned.
    pub fn into_path_buf(self) -> PathBuf {
        self.0
    }

    /// The URI text, e.g. `file:///tmp/a%20b`.
    pub fn to_uri_string(&self) -> String {
        encode(self.0.as_os_str().as_bytes())
    }
}

fn strip_scheme(input: &str) -> Option<&str> {
    let (scheme, rest) = input.split_at_checked(5)?;
    scheme.eq_ignore_ascii_case("file:").then_some(rest)
}

fn encode(path: &[u8]) -> String {
    format!("file://{}", percent_encode(path, PATH_ESCAPES))
}

fn escapes_are_well_formed(bytes: &[u8]) -> bool {
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = |offset: usize| bytes.get(index + offset).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(1) && hex(2)) {
                return false;
            }
            index += 3;
        } else {
            index += 1;
        }
    }
    true
}

impl std::fmt::Display for FileUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_uri_string())
    }
}

impl std::str::FromStr for FileUri {
    type Err = UriError;
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        Self::parse(input)
    }
}

impl Serialize for FileUri {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_uri_string())
    }
}

impl<'de> Deserialize<'de> for FileUri {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn plain_and_localhost_forms_parse() {
        assert_eq!(
            FileUri::parse("file:///tmp/x").unwrap().as_path(),
            Path::new("/tmp/x")
        );
        assert_eq!(
            FileUri::parse("file://localhost/tmp/x").unwrap().as_path(),
            Path::new("/tmp/x")
        );
        assert_eq!(
            FileUri::parse("FILE:/tmp/x").unwrap().as_path(),
            Path::new("/tmp/x")
        );
        assert_eq!(
            FileUri::parse("file:///").unwrap().as_path(),
            Path::new("/")
        );
    }

    #[test]
    fn percent_encoding_round_trips_spaces_and_delimiters() {
        let uri = FileUri::from_path("/tmp/a b/#?%[x]").unwrap();
        assert_eq!(uri.to_uri_string(), "file:///tmp/a%20b/%23%3F%25%5Bx%5D");
        assert_eq!(FileUri::parse(&uri.to_uri_string()).unwrap(), uri);
    }

    #[test]
    fn non_utf8_names_round_trip() {
        let path = PathBuf::from(OsString::from_vec(b"/tmp/\xff\xfe-name".to_vec()));
        let uri = FileUri::from_path(path.clone()).unwrap();
        assert_eq!(uri.to_uri_string(), "file:///tmp/%FF%FE-name");
        assert_eq!(
            FileUri::parse(&uri.to_uri_string())
                .unwrap()
                .into_path_buf(),
            path
        );
    }

    #[test]
    fn native_path_is_rejected_with_the_uri_form() {
        let error = FileUri::parse("/tmp/a b").unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"expected a file: URI such as "file:///tmp/a%20b" (got the native path "/tmp/a b")"#
        );
    }

    #[test]
    fn relative_other_hosts_queries_bad_escapes_and_nul_are_rejected() {
        assert!(matches!(
            FileUri::parse("tmp/x"),
            Err(UriError::NotFileUri { .. })
        ));
        assert!(matches!(
            FileUri::parse("file:tmp/x"),
            Err(UriError::Relative { .. })
        ));
        assert!(matches!(
            FileUri::parse("file://server/share"),
            Err(UriError::Host { .. })
        ));
        assert!(matches!(
            FileUri::parse("file:///tmp/x?y"),
            Err(UriError::QueryOrFragment { .. })
        ));
        assert!(matches!(
            FileUri::parse("file:///tmp/%zz"),
            Err(UriError::BadEscape { .. })
        ));
        assert!(matches!(
            FileUri::parse("file:///tmp/%4"),
            Err(UriError::BadEscape { .. })
        ));
        assert!(matches!(
            FileUri::parse("file:///tmp/%00"),
            Err(UriError::Nul { .. })
        ));
        assert!(matches!(
            FileUri::parse("http://x/y"),
            Err(UriError::NotFileUri { .. })
        ));
        assert!(matches!(
            FileUri::from_path("rel"),
            Err(UriError::Relative { .. })
        ));
    }

    #[test]
    fn serde_uses_the_uri_text() {
        let uri: FileUri = serde_json::from_str(r#""file:///etc/hosts""#).unwrap();
        assert_eq!(
            serde_json::to_string(&uri).unwrap(),
            r#""file:///etc/hosts""#
        );
        let error = serde_json::from_str::<FileUri>(r#""/etc/hosts""#).unwrap_err();
        assert!(error.to_string().contains("file:///etc/hosts"), "{error}");
    }
}
