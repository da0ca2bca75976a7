use super::*;
use crate::tls::tests::client_hello;
use pretty_assertions::assert_eq;

fn host(name: &str) -> Host {
    Host::parse(name).unwrap()
}

/// Feeds `input` in pieces of `step` bytes as the relay does; returns the bytes sent
/// upstream and the refusal, if any.
fn relay(inspector: &mut Inspector, input: &[u8], step: usize) -> (Vec<u8>, Option<Refusal>) {
    let mut held = Vec::new();
    let mut sent = Vec::new();
    for piece in input.chunks(step.max(1)) {
        held.extend_from_slice(piece);
        loop {
            if held.is_empty() {
                break;
            }
            match inspector.feed(&held) {
                Step::Pass(n) => {
                    sent.extend(held.drain(..n));
                }
                Step::Replace { consumed, bytes } => {
                    held.drain(..consumed);
                    sent.extend(bytes);
                }
                Step::NeedMore => break,
                Step::Refuse(refusal) => return (sent, Some(refusal)),
            }
        }
    }
    (sent, None)
}

fn every_split(
    make: impl Fn() -> Inspector,
    input: &[u8],
) -> Vec<(usize, Vec<u8>, Option<Refusal>)> {
    [1, 2, 5, 13, input.len()]
        .into_iter()
        .map(|step| {
            let (sent, refusal) = relay(&mut make(), input, step);
            (step, sent, refusal)
        })
        .collect()
}

fn read_only_scope() -> RequestScope {
    sandbox::EgressRules::parse(&["a.test methods=read-only paths=/ok/".to_owned()], &[])
        .unwrap()
        .request_scope(&host("a.test"), 80)
}

/// Under `methods=read-only paths=/ok/`, a kept-alive tunnel passes the GET and is cut at
/// the pipelined POST (nothing of it passes), whatever the pieces; TLS is cut at its first
/// byte; a forward connection's later request is checked the same way.
#[test]
fn a_limited_scope_checks_every_request_of_a_connection_and_refuses_tls() {
    let get = b"GET /ok/a HTTP/1.1\r\nHost: a.test\r\n\r\n".to_vec();
    let mut input = get.clone();
    input.extend_from_slice(b"POST /ok/a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\n\r\nhi");
    let make =
        || Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked).limited_to(read_only_scope());
    for (step, sent, refusal) in every_split(make, &input) {
        assert_eq!(sent, get, "step {step}");
        let refusal = refusal.unwrap_or_else(|| panic!("step {step}: the POST passed"));
        assert!(refusal.reason.contains("POST /ok/a"), "{refusal:?}");
    }
    let mut other_path = get.clone();
    other_path.extend_from_slice(b"GET /ok/../admin HTTP/1.1\r\nHost: a.test\r\n\r\n");
    let (sent, refusal) = relay(&mut make(), &other_path, 7);
    assert_eq!(sent, get);
    assert!(refusal.is_some());
    let (sent, refusal) = relay(&mut make(), &client_hello(Some("a.test")), 64);
    assert!(sent.is_empty());
    assert!(refusal.unwrap().reason.contains("TLS would hide them"));
    // Without the scope, the same bytes pass (the control).
    let (sent, refusal) = relay(
        &mut Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked),
        &input,
        5,
    );
    assert_eq!((sent, refusal), (input.clone(), None));
    let mut forward =
        Inspector::forward(host("a.test"), 80, Body::None).limited_to(read_only_scope());
    let (sent, refusal) = relay(
        &mut forward,
        b"DELETE http://a.test/ok/a HTTP/1.1\r\n\r\n",
        9,
    );
    assert!(sent.is_empty());
    assert!(refusal.unwrap().reason.contains("DELETE /ok/a"));
}

#[test]
fn pipelined_and_kept_alive_requests_in_a_tunnel_each_have_their_host_checked() {
    let first = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n".to_vec();
    let second = b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_vec();
    let make = || Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked);
    for (step, sent, refusal) in every_split(make, &[first.clone(), second].concat()) {
        assert_eq!(sent, first, "step {step}");
        let refusal = refusal.expect("the second request is refused");
        assert!(refusal.reason.contains("evil.test"), "{refusal:?}");
    }
    // The control: the same host twice passes whole.
    let both = [first.clone(), first.clone()].concat();
    for (step, sent, refusal) in every_split(make, &both) {
        assert_eq!((sent, refusal), (both.clone(), None), "step {step}");
    }
}

#[test]
fn a_chunked_body_that_looks_like_a_request_is_not_taken_for_one() {
    let request = b"POST /u HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n\
                    23\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n0\r\n\r\n\
                    GET /next HTTP/1.1\r\nHost: a.test\r\n\r\n";
    let make = || Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked);
    for (step, sent, refusal) in every_split(make, request) {
        assert_eq!(
            (sent.as_slice(), refusal),
            (&request[..], None),
            "step {step}"
        );
    }
    let lengthy = b"POST /u HTTP/1.1\r\nHost: a.test\r\nContent-Length: 35\r\n\r\n\
                    GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n\
                    GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
    for (step, sent, refusal) in every_split(make, lengthy) {
        assert_eq!(sent.len(), lengthy.len() - 35, "step {step}");
        assert!(refusal.is_some(), "step {step}");
    }
}

#[test]
fn unframeable_requests_and_other_protocols_are_refused_in_a_checked_tunnel() {
    for bad in [
        &b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\n folded\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: evil.test\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET http://evil.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"CONNECT evil.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"EHLO a.test\r\n",
        b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
    ] {
        let mut inspector = Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked);
        let (_, refusal) = relay(&mut inspector, bad, bad.len());
        assert!(refusal.is_some(), "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn tls_only_tunnels_refuse_plaintext_and_any_tunnels_pass_it() {
    let mut inspector = Inspector::tunnel(host("a.test"), 443, TunnelMode::TlsOnly);
    assert!(matches!(
        inspector.feed(b"GET / HTTP/1.1\r\n"),
        Step::Refuse(_)
    ));
    let mut inspector = Inspector::tunnel(host("a.test"), 443, TunnelMode::TlsOnly);
    let hello = client_hello(Some("a.test"));
    assert_eq!(relay(&mut inspector, &hello, 7), (hello.clone(), None));
    let mut inspector = Inspector::tunnel(host("a.test"), 5432, TunnelMode::Any);
    assert_eq!(
        relay(&mut inspector, b"EHLO x\r\n\x16\x03", 3),
        (b"EHLO x\r\n\x16\x03".to_vec(), None)
    );
}

#[test]
fn a_starttls_client_hello_is_checked_wherever_it_starts_in_any_split() {
    let plain = b"\x00\x00\x00\x08\x04\xd2\x16\x2fEHLO x\r\nSTARTTLS\r\n\x16\x03".to_vec();
    let evil = [plain.clone(), client_hello(Some("evil.test"))].concat();
    let good = [
        plain.clone(),
        client_hello(Some("a.test")),
        b"after".to_vec(),
    ]
    .concat();
    let make = || Inspector::tunnel(host("a.test"), 5432, TunnelMode::Any);
    for (step, sent, refusal) in every_split(make, &evil) {
        assert!(refusal.is_some(), "step {step}");
        assert!(
            !sent.windows(9).any(|w| w == b"evil.test"),
            "step {step}: the name passed"
        );
    }
    for (step, sent, refusal) in every_split(make, &good) {
        assert_eq!((sent, refusal), (good.clone(), None), "step {step}");
    }
    // The ClientHello fragmented, its first record one byte long: followed all the same.
    let hello = client_hello(Some("evil.test"));
    let handshake = &hello[5..];
    let fragmented = [
        plain.clone(),
        super::super::tls::tests::record(0x16, &handshake[..1]),
        super::super::tls::tests::record(0x16, &handshake[1..]),
    ]
    .concat();
    for (step, sent, refusal) in every_split(make, &fragmented) {
        assert!(refusal.is_some(), "step {step}");
        assert!(!sent.windows(9).any(|w| w == b"evil.test"), "step {step}");
    }
}

/// A small deterministic generator (xorshift64*), so the property test needs no crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Makes one piece of a client's stream.
type Piece = dyn Fn(&mut Rng) -> Vec<u8>;

/// A stream of pieces a client might send, good and hostile mixed.
fn random_stream(rng: &mut Rng) -> Vec<u8> {
    let pieces: [&Piece; 9] = [
        &|_| b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n".to_vec(),
        &|_| b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n".to_vec(),
        &|rng| {
            let body = vec![b'x'; rng.below(40)];
            let mut out = format!(
                "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            out.extend(body);
            out
        },
        &|_| b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        &|rng| {
            format!(
                "{:x}\r\n{}\r\n",
                3,
                ["abc", "\x16\x03\x01", "GET"][rng.below(3)]
            )
            .into_bytes()
        },
        &|_| b"0\r\n\r\n".to_vec(),
        &|rng| client_hello(Some(["a.test", "evil.test"][rng.below(2)])),
        &|rng| {
            let mut junk = vec![0u8; rng.below(30)];
            for byte in &mut junk {
                *byte = [0x16, 0x03, 0x01, 0x00, b'\r', b'\n', b'A'][rng.below(7)];
            }
            junk
        },
        &|rng| super::tls::tests::record(23, &vec![0u8; rng.below(50)]),
    ];
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(6) {
        out.extend(pieces[rng.below(pieces.len())](rng));
    }
    out
}

#[test]
fn what_passes_is_a_verbatim_prefix_and_whether_it_is_refused_does_not_depend_on_the_split() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let input = random_stream(&mut rng);
        let mode = [TunnelMode::TlsOnly, TunnelMode::Checked, TunnelMode::Any][round % 3];
        let make = || Inspector::tunnel(host("a.test"), 80, mode);
        let (whole_sent, whole_refusal) = relay(&mut make(), &input, input.len());
        for step in [1, 2, 3, 7, 1 + rng.below(64)] {
            let (sent, refusal) = relay(&mut make(), &input, step);
            assert!(
                input.starts_with(&sent),
                "{mode:?} step {step}: passed bytes are not the input's prefix: {:?}",
                String::from_utf8_lossy(&input)
            );
            assert_eq!(
                refusal.is_some(),
                whole_refusal.is_some(),
                "{mode:?} step {step}: {:?} vs {:?} for {:?}",
                refusal,
                whole_refusal,
                String::from_utf8_lossy(&input)
            );
            // A split may let the first bytes of a ClientHello's headers pass before it is
            // recognised (they name nothing); never more than that.
            assert!(
                sent.len().abs_diff(whole_sent.len()) < super::tls::CLIENT_HELLO_PREFIX,
                "{mode:?} step {step}: {} vs {} bytes passed of {:?}",
                sent.len(),
                whole_sent.len(),
                String::from_utf8_lossy(&input)
            );
        }
    }
}

#[test]
fn later_requests_on_a_proxy_connection_name_the_same_destination() {
    let mut inspector = Inspector::forward(host("a.test"), 80, Body::Length(2));
    let input = b"hiGET http://a.test/2 HTTP/1.1\r\nHost: a.test\r\n\r\n\
                  GET http://evil.test/ HTTP/1.1\r\n\r\n";
    let (sent, refusal) = relay(&mut inspector, input, 5);
    assert_eq!(
        String::from_utf8(sent).unwrap(),
        "hiGET /2 HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"
    );
    assert!(refusal.unwrap().reason.contains("evil.test:80"));
}
