//! The hosts-file mapping (`ADDRESS NAME [NAME...]`, `#` comments): names the proxy resolves
//! without DNS. Tests use it; so do air-gapped sites whose mirrors have no public DNS.

use std::net::IpAddr;
use std::path::Path;

use crate::policy::network::Host;

/// Largest hosts file read.
pub const MAX_HOSTS_FILE_BYTES: u64 = 1024 * 1024;

/// Why a hosts file was refused.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// Reading it failed.
    #[error("cannot read the egress hosts file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It is larger than [`MAX_HOSTS_FILE_BYTES`].
    #[error(
        "the egress hosts file {path} is larger than MAX_HOSTS_FILE_BYTES ({MAX_HOSTS_FILE_BYTES})"
    )]
    TooLarge {
        /// The file.
        path: String,
    },
    /// A line is malformed.
    #[error("{path} line {line}: {message} (expected \"ADDRESS NAME [NAME...]\")")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        message: String,
    },
}

/// Parses hosts-file text; `origin` names it in errors.
///
/// # Errors
/// [`HostsError::Line`] for a bad address or name.
pub fn parse(text: &str, origin: &str) -> Result<Vec<(String, IpAddr)>, HostsError> {
    let mut out = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(address) = fields.next() else {
            continue;
        };
        let bad = |message: String| HostsError::Line {
            path: origin.to_owned(),
            line: index + 1,
            message,
        };
        let ip: IpAddr = address
            .parse()
            .map_err(|_| bad(format!("{address:?} is not an IP address")))?;
        let mut any = false;
        for name in fields {
            match Host::parse(name) {
                Ok(Host::Name(name)) => out.push((name, ip)),
                _ => return Err(bad(format!("{name:?} is not a host name"))),
            }
            any = true;
        }
        if !any {
            return Err(bad("no name after the address".to_owned()));
        }
    }
    Ok(out)
}

/// Reads and parses a hosts file.
///
/// # Errors
/// [`HostsError`].
pub fn load(path: &Path) -> Result<Vec<(String, IpAddr)>, HostsError> {
    use std::io::Read;
    let origin = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| HostsError::Read {
        path: origin.clone(),
        source,
    })?;
    let mut text = String::new();
    file.take(MAX_HOSTS_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|source| HostsError::Read {
            path: origin.clone(),
            source,
        })?;
    if text.len() as u64 > MAX_HOSTS_FILE_BYTES {
        return Err(HostsError::TooLarge { path: origin });
    }
    parse(&text, &origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_lines_map_every_name_normalised() {
        let map = parse(
            "# mirror\n127.0.0.1 Registry.Test pypi.test\n\n::1 v6.test # comment\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            map,
            vec![
                ("registry.test".to_owned(), "127.0.0.1".parse().unwrap()),
                ("pypi.test".to_owned(), "127.0.0.1".parse().unwrap()),
                ("v6.test".to_owned(), "::1".parse().unwrap()),
            ]
        );
        assert!(parse("nonsense name\n", "t").is_err());
        assert!(parse("127.0.0.1\n", "t").is_err());
    }
}
