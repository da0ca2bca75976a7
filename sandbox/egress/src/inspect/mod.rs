//! Every byte the client sends towards an allowed destination, checked as the destination will
//! read it, sans-I/O: the proxy's relay feeds the client's bytes in and is told which may pass,
//! which must be held until more arrive, and when to close the connection with a refusal.
//!
//! What is checked depends on the [`TunnelMode`] the policy gives the destination:
//! - `tls-only`: TLS from the first byte ([`tls`]); every plaintext ClientHello names the host;
//! - checked (the default off port 443): TLS as above, or HTTP/1.x in which every request head
//!   (the first, kept-alive and pipelined ones alike, found by following each body's framing,
//!   [`framing`](super::framing)) has exactly one `Host` naming the host, an absolute-form
//!   target (if any) naming it too, no `CONNECT` and no `Upgrade` (what follows an upgrade
//!   cannot be framed); anything else is refused as an unknown protocol;
//! - `any`: any bytes; the plaintext is scanned for a TLS ClientHello wherever it starts (a
//!   STARTTLS switch in SMTP, IMAP, POP3, FTP, LDAP, XMPP or Postgres alike, recognised by its
//!   record and handshake headers, [`tls::client_hello_starts`]) and from there the TLS is
//!   followed as above; when the client leaves TLS, scanning resumes.
//!
//! A plain-HTTP proxy connection (absolute-form requests) is followed like a checked tunnel,
//! but each later request must be absolute-form naming the same destination, and its head is
//! rewritten as the first one was ([`http::parse`](super::http::parse)).

use sandbox::policy::network::{Host, RequestScope, TunnelMode};

use super::framing::{Body, BodyReader};
use super::tls::{self, TlsStep, TlsStream};

mod head;

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
                sandbox::policy::network::suggested_rule(&self.host, self.port)
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
                sandbox::policy::network::suggested_rule(&self.host, self.port)
            ),
        )
    }

    fn any_rule(&self) -> String {
        format!(
            "--allow-domain '{} tunnel=any' (or tunnel = \"any\" on its pattern)",
            sandbox::policy::network::suggested_rule(&self.host, self.port)
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
mod tests;
