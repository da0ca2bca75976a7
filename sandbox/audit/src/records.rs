//! Parsing audit record text (`audit(1718000000.123:42): key=value key="quoted" ...`).
//!
//! Pure functions over bytes the kernel sent; no I/O. Untrusted strings (paths, `exe`, `comm`,
//! `name`, `cwd`, `proctitle`) arrive either quoted or hex-encoded when they contain spaces,
//! quotes or control characters ([`Record::text`] decodes both).
//!
//! A record keeps its text and the byte ranges of its fields (found in one pass): the collector
//! reads every record of a flood, and a map of owned strings per record would cost more than
//! everything else it does.

/// `AUDIT_TRUSTED_APP`: the user-space message type the collector sends as a drain marker.
pub const AUDIT_TRUSTED_APP: u16 = 1121;
/// `AUDIT_SYSCALL`: syscall exit record (pid, exe, arguments, result).
pub const AUDIT_SYSCALL: u16 = 1300;
/// `AUDIT_PATH`: one path name the syscall resolved.
pub const AUDIT_PATH: u16 = 1302;
/// `AUDIT_CWD`: the working directory of the syscall.
pub const AUDIT_CWD: u16 = 1307;
/// `AUDIT_EOE`: end of a multi-record event.
pub const AUDIT_EOE: u16 = 1320;
/// `AUDIT_SECCOMP`: a seccomp action was logged.
pub const AUDIT_SECCOMP: u16 = 1326;
/// `AUDIT_LANDLOCK_ACCESS`: Landlock denied an access.
pub const AUDIT_LANDLOCK_ACCESS: u16 = 1423;
/// `AUDIT_LANDLOCK_DOMAIN`: a Landlock domain's status (allocated/deallocated).
pub const AUDIT_LANDLOCK_DOMAIN: u16 = 1424;

/// Fields whose values are untrusted strings (quoted, or hex when they hold odd bytes).
const UNTRUSTED_FIELDS: &[&str] = &[
    "path",
    "name",
    "exe",
    "comm",
    "cwd",
    "proctitle",
    "ocomm",
    "root_dir",
];

/// One audit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The netlink message type (1300, 1423, ...).
    pub kind: u16,
    /// Event time: seconds since the epoch.
    pub secs: u64,
    /// Event time: milliseconds part.
    pub millis: u32,
    /// Event serial; all records of one event share it.
    pub serial: u64,
    /// The `key=value ...` text after the header.
    body: String,
    /// Where each field's key and value are in `body`.
    spans: Vec<Span>,
}

/// One field's place in a record's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    key: (u32, u32),
    value: (u32, u32),
    quoted: bool,
}

/// Why a record could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// The `audit(SECS.MILLIS:SERIAL):` header is missing or malformed.
    #[error("audit record without a valid audit(SECS.MILLIS:SERIAL) header: {text:?}")]
    Header {
        /// The start of the text.
        text: String,
    },
}

impl Record {
    /// Parses the payload of an audit netlink message of type `kind`.
    ///
    /// # Errors
    /// [`ParseError::Header`] when the text does not start with `audit(S.M:N):`.
    pub fn parse(kind: u16, payload: &[u8]) -> Result<Self, ParseError> {
        let text = utf8_lossy(payload);
        let text = text.trim_end_matches('\0').trim();
        let header_err = || ParseError::Header {
            text: text.chars().take(60).collect(),
        };
        let rest = text.strip_prefix("audit(").ok_or_else(header_err)?;
        let (stamp, body) = rest.split_once("):").ok_or_else(header_err)?;
        let (time, serial) = stamp.split_once(':').ok_or_else(header_err)?;
        let (secs, millis) = time.split_once('.').ok_or_else(header_err)?;
        let body = body.trim_start().to_owned();
        let spans = spans(&body);
        Ok(Self {
            kind,
            secs: secs.parse().map_err(|_| header_err())?,
            millis: millis.parse().map_err(|_| header_err())?,
            serial: serial.parse().map_err(|_| header_err())?,
            body,
            spans,
        })
    }

    /// The first field named `key`: its value (quotes removed) and whether it was quoted.
    fn field(&self, key: &str) -> Option<(&str, bool)> {
        let at = |(from, to): (u32, u32)| self.body.get(from as usize..to as usize);
        self.spans
            .iter()
            .find(|span| at(span.key) == Some(key))
            .and_then(|span| Some((at(span.value)?, span.quoted)))
    }

    /// The raw value of `key` as it appeared (quotes removed, hex not decoded).
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.field(key).map(|(value, _)| value)
    }

    /// The value of `key` as text: quoted values as they are, hex-encoded untrusted strings
    /// decoded (lossily for non-UTF-8 bytes). `(null)` counts as absent.
    pub fn text(&self, key: &str) -> Option<String> {
        let (value, quoted) = self.field(key)?;
        if value == "(null)" || value == "?" {
            return None;
        }
        if !quoted
            && UNTRUSTED_FIELDS.contains(&key)
            && let Some(bytes) = decode_hex(value)
        {
            return Some(utf8_lossy(&bytes).into_owned());
        }
        Some(value.to_owned())
    }

    /// The value of `key` parsed as a decimal number.
    pub fn number(&self, key: &str) -> Option<i64> {
        self.raw(key)?.parse().ok()
    }

    /// The value of `key` parsed as a hexadecimal number (syscall arguments, `code`).
    pub fn hex(&self, key: &str) -> Option<u64> {
        let raw = self.raw(key)?;
        u64::from_str_radix(raw.trim_start_matches("0x"), 16).ok()
    }
}

/// `bytes` as UTF-8 (invalid sequences replaced), without a copy when valid.
fn utf8_lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// The fields of `body`, in order. A key containing a space means the text lost sync (free
/// text before it); its last word is the key.
fn spans(body: &str) -> Vec<Span> {
    let offset = |part: &str| {
        let from = part.as_ptr() as usize - body.as_ptr() as usize;
        (
            u32::try_from(from).unwrap_or(u32::MAX),
            u32::try_from(from + part.len()).unwrap_or(u32::MAX),
        )
    };
    let mut out = Vec::with_capacity(24);
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else { break };
        let key = rest[..eq].trim();
        let after = &rest[eq + 1..];
        let (value, quoted, remaining) = match after.chars().next() {
            Some(q @ ('"' | '\'')) => match after[1..].find(q) {
                Some(end) => (&after[1..1 + end], true, &after[2 + end..]),
                None => (&after[1..], true, ""),
            },
            _ => {
                let end = after
                    .find(|c: char| c.is_ascii_whitespace())
                    .unwrap_or(after.len());
                (&after[..end], false, &after[end..])
            }
        };
        let key = key.rsplit(' ').next().unwrap_or(key);
        out.push(Span {
            key: offset(key),
            value: offset(value),
            quoted,
        });
        rest = remaining.trim_start();
    }
    out
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let nibble = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    if text.is_empty() || !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

/// Formats an audit timestamp as RFC 3339 UTC (`2025-06-01T12:00:00.123Z`).
pub fn rfc3339(secs: u64, millis: u32) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), valid for the whole u64 range we see.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn landlock_access_record_fields_are_parsed() {
        let text = br#"audit(1729738800.268:30): domain=195ba459b blockers=fs.make_reg,fs.refer path="/usr/local" dev="vda2" ino=365"#;
        let record = Record::parse(AUDIT_LANDLOCK_ACCESS, text).unwrap();
        assert_eq!(
            (record.secs, record.millis, record.serial),
            (1729738800, 268, 30)
        );
        assert_eq!(record.raw("domain"), Some("195ba459b"));
        assert_eq!(record.raw("blockers"), Some("fs.make_reg,fs.refer"));
        assert_eq!(record.text("path").as_deref(), Some("/usr/local"));
        assert_eq!(record.number("ino"), Some(365));
    }

    #[test]
    fn hex_encoded_untrusted_strings_are_decoded_and_others_are_not() {
        let text = b"audit(1.002:3): name=2F746D702F6120622E747874 a0=ffffff9c exe=(null)";
        let record = Record::parse(AUDIT_PATH, text).unwrap();
        assert_eq!(record.text("name").as_deref(), Some("/tmp/a b.txt"));
        assert_eq!(record.text("a0").as_deref(), Some("ffffff9c"));
        assert_eq!(record.hex("a0"), Some(0xffff_ff9c));
        assert_eq!(record.text("exe"), None);
    }

    #[test]
    fn single_quoted_user_messages_keep_their_spaces() {
        let text = b"audit(5.000:9): pid=1 uid=0 msg='op=execward-drain nonce=ab12 res=success'\0";
        let record = Record::parse(AUDIT_TRUSTED_APP, text).unwrap();
        assert_eq!(
            record.text("msg").as_deref(),
            Some("op=execward-drain nonce=ab12 res=success")
        );
    }

    #[test]
    fn malformed_header_is_an_error() {
        assert!(Record::parse(AUDIT_SYSCALL, b"hello").is_err());
        assert!(Record::parse(AUDIT_SYSCALL, b"audit(1:2): x=1").is_err());
    }

    #[test]
    fn timestamps_render_as_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_729_738_800, 268), "2024-10-24T03:00:00.268Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
    }
}
