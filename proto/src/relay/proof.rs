//! Proof of key possession for an executor socket, sans I/O.
//!
//! The rendezvous binds an environment id to its executor's static Noise key, and routes harness
//! frames to an executor socket only once that socket proved it holds the private half: the
//! rendezvous runs a Noise IK handshake *as the initiator* towards the bound public key on a
//! reserved stream ([`PROOF_STREAM_PREFIX`]), and the socket must answer with message 2. Message
//! 2 carries a tag under keys that mix `es` (the rendezvous's fresh ephemeral with the executor's
//! static key), so only the holder of the private key can write it, and the fresh ephemeral
//! makes every challenge new: an answer recorded earlier, or given on another socket, does not
//! verify. The prologue binds the environment id and the challenge's stream id, which names the
//! socket.
//!
//! Then the rendezvous tells the executor it was accepted ([`accepted_frame`], an ack-only frame
//! on the proof stream), and the executor starts serving (resumes its streams). The link may
//! lose frames: the rendezvous sends the challenge again until answered (the executor answers
//! every copy; the first answer that arrives is checked), and a relay frame reaching the
//! executor also means it was accepted.
//!
//! Rules the two ends keep:
//! - The rendezvous never routes a frame whose stream id starts with [`PROOF_STREAM_PREFIX`]
//!   from a harness, so a harness cannot relay another socket's challenge to the real executor.
//! - The executor answers a challenge only on a socket it just opened, before it serves any
//!   stream ([`answer`]); a proof stream id is never a relay stream.

use super::frame::{Body, Frame};
use super::noise::{Cipher, Initiator, NoiseError, StaticKeypair, respond};

/// Stream ids starting with this are the rendezvous's key-possession challenges, never relay
/// streams.
pub const PROOF_STREAM_PREFIX: &str = "rendezvous-proof:";

/// Whether `stream_id` names a proof challenge (and so never a relay stream).
pub fn is_proof_stream(stream_id: &str) -> bool {
    stream_id.starts_with(PROOF_STREAM_PREFIX)
}

/// Why a proof failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The answer is not message 2 of this challenge under the bound key.
    #[error("the executor socket did not prove it holds the environment's key: {0}")]
    NotProven(NoiseError),
    /// The frame is not an answer to this challenge.
    #[error("expected a handshake answer on stream {expected:?}")]
    WrongFrame {
        /// The challenge's stream id.
        expected: String,
    },
}

/// A challenge the rendezvous sent on one executor socket.
#[derive(Debug)]
pub struct Challenge {
    stream_id: String,
    initiator: Initiator,
}

impl Challenge {
    /// A fresh challenge for the socket named `socket` (unique per rendezvous process) of
    /// `environment_id`, towards its bound `public_key`; returns it and the frame to send.
    ///
    /// # Errors
    /// [`NoiseError`] for a key of the wrong length or a random-source failure.
    pub fn new(
        environment_id: &str,
        socket: u64,
        public_key: &[u8],
    ) -> Result<(Self, Frame), NoiseError> {
        let stream_id = format!("{PROOF_STREAM_PREFIX}{socket}");
        // The proof carries no data: the default cipher, whatever the streams use.
        let (initiator, message) =
            Initiator::start(environment_id, &stream_id, public_key, Cipher::ChaChaPoly)?;
        let frame = Frame::new(stream_id.clone(), Body::Handshake(message.into()));
        Ok((
            Self {
                stream_id,
                initiator,
            },
            frame,
        ))
    }

    /// The challenge's stream id.
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// Check the socket's answer.
    ///
    /// # Errors
    /// [`ProofError::WrongFrame`] for a frame of another stream or kind, [`ProofError::NotProven`]
    /// when message 2 does not authenticate under the bound key.
    pub fn verify(self, frame: &Frame) -> Result<(), ProofError> {
        let Body::Handshake(message) = &frame.body else {
            return Err(ProofError::WrongFrame {
                expected: self.stream_id,
            });
        };
        if frame.stream_id != self.stream_id {
            return Err(ProofError::WrongFrame {
                expected: self.stream_id,
            });
        }
        self.initiator
            .finish(&message.payload)
            .map(|_| ())
            .map_err(ProofError::NotProven)
    }
}

/// The frame telling an executor its proof was accepted.
pub fn accepted_frame(challenge_stream_id: &str) -> Frame {
    Frame::new(challenge_stream_id, Body::Ack)
}

/// The executor's side: answer a challenge frame with message 2 under its static key.
/// `None` when `frame` is not a challenge.
///
/// # Errors
/// [`NoiseError`] when message 1 does not authenticate (not for this key or environment).
pub fn answer(
    keypair: &StaticKeypair,
    environment_id: &str,
    frame: &Frame,
) -> Option<Result<Frame, NoiseError>> {
    if !is_proof_stream(&frame.stream_id) {
        return None;
    }
    let Body::Handshake(message) = &frame.body else {
        return None;
    };
    Some(
        respond(
            keypair,
            environment_id,
            &frame.stream_id,
            &message.payload,
            Cipher::ChaChaPoly,
        )
        .map(|(_, reply)| Frame::new(frame.stream_id.clone(), Body::Handshake(reply.into()))),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_the_key_holder_answers_a_challenge() {
        let holder = StaticKeypair::generate().unwrap();
        let (challenge, frame) = Challenge::new("laptop", 7, holder.public()).unwrap();
        assert!(is_proof_stream(challenge.stream_id()));
        let reply = answer(&holder, "laptop", &frame).unwrap().unwrap();
        challenge.verify(&reply).unwrap();

        // Someone else's key cannot even read message 1.
        let stranger = StaticKeypair::generate().unwrap();
        let (challenge, frame) = Challenge::new("laptop", 8, holder.public()).unwrap();
        assert!(answer(&stranger, "laptop", &frame).unwrap().is_err());
        // A made-up message 2 does not verify.
        let forged = Frame::new(challenge.stream_id(), Body::Handshake(vec![0u8; 48].into()));
        assert!(matches!(
            challenge.verify(&forged),
            Err(ProofError::NotProven(_))
        ));
    }

    #[test]
    fn an_answer_for_another_challenge_or_environment_does_not_verify() {
        let holder = StaticKeypair::generate().unwrap();
        // The answer to socket 1's challenge, replayed for socket 2's (same stream id forged).
        let (_, first) = Challenge::new("laptop", 1, holder.public()).unwrap();
        let old = answer(&holder, "laptop", &first).unwrap().unwrap();
        let (second, _) = Challenge::new("laptop", 1, holder.public()).unwrap();
        assert!(matches!(second.verify(&old), Err(ProofError::NotProven(_))));
        // A challenge for another environment is not answered as this one.
        let (_, other) = Challenge::new("ci-runner-1", 3, holder.public()).unwrap();
        assert!(answer(&holder, "laptop", &other).unwrap().is_err());
        // Not a challenge at all: no answer.
        let relay = Frame::new("stream-1", Body::Handshake(vec![1; 96].into()));
        assert!(answer(&holder, "laptop", &relay).is_none());
        // The right answer on the wrong stream id is refused.
        let (third, frame) = Challenge::new("laptop", 4, holder.public()).unwrap();
        let mut reply = answer(&holder, "laptop", &frame).unwrap().unwrap();
        reply.stream_id = format!("{PROOF_STREAM_PREFIX}5");
        assert!(matches!(
            third.verify(&reply),
            Err(ProofError::WrongFrame { .. })
        ));
    }
}
