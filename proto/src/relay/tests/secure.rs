//! The encrypted layer: handshakes, tampering, forged and replayed acks.

use pretty_assertions::assert_eq;

use super::*;

fn secure_pair(now: Instant) -> (SecureStream, SecureStream) {
    let keys = StaticKeypair::generate().unwrap();
    let mut harness = SecureStream::initiate("env", "s", keys.public(), now).unwrap();
    let first = harness.poll_transmit(now).unwrap();
    let environment = SecureStream::accept(&keys, "env", &first, now).unwrap();
    (harness, environment)
}

#[test]
fn encrypted_streams_survive_loss_including_handshake_messages() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let sent = messages(&[10, 200_000, 33, 0, 70_000]);
    let faults = Faults {
        drop_percent: 35,
        duplicate_percent: 15,
        jitter_ms: 20,
    };
    for seed in 1..6 {
        let (mut h, mut e) = secure_pair(now);
        let outcome = simulate(&mut h, &mut e, &sent, &sent, faults, seed, None);
        assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        assert!(outcome.b_received == sent && outcome.a_received == sent);
        assert!(h.is_confirmed() && e.is_confirmed());
    }
    let outcome = simulate(&mut harness, &mut environment, &sent, &[], CLEAN, 3, None);
    assert!(outcome.b_received == sent);
}

#[test]
fn encrypted_payloads_never_contain_the_plaintext() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let secret = br#"{"id":1,"method":"process/start","params":{"argv":["cat","/etc/secret"]}}"#;
    harness.send_message(secret.to_vec()).unwrap();
    // Message 2 establishes the harness.
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    let frame = harness.poll_transmit(now).unwrap();
    let Body::Data(data) = &frame.body else {
        panic!("expected data, got {frame:?}");
    };
    assert!(!data.payload.windows(14).any(|w| w == b"process/start\""));
    environment.handle_frame(frame, now);
    assert_eq!(environment.poll_event(), Some(StreamEvent::Established));
    assert_eq!(
        environment.poll_event(),
        Some(StreamEvent::Message(secret.to_vec()))
    );
}

#[test]
fn tampered_segments_are_dropped_then_the_stream_is_reset() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    harness.send_message(b"hello".to_vec()).unwrap();
    let frame = harness.poll_transmit(now).unwrap();
    for _ in 0..=MAX_AUTH_FAILURES {
        let mut forged = frame.clone();
        if let Body::Data(d) = &mut forged.body {
            d.payload[12] ^= 1;
        }
        environment.handle_frame(forged, now);
    }
    assert!(environment.is_closed());
}

/// Two established encrypted ends whose first data segment (harness -> environment) was
/// delivered, so the environment holds data to acknowledge.
fn established_pair(now: Instant) -> (SecureStream, SecureStream) {
    let (mut harness, mut environment) = secure_pair(now);
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    harness.send_message(b"hello".to_vec()).unwrap();
    while let Some(frame) = harness.poll_transmit(now) {
        environment.handle_frame(frame, now);
    }
    while environment.poll_event().is_some() {}
    while harness.poll_event().is_some() {}
    assert!(environment.is_confirmed());
    (harness, environment)
}

/// The environment's next frame, which acknowledges the harness's data.
fn ack_from(environment: &mut SecureStream, now: Instant) -> Frame {
    environment.request_ack();
    let frame = environment.poll_transmit(now).unwrap();
    assert_eq!(frame.ack, Some(0), "{frame:?}");
    assert!(!frame.ack_auth.is_empty());
    frame
}

fn closed_reason(stream: &mut SecureStream) -> Option<String> {
    while let Some(event) = stream.poll_event() {
        if let StreamEvent::Closed { reason, .. } = event {
            return Some(reason);
        }
    }
    None
}

#[test]
fn a_forged_or_altered_ack_resets_the_stream() {
    let now = Instant::now();
    type Forgery = fn(&mut Frame);
    let forgeries: [(&str, Forgery); 4] = [
        ("ack moved", |frame| frame.ack = Some(7)),
        ("ack_bits set", |frame| frame.ack_bits = 0b100),
        ("tag stripped", |frame| frame.ack_auth.clear()),
        ("tag corrupted", |frame| {
            let last = frame.ack_auth.len() - 1;
            frame.ack_auth[last] ^= 1;
        }),
    ];
    for (what, forge) in forgeries {
        let (mut harness, mut environment) = established_pair(now);
        let mut frame = ack_from(&mut environment, now);
        forge(&mut frame);
        // Across the wire, as a relay would send it.
        harness.handle_frame(Frame::decode(&frame.encode()).unwrap(), now);
        assert!(harness.is_closed(), "{what}: the forged ack was accepted");
        let reason = closed_reason(&mut harness).unwrap();
        assert!(reason.contains("forged"), "{what}: {reason}");
        assert!(
            matches!(
                harness.poll_transmit(now),
                Some(Frame {
                    body: Body::Reset { .. },
                    ..
                })
            ),
            "{what}: no reset sent"
        );
    }
    // Ack fields on a frame that never had them (an injected heartbeat) are forged too.
    let (mut harness, _environment) = established_pair(now);
    let mut injected = Frame::new("s", Body::Heartbeat);
    injected.ack = Some(0);
    harness.handle_frame(injected, now);
    assert!(harness.is_closed());
}

#[test]
fn a_replayed_ack_is_detected_and_ignored() {
    let now = Instant::now();
    let (mut harness, mut environment) = established_pair(now);
    // The harness sends a second segment; the environment's old ack (for seq 0) is replayed
    // after its newer ack (for seq 1): the replay must not count as hearing from the peer.
    let old = ack_from(&mut environment, now);
    harness.handle_frame(old.clone(), now);
    harness.send_message(b"second".to_vec()).unwrap();
    let data = harness.poll_transmit(now).unwrap();
    environment.handle_frame(data, now);
    // In-order data alone is acknowledged once ACK_DELAY passes.
    let newer = environment.poll_transmit(now + ACK_DELAY).unwrap();
    assert_eq!(newer.ack, Some(1));
    harness.handle_frame(newer, now);
    assert!(harness.is_idle());
    for _ in 0..3 {
        harness.handle_frame(old.clone(), now);
    }
    assert!(!harness.is_closed());
    let stats = harness.reliable().unwrap().stats();
    assert_eq!(stats.replayed_acks, 3);
    // A replay does not keep a silent peer alive: liveness still runs from the last fresh frame.
    harness.handle_frame(old, now + LIVENESS_TIMEOUT);
    harness.handle_timeout(now + LIVENESS_TIMEOUT);
    assert!(harness.is_closed());
}

#[test]
fn a_responder_is_confirmed_only_by_an_authenticated_frame() {
    let now = Instant::now();
    let (mut harness, mut environment) = secure_pair(now);
    // A frame injected by the relay does not confirm the stream (nor reset it: a reset from
    // outside the stream is always possible).
    environment.handle_frame(Frame::new("s", Body::Heartbeat), now);
    assert!(!environment.is_confirmed());
    let second = environment.poll_transmit(now).unwrap();
    harness.handle_frame(second, now);
    // The harness confirms at once, before it has anything to send.
    let confirmation = harness.poll_transmit(now).unwrap();
    assert_eq!(confirmation.body, Body::Ack);
    environment.handle_frame(confirmation, now);
    assert!(environment.is_confirmed());
}

#[test]
fn a_handshake_for_the_wrong_key_is_refused() {
    let now = Instant::now();
    let keys = StaticKeypair::generate().unwrap();
    let other = StaticKeypair::generate().unwrap();
    let mut harness = SecureStream::initiate("env", "s", other.public(), now).unwrap();
    let first = harness.poll_transmit(now).unwrap();
    assert!(SecureStream::accept(&keys, "env", &first, now).is_err());
    harness.handle_timeout(now + HANDSHAKE_TIMEOUT);
    assert!(harness.is_closed());
    assert!(matches!(
        harness.poll_transmit(now + HANDSHAKE_TIMEOUT),
        Some(Frame {
            body: Body::Reset { .. },
            ..
        })
    ));
}
