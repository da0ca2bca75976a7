//! Following the client's side of a TLS connection record by record, sans-I/O, so that every
//! ClientHello it sends in plaintext has its server name checked, not only the first.
//!
//! Records are framed by their 5-byte header. Handshake records the client sends before its
//! first ChangeCipherSpec are plaintext: their handshake messages are reassembled (bounded)
//! and every ClientHello among them (the first, the one after a HelloRetryRequest, one after
//! a STARTTLS-style switch) must name the tunnel's host. A record holding a ClientHello is held
//! until it is whole and checked; a ClientHello must fit in one record (no client splits one;
//! a front that routes on a partial ClientHello would otherwise see a name before the check).
//! After the ChangeCipherSpec, handshake records are encrypted to the server the first
//! ClientHello reached (TLS 1.2 renegotiation), except a record that is exactly one plaintext
//! ClientHello (TLS 1.3's compatibility mode sends ChangeCipherSpec before the second
//! ClientHello of a HelloRetryRequest): that one is checked too. Every other record's payload
//! passes by count.

use sandbox::policy::network::Host;

use super::sni;

/// Largest record payload accepted (TLS 1.2 ciphertext: 2^14 + 2048 bytes).
pub const MAX_RECORD_PAYLOAD: usize = 16 * 1024 + 2048;

/// Record header length.
pub const RECORD_HEADER: usize = 5;

/// Record content types.
const CHANGE_CIPHER_SPEC: u8 = 20;
const HANDSHAKE: u8 = 22;
const HEARTBEAT: u8 = 24;

/// Largest ClientHello message accepted (one record's worth).
const MAX_CLIENT_HELLO_MESSAGE: usize = 16 * 1024;

/// What [`TlsStream::feed`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsStep {
    /// The first `n` bytes may pass.
    Pass(usize),
    /// Hold what there is; more bytes are needed to decide.
    NeedMore,
    /// The bytes at the front are not a TLS record (the client left TLS, or never spoke it).
    NotTls,
}

/// Why a TLS stream was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A ClientHello names another server than the tunnel's host.
    #[error(
        "the TLS server name {name:?} is not the host the tunnel was opened for ({host}): \
         domain fronting"
    )]
    Fronting {
        /// The name the ClientHello carries.
        name: String,
        /// The tunnel's host.
        host: String,
    },
    /// A malformed or unacceptable handshake.
    #[error("{0}")]
    Handshake(String),
}

/// Plaintext handshake messages, reassembled across records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Handshake {
    /// The 4-byte message header collected so far.
    header: Vec<u8>,
    /// Body bytes of the current message still to come.
    left: usize,
    /// Whether the current message is a ClientHello (its body is collected).
    hello: Option<Vec<u8>>,
    /// Whether a message was seen (the first must be a ClientHello).
    seen: bool,
}

impl Handshake {
    /// Consumes one plaintext handshake record's payload; checks every ClientHello it ends.
    fn feed(&mut self, mut data: &[u8], host: &Host) -> Result<(), TlsError> {
        while !data.is_empty() {
            if self.header.len() < 4 {
                let n = (4 - self.header.len()).min(data.len());
                self.header.extend_from_slice(&data[..n]);
                data = &data[n..];
                if self.header.len() < 4 {
                    break;
                }
                let kind = self.header[0];
                let len = (usize::from(self.header[1]) << 16)
                    | (usize::from(self.header[2]) << 8)
                    | usize::from(self.header[3]);
                if !self.seen && kind != sni::HANDSHAKE_CLIENT_HELLO {
                    return Err(TlsError::Handshake(
                        "the first TLS handshake message is not a ClientHello".to_owned(),
                    ));
                }
                self.seen = true;
                self.left = len;
                self.hello = None;
                if kind == sni::HANDSHAKE_CLIENT_HELLO {
                    if len > MAX_CLIENT_HELLO_MESSAGE {
                        return Err(TlsError::Handshake(
                            "the TLS ClientHello is larger than one record".to_owned(),
                        ));
                    }
                    self.hello = Some(Vec::with_capacity(len));
                }
            } else {
                let n = self.left.min(data.len());
                if let Some(hello) = &mut self.hello {
                    hello.extend_from_slice(&data[..n]);
                }
                data = &data[n..];
                self.left -= n;
            }
            if self.header.len() == 4 && self.left == 0 {
                if let Some(hello) = self.hello.take() {
                    check_server_name(&hello, host)?;
                }
                self.header.clear();
            }
        }
        if self.hello.is_some() {
            return Err(TlsError::Handshake(
                "a TLS ClientHello spans more than one record".to_owned(),
            ));
        }
        Ok(())
    }
}

fn check_server_name(body: &[u8], host: &Host) -> Result<(), TlsError> {
    let name = sni::server_name(body).map_err(|err| TlsError::Handshake(err.to_string()))?;
    match name {
        None => Ok(()),
        Some(name) => match Host::parse(&name) {
            Ok(named) if named == *host => Ok(()),
            _ => Err(TlsError::Fronting {
                name,
                host: host.to_string(),
            }),
        },
    }
}

/// The client's side of one TLS connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsStream {
    host: Host,
    /// Before the client's first ChangeCipherSpec.
    plaintext: bool,
    /// Bytes of the current record (header included) still to pass by count.
    left: usize,
    /// Bytes of the current record that already passed before this stream took over (a
    /// ClientHello found by scanning plaintext: its first bytes passed as plaintext).
    passed: Vec<u8>,
    handshake: Handshake,
}

impl TlsStream {
    /// A stream for a tunnel to `host`, at a record boundary.
    pub fn new(host: Host) -> Self {
        Self {
            host,
            plaintext: true,
            left: 0,
            passed: Vec::new(),
            handshake: Handshake::default(),
        }
    }

    /// A stream whose first record began with `passed`, bytes that already went upstream
    /// (fewer than a record header and the start of its ClientHello: no name in them).
    pub fn resumed(host: Host, passed: Vec<u8>) -> Self {
        Self {
            passed,
            ..Self::new(host)
        }
    }

    /// Bytes that may pass now without being looked at.
    pub fn opaque(&self) -> u64 {
        self.left as u64
    }

    /// `n` of the [`Self::opaque`] bytes passed.
    pub fn skipped(&mut self, n: u64) {
        self.left = self
            .left
            .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX));
    }

    /// Looks at the bytes at the front of `buf` (non-empty).
    ///
    /// # Errors
    /// [`TlsError`]: a ClientHello naming another host, or a malformed handshake.
    pub fn feed(&mut self, buf: &[u8]) -> Result<TlsStep, TlsError> {
        if self.left > 0 {
            let n = self.left.min(buf.len());
            self.left -= n;
            return Ok(TlsStep::Pass(n));
        }
        let joined;
        let view = if self.passed.is_empty() {
            buf
        } else {
            joined = [self.passed.as_slice(), buf].concat();
            &joined
        };
        let Some(header) = view.get(..RECORD_HEADER) else {
            return Ok(if plausible_header(view) {
                TlsStep::NeedMore
            } else {
                TlsStep::NotTls
            });
        };
        if !plausible_header(header) {
            return Ok(TlsStep::NotTls);
        }
        let kind = header[0];
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len > MAX_RECORD_PAYLOAD {
            return Ok(TlsStep::NotTls);
        }
        let total = RECORD_HEADER + len;
        let already = self.passed.len();
        if kind == CHANGE_CIPHER_SPEC {
            self.plaintext = false;
        }
        if already >= total {
            // A tiny record that passed whole while it was plaintext to the scan (at most a
            // partial handshake header: no name): follow it, then go on from the next one.
            if kind == HANDSHAKE && self.plaintext {
                self.handshake
                    .feed(&view[RECORD_HEADER..total], &self.host)?;
            }
            self.passed.drain(..total);
            return self.feed(buf);
        }
        if kind == HANDSHAKE {
            let Some(record) = view.get(..total) else {
                return Ok(TlsStep::NeedMore);
            };
            let payload = &record[RECORD_HEADER..];
            if self.plaintext {
                self.handshake.feed(payload, &self.host)?;
            } else if looks_like_whole_client_hello(payload) {
                // After the ChangeCipherSpec a handshake record is encrypted (TLS 1.2) or, in
                // TLS 1.3's compatibility mode, a plaintext second ClientHello: one whose
                // header, length and version all say ClientHello is checked as one.
                check_server_name(&payload[4..], &self.host)?;
            }
            self.passed.clear();
            return Ok(TlsStep::Pass(total - already));
        }
        self.passed.clear();
        let n = (total - already).min(buf.len());
        self.left = total - already - n;
        Ok(TlsStep::Pass(n))
    }
}

/// Whether a handshake record's payload is exactly one ClientHello message (type, a length
/// filling the record, a TLS 1.x legacy version): ciphertext matches this by chance about once
/// in 2^40 records.
fn looks_like_whole_client_hello(payload: &[u8]) -> bool {
    payload.len() > 6
        && payload[0] == sni::HANDSHAKE_CLIENT_HELLO
        && (usize::from(payload[1]) << 16 | usize::from(payload[2]) << 8 | usize::from(payload[3]))
            == payload.len() - 4
        && payload[4] == 3
}

/// Whether `bytes` (up to a header's length) can start a TLS record.
fn plausible_header(bytes: &[u8]) -> bool {
    let kind_ok = bytes
        .first()
        .is_some_and(|k| (CHANGE_CIPHER_SPEC..=HEARTBEAT).contains(k));
    let major_ok = bytes.get(1).is_none_or(|v| *v == 3);
    let minor_ok = bytes.get(2).is_none_or(|v| *v <= 4);
    kind_ok && major_ok && minor_ok
}

/// Whether a TLS ClientHello may start at the front of `bytes`: `Some(true)` it does (record
/// header, handshake header and version agree), `Some(false)` it does not, `None` too few bytes
/// to tell. Used to find STARTTLS-style switches in plaintext.
pub fn client_hello_starts(bytes: &[u8]) -> Option<bool> {
    /// Record header, handshake type and length, version major.
    const NEEDED: usize = 10;
    let record_len = |b: &[u8]| usize::from(u16::from_be_bytes([b[3], b[4]]));
    // Each check reads the bytes up to its index; the payload's bytes are only looked at
    // where the record holds them (a tiny first record of a fragmented ClientHello is one).
    let checks: [fn(&[u8]) -> bool; NEEDED] = [
        |b| b[0] == HANDSHAKE,
        |b| b[1] == 3,
        |b| b[2] <= 4,
        |b| b[3] <= (MAX_RECORD_PAYLOAD >> 8) as u8,
        |b| (1..=MAX_RECORD_PAYLOAD).contains(&usize::from(u16::from_be_bytes([b[3], b[4]]))),
        |b| b[5] == sni::HANDSHAKE_CLIENT_HELLO,
        // A handshake length under 128 KiB (what servers accept for a ClientHello).
        |b| usize::from(u16::from_be_bytes([b[3], b[4]])) < 2 || b[6] <= 1,
        |_| true,
        |_| true,
        |b| usize::from(u16::from_be_bytes([b[3], b[4]])) < 5 || b[9] == 3,
    ];
    for (i, check) in checks.iter().enumerate() {
        if bytes.len() <= i {
            // Past a tiny record's end nothing more is needed.
            if i >= 6 && RECORD_HEADER + record_len(bytes) <= i {
                return Some(true);
            }
            return None;
        }
        if !check(bytes) {
            return Some(false);
        }
    }
    Some(true)
}

/// Bytes [`client_hello_starts`] needs to decide.
pub const CLIENT_HELLO_PREFIX: usize = 10;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A ClientHello record carrying `name` (as in `sni`'s tests).
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
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
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(&extensions);
        let mut handshake = vec![1, 0];
        handshake.extend_from_slice(&(body.len() as u16).to_be_bytes());
        handshake.extend_from_slice(&body);
        record(HANDSHAKE, &handshake)
    }

    pub(crate) fn record(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![kind, 3, 3];
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn host(name: &str) -> Host {
        Host::parse(name).unwrap()
    }

    /// Feeds `input` as a relay would (whole buffer, then what is left); returns the bytes
    /// passed before it stopped, and the error if it refused.
    fn drive(stream: &mut TlsStream, input: &[u8]) -> (usize, Result<(), TlsError>) {
        let mut at = 0;
        while at < input.len() {
            match stream.feed(&input[at..]) {
                Ok(TlsStep::Pass(n)) => at += n,
                Ok(TlsStep::NeedMore) => return (at, Ok(())),
                Ok(TlsStep::NotTls) => {
                    return (at, Err(TlsError::Handshake("not tls".to_owned())));
                }
                Err(err) => return (at, Err(err)),
            }
        }
        (at, Ok(()))
    }

    #[test]
    fn every_plaintext_client_hello_is_checked_and_encrypted_records_pass() {
        let mut stream = TlsStream::new(host("a.test"));
        let mut input = client_hello(Some("a.test"));
        input.extend(record(23, &[9; 100]));
        // A second ClientHello (after a HelloRetryRequest) naming another host.
        let second = client_hello(Some("evil.test"));
        let (passed, result) = drive(&mut stream, &[input.clone(), second].concat());
        assert_eq!(passed, input.len());
        assert!(
            matches!(result, Err(TlsError::Fronting { .. })),
            "{result:?}"
        );
        // TLS 1.3 compatibility mode: ChangeCipherSpec, then the second ClientHello.
        let mut stream = TlsStream::new(host("a.test"));
        let first = [
            client_hello(Some("a.test")),
            record(CHANGE_CIPHER_SPEC, &[1]),
        ]
        .concat();
        let (passed, result) = drive(
            &mut stream,
            &[first.clone(), client_hello(Some("evil.test"))].concat(),
        );
        assert_eq!(passed, first.len());
        assert!(
            matches!(result, Err(TlsError::Fronting { .. })),
            "{result:?}"
        );
        // The control: after ChangeCipherSpec, handshake records are encrypted and pass.
        let mut stream = TlsStream::new(host("a.test"));
        let mut input = client_hello(Some("a.test"));
        input.extend(record(CHANGE_CIPHER_SPEC, &[1]));
        input.extend(record(HANDSHAKE, &[0xee; 40]));
        assert_eq!(drive(&mut stream, &input), (input.len(), Ok(())));
    }

    #[test]
    fn a_record_holding_a_client_hello_is_held_until_whole() {
        let mut stream = TlsStream::new(host("a.test"));
        let hello = client_hello(Some("evil.test"));
        assert_eq!(
            stream.feed(&hello[..hello.len() - 1]),
            Ok(TlsStep::NeedMore)
        );
        assert!(stream.feed(&hello).is_err());
    }

    #[test]
    fn application_data_passes_by_count_and_non_records_are_not_tls() {
        let mut stream = TlsStream::new(host("a.test"));
        let hello = client_hello(None);
        assert_eq!(stream.feed(&hello), Ok(TlsStep::Pass(hello.len())));
        let data = record(23, &[0; 1000]);
        assert_eq!(stream.feed(&data[..10]), Ok(TlsStep::Pass(10)));
        assert_eq!(stream.opaque(), 995);
        stream.skipped(995);
        assert_eq!(stream.feed(b"GET / HTTP/1.1\r\n"), Ok(TlsStep::NotTls));
    }

    #[test]
    fn a_client_hello_split_over_records_is_refused() {
        let hello = client_hello(Some("a.test"));
        let handshake = &hello[RECORD_HEADER..];
        let input = [
            record(HANDSHAKE, &handshake[..20]),
            record(HANDSHAKE, &handshake[20..]),
        ]
        .concat();
        let mut stream = TlsStream::new(host("a.test"));
        assert!(drive(&mut stream, &input).1.is_err());
    }

    #[test]
    fn client_hello_prefixes_are_recognised() {
        let hello = client_hello(Some("a.test"));
        assert_eq!(client_hello_starts(&hello), Some(true));
        assert_eq!(client_hello_starts(&hello[..4]), None);
        assert_eq!(
            client_hello_starts(b"\x16\x03\x01\x00\x10\x02"),
            Some(false)
        );
        assert_eq!(client_hello_starts(b"EHLO x"), Some(false));
    }
}
