//! The request heads of an HTTP stream the [`Inspector`] follows: inside a tunnel, checked and
//! passed as they are; on a plain-HTTP proxy connection, checked and rewritten.

use super::super::framing::{self, Body, BodyReader};
use super::super::http::{self, Request};
use super::super::{MAX_HEADER_BYTES, MAX_HEADERS};
use super::{Form, Inspector, Refusal, State, Step};

impl Inspector {
    /// A request head at the front of `buf`.
    pub(super) fn head(&mut self, form: Form, buf: &[u8]) -> Step {
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
}
