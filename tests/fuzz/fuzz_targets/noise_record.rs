//! Noise per relay stream with garbage input: handshake message 1 as the environment reads it
//! ([`noise::respond`], [`SecureStream::accept`]), message 2 as the harness reads it
//! ([`Initiator::finish`]), transport records ([`NoiseCipher::open`] with seq as nonce), and
//! whole [`SecureStream`]s (handshaking and established) fed frames decoded from the input.
//!
//! Invariants:
//! - no panic on any bytes;
//! - garbage never authenticates: no forged handshake is accepted, no forged record opens, and
//!   an established stream fed only garbage frames never delivers a message;
//! - a record sealed at one seq opens at that seq only, to the same bytes, and is exactly
//!   `NOISE_TAG_BYTES` longer than its plaintext;
//! - every handshake message fits `MAX_HANDSHAKE_BYTES` and every frame a stream emits
//!   decodes (`MAX_RELAY_FRAME_BYTES`).
#![no_main]

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use proto::relay::limits::{MAX_HANDSHAKE_BYTES, MAX_RELAY_FRAME_BYTES, NOISE_TAG_BYTES};
use proto::relay::noise::{self, Initiator, NoiseCipher, StaticKeypair};
use proto::relay::{Body, Cipher, Frame, SecureStream, SegmentCipher, StreamEvent};

const ENVIRONMENT: &str = "env-fuzz";
const STREAM: &str = "stream-1";

fn keys() -> &'static StaticKeypair {
    static KEYS: OnceLock<StaticKeypair> = OnceLock::new();
    KEYS.get_or_init(|| StaticKeypair::generate().expect("keypair"))
}

/// One established pair of transport keys per cipher, made once (a handshake per input is
/// slow).
fn ciphers(cipher: Cipher) -> &'static Mutex<(NoiseCipher, NoiseCipher)> {
    static PAIRS: [OnceLock<Mutex<(NoiseCipher, NoiseCipher)>>; 2] =
        [OnceLock::new(), OnceLock::new()];
    let at = Cipher::ALL.iter().position(|c| *c == cipher).unwrap_or(0);
    PAIRS[at].get_or_init(|| {
        let (initiator, m1) =
            Initiator::start(ENVIRONMENT, STREAM, keys().public(), cipher).expect("message 1");
        let (responder, m2) =
            noise::respond(keys(), ENVIRONMENT, STREAM, &m1, cipher).expect("message 2");
        let harness = initiator.finish(&m2).expect("transport keys");
        Mutex::new((harness, responder))
    })
}

/// The cipher an input exercises (both are negotiable).
fn cipher(u: &mut Unstructured) -> arbitrary::Result<Cipher> {
    Ok(Cipher::ALL[usize::from(u.arbitrary::<bool>()?)])
}

/// Frames decoded from length-prefixed chunks of the input (invalid ones are skipped).
fn frames(u: &mut Unstructured) -> arbitrary::Result<Vec<Frame>> {
    let mut frames = Vec::new();
    while !u.is_empty() && frames.len() < 32 {
        let len = usize::from(u.arbitrary::<u16>()? % 2048);
        let bytes = u.bytes(len.min(u.len()))?;
        if let Ok(mut frame) = Frame::decode(bytes) {
            frame.stream_id = STREAM.to_owned();
            frames.push(frame);
        }
    }
    Ok(frames)
}

fn check_emitted(stream: &mut SecureStream, now: Instant) {
    let mut emitted = 0;
    while let Some(frame) = stream.poll_transmit(now) {
        emitted += 1;
        assert!(emitted < 2048, "poll_transmit did not settle");
        if let Body::Handshake(message) = &frame.body {
            assert!(message.payload.len() <= MAX_HANDSHAKE_BYTES);
        }
        let encoded = frame.encode();
        assert!(encoded.len() <= MAX_RELAY_FRAME_BYTES);
        assert_eq!(Frame::decode(&encoded), Ok(frame));
    }
}

fn no_forged_messages(stream: &mut SecureStream) {
    while let Some(event) = stream.poll_event() {
        assert!(
            !matches!(event, StreamEvent::Message(_)),
            "garbage frames produced a message"
        );
    }
}

fn run(u: &mut Unstructured) -> arbitrary::Result<()> {
    let now = Instant::now();
    // Handshakes cost several X25519 operations; records are cheap, so they get more runs.
    let case = match u.arbitrary::<u8>()? % 20 {
        0..=1 => 0,
        2..=3 => 1,
        4..=10 => 2,
        11..=13 => 3,
        14..=16 => 4,
        _ => 5,
    };
    match case {
        // Message 1 as the environment reads it.
        0 => {
            let cipher = cipher(u)?;
            let message = u.bytes(u.len())?;
            assert!(noise::respond(keys(), ENVIRONMENT, STREAM, message, cipher).is_err());
        }
        // Message 2 as the harness reads it.
        1 => {
            let cipher = cipher(u)?;
            let message = u.bytes(u.len())?;
            let (initiator, m1) =
                Initiator::start(ENVIRONMENT, STREAM, keys().public(), cipher).expect("message 1");
            assert!(m1.len() <= MAX_HANDSHAKE_BYTES);
            assert!(initiator.finish(message).is_err());
        }
        // A transport record: garbage never opens; a sealed one opens at its seq only.
        2 => {
            let seq: u64 = u.arbitrary()?;
            let other: u64 = u.arbitrary()?;
            let cipher = cipher(u)?;
            let bytes = u.bytes(u.len())?;
            let mut pair = ciphers(cipher).lock().unwrap_or_else(|e| e.into_inner());
            let (harness, environment) = &mut *pair;
            assert!(
                environment.open(seq, bytes).is_err(),
                "garbage record opened"
            );
            assert!(harness.open(seq, bytes).is_err(), "garbage record opened");
            if let Ok(sealed) = harness.seal(seq, bytes) {
                assert_eq!(sealed.len(), bytes.len() + NOISE_TAG_BYTES);
                assert_eq!(environment.open(seq, &sealed).as_deref(), Ok(bytes));
                if other != seq {
                    assert!(environment.open(other, &sealed).is_err());
                }
                assert!(
                    harness.open(seq, &sealed).is_err(),
                    "a record opened in its own direction"
                );
            }
        }
        // The environment accepting a stream whose first frame is garbage.
        3 => {
            for frame in frames(u)? {
                assert!(SecureStream::accept(keys(), ENVIRONMENT, &frame, now).is_err());
            }
        }
        // A harness stream mid-handshake fed garbage frames and time.
        4 => {
            let mut stream = SecureStream::initiate(ENVIRONMENT, STREAM, keys().public(), now)
                .expect("initiate");
            let _ = stream.send_message(b"queued before the handshake".to_vec());
            let mut clock = now;
            for frame in frames(u)? {
                stream.handle_frame(frame, clock);
                clock += Duration::from_millis(700);
                stream.handle_timeout(clock);
                check_emitted(&mut stream, clock);
                no_forged_messages(&mut stream);
            }
            assert!(stream.poll_timeout().is_none() || !stream.is_closed());
        }
        // An established pair: the environment is fed garbage between genuine frames.
        _ => {
            let mut harness = SecureStream::initiate(ENVIRONMENT, STREAM, keys().public(), now)
                .expect("initiate");
            let first = harness
                .poll_transmit(now)
                .expect("message 1 goes out at once");
            let mut environment =
                SecureStream::accept(keys(), ENVIRONMENT, &first, now).expect("accept");
            let second = environment.poll_transmit(now).expect("message 2");
            harness.handle_frame(second, now);
            let _ = harness.send_message(b"genuine".to_vec());
            let mut delivered = 0;
            for frame in frames(u)? {
                environment.handle_frame(frame, now);
                no_forged_messages(&mut environment);
                check_emitted(&mut environment, now);
            }
            // The genuine message still arrives (unless garbage reset the stream).
            while let Some(frame) = harness.poll_transmit(now) {
                environment.handle_frame(frame, now);
            }
            while let Some(event) = environment.poll_event() {
                if let StreamEvent::Message(bytes) = event {
                    assert_eq!(bytes, b"genuine");
                    delivered += 1;
                }
            }
            assert!(delivered <= 1);
            assert!(delivered == 1 || environment.is_closed());
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
