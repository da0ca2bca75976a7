//! One end of a relay stream: the Noise IK handshake in `handshake` frames, then a
//! [`ReliableStream`] sealed with the transport keys. Sans I/O like the stream itself.
//!
//! Handshake reliability: the harness resends message 1 (same bytes) with backoff until message
//! 2 arrives or [`HANDSHAKE_TIMEOUT`] passes; the environment answers a repeated message 1 with
//! the same message 2 until the harness proves it has the keys (a frame authenticated with
//! them arrives; the harness sends an ack at once for that). A repeated message 2 makes the
//! harness confirm again.
//! Messages queued before the handshake finishes wait, within [`MAX_SEND_QUEUE_BYTES`].

use std::collections::VecDeque;
use std::time::Instant;

use super::frame::{Body, Frame, Handshake};
use super::limits::{
    HANDSHAKE_TIMEOUT, INITIAL_RTO, MAX_MESSAGE_BYTES, MAX_RTO, MAX_SEND_QUEUE_BYTES,
};
use super::noise::{
    CIPHER_REFUSED, Cipher, CipherPolicy, Initiator, NoiseCipher, NoiseError, StaticKeypair,
    respond,
};
use super::reliability::{ReliableStream, StreamError, StreamEvent};

enum State {
    Handshaking {
        initiator: Option<Box<Initiator>>,
        message: Handshake,
        next_send: Instant,
        attempts: u32,
        deadline: Instant,
        queued: VecDeque<Vec<u8>>,
        queued_bytes: usize,
    },
    Established {
        stream: Box<ReliableStream<NoiseCipher>>,
        /// Responder only: message 1 and our message 2, until the initiator is confirmed.
        reply: Option<(Handshake, Handshake)>,
        resend_reply: bool,
    },
    Closed {
        reset: Option<String>,
    },
}

/// One end of a relay stream; see the module docs.
pub struct SecureStream {
    stream_id: String,
    state: State,
    events: VecDeque<StreamEvent>,
}

impl std::fmt::Debug for SecureStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Handshaking { .. } => "handshaking",
            State::Established { .. } => "established",
            State::Closed { .. } => "closed",
        };
        f.debug_struct("SecureStream")
            .field("stream_id", &self.stream_id)
            .field("state", &state)
            .finish()
    }
}

impl SecureStream {
    /// The harness side: start a handshake towards the environment's public key, in the
    /// default cipher ([`Cipher::ChaChaPoly`]).
    ///
    /// # Errors
    /// [`NoiseError`] for a bad public key or a random-source failure.
    pub fn initiate(
        environment_id: &str,
        stream_id: &str,
        environment_public: &[u8],
        now: Instant,
    ) -> Result<Self, NoiseError> {
        Self::initiate_with(
            environment_id,
            stream_id,
            environment_public,
            Cipher::ChaChaPoly,
            now,
        )
    }

    /// [`Self::initiate`] in `cipher`.
    ///
    /// # Errors
    /// [`NoiseError`] for a bad public key or a random-source failure.
    pub fn initiate_with(
        environment_id: &str,
        stream_id: &str,
        environment_public: &[u8],
        cipher: Cipher,
        now: Instant,
    ) -> Result<Self, NoiseError> {
        let (initiator, message) =
            Initiator::start(environment_id, stream_id, environment_public, cipher)?;
        let message = Handshake::new(message, cipher);
        Ok(Self {
            stream_id: stream_id.to_owned(),
            state: State::Handshaking {
                initiator: Some(Box::new(initiator)),
                message,
                next_send: now,
                attempts: 0,
                deadline: now + HANDSHAKE_TIMEOUT,
                queued: VecDeque::new(),
                queued_bytes: 0,
            },
            events: VecDeque::new(),
        })
    }

    /// The environment side: answer the first frame of a new stream, which must carry
    /// handshake message 1, in any cipher. Message 2 goes out on the next
    /// [`Self::poll_transmit`].
    ///
    /// # Errors
    /// [`NoiseError::Handshake`] when the frame is not a valid message 1 for this environment
    /// and stream; the caller resets the stream.
    pub fn accept(
        keypair: &StaticKeypair,
        environment_id: &str,
        frame: &Frame,
        now: Instant,
    ) -> Result<Self, NoiseError> {
        Self::accept_with(keypair, environment_id, frame, CipherPolicy::Any, now)
    }

    /// [`Self::accept`] for the ciphers `policy` accepts.
    ///
    /// # Errors
    /// As [`Self::accept`]; [`NoiseError::CipherRefused`] for a cipher the policy does not
    /// accept or does not know (its message starts with [`CIPHER_REFUSED`]).
    pub fn accept_with(
        keypair: &StaticKeypair,
        environment_id: &str,
        frame: &Frame,
        policy: CipherPolicy,
        now: Instant,
    ) -> Result<Self, NoiseError> {
        let Body::Handshake(message) = &frame.body else {
            return Err(NoiseError::Handshake(
                "the first frame of a stream must be a handshake".into(),
            ));
        };
        let accepted = || {
            policy
                .accepted()
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let cipher = match Cipher::from_wire(message.cipher) {
            Some(cipher) if policy.accepts(cipher) => cipher,
            Some(cipher) => {
                return Err(NoiseError::CipherRefused(format!(
                    "{CIPHER_REFUSED}: {cipher} (accepted: {})",
                    accepted()
                )));
            }
            None => {
                return Err(NoiseError::CipherRefused(format!(
                    "{CIPHER_REFUSED}: unknown cipher {} (accepted: {})",
                    message.cipher,
                    accepted()
                )));
            }
        };
        let (keys, reply) = respond(
            keypair,
            environment_id,
            &frame.stream_id,
            &message.payload,
            cipher,
        )?;
        let reply = Handshake::new(reply, cipher);
        let cipher = keys;
        let stream = ReliableStream::new(frame.stream_id.clone(), cipher, now);
        let mut events = VecDeque::new();
        events.push_back(StreamEvent::Established);
        Ok(Self {
            stream_id: frame.stream_id.clone(),
            state: State::Established {
                stream: Box::new(stream),
                reply: Some((message.clone(), reply)),
                resend_reply: true,
            },
            events,
        })
    }

    /// Charge what the stream holds out of order or in reassembly to `budget`, shared with the
    /// endpoint's other streams (an established stream: the environment side sets it right
    /// after [`Self::accept`]).
    pub fn set_receive_budget(&mut self, budget: super::reliability::ReceiveBudget) {
        if let State::Established { stream, .. } = &mut self.state {
            stream.set_receive_budget(budget);
        }
    }

    /// The stream id.
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// True once the stream ended.
    pub fn is_closed(&self) -> bool {
        match &self.state {
            State::Closed { .. } => true,
            State::Established { stream, .. } => stream.is_closed(),
            State::Handshaking { .. } => false,
        }
    }

    /// True when established and every message queued so far was acknowledged.
    pub fn is_idle(&self) -> bool {
        match &self.state {
            State::Established { stream, .. } => stream.is_idle(),
            State::Handshaking { queued, .. } => queued.is_empty(),
            State::Closed { .. } => true,
        }
    }

    /// Responder: true once the initiator showed it holds the transport keys (a frame of the
    /// stream authenticated). Initiator: true once established.
    pub fn is_confirmed(&self) -> bool {
        matches!(&self.state, State::Established { reply: None, .. })
    }

    /// The reliable stream, once established (for stats).
    pub fn reliable(&self) -> Option<&ReliableStream<NoiseCipher>> {
        match &self.state {
            State::Established { stream, .. } => Some(stream),
            _ => None,
        }
    }

    /// Whether [`Self::send_message`] would accept a message now.
    pub fn can_accept_message(&self) -> bool {
        match &self.state {
            State::Handshaking { queued_bytes, .. } => *queued_bytes < MAX_SEND_QUEUE_BYTES,
            State::Established { stream, .. } => stream.can_accept_message(),
            State::Closed { .. } => false,
        }
    }

    /// Queue one application message (held until the handshake finishes).
    ///
    /// # Errors
    /// [`StreamError`] as for [`ReliableStream::send_message`].
    pub fn send_message(&mut self, message: Vec<u8>) -> Result<(), StreamError> {
        match &mut self.state {
            State::Handshaking {
                queued,
                queued_bytes,
                ..
            } => {
                if message.len() > MAX_MESSAGE_BYTES {
                    return Err(StreamError::MessageTooLarge { len: message.len() });
                }
                if *queued_bytes >= MAX_SEND_QUEUE_BYTES {
                    return Err(StreamError::QueueFull);
                }
                *queued_bytes += message.len();
                queued.push_back(message);
                Ok(())
            }
            State::Established { stream, .. } => stream.send_message(message),
            State::Closed { .. } => Err(StreamError::Closed("stream is closed".into())),
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<StreamEvent> {
        if let Some(event) = self.events.pop_front() {
            return Some(event);
        }
        match &mut self.state {
            State::Established { stream, .. } => stream.poll_event(),
            _ => None,
        }
    }

    /// Send an ack-only frame on the next poll, once established.
    pub fn request_ack(&mut self) {
        if let State::Established { stream, .. } = &mut self.state {
            stream.request_ack();
        }
    }

    /// Reset from this side.
    pub fn reset(&mut self, reason: impl Into<String>) {
        let reason = reason.into();
        match &mut self.state {
            State::Established { stream, .. } => stream.reset(reason),
            State::Handshaking { .. } => self.close(reason, false),
            State::Closed { .. } => {}
        }
    }

    fn close(&mut self, reason: String, by_peer: bool) {
        self.state = State::Closed {
            reset: (!by_peer).then(|| reason.clone()),
        };
        self.events
            .push_back(StreamEvent::Closed { reason, by_peer });
    }

    /// The socket reconnected: resend what is outstanding now.
    pub fn on_reconnect(&mut self, now: Instant) {
        match &mut self.state {
            State::Handshaking { next_send, .. } => *next_send = now,
            State::Established {
                stream,
                reply,
                resend_reply,
            } => {
                if reply.is_some() {
                    *resend_reply = true;
                }
                stream.on_reconnect(now);
            }
            State::Closed { .. } => {}
        }
    }

    /// Apply one frame from the peer (its stream id is this stream's).
    pub fn handle_frame(&mut self, frame: Frame, now: Instant) {
        match &mut self.state {
            State::Closed { .. } => {}
            State::Handshaking {
                initiator, queued, ..
            } => match frame.body {
                Body::Handshake(message) => {
                    let Some(pending) = initiator.take() else {
                        return;
                    };
                    match pending.finish(&message.payload) {
                        Ok(cipher) => {
                            let mut stream =
                                ReliableStream::new(self.stream_id.clone(), cipher, now);
                            for message in queued.drain(..) {
                                // Within limits: checked when queued.
                                let _ = stream.send_message(message);
                            }
                            // Key confirmation: the responder counts this stream as a pending
                            // handshake until an authenticated frame arrives.
                            stream.request_ack();
                            self.state = State::Established {
                                stream: Box::new(stream),
                                reply: None,
                                resend_reply: false,
                            };
                            self.events.push_back(StreamEvent::Established);
                        }
                        Err(error) => self.close(error.to_string(), false),
                    }
                }
                Body::Reset { reason } => self.close(reason, true),
                // Data cannot precede message 2; anything else waits for it.
                _ => {}
            },
            State::Established {
                stream,
                reply,
                resend_reply,
            } => {
                if let Body::Handshake(message) = &frame.body {
                    match reply {
                        // Responder: message 1 again, so message 2 was lost.
                        Some((first, _)) if first == message => *resend_reply = true,
                        Some(_) => {}
                        // Initiator: message 2 again, so our confirmation was lost.
                        None => stream.request_ack(),
                    }
                    return;
                }
                stream.handle_frame(frame, now);
                if stream.peer_authenticated() {
                    *reply = None;
                    *resend_reply = false;
                }
            }
        }
    }

    /// The next frame to send, if any.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Frame> {
        match &mut self.state {
            State::Closed { reset } => reset
                .take()
                .map(|reason| Frame::new(self.stream_id.clone(), Body::Reset { reason })),
            State::Handshaking {
                message,
                next_send,
                attempts,
                ..
            } => {
                if now < *next_send {
                    return None;
                }
                *attempts += 1;
                let backoff = INITIAL_RTO.saturating_mul(1 << (*attempts).min(8));
                *next_send = now + backoff.min(MAX_RTO);
                Some(Frame::new(
                    self.stream_id.clone(),
                    Body::Handshake(message.clone()),
                ))
            }
            State::Established {
                stream,
                reply,
                resend_reply,
            } => {
                if *resend_reply {
                    *resend_reply = false;
                    if let Some((_, second)) = reply {
                        return Some(Frame::new(
                            self.stream_id.clone(),
                            Body::Handshake(second.clone()),
                        ));
                    }
                }
                stream.poll_transmit(now)
            }
        }
    }

    /// When [`Self::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed { .. } => None,
            State::Handshaking {
                next_send,
                deadline,
                ..
            } => Some((*next_send).min(*deadline)),
            State::Established { stream, .. } => stream.poll_timeout(),
        }
    }

    /// Handshake deadline and liveness.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &mut self.state {
            State::Handshaking { deadline, .. } if now >= *deadline => self.close(
                format!("handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
                false,
            ),
            State::Established { stream, .. } => stream.handle_timeout(now),
            _ => {}
        }
    }
}
