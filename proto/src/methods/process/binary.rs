//! `process/output` as a websocket binary frame, for a client that asked for it at `initialize`
//! (`binaryOutput`): the same notification without JSON or base64, so output costs the server
//! and the client a copy instead of an encoding each way. Everything else (requests, answers,
//! `process/exited`, `process/closed`, `process/read`) stays JSON.
//!
//! ```text
//! offset   size  field
//! 0        1     kind: 0x01, process/output (no JSON text can begin with this byte)
//! 1        1     stream: 0 stdout, 1 stderr, 2 pty
//! 2        8     seq, unsigned, big-endian (the seq the JSON form carries)
//! 10       2     N, the process id's length in bytes, unsigned, big-endian, at least 1
//! 12       N     the process id, UTF-8
//! 12 + N   rest  the chunk's bytes (at least one)
//! ```
//!
//! A receiver refuses any other kind, stream, a zero or overlong id, an id that is not UTF-8,
//! and an empty chunk ([`FrameError`]).

use super::OutputStream;

/// The first byte of an output frame.
pub const OUTPUT_FRAME_KIND: u8 = 0x01;
/// Bytes before the process id.
pub const OUTPUT_FRAME_HEADER_BYTES: usize = 12;

/// One decoded output frame, borrowing the received bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputFrame<'a> {
    /// The process.
    pub process_id: &'a str,
    /// The stream.
    pub stream: OutputStream,
    /// Event sequence number (shared with exited and closed).
    pub seq: u64,
    /// The chunk.
    pub data: &'a [u8],
}

/// Why bytes are not an output frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than its header says.
    #[error("an output frame of {length} bytes is shorter than its header ({needed} bytes)")]
    Truncated {
        /// Bytes received.
        length: usize,
        /// Bytes the header needs.
        needed: usize,
    },
    /// The first byte is not [`OUTPUT_FRAME_KIND`].
    #[error("binary frame kind {0:#04x} is not an output frame (0x01)")]
    Kind(u8),
    /// The stream byte is not 0, 1 or 2.
    #[error("output frame stream {0} is not 0 (stdout), 1 (stderr) or 2 (pty)")]
    Stream(u8),
    /// The process id is empty or not UTF-8.
    #[error("an output frame's process id is empty or not UTF-8")]
    ProcessId,
    /// No chunk bytes.
    #[error("an output frame carries no output")]
    Empty,
}

fn stream_byte(stream: OutputStream) -> u8 {
    match stream {
        OutputStream::Stdout => 0,
        OutputStream::Stderr => 1,
        OutputStream::Pty => 2,
    }
}

impl<'a> OutputFrame<'a> {
    /// The frame's bytes. A process id longer than `u16::MAX` bytes cannot be framed and is
    /// cut to that length (the server accepts ids of at most 128 bytes).
    pub fn encode(&self) -> Vec<u8> {
        let id = self.process_id.as_bytes();
        let id_len = u16::try_from(id.len()).unwrap_or(u16::MAX);
        let mut frame = Vec::with_capacity(OUTPUT_FRAME_HEADER_BYTES + id.len() + self.data.len());
        frame.push(OUTPUT_FRAME_KIND);
        frame.push(stream_byte(self.stream));
        frame.extend_from_slice(&self.seq.to_be_bytes());
        frame.extend_from_slice(&id_len.to_be_bytes());
        frame.extend_from_slice(&id[..usize::from(id_len)]);
        frame.extend_from_slice(self.data);
        frame
    }

    /// Parse a received binary frame.
    ///
    /// # Errors
    /// [`FrameError`] saying what is wrong.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, FrameError> {
        let truncated = |needed| FrameError::Truncated {
            length: bytes.len(),
            needed,
        };
        let header = bytes
            .get(..OUTPUT_FRAME_HEADER_BYTES)
            .ok_or_else(|| truncated(OUTPUT_FRAME_HEADER_BYTES))?;
        if header[0] != OUTPUT_FRAME_KIND {
            return Err(FrameError::Kind(header[0]));
        }
        let stream = match header[1] {
            0 => OutputStream::Stdout,
            1 => OutputStream::Stderr,
            2 => OutputStream::Pty,
            other => return Err(FrameError::Stream(other)),
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&header[2..10]);
        let id_len = usize::from(u16::from_be_bytes([header[10], header[11]]));
        let id_end = OUTPUT_FRAME_HEADER_BYTES + id_len;
        let id = bytes
            .get(OUTPUT_FRAME_HEADER_BYTES..id_end)
            .ok_or_else(|| truncated(id_end))?;
        let process_id = std::str::from_utf8(id).map_err(|_| FrameError::ProcessId)?;
        if process_id.is_empty() {
            return Err(FrameError::ProcessId);
        }
        let data = &bytes[id_end..];
        if data.is_empty() {
            return Err(FrameError::Empty);
        }
        Ok(Self {
            process_id,
            stream,
            seq: u64::from_be_bytes(seq),
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_its_layout_is_the_documented_one() {
        let frame = OutputFrame {
            process_id: "build",
            stream: OutputStream::Stderr,
            seq: 0x0102_0304_0506_0708,
            data: b"\xff\x00 not utf-8",
        };
        let bytes = frame.encode();
        assert_eq!(
            &bytes[..OUTPUT_FRAME_HEADER_BYTES],
            &[1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 5]
        );
        assert_eq!(&bytes[12..17], b"build");
        assert_eq!(OutputFrame::decode(&bytes), Ok(frame));
    }

    #[test]
    fn malformed_frames_are_refused_by_what_is_wrong() {
        let good = OutputFrame {
            process_id: "p",
            stream: OutputStream::Pty,
            seq: 7,
            data: b"x",
        }
        .encode();
        assert_eq!(
            OutputFrame::decode(&good[..5]),
            Err(FrameError::Truncated {
                length: 5,
                needed: 12
            })
        );
        let mut kind = good.clone();
        kind[0] = b'{';
        assert_eq!(OutputFrame::decode(&kind), Err(FrameError::Kind(b'{')));
        let mut stream = good.clone();
        stream[1] = 3;
        assert_eq!(OutputFrame::decode(&stream), Err(FrameError::Stream(3)));
        let mut long_id = good.clone();
        long_id[11] = 200;
        assert!(matches!(
            OutputFrame::decode(&long_id),
            Err(FrameError::Truncated { needed: 212, .. })
        ));
        let mut no_id = good.clone();
        no_id[11] = 0;
        no_id.remove(12);
        assert_eq!(OutputFrame::decode(&no_id), Err(FrameError::ProcessId));
        let mut bad_utf8 = good.clone();
        bad_utf8[12] = 0xff;
        assert_eq!(OutputFrame::decode(&bad_utf8), Err(FrameError::ProcessId));
        assert_eq!(
            OutputFrame::decode(&good[..good.len() - 1]),
            Err(FrameError::Empty)
        );
    }
}
