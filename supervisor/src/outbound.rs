//! A connection's outbound queue, bounded by bytes as well as by count. A leaf below the
//! connection loop (`rpc::connection`, whose writer task drains it), the session (which holds the
//! attached connection's sender) and the producers of notifications (process pumps, response
//! body streams).
//!
//! Messages are serialized by the task that sends them (not by the writer), so their size is
//! known when they are queued: a sender waits until the queued text fits in
//! [`OUTBOUND_QUEUE_BYTES`]. A client that stops reading therefore stalls its producers (process
//! output waits, and the child blocks on its pipe) instead of growing server memory: at most
//! `OUTBOUND_QUEUE_BYTES` plus one message per connection.
//!
//! Answers to requests are the exception: their memory was reserved before the request ran
//! ([`crate::budget`]), so they carry that reservation instead of drawing on this budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proto::jsonrpc::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_tungstenite::tungstenite::Bytes;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::budget::MemoryCharge;
use crate::limits::{OUTBOUND_QUEUE_BYTES, OUTBOUND_QUEUE_MESSAGES};

/// Something for the writer task.
#[derive(Debug)]
pub enum Outbound {
    /// A JSON-RPC message (serialized when queued).
    Message(Message),
    /// A message already serialized (hot-path notifications).
    Text(String),
    /// A binary frame (`process/output` to a client that asked for binary output).
    Binary(Bytes),
    /// Close the transport with this code and reason, then stop.
    Close(CloseCode, String),
}

/// What the writer receives: serialized text (with its share of a byte budget) or a close.
#[derive(Debug)]
pub enum Queued {
    /// One serialized message; dropping what it holds returns its bytes to their budget.
    Text(String, Held),
    /// One binary frame, likewise.
    Binary(Bytes, Held),
    /// Close, then stop.
    Close(CloseCode, String),
}

/// The budget share a queued message holds until the writer has sent it.
#[derive(Debug)]
pub enum Held {
    /// A notification's share of [`OUTBOUND_QUEUE_BYTES`].
    Queue(
        #[expect(dead_code, reason = "held for its Drop, which returns the share")]
        OwnedSemaphorePermit,
    ),
    /// An answer's reservation ([`crate::budget`]), made before its request ran.
    Answer(
        #[expect(
            dead_code,
            reason = "held for its Drop, which releases the reservation"
        )]
        MemoryCharge,
    ),
}

/// The queue is gone (the connection ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection is closed")]
pub struct Closed;

/// The sending end of a connection's outbound queue.
#[derive(Debug, Clone)]
pub struct OutboundSender {
    queue: mpsc::Sender<Queued>,
    budget: Arc<Semaphore>,
    /// The connection's client asked for `process/output` as binary frames and was granted it.
    binary_output: Arc<AtomicBool>,
}

/// A new queue.
pub fn outbound_queue() -> (OutboundSender, mpsc::Receiver<Queued>) {
    let (queue, receiver) = mpsc::channel(OUTBOUND_QUEUE_MESSAGES);
    (
        OutboundSender {
            queue,
            budget: Arc::new(Semaphore::new(OUTBOUND_QUEUE_BYTES)),
            binary_output: Arc::new(AtomicBool::new(false)),
        },
        receiver,
    )
}

/// An item ready for the queue except for its budget share.
enum Prepared {
    /// Serialized text (empty when serialization failed; nothing is sent then).
    Text(String),
    /// A binary frame.
    Binary(Bytes),
    /// A close.
    Close(CloseCode, String),
}

fn prepare(item: Outbound) -> Prepared {
    match item {
        Outbound::Message(message) => {
            Prepared::Text(serde_json::to_string(&message).unwrap_or_else(|error| {
                tracing::error!(%error, "cannot serialize an outgoing message");
                String::new()
            }))
        }
        Outbound::Text(text) => Prepared::Text(text),
        Outbound::Binary(bytes) => Prepared::Binary(bytes),
        Outbound::Close(code, reason) => Prepared::Close(code, reason),
    }
}

/// The budget share of a message of `length` bytes: its length, at most the whole budget (a
/// message larger than the budget waits for the queue to drain completely).
fn cost(length: usize) -> u32 {
    length.clamp(1, OUTBOUND_QUEUE_BYTES) as u32
}

impl OutboundSender {
    /// Queue an item, waiting for room (bytes and count).
    ///
    /// # Errors
    /// [`Closed`] when the connection has ended.
    pub async fn send(&self, item: Outbound) -> Result<(), Closed> {
        let queued = match prepare(item) {
            Prepared::Close(code, reason) => Queued::Close(code, reason),
            Prepared::Text(text) if text.is_empty() => return Ok(()),
            Prepared::Text(text) => {
                let permit = self.queue_share(text.len()).await?;
                Queued::Text(text, Held::Queue(permit))
            }
            Prepared::Binary(bytes) => {
                let permit = self.queue_share(bytes.len()).await?;
                Queued::Binary(bytes, Held::Queue(permit))
            }
        };
        self.queue.send(queued).await.map_err(|_| Closed)
    }

    /// Wait for a message of `length` bytes' share of [`OUTBOUND_QUEUE_BYTES`].
    async fn queue_share(&self, length: usize) -> Result<OwnedSemaphorePermit, Closed> {
        self.budget
            .clone()
            .acquire_many_owned(cost(length))
            .await
            .map_err(|_| Closed)
    }

    /// Send `process/output` to this connection as binary frames (or as JSON) from now on.
    pub fn set_binary_output(&self, binary: bool) {
        self.binary_output.store(binary, Ordering::Relaxed);
    }

    /// Whether `process/output` goes to this connection as binary frames.
    pub fn binary_output(&self) -> bool {
        self.binary_output.load(Ordering::Relaxed)
    }

    /// Queue an answer already serialized, with the memory reserved for it (it does not draw on
    /// the notifications' [`OUTBOUND_QUEUE_BYTES`]); waits only for room in the message count.
    ///
    /// # Errors
    /// [`Closed`] when the connection has ended.
    pub async fn send_reserved(&self, text: String, charge: MemoryCharge) -> Result<(), Closed> {
        self.queue
            .send(Queued::Text(text, Held::Answer(charge)))
            .await
            .map_err(|_| Closed)
    }

    /// Queue an item only if there is room now.
    ///
    /// # Errors
    /// [`Closed`] when the connection has ended or the queue is full.
    pub fn try_send(&self, item: Outbound) -> Result<(), Closed> {
        let share = |length| {
            self.budget
                .clone()
                .try_acquire_many_owned(cost(length))
                .map_err(|_| Closed)
        };
        let queued = match prepare(item) {
            Prepared::Close(code, reason) => Queued::Close(code, reason),
            Prepared::Text(text) if text.is_empty() => return Ok(()),
            Prepared::Text(text) => {
                let permit = share(text.len())?;
                Queued::Text(text, Held::Queue(permit))
            }
            Prepared::Binary(bytes) => {
                let permit = share(bytes.len())?;
                Queued::Binary(bytes, Held::Queue(permit))
            }
        };
        self.queue.try_send(queued).map_err(|_| Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn senders_wait_when_the_byte_budget_is_used_up() {
        let (sender, mut receiver) = outbound_queue();
        let big = "x".repeat(OUTBOUND_QUEUE_BYTES / 2 + 1);
        sender.send(Outbound::Text(big.clone())).await.unwrap();
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            sender.send(Outbound::Text(big.clone())),
        )
        .await;
        assert!(blocked.is_err(), "a second half-budget message must wait");
        let first = receiver.recv().await.unwrap();
        drop(first);
        sender.send(Outbound::Text(big)).await.unwrap();
    }

    #[tokio::test]
    async fn a_message_larger_than_the_budget_still_goes_through_alone() {
        let (sender, mut receiver) = outbound_queue();
        sender
            .send(Outbound::Text("y".repeat(OUTBOUND_QUEUE_BYTES * 2)))
            .await
            .unwrap();
        assert!(
            matches!(receiver.recv().await, Some(Queued::Text(text, _)) if text.len() == OUTBOUND_QUEUE_BYTES * 2)
        );
    }
}
