//! The server name of a TLS ClientHello, sans-I/O, for the domain-fronting check: a tunnel
//! opened for `allowed.example` whose ClientHello asks a shared front-end for `other.example`
//! is refused.
//!
//! [`server_name`] reads a ClientHello message body (the proxy's [`tls`](super::tls) follower
//! finds every plaintext ClientHello of a tunnel and hands each one here); [`parse`] reads one
//! from the first record of a buffer. A ClientHello larger than one record is refused, as no
//! client sends one. Every length is checked against what is left; nothing is trusted.

/// The outcome of [`parse`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientHello {
    /// Not enough bytes yet.
    Incomplete,
    /// Not a TLS handshake record at all.
    NotTls,
    /// A ClientHello; its `server_name` (host_name type), if it carries one.
    Parsed(Option<String>),
}

/// Why a ClientHello was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SniError {
    /// A length field points past its container, or the message is not a ClientHello.
    #[error("malformed TLS ClientHello: {0}")]
    Malformed(&'static str),
}

/// A bounds-checked reader.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SniError> {
        if self.bytes.len() < n {
            return Err(SniError::Malformed(what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<usize, SniError> {
        Ok(usize::from(self.take(1, what)?[0]))
    }

    fn u16(&mut self, what: &'static str) -> Result<usize, SniError> {
        let b = self.take(2, what)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], SniError> {
        let n = self.u8(what)?;
        self.take(n, what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], SniError> {
        let n = self.u16(what)?;
        self.take(n, what)
    }
}

/// Parses the first TLS record of a connection.
///
/// # Errors
/// [`SniError::Malformed`] when it claims to be a handshake but its lengths do not add up.
pub fn parse(buf: &[u8]) -> Result<ClientHello, SniError> {
    match buf.first() {
        None => return Ok(ClientHello::Incomplete),
        Some(0x16) => {}
        Some(_) => return Ok(ClientHello::NotTls),
    }
    if buf.len() < 5 {
        return Ok(ClientHello::Incomplete);
    }
    if buf[1] != 3 {
        return Ok(ClientHello::NotTls);
    }
    let record_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    let Some(record) = buf.get(5..5 + record_len) else {
        return Ok(ClientHello::Incomplete);
    };
    let mut r = Cursor { bytes: record };
    if r.u8("handshake type")? != usize::from(HANDSHAKE_CLIENT_HELLO) {
        return Err(SniError::Malformed(
            "the first handshake message is not a ClientHello",
        ));
    }
    let body_len = {
        let b = r.take(3, "handshake length")?;
        (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
    };
    let body = r.take(body_len, "ClientHello spans more than one record")?;
    server_name(body).map(ClientHello::Parsed)
}

/// Handshake message type of a ClientHello.
pub const HANDSHAKE_CLIENT_HELLO: u8 = 1;

/// Extension type `server_name` (RFC 6066).
const EXTENSION_SERVER_NAME: usize = 0;

/// Extension type `encrypted_client_hello` (RFC 9849): the real server name travels encrypted.
const EXTENSION_ENCRYPTED_CLIENT_HELLO: usize = 0xfe0d;

/// The `server_name` (host_name type) of a ClientHello message body (after the 4-byte
/// handshake header), if it carries one.
///
/// # Errors
/// [`SniError::Malformed`] when a length does not add up, the extension or a host name appears
/// twice (which name a server would use is not ours to guess), or the ClientHello carries
/// `encrypted_client_hello` (its outer name need not be the server it reaches).
pub fn server_name(body: &[u8]) -> Result<Option<String>, SniError> {
    let mut hello = Cursor { bytes: body };
    hello.take(2 + 32, "version and random")?;
    hello.vec8("session id")?;
    hello.vec16("cipher suites")?;
    hello.vec8("compression methods")?;
    if hello.bytes.is_empty() {
        return Ok(None);
    }
    let mut extensions = Cursor {
        bytes: hello.vec16("extensions")?,
    };
    let mut found: Option<Option<String>> = None;
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vec16("extension data")?;
        if kind == EXTENSION_ENCRYPTED_CLIENT_HELLO {
            return Err(SniError::Malformed(
                "encrypted_client_hello hides the server name it reaches",
            ));
        }
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        if found.is_some() {
            return Err(SniError::Malformed("two server_name extensions"));
        }
        let mut list = Cursor { bytes: data };
        let mut names = Cursor {
            bytes: list.vec16("server name list")?,
        };
        let mut host_name = None;
        while !names.bytes.is_empty() {
            let name_type = names.u8("server name type")?;
            let name = names.vec16("server name")?;
            if name_type == 0 {
                if host_name.is_some() {
                    return Err(SniError::Malformed("two host names in server_name"));
                }
                let text = std::str::from_utf8(name)
                    .map_err(|_| SniError::Malformed("server name is not ASCII"))?;
                host_name = Some(text.to_owned());
            }
        }
        found = Some(host_name);
    }
    Ok(found.flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record carrying `name` (or no SNI extension).
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut extensions = Vec::new();
        if let Some(name) = name {
            let mut entry = vec![0];
            entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
            entry.extend_from_slice(name.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend_from_slice(&entry);
            extensions.extend_from_slice(&[0, 0]);
            extensions.extend_from_slice(&(list.len() as u16).to_be_bytes());
            extensions.extend_from_slice(&list);
        }
        extensions.extend_from_slice(&[0, 0x2b, 0, 3, 2, 3, 4]); // supported_versions
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![1, 0];
        handshake.extend_from_slice(&(body.len() as u16).to_be_bytes());
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn the_server_name_is_read_from_a_client_hello() {
        let hello = client_hello(Some("pypi.org"));
        assert_eq!(
            parse(&hello),
            Ok(ClientHello::Parsed(Some("pypi.org".into())))
        );
        assert_eq!(parse(&client_hello(None)), Ok(ClientHello::Parsed(None)));
    }

    #[test]
    fn partial_and_non_tls_input_is_told_apart() {
        let hello = client_hello(Some("pypi.org"));
        for cut in [0, 1, 4, 5, hello.len() - 1] {
            assert_eq!(
                parse(&hello[..cut]),
                Ok(ClientHello::Incomplete),
                "cut {cut}"
            );
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Ok(ClientHello::NotTls));
    }

    #[test]
    fn lengths_past_their_container_are_malformed() {
        let mut hello = client_hello(Some("pypi.org"));
        // Make the server-name length claim more than the extension holds.
        let at = hello.windows(8).position(|w| w == b"pypi.org").unwrap() - 2;
        hello[at] = 0xff;
        assert!(parse(&hello).is_err());
    }
}
