//! The egress proxy's [`Inspector`]: every byte a sandboxed client sends through a tunnel
//! (HTTP/1.x framing, TLS records and ClientHellos, the plaintext scan of `tunnel=any`), fed as
//! the proxy's relay feeds it.
//!
//! The first input byte picks the tunnel mode (TLS-only, checked, any) or a plain-HTTP proxy
//! connection after its first request (a Content-Length or chunked body next); the second
//! picks the size of the pieces the rest arrives in.
//!
//! Invariants (no panic, and):
//! - in a tunnel what passes is a verbatim prefix of the input (a proxy connection's heads are
//!   rewritten, so only "no panic" and the bounds hold there);
//! - whether the input is refused does not depend on the pieces it arrives in, and the bytes
//!   that pass differ by less than a ClientHello's recognisable prefix (header bytes that name
//!   nothing) between any two ways of cutting it;
//! - an incomplete message is never held past `MAX_HELD_BYTES` (the relay's own bound);
//! - `opaque` bytes never exceed what the input still holds of a body or record once fed.
#![no_main]

use egress::MAX_HELD_BYTES;
use egress::framing::Body;
use egress::inspect::{Inspector, Step};
use egress::tls::CLIENT_HELLO_PREFIX;
use libfuzzer_sys::fuzz_target;
use sandbox::policy::network::{Host, TunnelMode};

fn inspector(selector: u8) -> (Inspector, bool) {
    let host = Host::parse("a.test").expect("a valid name");
    match selector % 5 {
        0 => (Inspector::tunnel(host, 443, TunnelMode::TlsOnly), true),
        1 => (Inspector::tunnel(host, 80, TunnelMode::Checked), true),
        2 => (Inspector::tunnel(host, 5432, TunnelMode::Any), true),
        3 => (
            Inspector::forward(host, 80, Body::Length(u64::from(selector / 5))),
            false,
        ),
        _ => (Inspector::forward(host, 80, Body::Chunked), false),
    }
}

/// Feeds `input` in pieces of `step` bytes, splicing opaque bytes by count as the relay does.
/// Returns the bytes sent upstream and whether it was refused.
fn relay(mut inspector: Inspector, input: &[u8], step: usize) -> (Vec<u8>, bool) {
    let mut held: Vec<u8> = Vec::new();
    let mut sent = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let opaque = inspector.opaque();
        if held.is_empty() && opaque > 0 {
            let n = usize::try_from(opaque)
                .unwrap_or(usize::MAX)
                .min(step)
                .min(input.len() - at);
            sent.extend_from_slice(&input[at..at + n]);
            inspector.skipped(n as u64);
            at += n;
            continue;
        }
        let n = step.min(input.len() - at);
        held.extend_from_slice(&input[at..at + n]);
        at += n;
        while !held.is_empty() {
            match inspector.feed(&held) {
                Step::Pass(n) => {
                    assert!(n > 0 && n <= held.len(), "Pass({n}) of {}", held.len());
                    sent.extend(held.drain(..n));
                }
                Step::Replace { consumed, bytes } => {
                    assert!(consumed > 0 && consumed <= held.len());
                    held.drain(..consumed);
                    sent.extend(bytes);
                }
                Step::NeedMore => {
                    assert!(held.len() < MAX_HELD_BYTES, "{} bytes held", held.len());
                    break;
                }
                Step::Refuse(refusal) => {
                    assert!(!refusal.reason.is_empty() && !refusal.rule.is_empty());
                    return (sent, true);
                }
            }
        }
    }
    (sent, false)
}

fuzz_target!(|data: &[u8]| {
    let [selector, step, input @ ..] = data else {
        return;
    };
    let step = usize::from(*step % 64) + 1;
    let (whole, whole_refused) = relay(inspector(*selector).0, input, input.len().max(1));
    let (split, split_refused) = relay(inspector(*selector).0, input, step);
    let (single, single_refused) = relay(inspector(*selector).0, input, 1);
    assert_eq!(whole_refused, split_refused, "step {step}");
    assert_eq!(whole_refused, single_refused);
    if inspector(*selector).1 {
        for sent in [&whole, &split, &single] {
            assert!(input.starts_with(sent), "not a verbatim prefix");
        }
        for sent in [&split, &single] {
            assert!(sent.len().abs_diff(whole.len()) < CLIENT_HELLO_PREFIX);
        }
    }
});
