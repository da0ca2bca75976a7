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
//!
//! The same bytes count in the connection's in-flight bytes
//! ([`MAX_INFLIGHT_BYTES_PER_CONNECTION`]) beside its requests, so a connection holds at most
//! that much whether in requests or in an unfinished message. When they do not fit, nothing more
//! is read until earlier answers were written (backpressure, as for a request); meanwhile the
//! completion deadline still runs and the peer leaving ends the read ([`MeterError::PeerGone`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::hangup::PeerHangup;
use crate::budget::{BudgetError, ConnectionBudget, MemoryCharge};
#[cfg(doc)]
use crate::limits::{MAX_FRAME_BYTES, MAX_INFLIGHT_BYTES_PER_CONNECTION, MEMORY_BUDGET_BYTES};
use crate::limits::{MESSAGE_CHARGE_STEP_BYTES, MESSAGE_COMPLETION_TIMEOUT};

/// Why the metered stream stopped reading.
#[derive(Debug, thiserror::Error)]
pub enum MeterError {
    /// The memory for the message being received is not available.
    #[error(
        "the server's memory budget (MEMORY_BUDGET_BYTES, --memory-budget) has no room for the {received} bytes of \
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
    /// The peer closed its end while the rest of a message waited for in-flight room.
    #[error("the client closed its end of the connection")]
    PeerGone,
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
    /// In-flight bytes the unfinished message waits for; nothing is read until they are counted.
    waiting: Option<Pin<Box<InflightWait>>>,
    /// The peer's close, watched while `waiting`.
    hangup: Option<Arc<PeerHangup>>,
    gone: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

type InflightWait = dyn Future<Output = Result<MemoryCharge, BudgetError>> + Send;

impl<S> MeteredStream<S> {
    /// Meter `inner`, charging `budget`; `already` are bytes of it read before (they are passed
    /// on by other means, and charged with the next read). `hangup`, when given, ends a read
    /// that waits for in-flight room once the peer has gone.
    pub fn new(
        inner: S,
        budget: ConnectionBudget,
        hangup: Option<Arc<PeerHangup>>,
        already: &[u8],
    ) -> Self {
        let mut meter = FrameMeter::default();
        meter.feed(already);
        Self {
            inner,
            meter,
            budget,
            charge: None,
            deadline: None,
            waiting: None,
            hangup,
            gone: None,
        }
    }

    /// Poll the in-flight room the unfinished message waits for: `Ready(Ok)` once there is
    /// nothing (more) to wait for, `Pending` while it waits (the deadline and the peer's close
    /// still end it).
    fn poll_waiting(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), MeterError>> {
        let Some(waiting) = self.waiting.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        match waiting.as_mut().poll(cx) {
            Poll::Ready(Ok(counted)) => {
                self.waiting = None;
                self.gone = None;
                match &mut self.charge {
                    Some(charge) => charge.merge(counted),
                    None => self.charge = Some(counted),
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(source)) => Poll::Ready(Err(MeterError::Memory {
                received: usize::try_from(self.meter.unfinished_bytes()).unwrap_or(usize::MAX),
                source,
            })),
            Poll::Pending => {
                if self.deadline_passed(cx) {
                    return Poll::Ready(Err(MeterError::Timeout));
                }
                if let Some(hangup) = &self.hangup {
                    let hangup = hangup.clone();
                    let gone = self
                        .gone
                        .get_or_insert_with(|| Box::pin(async move { hangup.gone().await }));
                    if gone.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(MeterError::PeerGone));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline
            .as_mut()
            .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
    }

    /// Charge what the meter says is held now; start or clear the deadline.
    fn account(&mut self) -> Result<(), MeterError> {
        if self.meter.is_between_messages() {
            self.charge = None;
            self.deadline = None;
            self.waiting = None;
            self.gone = None;
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
            // The same bytes in the connection's in-flight count, beside its requests: taken now
            // when they fit, else waited for before anything more is read.
            let counted = self.charge.as_ref().map_or(0, MemoryCharge::inflight_bytes);
            if want > counted && self.waiting.is_none() {
                let more = want - counted;
                match self.budget.try_count_inflight(more) {
                    Some(counted) => {
                        if let Some(charge) = &mut self.charge {
                            charge.merge(counted);
                        }
                    }
                    None => {
                        let budget = self.budget.clone();
                        self.waiting = Some(Box::pin(async move { budget.reserve(more, 0).await }));
                    }
                }
            }
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
        match this.poll_waiting(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(error)) => return Poll::Ready(Err(io_error(error))),
            Poll::Pending => return Poll::Pending,
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.meter.feed(&buf.filled()[before..]);
                Poll::Ready(this.account().map_err(io_error))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                if this.deadline_passed(cx) {
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
    use std::time::Duration;

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

    #[tokio::test]
    async fn an_unfinished_message_waits_for_in_flight_room_beside_the_requests() {
        use crate::budget::Budgets;
        use crate::limits::MAX_INFLIGHT_BYTES_PER_CONNECTION;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const MIB: usize = 1 << 20;
        let budget = ConnectionBudget::new(Arc::new(Budgets::new(0, 0)));
        // Requests hold all but 1 MiB of the connection's in-flight bytes.
        let requests = budget
            .reserve(MAX_INFLIGHT_BYTES_PER_CONNECTION - MIB, 0)
            .await
            .unwrap();
        let (mut client, server) = tokio::io::duplex(8 * MIB);
        let mut metered = MeteredStream::new(server, budget.clone(), None, &[]);
        let head = header(true, 2, (4 * MIB + 1) as u64);
        client.write_all(&head).await.unwrap();
        client.write_all(&vec![0; 4 * MIB]).await.unwrap();
        let mut buffer = vec![0; 64 * 1024];
        let mut read = 0;
        while let Ok(n) =
            tokio::time::timeout(Duration::from_millis(200), metered.read(&mut buffer)).await
        {
            read += n.unwrap();
        }
        // What fits (1 MiB), rounded up to a charge step, plus the read that found it full.
        assert!(
            read <= MIB + MESSAGE_CHARGE_STEP_BYTES + buffer.len(),
            "{read} bytes read past the in-flight room"
        );
        drop(requests);
        let rest = head.len() + 4 * MIB - read;
        let mut tail = vec![0; rest];
        tokio::time::timeout(Duration::from_secs(5), metered.read_exact(&mut tail))
            .await
            .expect("the rest is read once the requests are answered")
            .unwrap();
    }

    #[test]
    fn a_control_frame_alone_is_between_messages_once_read() {
        let mut meter = FrameMeter::default();
        meter.feed(&header(true, 9, 0));
        assert!(meter.is_between_messages());
    }
}
