//! Unfinished websocket messages, charged as they arrive.
//!
//! The websocket layer buffers a message until its last byte is in; only then does the
//! connection loop see it and reserve its memory. A client could hold [`MAX_FRAME_BYTES`] per
//! connection that way, uncharged and for ever. [`MeteredStream`] sits under the websocket layer:
//! it follows the frame headers of the bytes it passes up ([`FrameMeter`], sans-I/O), backs the
//! bytes of the message being assembled with the connection's memory (its allowance, then the
//! server's [`MEMORY_BUDGET_BYTES`]) before handing them on, and gives the charge back once the
//! message is complete (the connection loop then reserves it as a request). A message the
//! budget cannot take fails the read ([`MeterError::Memory`]: the connection is closed with 1013,
//! try again later); a message not complete [`MESSAGE_COMPLETION_TIMEOUT`] after its first byte
//! fails it too ([`MeterError::Timeout`], close 1008).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::budget::{BudgetError, ConnectionBudget, MemoryCharge};
#[cfg(doc)]
use crate::limits::{MAX_FRAME_BYTES, MEMORY_BUDGET_BYTES};
use crate::limits::{MESSAGE_CHARGE_STEP_BYTES, MESSAGE_COMPLETION_TIMEOUT};

/// Why the metered stream stopped reading.
#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    /// The memory for the message being received is not available.
    #[error(
        "the server's memory budget (MEMORY_BUDGET_BYTES) has no room for the {received} bytes of \
         the message being received; retry later"
    )]
    Memory {
        /// Bytes of the unfinished message so far.
        received: usize,
        /// The refusal.
        #[source]
        source: BudgetError,
    },
    /// The message was started and not finished in time.
    #[error(
        "a websocket message was started and not finished within {MESSAGE_COMPLETION_TIMEOUT:?} \
         (MESSAGE_COMPLETION_TIMEOUT)"
    )]
    Timeout,
}

/// Follows the frames of a client's byte stream (RFC 6455 §5.2) to know how many payload bytes
/// of a not yet complete message have been passed on.
#[derive(Debug, Default)]
pub struct FrameMeter {
    /// Header bytes of the frame being read (at most 14).
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come (once its header is complete).
    payload_left: u64,
    /// Whether the current frame is the last of its message.
    fin: bool,
    /// Whether the current frame is a control frame (not part of the data message).
    control: bool,
    /// A data message was started (a non-final frame passed) and is not complete.
    message_open: bool,
    /// Payload bytes of the unfinished data message so far.
    message_bytes: u64,
}

impl FrameMeter {
    /// Account for `bytes` passed on.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(bytes.len() as u64);
                self.payload_left -= take;
                if !self.control {
                    self.message_bytes += take;
                }
                bytes = &bytes[take as usize..];
                if self.payload_left == 0 {
                    self.frame_done();
                }
                continue;
            }
            self.header.push(bytes[0]);
            bytes = &bytes[1..];
            if let Some(len) = self.header_payload_len() {
                self.header.clear();
                self.payload_left = len;
                if len == 0 {
                    self.frame_done();
                }
            }
        }
    }

    /// Payload bytes of the unfinished message passed on so far (0 between messages).
    pub fn unfinished_bytes(&self) -> u64 {
        if self.is_between_messages() {
            0
        } else {
            self.message_bytes
        }
    }

    /// True when no data frame or message is partly passed on.
    pub fn is_between_messages(&self) -> bool {
        !self.message_open && self.header.is_empty() && (self.payload_left == 0 || self.control)
    }

    /// The payload length once `header` holds a complete header; sets `fin` and `control`.
    fn header_payload_len(&mut self) -> Option<u64> {
        let header = &self.header;
        if header.len() < 2 {
            return None;
        }
        let masked = header[1] & 0x80 != 0;
        let mask_len = if masked { 4 } else { 0 };
        let (len, len_bytes) = match header[1] & 0x7f {
            126 => (None, 2),
            127 => (None, 8),
            short => (Some(u64::from(short)), 0),
        };
        if header.len() < 2 + len_bytes + mask_len {
            return None;
        }
        let len = len.unwrap_or_else(|| {
            header[2..2 + len_bytes]
                .iter()
                .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte))
        });
        self.fin = header[0] & 0x80 != 0;
        self.control = header[0] & 0x08 != 0;
        if !self.control {
            self.message_open = true;
        }
        Some(len)
    }

    fn frame_done(&mut self) {
        if !self.control && self.fin {
            self.message_open = false;
            self.message_bytes = 0;
        }
    }
}

/// A client's byte stream whose unfinished websocket messages are charged to its connection's
/// budget and must complete in time (see the module docs). Writes pass through.
pub struct MeteredStream<S> {
    inner: S,
    meter: FrameMeter,
    budget: ConnectionBudget,
    charge: Option<MemoryCharge>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> MeteredStream<S> {
    /// Meter `inner`, charging `budget`; `already` are bytes of it read before (they are passed
    /// on by other means, and charged with the next read).
    pub fn new(inner: S, budget: ConnectionBudget, already: &[u8]) -> Self {
        let mut meter = FrameMeter::default();
        meter.feed(already);
        Self {
            inner,
            meter,
            budget,
            charge: None,
            deadline: None,
        }
    }

    /// Charge what the meter says is held now; start or clear the deadline.
    fn account(&mut self) -> Result<(), MeterError> {
        if self.meter.is_between_messages() {
            self.charge = None;
            self.deadline = None;
            return Ok(());
        }
        if self.deadline.is_none() {
            self.deadline = Some(Box::pin(tokio::time::sleep(MESSAGE_COMPLETION_TIMEOUT)));
        }
        let held = usize::try_from(self.meter.unfinished_bytes()).unwrap_or(usize::MAX);
        let charged = self.charge.as_ref().map_or(0, MemoryCharge::bytes);
        // A message within the first step is held uncharged, like the socket's read buffer: an
        // ordinary request never depends on the budgets' room to be received.
        if held > MESSAGE_CHARGE_STEP_BYTES && held > charged {
            // In steps, so a large message costs a few budget operations, not one per read.
            let want = held.div_ceil(MESSAGE_CHARGE_STEP_BYTES) * MESSAGE_CHARGE_STEP_BYTES;
            let result = match &mut self.charge {
                Some(charge) => charge.back(&self.budget, want),
                None => self.budget.hold(want).map(|charge| {
                    self.charge = Some(charge);
                }),
            };
            result.map_err(|source| MeterError::Memory {
                received: held,
                source,
            })?;
        }
        Ok(())
    }
}

fn io_error(error: MeterError) -> std::io::Error {
    std::io::Error::other(error)
}

impl<S: AsyncRead + Unpin> AsyncRead for MeteredStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.meter.feed(&buf.filled()[before..]);
                Poll::Ready(this.account().map_err(io_error))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                let expired = this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if expired {
                    Poll::Ready(Err(io_error(MeterError::Timeout)))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MeteredStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
        let mut frame = vec![u8::from(fin) << 7 | opcode];
        match len {
            0..=125 => frame.push(0x80 | len as u8),
            126..=0xFFFF => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&len.to_be_bytes());
            }
        }
        frame.extend_from_slice(&[1, 2, 3, 4]);
        frame
    }

    #[test]
    fn a_frame_is_counted_until_its_last_byte() {
        let mut meter = FrameMeter::default();
        meter.feed(&header(true, 2, 100_000));
        assert!(!meter.is_between_messages());
        meter.feed(&vec![0; 60_000]);
        assert_eq!(meter.unfinished_bytes(), 60_000);
        // The rest of the frame and the first two bytes of the next header, byte by byte.
        let mut rest = vec![0; 40_000];
        rest.extend_from_slice(&header(true, 1, 5)[..2]);
        for byte in rest {
            meter.feed(&[byte]);
        }
        assert_eq!(meter.unfinished_bytes(), 0);
        assert!(!meter.is_between_messages(), "a header has started");
        meter.feed(&header(true, 1, 5)[2..]);
        meter.feed(b"hello");
        assert!(meter.is_between_messages());
    }

    #[test]
    fn fragments_add_up_and_control_frames_between_them_do_not_count() {
        let mut meter = FrameMeter::default();
        meter.feed(&header(false, 2, 1000));
        meter.feed(&[0; 1000]);
        assert_eq!(meter.unfinished_bytes(), 1000);
        // A ping between fragments.
        meter.feed(&header(true, 9, 4));
        meter.feed(b"ping");
        assert_eq!(meter.unfinished_bytes(), 1000);
        assert!(!meter.is_between_messages());
        meter.feed(&header(false, 0, 70_000));
        meter.feed(&[0; 70_000]);
        assert_eq!(meter.unfinished_bytes(), 71_000);
        meter.feed(&header(true, 0, 10));
        meter.feed(&[0; 10]);
        assert!(meter.is_between_messages());
        assert_eq!(meter.unfinished_bytes(), 0);
    }

    #[test]
    fn a_control_frame_alone_is_between_messages_once_read() {
        let mut meter = FrameMeter::default();
        meter.feed(&header(true, 9, 0));
        assert!(meter.is_between_messages());
    }
}
