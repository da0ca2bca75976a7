//! HTTP/1.x request framing, sans-I/O: where one request's body ends, so that the next
//! request head is found and checked like the first.
//!
//! Bodies are never buffered: a Content-Length body, and each chunk's data, pass by count
//! ([`BodyReader::opaque`]); only chunk-size lines and trailers are looked at, each bounded.
//! What cannot be framed the one way every server frames it is refused: Content-Length beside
//! Transfer-Encoding, a transfer coding other than `chunked`, two Content-Length headers, a
//! length that is not one decimal number, a line that does not end with CRLF, a bad
//! chunk-size line, chunk data not followed by CRLF, obsolete line folding (in the head
//! `httparse` refuses it; in a trailer it is refused here).

use super::MAX_HEADER_BYTES;

/// Longest chunk-size line (size, extensions, CRLF): bounds what is held to find its end.
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;

/// Most hex digits of a chunk size (a `u64`).
const MAX_CHUNK_SIZE_DIGITS: usize = 16;

/// How a request's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// No body (neither Content-Length nor Transfer-Encoding).
    None,
    /// `Content-Length: N`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Why a request could not be framed (the connection is closed with a named refusal).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// Both headers: which one a server obeys differs (request smuggling).
    #[error("the request has both Content-Length and Transfer-Encoding")]
    LengthAndCoding,
    /// More than one Content-Length or Transfer-Encoding header.
    #[error("the request has more than one {0} header")]
    Repeated(&'static str),
    /// A Content-Length that is not one decimal number.
    #[error("Content-Length {0:?} is not one decimal number")]
    Length(String),
    /// A transfer coding other than exactly `chunked`.
    #[error("Transfer-Encoding {0:?} is not \"chunked\" (the only coding framed here)")]
    Coding(String),
    /// Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1: faulty framing).
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    CodingInHttp10,
    /// A CR or LF that is not part of a CRLF line end.
    #[error("a line of the request does not end with CRLF (bare CR or LF)")]
    BareLineEnd,
    /// A chunk-size line that is not `HEX[;extensions]CRLF`.
    #[error("malformed chunk-size line {0:?}")]
    ChunkSize(String),
    /// A chunk-size line longer than [`MAX_CHUNK_LINE_BYTES`].
    #[error("a chunk-size line is longer than MAX_CHUNK_LINE_BYTES ({MAX_CHUNK_LINE_BYTES})")]
    ChunkLineTooLong,
    /// Chunk data not followed by CRLF.
    #[error("chunk data is not followed by CRLF")]
    ChunkEnd,
    /// A trailer line that is no `name: value`, folded, or too long.
    #[error("malformed trailer: {0}")]
    Trailer(&'static str),
}

/// The body framing of a request head's headers (`version`: the `1` of `HTTP/1.1`).
///
/// # Errors
/// [`FramingError`] for every framing a server could read differently.
pub fn body_of(version: u8, headers: &[httparse::Header<'_>]) -> Result<Body, FramingError> {
    let mut length = None;
    let mut coding = None;
    for header in headers {
        if header.name.eq_ignore_ascii_case("content-length") {
            if length.is_some() {
                return Err(FramingError::Repeated("Content-Length"));
            }
            length = Some(header.value);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            if coding.is_some() {
                return Err(FramingError::Repeated("Transfer-Encoding"));
            }
            coding = Some(header.value);
        }
    }
    match (length, coding) {
        (Some(_), Some(_)) => Err(FramingError::LengthAndCoding),
        (None, None) => Ok(Body::None),
        (Some(value), None) => {
            let text = String::from_utf8_lossy(value);
            let digits = text.trim_matches([' ', '\t']);
            if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(FramingError::Length(text.into_owned()));
            }
            digits
                .parse::<u64>()
                .map(Body::Length)
                .map_err(|_| FramingError::Length(text.into_owned()))
        }
        (None, Some(value)) => {
            if version == 0 {
                return Err(FramingError::CodingInHttp10);
            }
            let text = String::from_utf8_lossy(value);
            if text
                .trim_matches([' ', '\t'])
                .eq_ignore_ascii_case("chunked")
            {
                Ok(Body::Chunked)
            } else {
                Err(FramingError::Coding(text.into_owned()))
            }
        }
    }
}

/// Whether every CR and LF of `head` is part of a CRLF (`httparse` accepts a bare LF as a line
/// end; a server that does not would see other header lines than the proxy checked).
///
/// # Errors
/// [`FramingError::BareLineEnd`].
pub fn check_line_ends(head: &[u8]) -> Result<(), FramingError> {
    let mut previous = 0u8;
    for (i, &byte) in head.iter().enumerate() {
        let bare_lf = byte == b'\n' && previous != b'\r';
        let bare_cr = byte == b'\r' && head.get(i + 1) != Some(&b'\n');
        if bare_lf || bare_cr {
            return Err(FramingError::BareLineEnd);
        }
        previous = byte;
    }
    Ok(())
}

/// Where a body reader is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// This many body bytes (Content-Length, or one chunk's data) still to pass.
    Data { left: u64, chunked: bool },
    /// The CRLF after a chunk's data.
    DataEnd,
    /// A chunk-size line.
    SizeLine,
    /// The trailer section after the last chunk (bytes of it seen so far).
    Trailer { seen: usize },
    /// The body is over.
    Done,
}

/// Follows one request body through the byte stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyReader {
    state: State,
}

impl BodyReader {
    /// A reader for `body`.
    pub fn new(body: Body) -> Self {
        let state = match body {
            Body::None | Body::Length(0) => State::Done,
            Body::Length(left) => State::Data {
                left,
                chunked: false,
            },
            Body::Chunked => State::SizeLine,
        };
        Self { state }
    }

    /// Whether the body is over (the next byte starts the next request head).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Bytes that may pass now without being looked at (body data).
    pub fn opaque(&self) -> u64 {
        match self.state {
            State::Data { left, .. } => left,
            _ => 0,
        }
    }

    /// `n` of the [`Self::opaque`] bytes passed.
    pub fn skipped(&mut self, n: u64) {
        if let State::Data { left, chunked } = self.state {
            let left = left.saturating_sub(n);
            self.state = match (left, chunked) {
                (0, true) => State::DataEnd,
                (0, false) => State::Done,
                (left, chunked) => State::Data { left, chunked },
            };
        }
    }

    /// Consumes body bytes from the front of `buf` (they pass as they are); stops at the end of
    /// the body or where more bytes are needed. Returns how many were consumed.
    ///
    /// # Errors
    /// [`FramingError`] for a malformed chunk-size line, chunk end or trailer.
    pub fn advance(&mut self, buf: &[u8]) -> Result<usize, FramingError> {
        let mut at = 0;
        match self.advance_from(buf, &mut at) {
            // What was framed before the error passes (as it would have, read in smaller
            // pieces); the error comes back on the next call, which starts where it is.
            Err(_) if at > 0 => Ok(at),
            Err(err) => Err(err),
            Ok(()) => Ok(at),
        }
    }

    fn advance_from(&mut self, buf: &[u8], at: &mut usize) -> Result<(), FramingError> {
        loop {
            let rest = &buf[*at..];
            match self.state {
                State::Done => return Ok(()),
                State::Data { left, .. } => {
                    if rest.is_empty() {
                        return Ok(());
                    }
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(rest.len());
                    self.skipped(n as u64);
                    *at += n;
                }
                State::DataEnd => {
                    if rest.len() < 2 {
                        if rest.first().is_some_and(|b| *b != b'\r') {
                            return Err(FramingError::ChunkEnd);
                        }
                        return Ok(());
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(FramingError::ChunkEnd);
                    }
                    *at += 2;
                    self.state = State::SizeLine;
                }
                State::SizeLine => {
                    let Some(end) = rest.iter().position(|b| *b == b'\n') else {
                        if rest.len() >= MAX_CHUNK_LINE_BYTES {
                            return Err(FramingError::ChunkLineTooLong);
                        }
                        return Ok(());
                    };
                    if end + 1 > MAX_CHUNK_LINE_BYTES {
                        return Err(FramingError::ChunkLineTooLong);
                    }
                    let size = chunk_size(&rest[..=end])?;
                    *at += end + 1;
                    self.state = if size == 0 {
                        State::Trailer { seen: 0 }
                    } else {
                        State::Data {
                            left: size,
                            chunked: true,
                        }
                    };
                }
                State::Trailer { seen } => {
                    let Some(end) = rest.iter().position(|b| *b == b'\n') else {
                        if seen + rest.len() >= MAX_HEADER_BYTES {
                            return Err(FramingError::Trailer("larger than MAX_HEADER_BYTES"));
                        }
                        return Ok(());
                    };
                    let line = &rest[..=end];
                    if seen + line.len() > MAX_HEADER_BYTES {
                        return Err(FramingError::Trailer("larger than MAX_HEADER_BYTES"));
                    }
                    check_line_ends(line)
                        .map_err(|_| FramingError::Trailer("a line does not end with CRLF"))?;
                    if line == b"\r\n" {
                        *at += line.len();
                        self.state = State::Done;
                        continue;
                    }
                    if matches!(line[0], b' ' | b'\t') {
                        return Err(FramingError::Trailer("obsolete line folding"));
                    }
                    let colon = line.iter().position(|b| *b == b':');
                    let name_ok = colon.is_some_and(|c| {
                        c > 0
                            && line[..c].iter().all(|b| {
                                b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b)
                            })
                    });
                    if !name_ok {
                        return Err(FramingError::Trailer("a line is not name: value"));
                    }
                    // Consumed only once checked: an error must recur on the next call.
                    *at += line.len();
                    self.state = State::Trailer {
                        seen: seen + line.len(),
                    };
                }
            }
        }
    }
}

/// The size of a chunk-size line `HEX[ BWS ; extensions ]CRLF`.
fn chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let bad = || FramingError::ChunkSize(String::from_utf8_lossy(line).into_owned());
    let body = line.strip_suffix(b"\r\n").ok_or_else(bad)?;
    let digits = body.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > MAX_CHUNK_SIZE_DIGITS {
        return Err(bad());
    }
    let rest = &body[digits..];
    let extensions = rest.iter().position(|b| !matches!(b, b' ' | b'\t'));
    match extensions {
        None if rest.is_empty() => {}
        Some(at) if rest[at] == b';' => {
            if rest[at..]
                .iter()
                .any(|b| (b.is_ascii_control() && *b != b'\t') || *b == 0x7f)
            {
                return Err(bad());
            }
        }
        _ => return Err(bad()),
    }
    let text = std::str::from_utf8(&body[..digits]).map_err(|_| bad())?;
    u64::from_str_radix(text, 16).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn head(headers: &[(&str, &str)]) -> Result<Body, FramingError> {
        let parsed: Vec<httparse::Header<'_>> = headers
            .iter()
            .map(|(name, value)| httparse::Header {
                name,
                value: value.as_bytes(),
            })
            .collect();
        body_of(1, &parsed)
    }

    #[test]
    fn the_body_framing_comes_from_one_header_or_none() {
        assert_eq!(head(&[("Host", "a.test")]), Ok(Body::None));
        assert_eq!(head(&[("Content-Length", " 12 ")]), Ok(Body::Length(12)));
        assert_eq!(head(&[("transfer-encoding", "Chunked")]), Ok(Body::Chunked));
        for refused in [
            vec![("Content-Length", "1"), ("Transfer-Encoding", "chunked")],
            vec![("Content-Length", "1"), ("Content-Length", "1")],
            vec![
                ("Transfer-Encoding", "chunked"),
                ("Transfer-Encoding", "chunked"),
            ],
            vec![("Content-Length", "+1")],
            vec![("Content-Length", "1, 1")],
            vec![("Content-Length", "0x10")],
            vec![("Content-Length", "99999999999999999999")],
            vec![("Transfer-Encoding", "gzip, chunked")],
            vec![("Transfer-Encoding", "identity")],
        ] {
            assert!(head(&refused).is_err(), "{refused:?}");
        }
        let te = [httparse::Header {
            name: "Transfer-Encoding",
            value: b"chunked",
        }];
        assert_eq!(body_of(0, &te), Err(FramingError::CodingInHttp10));
    }

    #[test]
    fn bare_line_ends_are_refused() {
        assert_eq!(
            check_line_ends(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(())
        );
        for bad in [
            &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n",
        ] {
            assert_eq!(check_line_ends(bad), Err(FramingError::BareLineEnd));
        }
    }

    /// Feeds `input` in pieces of `step` bytes; returns the consumed count when the body ends.
    fn run(body: Body, input: &[u8], step: usize) -> Result<Option<usize>, FramingError> {
        let mut reader = BodyReader::new(body);
        let mut held = Vec::new();
        let mut consumed = 0;
        for piece in input.chunks(step) {
            held.extend_from_slice(piece);
            let n = reader.advance(&held)?;
            held.drain(..n);
            consumed += n;
            if reader.is_done() {
                return Ok(Some(consumed));
            }
        }
        Ok(None)
    }

    #[test]
    fn chunked_bodies_end_where_the_last_chunk_and_trailer_end_in_any_split() {
        let body = b"5\r\nhello\r\n1e;ext=\"x\"\r\nGET / HTTP/1.1\r\nHost: evil\r\n\r\n\r\n0\r\nX-T: 1\r\n\r\n";
        for step in [1, 2, 3, 7, body.len()] {
            assert_eq!(
                run(Body::Chunked, &[&body[..], b"NEXT"].concat(), step),
                Ok(Some(body.len())),
                "step {step}"
            );
        }
        assert_eq!(run(Body::Length(4), b"abcdNEXT", 3), Ok(Some(4)));
        assert_eq!(run(Body::Length(10), b"abcd", 3), Ok(None));
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"-1\r\n",
            b"0x5\r\n",
            b"5 5\r\n",
            b"5\n",
            b"11111111111111111\r\n",
            b"5\r\nhelloXX",
            b"0\r\n folded\r\n\r\n",
            b"0\r\nno colon\r\n\r\n",
        ] {
            assert!(
                run(Body::Chunked, bad, 1).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = [b"5;".as_slice(), &[b'a'; MAX_CHUNK_LINE_BYTES]].concat();
        assert_eq!(
            run(Body::Chunked, &long, 512),
            Err(FramingError::ChunkLineTooLong)
        );
    }

    #[test]
    fn body_data_is_opaque_by_count() {
        let mut reader = BodyReader::new(Body::Chunked);
        assert_eq!(reader.advance(b"10\r\n"), Ok(4));
        assert_eq!(reader.opaque(), 16);
        reader.skipped(16);
        assert_eq!(reader.opaque(), 0);
        assert_eq!(reader.advance(b"\r\n0\r\n\r\n"), Ok(7));
        assert!(reader.is_done());
    }
}
