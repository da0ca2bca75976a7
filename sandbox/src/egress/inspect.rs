//! Every byte the client sends towards an allowed destination, checked as the destination will
//! read it, sans-I/O: the proxy's relay feeds the client's bytes in and is told which may pass,
//! which must be held until more arrive, and when to close the connection with a refusal.
//!
//! What is checked depends on the [`TunnelMode`] the policy gives the destination:
//! - `tls-only`: TLS from the first byte ([`tls`]); every plaintext ClientHello names the host;
//! - checked (the default off port 443): TLS as above, or HTTP/1.x in which every request head
//!   (the first, kept-alive and pipelined ones alike, found by following each body's framing,
//!   [`framing`]) has exactly one `Host` naming the host, an absolute-form target (if any)
//!   naming it too, no `CONNECT` and no `Upgrade` (what follows an upgrade cannot be framed);
//!   anything else is refused as an unknown protocol;
//! - `any`: any bytes; the plaintext is scanned for a TLS ClientHello wherever it starts (a
//!   STARTTLS switch in SMTP, IMAP, POP3, FTP, LDAP, XMPP or Postgres alike, recognised by its
//!   record and handshake headers, [`tls::client_hello_starts`]) and from there the TLS is
//!   followed as above; when the client leaves TLS, scanning resumes.
//!
//! A plain-HTTP proxy connection (absolute-form requests) is followed like a checked tunnel,
//! but each later request must be absolute-form naming the same destination, and its head is
//! rewritten as the first one was ([`http::parse`]).

use crate::policy::network::{Host, RequestScope, TunnelMode};

use super::framing::{self, Body, BodyReader};
use super::http::{self, Request};
use super::tls::{self, TlsStep, TlsStream};
use super::{MAX_HEADER_BYTES, MAX_HEADERS};

/// What to do with the bytes at the front of the client's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The first `n` bytes pass as they are.
    Pass(usize),
    /// The first `consumed` bytes are replaced by `bytes` (a rewritten request head).
    Replace {
        /// Bytes of the buffer consumed.
        consumed: usize,
        /// What goes upstream instead.
        bytes: Vec<u8>,
    },
    /// Hold everything: more bytes are needed to decide.
    NeedMore,
    /// Close the connection: what it carries is refused.
    Refuse(Refusal),
}

/// A refusal of what a connection carries, reported like every refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why, in plain words (names the host the bytes named).
    pub reason: String,
    /// What would allow it.
    pub rule: String,
}

impl Refusal {
    fn new(reason: impl Into<String>, rule: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            rule: rule.into(),
        }
    }
}

/// Which requests an HTTP stream carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Requests inside a tunnel: forwarded as they are.
    Tunnel,
    /// Absolute-form requests to the proxy: rewritten.
    Forward,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Nothing seen yet: the first bytes decide the protocol.
    Start,
    /// HTTP/1.x; the body of the last request (done: a head comes next).
    Http { form: Form, body: BodyReader },
    /// TLS, record by record.
    Tls(TlsStream),
    /// Plaintext of an unknown protocol, scanned for a ClientHello; `carry` holds the last
    /// bytes that passed (a ClientHello's first bytes may have passed before it was seen).
    Scan { carry: Vec<u8> },
}

/// Follows the client's bytes of one connection to `host:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspector {
    host: Host,
    port: u16,
    mode: TunnelMode,
    /// The requests the destination may be sent ([`Self::limited_to`]).
    scope: RequestScope,
    state: State,
}

impl Inspector {
    /// For a tunnel (CONNECT or SOCKS5) to `host:port` whose bytes `mode` allows.
    pub fn tunnel(host: Host, port: u16, mode: TunnelMode) -> Self {
        Self {
            host,
            port,
            mode,
            scope: RequestScope::Any,
            state: State::Start,
        }
    }

    /// Only requests `scope` permits pass (each request of the connection is checked; TLS,
    /// which hides them, is refused when the scope limits anything).
    #[must_use]
    pub fn limited_to(mut self, scope: RequestScope) -> Self {
        self.scope = scope;
        self
    }

    /// For a plain-HTTP proxy connection after its first request (whose head went upstream
    /// rewritten), with that request's `body` next.
    pub fn forward(host: Host, port: u16, body: Body) -> Self {
        Self {
            host,
            port,
            mode: TunnelMode::Checked,
            scope: RequestScope::Any,
            state: State::Http {
                form: Form::Forward,
                body: BodyReader::new(body),
            },
        }
    }

    /// Bytes that may now pass without being looked at (a body's or a record's rest); the
    /// relay may move them without reading them, then calls [`Self::skipped`].
    pub fn opaque(&self) -> u64 {
        match &self.state {
            State::Http { body, .. } => body.opaque(),
            State::Tls(tls) => tls.opaque(),
            State::Start | State::Scan { .. } => 0,
        }
    }

    /// `n` of the [`Self::opaque`] bytes passed.
    pub fn skipped(&mut self, n: u64) {
        match &mut self.state {
            State::Http { body, .. } => body.skipped(n),
            State::Tls(tls) => tls.skipped(n),
            State::Start | State::Scan { .. } => {}
        }
    }

    /// Decides about the bytes at the front of `buf` (non-empty).
    pub fn feed(&mut self, buf: &[u8]) -> Step {
        if buf.is_empty() {
            return Step::NeedMore;
        }
        let step = match &mut self.state {
            State::Start => return self.start(buf),
            State::Http { form, body } => {
                let form = *form;
                if body.is_done() {
                    self.head(form, buf)
                } else {
                    match body.advance(buf) {
                        Ok(0) => Step::NeedMore,
                        Ok(n) => Step::Pass(n),
                        Err(err) => Step::Refuse(Refusal::new(
                            format!(
                                "{err}: the request body cannot be framed, so the next request could not be checked"
                            ),
                            "none: send well-framed HTTP/1.1",
                        )),
                    }
                }
            }
            State::Tls(stream) => match stream.feed(buf) {
                Ok(TlsStep::Pass(n)) => Step::Pass(n),
                Ok(TlsStep::NeedMore) => Step::NeedMore,
                Ok(TlsStep::NotTls) if self.mode == TunnelMode::Any => {
                    self.state = State::Scan { carry: Vec::new() };
                    return self.feed(buf);
                }
                Ok(TlsStep::NotTls) => Step::Refuse(Refusal::new(
                    "the client left TLS in a tunnel that carries TLS and checked HTTP only",
                    self.any_rule(),
                )),
                Err(err) => Step::Refuse(self.tls_refusal(&err)),
            },
            State::Scan { .. } => self.scan(buf),
        };
        if let Step::Pass(0) = step {
            return Step::NeedMore;
        }
        step
    }

    fn scope_refusal_tls(&self) -> Refusal {
        Refusal::new(
            format!(
                "requests to {}:{} are limited ({}), and TLS would hide them from the proxy",
                self.host,
                self.port,
                self.scope.describe()
            ),
            format!(
                "--allow-domain '{} inspect=true' with its methods=/paths= (the proxy \
                 terminates TLS and checks each request), or send plain HTTP",
                crate::policy::network::suggested_rule(&self.host, self.port)
            ),
        )
    }

    /// The refusal of a request the scope does not permit.
    fn scope_refusal(&self, method: &str, target: &str) -> Refusal {
        Refusal::new(
            format!(
                "{method} {target} to {}:{} is outside what its pattern allows ({})",
                self.host,
                self.port,
                self.scope.describe()
            ),
            format!(
                "--allow-domain '{}' with that method and path (methods=, paths=)",
                crate::policy::network::suggested_rule(&self.host, self.port)
            ),
        )
    }

    fn any_rule(&self) -> String {
        format!(
            "--allow-domain '{} tunnel=any' (or tunnel = \"any\" on its pattern)",
            crate::policy::network::suggested_rule(&self.host, self.port)
        )
    }

    fn tls_refusal(&self, err: &tls::TlsError) -> Refusal {
        match err {
            tls::TlsError::Fronting { name, .. } => Refusal::new(
                err.to_string(),
                format!("open the tunnel to {name} itself (and allow it)"),
            ),
            tls::TlsError::Handshake(_) => Refusal::new(err.to_string(), "none"),
        }
    }

    fn start(&mut self, buf: &[u8]) -> Step {
        if buf[0] == 0x16 && self.scope.is_limited() {
            return Step::Refuse(self.scope_refusal_tls());
        }
        if buf[0] == 0x16 {
            self.state = State::Tls(TlsStream::new(self.host.clone()));
            return self.feed(buf);
        }
        match self.mode {
            TunnelMode::TlsOnly => Step::Refuse(Refusal::new(
                format!(
                    "the tunnel carries TLS only (port {} or tunnel=tls-only), and the client \
                     did not start TLS",
                    self.port
                ),
                "none: speak TLS to this destination",
            )),
            TunnelMode::Checked => {
                self.state = State::Http {
                    form: Form::Tunnel,
                    body: BodyReader::new(Body::None),
                };
                self.feed(buf)
            }
            TunnelMode::Any => {
                self.state = State::Scan { carry: Vec::new() };
                self.feed(buf)
            }
        }
    }

    /// A request head at the front of `buf`.
    fn head(&mut self, form: Form, buf: &[u8]) -> Step {
        let parsed = match form {
            Form::Tunnel => self.tunnel_head(buf),
            Form::Forward => self.forward_head(buf),
        };
        match parsed {
            Ok(None) => Step::NeedMore,
            Ok(Some((step, body))) => {
                self.state = State::Http {
                    form,
                    body: BodyReader::new(body),
                };
                step
            }
            Err(refusal) => Step::Refuse(refusal),
        }
    }

    fn forward_head(&self, buf: &[u8]) -> Result<Option<(Step, Body)>, Refusal> {
        match http::parse(buf) {
            Ok(None) => Ok(None),
            Ok(Some(Request::Forward {
                host,
                port,
                method,
                path,
                ..
            })) if host == self.host
                && port == self.port
                && !self.scope.permits(&method, &path) =>
            {
                Err(self.scope_refusal(&method, &path))
            }
            Ok(Some(Request::Forward {
                host,
                port,
                upstream,
                body,
                head_len,
                ..
            })) if host == self.host && port == self.port => Ok(Some((
                Step::Replace {
                    consumed: head_len,
                    bytes: upstream,
                },
                body,
            ))),
            Ok(Some(Request::Forward { host, port, .. } | Request::Connect { host, port, .. })) => {
                Err(Refusal::new(
                    format!(
                        "a later request on this connection names {host}:{port}, not the \
                         destination it was opened for ({}:{})",
                        self.host, self.port
                    ),
                    "none: send each destination's requests on a connection of its own",
                ))
            }
            Err(http::HttpError::Refused { reason, rule, .. }) => Err(Refusal::new(reason, rule)),
            Err(err) => Err(Refusal::new(
                format!("a later request on this connection: {err}"),
                "none: send well-formed absolute-form requests",
            )),
        }
    }

    /// A request head inside a tunnel: parsed, checked, passed as it is.
    fn tunnel_head(&self, buf: &[u8]) -> Result<Option<(Step, Body)>, Refusal> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut headers);
        let unknown = |why: String| {
            Refusal::new(
                format!(
                    "the tunnel carries a protocol that is neither TLS nor HTTP/1.x ({why}), \
                     which the proxy cannot check"
                ),
                self.any_rule(),
            )
        };
        let head_len = match request.parse(buf) {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEADER_BYTES => len,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEADER_BYTES => return Ok(None),
            Ok(_) => {
                return Err(Refusal::new(
                    "a request head in the tunnel is larger than MAX_HEADER_BYTES",
                    "none",
                ));
            }
            Err(err) => return Err(unknown(err.to_string())),
        };
        let refuse = |why: String, rule: &str| Err(Refusal::new(why, rule));
        if let Err(err) = framing::check_line_ends(&buf[..head_len]) {
            return refuse(err.to_string(), "none: send well-framed HTTP/1.1");
        }
        let method = request.method.unwrap_or_default();
        if method.eq_ignore_ascii_case("CONNECT") {
            return refuse(
                format!(
                    "CONNECT inside a tunnel to {} (a tunnel through a tunnel)",
                    self.host
                ),
                "none: open each tunnel through the proxy itself",
            );
        }
        if request
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("upgrade"))
        {
            return refuse(
                "an Upgrade request: what follows a protocol switch cannot be checked".to_owned(),
                &self.any_rule(),
            );
        }
        let hosts: Vec<&[u8]> = request
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("host"))
            .map(|h| h.value)
            .collect();
        let [value] = hosts.as_slice() else {
            return refuse(
                format!(
                    "a request in the tunnel to {} has {} Host headers (exactly one is checked)",
                    self.host,
                    hosts.len()
                ),
                "none: send one Host header naming the tunnel's host",
            );
        };
        let value = String::from_utf8_lossy(value);
        if !http::host_header_names(&value, &self.host, self.port) {
            return refuse(
                format!(
                    "a request in the tunnel names the Host {value:?}, not the host the tunnel \
                     was opened for ({}): domain fronting",
                    self.host
                ),
                "none: open a tunnel to that host itself (and allow it)",
            );
        }
        let target = request.path.unwrap_or_default();
        let lower = target.to_ascii_lowercase();
        let mut origin_form = target;
        if let Some(after) = ["http://", "https://"]
            .iter()
            .find_map(|scheme| lower.starts_with(scheme).then(|| &target[scheme.len()..]))
        {
            let authority = &after[..after.find(['/', '?', '#']).unwrap_or(after.len())];
            origin_form = &after[authority.len()..];
            let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            if !http::host_header_names(authority, &self.host, self.port) {
                return refuse(
                    format!(
                        "a request in the tunnel targets {target:?}, not the host the tunnel \
                         was opened for ({}): domain fronting",
                        self.host
                    ),
                    "none: open a tunnel to that host itself (and allow it)",
                );
            }
        }
        if !self.scope.permits(method, origin_form) {
            return Err(self.scope_refusal(method, target));
        }
        let body = framing::body_of(request.version.unwrap_or(1), request.headers)
            .map_err(|err| Refusal::new(err.to_string(), "none: send well-framed HTTP/1.1"))?;
        Ok(Some((Step::Pass(head_len), body)))
    }

    /// Plaintext of an unknown protocol: passes up to the next ClientHello, which is followed
    /// as TLS from there.
    fn scan(&mut self, buf: &[u8]) -> Step {
        let State::Scan { carry } = &mut self.state else {
            return Step::NeedMore;
        };
        // A ClientHello whose first bytes passed already (the end of the last buffer).
        for start in 0..carry.len() {
            if carry[start] != 0x16 {
                continue;
            }
            let mut window = carry[start..].to_vec();
            let more = tls::CLIENT_HELLO_PREFIX.saturating_sub(window.len());
            window.extend_from_slice(&buf[..more.min(buf.len())]);
            if tls::client_hello_starts(&window) == Some(true) {
                let passed = carry[start..].to_vec();
                self.state = State::Tls(TlsStream::resumed(self.host.clone(), passed));
                return self.feed(buf);
            }
        }
        let mut from = 0;
        while let Some(offset) = memchr::memchr(0x16, &buf[from..]) {
            let at = from + offset;
            if tls::client_hello_starts(&buf[at..]) == Some(true) {
                if at == 0 {
                    self.state = State::Tls(TlsStream::new(self.host.clone()));
                    return self.feed(buf);
                }
                remember_tail(carry, &buf[..at]);
                return Step::Pass(at);
            }
            from = at + 1;
        }
        // No ClientHello starts here; one may start in the last bytes (which name nothing yet).
        remember_tail(carry, buf);
        Step::Pass(buf.len())
    }
}

/// Keeps the last bytes that passed, enough to recognise a ClientHello that began in them.
fn remember_tail(carry: &mut Vec<u8>, passed: &[u8]) {
    let keep = tls::CLIENT_HELLO_PREFIX - 1;
    carry.extend_from_slice(&passed[passed.len().saturating_sub(keep)..]);
    let excess = carry.len().saturating_sub(keep);
    carry.drain(..excess);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::tls::tests::client_hello;
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
        crate::EgressRules::parse(&["a.test methods=read-only paths=/ok/".to_owned()], &[])
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
        input.extend_from_slice(
            b"POST /ok/a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2\r\n\r\nhi",
        );
        let make = || {
            Inspector::tunnel(host("a.test"), 80, TunnelMode::Checked).limited_to(read_only_scope())
        };
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
}
