//! The framing between exec-server and a serving `fs-helper` (both directions): a 4-byte
//! big-endian length, then that many bytes. A frame may carry one descriptor (`fs/open`'s file),
//! sent with `SCM_RIGHTS` attached to its length prefix, so it arrives with the frame it
//! belongs to.
//!
//! Blocking I/O on any stream descriptor: a unix socket (the server's socketpair, which can carry
//! a descriptor) or a pipe (the helper run by hand; no descriptor can travel). A length above
//! the reader's limit is refused before anything is allocated; [`skip_body`] then lets the
//! reader stay in step without buffering the body.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Bytes of a frame's length prefix.
pub const HEADER_BYTES: usize = 4;

/// Largest body any frame can have: what the 4-byte length prefix can express.
pub const MAX_ENCODABLE_BYTES: usize = u32::MAX as usize;

/// What a frame I/O was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramePart {
    /// The 4-byte length prefix.
    Header,
    /// The bytes after it.
    Body,
}

impl std::fmt::Display for FramePart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FramePart::Header => "length prefix",
            FramePart::Body => "body",
        })
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The length prefix announces more than the reader accepts (or a body is longer than a
    /// frame can express). Nothing of the body was read: [`skip_body`] skips it.
    #[error("a frame of {len} bytes is larger than the limit of {max} bytes")]
    TooLarge {
        /// The announced (or attempted) length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The stream ended inside a frame.
    #[error("the stream ended after {got} of the {expected} bytes of a frame's {part}")]
    Truncated {
        /// Where it ended.
        part: FramePart,
        /// Bytes that part has.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
    /// Reading or writing a part failed.
    #[error("cannot {verb} a frame's {part}: {source}")]
    Io {
        /// `read`, `write` or `skip`.
        verb: &'static str,
        /// Which part.
        part: FramePart,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Descriptors arrived that the frame cannot carry: more than one, or cut off by the kernel
    /// (`MSG_CTRUNC`). All that arrived are closed.
    #[error(
        "a frame arrived with {count} descriptor(s){truncated}; a frame carries at most one, with its length prefix",
        truncated = if *.truncated { " and more cut off" } else { "" }
    )]
    UnexpectedDescriptor {
        /// Descriptors received.
        count: usize,
        /// The kernel dropped more (no room for them).
        truncated: bool,
    },
}

/// One frame read: its body and the descriptor sent with it, if any.
#[derive(Debug)]
pub struct Frame {
    /// The bytes after the length prefix.
    pub body: Vec<u8>,
    /// A descriptor passed with `SCM_RIGHTS` (close-on-exec).
    pub fd: Option<OwnedFd>,
}

/// Write one frame: `body`'s length, then `body`; `fd`, if any, rides with the length prefix
/// (the stream must then be a unix socket).
///
/// # Errors
/// [`FrameError::TooLarge`] for a body past [`MAX_ENCODABLE_BYTES`] (nothing written);
/// [`FrameError::Io`] when the stream fails (a broken pipe included: `MSG_NOSIGNAL`).
pub fn write_frame<S: Write + AsFd>(
    stream: &mut S,
    body: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), FrameError> {
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge {
        len: body.len(),
        max: MAX_ENCODABLE_BYTES,
    })?;
    let header = len.to_be_bytes();
    let io = |part| {
        move |source| FrameError::Io {
            verb: "write",
            part,
            source,
        }
    };
    let sent = match fd {
        None => 0,
        Some(fd) => send_with_descriptor(stream.as_fd().as_raw_fd(), &header, fd)
            .map_err(io(FramePart::Header))?,
    };
    // The rest of the header and the body in one `writev` where the socket takes them: the
    // reader then wakes once for the whole frame, not once for the length and again for the
    // body (a pooled helper's round trip is on every sandboxed request's path).
    let mut parts = [IoSlice::new(&header[sent..]), IoSlice::new(body)];
    let mut unsent = &mut parts[..];
    let mut header_left = header.len() - sent;
    IoSlice::advance_slices(&mut unsent, 0);
    while !unsent.is_empty() {
        let part = if header_left > 0 {
            FramePart::Header
        } else {
            FramePart::Body
        };
        match stream.write_vectored(unsent) {
            Ok(0) => return Err(io(part)(io::ErrorKind::WriteZero.into())),
            Ok(written) => {
                header_left = header_left.saturating_sub(written);
                IoSlice::advance_slices(&mut unsent, written);
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(io(part)(error)),
        }
    }
    stream.flush().map_err(io(FramePart::Body))
}

fn send_with_descriptor(socket: RawFd, header: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    let fds = [fd.as_raw_fd()];
    loop {
        match sendmsg::<()>(
            socket,
            &[IoSlice::new(header)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => {}
            other => return other.map_err(io::Error::from),
        }
    }
}

/// Read one frame whose body is at most `max_bytes`. `Ok(None)` when the stream ends cleanly
/// before a frame starts.
///
/// # Errors
/// [`FrameError::TooLarge`] when the prefix announces more than `max_bytes` (the body is not
/// read; [`skip_body`] skips it); [`FrameError::Truncated`] when the stream ends inside the
/// frame; [`FrameError::UnexpectedDescriptor`]; [`FrameError::Io`].
pub fn read_frame<S: Read + AsFd>(
    stream: &mut S,
    max_bytes: usize,
) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; HEADER_BYTES];
    let mut filled = 0;
    let mut fd = None;
    while filled < HEADER_BYTES {
        let (read, received) =
            receive(stream, &mut header[filled..]).map_err(|source| FrameError::Io {
                verb: "read",
                part: FramePart::Header,
                source,
            })?;
        let truncated = received.truncated;
        let count = received.fds.len() + usize::from(fd.is_some());
        for received in received.fds {
            fd.get_or_insert(received);
        }
        if count > 1 || truncated {
            return Err(FrameError::UnexpectedDescriptor { count, truncated });
        }
        if read == 0 {
            if filled == 0 && fd.is_none() {
                return Ok(None);
            }
            return Err(FrameError::Truncated {
                part: FramePart::Header,
                expected: HEADER_BYTES,
                got: filled,
            });
        }
        filled += read;
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > max_bytes {
        return Err(FrameError::TooLarge {
            len,
            max: max_bytes,
        });
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match stream.read(&mut body[got..]) {
            Ok(0) => {
                return Err(FrameError::Truncated {
                    part: FramePart::Body,
                    expected: len,
                    got,
                });
            }
            Ok(read) => got += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(FrameError::Io {
                    verb: "read",
                    part: FramePart::Body,
                    source,
                });
            }
        }
    }
    Ok(Some(Frame { body, fd }))
}

/// Skip the `len`-byte body of a frame [`read_frame`] refused as too large, without buffering
/// it, so the next frame can be read.
///
/// # Errors
/// [`FrameError::Truncated`] when the stream ends first; [`FrameError::Io`].
pub fn skip_body<S: Read>(stream: &mut S, len: usize) -> Result<(), FrameError> {
    let skipped = io::copy(&mut stream.take(len as u64), &mut io::sink()).map_err(|source| {
        FrameError::Io {
            verb: "skip",
            part: FramePart::Body,
            source,
        }
    })?;
    if skipped < len as u64 {
        return Err(FrameError::Truncated {
            part: FramePart::Body,
            expected: len,
            got: skipped as usize,
        });
    }
    Ok(())
}

/// Descriptors one `recvmsg` delivered.
struct Received {
    fds: Vec<OwnedFd>,
    truncated: bool,
}

/// One read into `buf`: `recvmsg` collecting descriptors on a socket, plain `read` on anything
/// else (a pipe carries no descriptors).
fn receive<S: Read + AsFd>(stream: &mut S, buf: &mut [u8]) -> io::Result<(usize, Received)> {
    loop {
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [IoSliceMut::new(buf)];
        let message = match recvmsg::<()>(
            stream.as_fd().as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(message) => message,
            Err(Errno::EINTR) => continue,
            Err(Errno::ENOTSOCK) => break,
            Err(errno) => return Err(errno.into()),
        };
        let mut received = Received {
            fds: Vec::new(),
            truncated: message.flags.contains(MsgFlags::MSG_CTRUNC),
        };
        let bytes = message.bytes;
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                received
                    .fds
                    .extend(fds.into_iter().map(crate::sys::owned_fd_from_scm_rights));
            }
        }
        return Ok((bytes, received));
    }
    loop {
        match stream.read(buf) {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            other => {
                let nothing = Received {
                    fds: Vec::new(),
                    truncated: false,
                };
                return other.map(|read| (read, nothing));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::fs::File;
    use std::io::Seek;
    use std::os::unix::net::UnixStream;

    fn frame_bytes(len: u32, body: &[u8]) -> Vec<u8> {
        let mut bytes = len.to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn frames_round_trip_without_a_descriptor_then_end_cleanly() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        write_frame(&mut ours, b"first", None).unwrap();
        write_frame(&mut ours, b"", None).unwrap();
        drop(ours);
        let first = read_frame(&mut theirs, 16).unwrap().unwrap();
        assert_eq!(
            (first.body.as_slice(), first.fd.is_none()),
            (&b"first"[..], true)
        );
        assert_eq!(read_frame(&mut theirs, 16).unwrap().unwrap().body, b"");
        assert!(read_frame(&mut theirs, 16).unwrap().is_none());
    }

    #[test]
    fn a_descriptor_travels_with_its_frame() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"passed").unwrap();
        write_frame(&mut ours, b"{\"handleId\":\"h\"}", Some(file.as_fd())).unwrap();
        write_frame(&mut ours, b"next", None).unwrap();
        let frame = read_frame(&mut theirs, 64).unwrap().unwrap();
        assert_eq!(frame.body, b"{\"handleId\":\"h\"}");
        let mut passed = File::from(frame.fd.expect("the descriptor"));
        passed.rewind().unwrap();
        let mut text = String::new();
        passed.read_to_string(&mut text).unwrap();
        assert_eq!(text, "passed");
        let next = read_frame(&mut theirs, 64).unwrap().unwrap();
        assert_eq!(
            (next.body.as_slice(), next.fd.is_none()),
            (&b"next"[..], true)
        );
    }

    #[test]
    fn a_frame_larger_than_the_socket_buffer_arrives_whole_through_partial_writes() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        let body: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let frame = read_frame(&mut theirs, 8 * 1024 * 1024).unwrap().unwrap();
            (
                frame.body,
                read_frame(&mut theirs, 16).unwrap().unwrap().body,
            )
        });
        write_frame(&mut ours, &body, None).unwrap();
        write_frame(&mut ours, b"after", None).unwrap();
        let (got, after) = reader.join().unwrap();
        assert!(got == body, "the large body came back altered");
        assert_eq!(after, b"after");
    }

    #[test]
    fn frames_work_over_a_pipe() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let (mut read, mut write) = (File::from(read), File::from(write));
        write_frame(&mut write, b"piped", None).unwrap();
        drop(write);
        assert_eq!(read_frame(&mut read, 16).unwrap().unwrap().body, b"piped");
        assert!(read_frame(&mut read, 16).unwrap().is_none());
    }

    #[test]
    fn an_oversize_frame_is_refused_before_its_body_is_read_and_can_be_skipped() {
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        // A prefix of 4 GiB - 1 with no body: reading (or allocating) the body first would
        // block or fail differently; the refusal comes from the prefix alone.
        ours.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let error = read_frame(&mut theirs, 1024).unwrap_err();
        assert!(
            matches!(error, FrameError::TooLarge { len, max: 1024 } if len == u32::MAX as usize),
            "{error}"
        );
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        ours.write_all(&frame_bytes(10, b"0123456789")).unwrap();
        write_frame(&mut ours, b"after", None).unwrap();
        let Err(FrameError::TooLarge { len, .. }) = read_frame(&mut theirs, 4) else {
            panic!("a 10-byte frame passed a 4-byte limit");
        };
        skip_body(&mut theirs, len).unwrap();
        assert_eq!(read_frame(&mut theirs, 16).unwrap().unwrap().body, b"after");
    }

    #[test]
    fn the_stream_ending_mid_frame_is_truncated() {
        for (bytes, part, expected, got) in [
            (frame_bytes(10, b"abc"), FramePart::Body, 10, 3),
            (vec![0, 0], FramePart::Header, HEADER_BYTES, 2),
        ] {
            let (mut ours, mut theirs) = UnixStream::pair().unwrap();
            ours.write_all(&bytes).unwrap();
            drop(ours);
            let error = read_frame(&mut theirs, 64).unwrap_err();
            assert!(
                matches!(error, FrameError::Truncated { part: p, expected: e, got: g }
                    if (p, e, g) == (part, expected, got)),
                "{error}"
            );
        }
        let (mut ours, mut theirs) = UnixStream::pair().unwrap();
        ours.write_all(&frame_bytes(10, b"abc")).unwrap();
        drop(ours);
        let error = skip_body(&mut theirs, 20).unwrap_err();
        assert!(
            matches!(error, FrameError::Truncated { got: 7, .. }),
            "{error}"
        );
    }

    #[test]
    fn two_descriptors_on_one_frame_are_refused() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (a, b) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
        let fds = [a.as_raw_fd(), b.as_raw_fd()];
        sendmsg::<()>(
            ours.as_raw_fd(),
            &[IoSlice::new(&frame_bytes(0, b""))],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let error = read_frame(&mut theirs, 64).unwrap_err();
        assert!(
            matches!(error, FrameError::UnexpectedDescriptor { .. }),
            "{error}"
        );
    }
}
