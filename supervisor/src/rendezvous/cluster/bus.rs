//! What travels on the cluster's subjects, and the queue every node publishes through.
//!
//! On an environment's executor subject (`execward.x.TOKEN`), one tag byte then:
//! - [`TAG_FRAME`]: harness socket id (u64 BE), party id (u64 BE), the relay frame as the
//!   harness sent it. The message's NATS reply subject is the harness socket's own subject,
//!   where frames for it go back.
//! - [`TAG_SOCKET_CLOSED`]: harness socket id: forget the streams it owned.
//! - [`TAG_TAKEOVER`]: a node id (16 bytes): that node now holds the executor socket; any other
//!   holder closes its own.
//! - [`TAG_RELEASE`]: the binding was released or displaced: the holder closes the executor
//!   socket and resets the streams.
//!
//! On a harness socket's subject: the relay frame, as is.
//!
//! Publishing never waits: frames go into one bounded queue per node ([`PUBLISH_QUEUE_FRAMES`])
//! drained by one task; a full queue drops the frame (the endpoints retransmit), as a full socket
//! queue does on a single node.

use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Bytes;

/// Frames waiting to be handed to NATS on one node; more are dropped.
pub const PUBLISH_QUEUE_FRAMES: usize = 16 * 1024;

const TAG_FRAME: u8 = 1;
const TAG_SOCKET_CLOSED: u8 = 2;
const TAG_TAKEOVER: u8 = 3;
const TAG_RELEASE: u8 = 4;

/// A message on an executor subject.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    /// A harness frame.
    Frame {
        /// The harness socket (unique in the cluster).
        socket: u64,
        /// Its credential's party (equal on every node).
        party: u64,
        /// The relay frame.
        frame: Bytes,
    },
    /// A harness socket closed.
    SocketClosed {
        /// The socket.
        socket: u64,
    },
    /// A node now holds the executor socket.
    Takeover {
        /// That node's id (random per node process).
        node: [u8; 16],
    },
    /// The binding was released or displaced.
    Release,
}

impl Control {
    /// The bytes of this message.
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::new();
        match self {
            Self::Frame {
                socket,
                party,
                frame,
            } => {
                out.reserve(17 + frame.len());
                out.push(TAG_FRAME);
                out.extend_from_slice(&socket.to_be_bytes());
                out.extend_from_slice(&party.to_be_bytes());
                out.extend_from_slice(frame);
            }
            Self::SocketClosed { socket } => {
                out.push(TAG_SOCKET_CLOSED);
                out.extend_from_slice(&socket.to_be_bytes());
            }
            Self::Takeover { node } => {
                out.push(TAG_TAKEOVER);
                out.extend_from_slice(node);
            }
            Self::Release => out.push(TAG_RELEASE),
        }
        Bytes::from(out)
    }

    /// Parse a message; `None` for anything malformed (dropped).
    pub fn decode(bytes: &Bytes) -> Option<Self> {
        let (&tag, rest) = bytes.split_first()?;
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(rest.get(at..at + 8)?.try_into().ok()?))
        };
        match tag {
            TAG_FRAME => Some(Self::Frame {
                socket: u64_at(0)?,
                party: u64_at(8)?,
                frame: bytes.slice(17..),
            })
            .filter(|_| bytes.len() > 17),
            TAG_SOCKET_CLOSED if rest.len() == 8 => Some(Self::SocketClosed { socket: u64_at(0)? }),
            TAG_TAKEOVER => Some(Self::Takeover {
                node: rest.try_into().ok()?,
            }),
            TAG_RELEASE if rest.is_empty() => Some(Self::Release),
            _ => None,
        }
    }
}

struct Outgoing {
    subject: async_nats::Subject,
    reply: Option<async_nats::Subject>,
    payload: Bytes,
}

/// A node's publishing queue (cheap to clone).
#[derive(Clone)]
pub struct Publisher(mpsc::Sender<Outgoing>);

impl Publisher {
    /// Start the task that hands queued messages to NATS.
    pub fn start(client: async_nats::Client) -> Self {
        let (queue, mut outgoing) = mpsc::channel::<Outgoing>(PUBLISH_QUEUE_FRAMES);
        tokio::spawn(async move {
            while let Some(message) = outgoing.recv().await {
                let sent = match message.reply {
                    Some(reply) => {
                        client
                            .publish_with_reply(message.subject, reply, message.payload)
                            .await
                    }
                    None => client.publish(message.subject, message.payload).await,
                };
                if let Err(error) = sent {
                    tracing::debug!(%error, "NATS publish failed: frame dropped");
                }
            }
        });
        Self(queue)
    }

    /// Queue `payload` for `subject` (with a reply subject); `false` when the queue is full and
    /// it was dropped.
    pub fn try_publish(
        &self,
        subject: &async_nats::Subject,
        reply: Option<&async_nats::Subject>,
        payload: Bytes,
    ) -> bool {
        self.0
            .try_send(Outgoing {
                subject: subject.clone(),
                reply: reply.cloned(),
                payload,
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_message_round_trips_and_junk_is_refused() {
        let messages = [
            Control::Frame {
                socket: u64::MAX - 3,
                party: 42,
                frame: Bytes::from_static(b"\x08\x01frame"),
            },
            Control::SocketClosed { socket: 9 },
            Control::Takeover { node: [5; 16] },
            Control::Release,
        ];
        for message in messages {
            assert_eq!(Control::decode(&message.encode()), Some(message));
        }
        for junk in [
            &b""[..],
            &[TAG_FRAME, 0, 0],
            &[TAG_FRAME; 17],
            &[TAG_SOCKET_CLOSED, 1],
            &[TAG_TAKEOVER, 1, 2],
            &[TAG_RELEASE, 0],
            &[99],
        ] {
            assert_eq!(Control::decode(&Bytes::copy_from_slice(junk)), None);
        }
    }
}
