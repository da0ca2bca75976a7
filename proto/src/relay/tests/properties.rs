//! Random and long mixed exchanges under faults.

use super::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any mix of loss, duplication and reordering delivers the same byte sequence, exactly
    /// once and in order, in both directions.
    #[test]
    fn any_interleaving_delivers_the_same_bytes(
        seed in any::<u64>(),
        drop_percent in 0u64..45,
        duplicate_percent in 0u64..40,
        jitter_ms in 0u64..80,
        sizes in proptest::collection::vec(prop_oneof![0usize..200, 1_000usize..70_000, 100_000usize..300_000], 1..25),
        back in proptest::collection::vec(0usize..5_000, 0..10),
    ) {
        let now = Instant::now();
        let (mut a, mut b) = pair(now);
        let sent = messages(&sizes);
        let replies = messages(&back);
        let faults = Faults { drop_percent, duplicate_percent, jitter_ms };
        let outcome = simulate(&mut a, &mut b, &sent, &replies, faults, seed, None);
        prop_assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        prop_assert!(outcome.b_received == sent);
        prop_assert!(outcome.a_received == replies);
        prop_assert!(outcome.frames_sent > 0);
    }

    /// Arbitrary frames (valid envelopes, hostile contents) never panic the receiver and never
    /// make it hold more than its limits.
    #[test]
    fn hostile_frames_never_exceed_the_receive_limits(
        frames in proptest::collection::vec((0u64..2_000, 0u32..4, 1u32..5, 0usize..70_000, any::<Option<u64>>(), any::<u32>()), 1..60),
    ) {
        let now = Instant::now();
        let (_, mut b) = pair(now);
        for (seq, index, count, len, ack, ack_bits) in frames {
            let index = index.min(count - 1).min(seq as u32);
            let mut frame = data(seq, index, count, &vec![0; len.min(MAX_SEGMENT_PLAINTEXT_BYTES)]);
            frame.ack = ack;
            frame.ack_bits = ack_bits;
            b.handle_frame(frame, now);
            prop_assert!(b.buffered_bytes() <= MAX_OUT_OF_ORDER_BYTES + MAX_MESSAGE_BYTES + MAX_UNDELIVERED_BYTES);
            while b.poll_transmit(now).is_some() {}
        }
        while b.poll_event().is_some() {}
    }
}

/// The mix of the end-to-end lossy test (many small messages, some of 4 MiB, both ways) under
/// heavier faults than it injects, in simulation.
#[test]
fn a_long_mixed_exchange_survives_heavy_faults() {
    let now = Instant::now();
    let sizes: Vec<usize> = (0..3000)
        .map(|i| {
            if i % 500 == 250 {
                4 * 1024 * 1024
            } else if i % 10 == 3 {
                1000 + (i * 37) % 100_000
            } else {
                60
            }
        })
        .collect();
    let sent = messages(&sizes);
    let replies = messages(&sizes);
    let faults = Faults {
        drop_percent: 36,
        duplicate_percent: 19,
        jitter_ms: 10,
    };
    for seed in 1..3 {
        let (mut a, mut b) = pair(now);
        let outcome = simulate(&mut a, &mut b, &sent, &replies, faults, seed, None);
        assert!(outcome.closed.is_empty(), "{:?}", outcome.closed);
        assert!(
            outcome.a_received == replies,
            "a got {}",
            outcome.a_received.len()
        );
        assert!(
            outcome.b_received == sent,
            "b got {}",
            outcome.b_received.len()
        );
    }
}
