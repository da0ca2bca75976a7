//! What travels on the cluster's subjects, and the queue every node publishes through.
//!
//! On an environment's executor subject (`execward.x.TOKEN`), one tag byte then:
//! - [`TAG_FRAME`]: harness socket id (u64 BE), party id (u64 BE), the relay frame as the
//!   harness sent it (at most [`MAX_PIECE_BYTES`](super::pieces::MAX_PIECE_BYTES)). The message's NATS reply subject is the
//!   harness socket's own subject, where frames for it go back.
//! - [`TAG_FRAME_PIECE`]: harness socket id, party id, a piece header and one piece of a longer
//!   frame (module `pieces`), with the same reply subject.
//! - [`TAG_SOCKET_CLOSED`]: harness socket id: forget the streams it owned.
//! - [`TAG_TAKEOVER`]: a node id (16 bytes): that node now holds the executor socket; any other
//!   holder closes its own.
//! - [`TAG_RELEASE`]: the binding was released or displaced: the holder closes the executor
//!   socket and resets the streams.
//!
//! On a harness socket's subject: [`HARNESS_WHOLE`] and a relay frame of at most
//! [`MAX_PIECE_BYTES`](super::pieces::MAX_PIECE_BYTES), or [`HARNESS_PIECE`], a piece header and one piece of a longer frame.
//!
//! Publishing never waits: frames go into one bounded queue per node ([`PUBLISH_QUEUE_FRAMES`]
//! entries holding at most [`PUBLISH_QUEUE_BYTES`]) drained by one task; a full queue drops the
//! frame (the endpoints retransmit), as a full socket queue does on a single node. The queue
//! has a lane per harness credential (its party), as an executor socket's queue has: frames from
//! a harness socket to its executor's node, and frames from an executor of this node to a
//! harness socket of another, go in the lane of that harness's credential, each held to its
//! share of the queue and served in turn with the others. A credential whose traffic outruns
//! NATS (a flood, or a stalled link) fills its own share, never the whole queue against every
//! other harness of the node. The node's own messages (takeovers, releases) have a lane of
//! their own, [`NODE_LANE`].

use tokio_tungstenite::tungstenite::Bytes;

use super::pieces::{FrameIds, Piece, cut};
use crate::rendezvous::queued::{FrameSender, Share, Weighed, fair_queue};

/// Frames waiting to be handed to NATS on one node; more are dropped.
pub const PUBLISH_QUEUE_FRAMES: usize = 16 * 1024;
/// Bytes of messages waiting to be handed to NATS on one node; a frame that would pass it is
/// dropped. Without it the queue could hold [`PUBLISH_QUEUE_FRAMES`] full frames, about 1 GiB,
/// while NATS is slow (a burst from an executor towards harness sockets of other nodes).
pub const PUBLISH_QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// The publish queue's lane for the node's own messages (a takeover, a release). Parties are
/// keyed hashes of credentials (`Cluster::party`), never chosen by a client.
pub const NODE_LANE: u64 = 0;

const TAG_FRAME: u8 = 1;
const TAG_SOCKET_CLOSED: u8 = 2;
const TAG_TAKEOVER: u8 = 3;
const TAG_RELEASE: u8 = 4;
const TAG_FRAME_PIECE: u8 = 5;

/// First byte of a whole frame on a harness socket's subject.
const HARNESS_WHOLE: u8 = 0;
/// First byte of a piece of a frame on a harness socket's subject.
const HARNESS_PIECE: u8 = 1;

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

/// A piece of a longer harness frame, on an executor subject.
#[derive(Debug, PartialEq, Eq)]
pub struct FramePiece {
    /// The harness socket.
    pub socket: u64,
    /// Its credential's party.
    pub party: u64,
    /// The piece.
    pub piece: Piece,
}

impl FramePiece {
    /// Parse a [`TAG_FRAME_PIECE`] message; `None` for any other or a malformed one.
    pub fn decode(bytes: &Bytes) -> Option<Self> {
        let rest = bytes.strip_prefix(&[TAG_FRAME_PIECE])?;
        Some(Self {
            socket: u64_at(rest, 0)?,
            party: u64_at(rest, 8)?,
            piece: Piece::decode(bytes, 17)?,
        })
    }
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
        match tag {
            TAG_FRAME => Some(Self::Frame {
                socket: u64_at(rest, 0)?,
                party: u64_at(rest, 8)?,
                frame: bytes.slice(17..),
            })
            .filter(|_| bytes.len() > 17),
            TAG_SOCKET_CLOSED if rest.len() == 8 => Some(Self::SocketClosed {
                socket: u64_at(rest, 0)?,
            }),
            TAG_TAKEOVER => Some(Self::Takeover {
                node: rest.try_into().ok()?,
            }),
            TAG_RELEASE if rest.is_empty() => Some(Self::Release),
            _ => None,
        }
    }
}

/// The big-endian u64 at `at` in `bytes`, if there is one.
fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The messages carrying a harness frame from `socket` (of credential `party`) to the
/// executor's node: one [`TAG_FRAME`], or [`TAG_FRAME_PIECE`]s.
fn frame_messages(socket: u64, party: u64, frame: &[u8], ids: &FrameIds) -> Vec<Bytes> {
    let head = |tag: u8| [&[tag][..], &socket.to_be_bytes(), &party.to_be_bytes()].concat();
    cut(frame, &head(TAG_FRAME), &head(TAG_FRAME_PIECE), ids)
}

/// A message on a harness socket's subject.
#[derive(Debug, PartialEq, Eq)]
pub enum ToHarness {
    /// A whole relay frame.
    Whole(Bytes),
    /// A piece of one.
    Piece(Piece),
}

impl ToHarness {
    /// Parse a message; `None` for anything malformed (dropped).
    pub fn decode(bytes: &Bytes) -> Option<Self> {
        match *bytes.first()? {
            HARNESS_WHOLE if bytes.len() > 1 => Some(Self::Whole(bytes.slice(1..))),
            HARNESS_PIECE => Piece::decode(bytes, 1).map(Self::Piece),
            _ => None,
        }
    }
}

struct Outgoing {
    subject: async_nats::Subject,
    reply: Option<async_nats::Subject>,
    /// Published in this order, one after the other (the pieces of one frame).
    payloads: Vec<Bytes>,
}

impl Weighed for Outgoing {
    /// What it holds, against [`PUBLISH_QUEUE_BYTES`].
    fn bytes(&self) -> usize {
        self.payloads.iter().map(Bytes::len).sum()
    }
}

/// A node's publishing queue (cheap to clone). Each entry is one control message or one whole
/// frame (all its pieces), so a full queue drops whole frames, never part of one.
#[derive(Clone)]
pub struct Publisher {
    queue: FrameSender<Outgoing>,
    ids: FrameIds,
}

impl Publisher {
    /// Start the task that hands queued messages to NATS.
    pub fn start(client: async_nats::Client) -> Self {
        let (queue, mut outgoing) = fair_queue::<Outgoing>(Share {
            bytes: PUBLISH_QUEUE_BYTES,
            frames: PUBLISH_QUEUE_FRAMES,
        });
        tokio::spawn(async move {
            while let Some(message) = outgoing.recv().await {
                for payload in message.payloads {
                    let sent = match &message.reply {
                        Some(reply) => {
                            client
                                .publish_with_reply(message.subject.clone(), reply.clone(), payload)
                                .await
                        }
                        None => client.publish(message.subject.clone(), payload).await,
                    };
                    if let Err(error) = sent {
                        tracing::debug!(%error, "NATS publish failed: frame dropped");
                        break;
                    }
                }
            }
        });
        Self {
            queue,
            ids: FrameIds::new(),
        }
    }

    /// Queue `message` in `lane` unless the queue or the lane's share of it is full (entries
    /// or bytes); `false` when dropped.
    fn try_queue(&self, lane: u64, message: Outgoing) -> bool {
        self.queue.try_send_from(lane, message).is_ok()
    }

    /// Queue control message `payload` for `subject` in `lane` ([`NODE_LANE`], or the party
    /// of the harness it concerns); `false` when the queue is full and it was dropped.
    pub fn try_publish(&self, lane: u64, subject: &async_nats::Subject, payload: Bytes) -> bool {
        self.try_queue(
            lane,
            Outgoing {
                subject: subject.clone(),
                reply: None,
                payloads: vec![payload],
            },
        )
    }

    /// Queue a relay frame for the harness socket whose subject is `subject`, of credential
    /// `party`; `false` when it was dropped.
    pub fn try_publish_to_harness(
        &self,
        subject: &async_nats::Subject,
        party: u64,
        frame: &[u8],
    ) -> bool {
        self.try_queue(
            party,
            Outgoing {
                subject: subject.clone(),
                reply: None,
                payloads: cut(frame, &[HARNESS_WHOLE], &[HARNESS_PIECE], &self.ids),
            },
        )
    }

    /// Queue a frame of harness socket `socket` for the executor's node at `executor`, with the
    /// socket's own subject to answer on; `false` when it was dropped.
    pub fn try_publish_to_executor(
        &self,
        executor: &async_nats::Subject,
        reply: &async_nats::Subject,
        socket: u64,
        party: u64,
        frame: &[u8],
    ) -> bool {
        self.try_queue(
            party,
            Outgoing {
                subject: executor.clone(),
                reply: Some(reply.clone()),
                payloads: frame_messages(socket, party, frame, &self.ids),
            },
        )
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
            &[TAG_FRAME_PIECE; 29],
            &[99],
        ] {
            assert_eq!(Control::decode(&Bytes::copy_from_slice(junk)), None);
            assert_eq!(FramePiece::decode(&Bytes::copy_from_slice(junk)), None);
        }
    }
}

#[cfg(test)]
mod queue_tests {
    use proto::relay::limits::MAX_RELAY_FRAME_BYTES;

    use super::*;

    fn message(bytes: usize) -> Outgoing {
        Outgoing {
            subject: async_nats::Subject::from("execward.h.0"),
            reply: None,
            payloads: vec![Bytes::from(vec![0u8; bytes])],
        }
    }

    #[test]
    fn the_publish_queue_holds_each_credential_to_its_share_of_bytes_and_frames() {
        let bound = Share {
            bytes: PUBLISH_QUEUE_BYTES,
            frames: PUBLISH_QUEUE_FRAMES,
        };
        let (queue, mut outgoing) = fair_queue::<Outgoing>(bound);
        let frame = 64 * 1024;
        let mut flooded = 0;
        while queue.try_send_from(7, message(frame)).is_ok() {
            flooded += 1;
        }
        assert_eq!(
            flooded * frame,
            PUBLISH_QUEUE_BYTES * 3 / 4,
            "alone, a credential holds three quarters of the bytes"
        );
        for _ in 0..100 {
            queue
                .try_send_from(8, message(1024))
                .expect("another credential finds room");
        }
        queue
            .try_send_from(NODE_LANE, message(16))
            .expect("the node's own messages find room");
        assert!(queue.try_send_from(7, message(frame)).is_err());
        // In turn: the flood's, the other's, the node's, the flood's, the other's, ...
        let sizes: Vec<usize> = (0..5)
            .map(|_| outgoing.try_recv().unwrap().bytes())
            .collect();
        assert_eq!(sizes, [frame, 1024, 16, frame, 1024]);

        let (queue, _outgoing) = fair_queue::<Outgoing>(bound);
        let mut small = 0;
        while queue.try_send_from(7, message(1)).is_ok() {
            small += 1;
        }
        assert_eq!(
            small,
            PUBLISH_QUEUE_FRAMES * 3 / 4,
            "small frames: three quarters of the slots"
        );
        queue
            .try_send_from(8, message(1))
            .expect("another credential still finds a slot");
        const { assert!(PUBLISH_QUEUE_BYTES < PUBLISH_QUEUE_FRAMES * MAX_RELAY_FRAME_BYTES / 8) };
    }
}

#[cfg(test)]
mod framing_tests {
    use super::super::pieces::{MAX_PIECE_BYTES, Reassembly};
    use super::*;

    #[test]
    fn frames_of_every_length_cross_both_subjects_whole() {
        let ids = FrameIds::new();
        for len in [
            1,
            MAX_PIECE_BYTES,
            MAX_PIECE_BYTES + 1,
            4 * MAX_PIECE_BYTES + 3,
        ] {
            let frame: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let mut to_harness = Reassembly::default();
            let mut delivered = Vec::new();
            for message in cut(&frame, &[HARNESS_WHOLE], &[HARNESS_PIECE], &ids) {
                match ToHarness::decode(&message).unwrap() {
                    ToHarness::Whole(whole) => delivered.push(whole),
                    ToHarness::Piece(piece) => delivered.extend(to_harness.push(&piece)),
                }
            }
            assert_eq!(delivered, [Bytes::from(frame.clone())], "{len}");

            let mut to_executor = Reassembly::default();
            let mut delivered = Vec::new();
            for message in frame_messages(9, 10, &frame, &ids) {
                if let Some(FramePiece {
                    socket: 9,
                    party: 10,
                    piece,
                }) = FramePiece::decode(&message)
                {
                    delivered.extend(to_executor.push(&piece));
                    continue;
                }
                match Control::decode(&message).unwrap() {
                    Control::Frame {
                        socket: 9,
                        party: 10,
                        frame,
                    } => delivered.push(frame),
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(delivered, [Bytes::from(frame)], "{len}");
        }
        assert_eq!(
            ToHarness::decode(&Bytes::from_static(&[HARNESS_WHOLE])),
            None
        );
        assert_eq!(ToHarness::decode(&Bytes::from_static(&[7, 1, 2])), None);
    }
}
