//! `http/request`: the executor makes an HTTP request for the harness.
//!
//! Order of a request:
//! 1. params are validated (method, `http`/`https` URL, headers, body, `requestId`): -32602;
//! 2. a `sandbox` whose network is off refuses the request (-32600 `sandboxDenied`);
//! 3. a slot is taken: at most [`MAX_HTTP_REQUESTS_PER_CONNECTION`] per connection and
//!    [`MAX_HTTP_REQUESTS`] in the server, buffered and streaming alike (-32600
//!    `limitExceeded`); a streamed request also reserves its `requestId` on the connection
//!    (a second active stream with the id: -32602);
//! 4. the target is resolved and checked ([`targets`]), the request sent on a client pinned to
//!    the checked addresses, redirects followed with the same checks ([`client`]);
//! 5. buffered: the body is read (at most [`MAX_HTTP_RESPONSE_BODY_BYTES`]) and returned;
//!    streamed: status and headers are returned, then [`body::BodyStream`] sends the body as
//!    `http/request/bodyDelta` notifications once the answer is queued. The slot and the
//!    `requestId` are held until the last delta is sent or the connection ends.

pub mod body;
pub mod client;
pub mod targets;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use base64::Engine;
use proto::methods::http::{HttpHeader, HttpRequestParams, HttpResponse};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use body::BodyStream;
use client::{HttpClients, Outgoing};
use targets::TargetPolicy;

use crate::error_text::error_chain;
use crate::limits::{
    HTTP_REQUEST_DEFAULT_TIMEOUT_MS, HTTP_REQUEST_MAX_TIMEOUT_MS, MAX_HTTP_REQUEST_BODY_BYTES,
    MAX_HTTP_REQUEST_ID_BYTES, MAX_HTTP_REQUESTS, MAX_HTTP_REQUESTS_PER_CONNECTION,
    MAX_HTTP_RESPONSE_BODY_BYTES,
};

/// Why an `http/request` failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// `requestId` is empty or longer than its limit.
    #[error(
        "invalid params for http/request: requestId must be 1 to {limit} bytes (MAX_HTTP_REQUEST_ID_BYTES), got {length}"
    )]
    RequestIdLength {
        /// Its length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// `method` is not an HTTP method token.
    #[error("invalid params for http/request: method {method:?} is invalid: {source}")]
    InvalidMethod {
        /// The method given.
        method: String,
        /// Why it does not parse (`http::method::InvalidMethod`).
        #[source]
        source: <Method as std::str::FromStr>::Err,
    },
    /// `method` is `CONNECT`.
    #[error(
        "invalid params for http/request: method CONNECT is not supported (it would open a tunnel)"
    )]
    ConnectMethod,
    /// `url` does not parse.
    #[error(
        "invalid params for http/request: url {url:?} is invalid: {source}; send an absolute http:// or https:// URL"
    )]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// Why it does not parse (`url::ParseError`).
        #[source]
        source: <Url as std::str::FromStr>::Err,
    },
    /// `url` is not `http:` or `https:`.
    #[error(
        "invalid params for http/request: only http and https URLs are supported, got scheme {scheme:?}"
    )]
    UnsupportedScheme {
        /// The scheme given.
        scheme: String,
    },
    /// A URL (of the request or a redirect) has no host.
    #[error(
        "invalid params for http/request: url {url} has no host; send an absolute http:// or https:// URL"
    )]
    UrlWithoutHost {
        /// The URL.
        url: String,
    },
    /// A URL (of the request or a redirect) has no port and no known default for its scheme.
    #[error("invalid params for http/request: url {url} has no port")]
    UrlWithoutPort {
        /// The URL.
        url: String,
    },
    /// A header name is not a valid token.
    #[error("invalid params for http/request: header name {name:?} is invalid: {source}")]
    InvalidHeaderName {
        /// The name given.
        name: String,
        /// Why it is invalid.
        #[source]
        source: reqwest::header::InvalidHeaderName,
    },
    /// A header value holds bytes a header cannot carry.
    #[error("invalid params for http/request: the value of header {name:?} is invalid: {source}")]
    InvalidHeaderValue {
        /// The header's name.
        name: String,
        /// Why the value is invalid.
        #[source]
        source: reqwest::header::InvalidHeaderValue,
    },
    /// `bodyBase64` does not decode.
    #[error("bodyBase64 is not valid base64: {0}")]
    InvalidBase64(#[source] base64::DecodeError),
    /// A streamed request with this `requestId` is still active on the connection. (The
    /// reference's words exactly: its tests compare them.)
    #[error("http/request streamResponse requestId `{request_id}` is already active")]
    DuplicateStream {
        /// The id.
        request_id: String,
    },
    /// A body is larger than its limit.
    #[error("{what} is larger than {limit_name} ({limit} bytes){hint}")]
    TooLarge {
        /// Which body.
        what: &'static str,
        /// The constant's name.
        limit_name: &'static str,
        /// The limit.
        limit: usize,
        /// What to do instead.
        hint: &'static str,
    },
    /// Too many requests in flight.
    #[error(
        "{limit} http/request calls are already in flight ({limit_name}); retry when one finishes"
    )]
    TooMany {
        /// The constant's name.
        limit_name: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The request's sandbox turns the network off.
    #[error("sandbox denied: http/request to {url}: the request's sandbox turns the network off")]
    NetworkOff {
        /// The URL.
        url: String,
    },
    /// The host is not in the request's network allowlist.
    #[error(
        "sandbox denied: http/request to {url}: {host}:{port} is {reason}; allow it with the pattern {rule:?} in the sandbox's network allowlist"
    )]
    NotInAllowlist {
        /// The URL (of this hop).
        url: String,
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// Why.
        reason: AllowlistRefusal,
        /// The pattern that would allow it.
        rule: String,
    },
    /// With a network allowlist, a `Host` header names another host than the URL's (the egress
    /// proxy refuses the same request).
    #[error(
        "sandbox denied: http/request to {url}: the Host header {value:?} names another host than the URL ({host}); with a network allowlist only the URL's host may be named (leave the header out)"
    )]
    HostHeaderMismatch {
        /// The URL (of this hop).
        url: String,
        /// The URL's host.
        host: String,
        /// The header's value.
        value: String,
    },
    /// The sandbox object does not parse.
    #[error("invalid sandbox: {0}; see policies/README.md for the accepted shapes")]
    SandboxShape(#[source] serde_json::Error),
    /// The sandbox object parses but does not resolve.
    #[error("invalid sandbox: {0}; see policies/README.md for the accepted shapes")]
    SandboxPolicy(#[source] sandbox::PolicyError),
    /// The target address is refused.
    #[error("sandbox denied: http/request to {url}: {address} is {reason}")]
    TargetRefused {
        /// The URL.
        url: String,
        /// The refused address.
        address: SocketAddr,
        /// Which rule.
        reason: &'static str,
    },
    /// A header asks for something this server does not do.
    #[error("http/request: header {name:?} has valueEnvVar, which this server does not support")]
    ValueEnvVar {
        /// The header.
        name: String,
    },
    /// The host name does not resolve.
    #[error("http/request failed: cannot resolve {host}: {source}")]
    Resolve {
        /// The name.
        host: String,
        /// The resolver's error.
        #[source]
        source: std::io::Error,
    },
    /// The host name resolves to no address.
    #[error("http/request failed: cannot resolve {host}: the name has no address")]
    NoAddress {
        /// The name.
        host: String,
    },
    /// The request's deadline passed: its `timeoutMs` (capped at
    /// [`HTTP_REQUEST_MAX_TIMEOUT_MS`]) or [`HTTP_REQUEST_DEFAULT_TIMEOUT_MS`].
    #[error(
        "http/request failed: timed out after timeoutMs ({timeout_ms} ms; without timeoutMs \
         HTTP_REQUEST_DEFAULT_TIMEOUT_MS applies, and HTTP_REQUEST_MAX_TIMEOUT_MS caps it)"
    )]
    TimedOut {
        /// The timeout.
        timeout_ms: u64,
    },
    /// Connecting, sending or reading failed.
    #[error("http/request failed: {url}: {}", error_chain(source))]
    Upstream {
        /// The URL.
        url: String,
        /// reqwest's error (its causes are part of the message: reqwest's own text is only the
        /// outermost).
        #[source]
        source: reqwest::Error,
    },
    /// Redirects did not end.
    #[error("http/request failed: more than {limit} redirects (MAX_HTTP_REDIRECTS), last to {url}")]
    TooManyRedirects {
        /// The last URL.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// The TLS client configuration could not be built.
    #[error("http/request: cannot configure TLS: {0}")]
    Tls(#[source] rustls::Error),
    /// The HTTP client (for one pinned address set) could not be built.
    #[error("http/request: cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

impl HttpError {
    /// A reqwest failure: a timeout, or an upstream error with its whole cause chain.
    pub fn upstream(url: &Url, error: reqwest::Error, timeout_ms: Option<u64>) -> Self {
        if error.is_timeout() {
            return HttpError::TimedOut {
                timeout_ms: timeout_ms.unwrap_or(0),
            };
        }
        HttpError::Upstream {
            url: url.to_string(),
            source: error,
        }
    }
}

/// Why the request's network allowlist refuses a host.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistRefusal {
    /// The URL's host is not a valid host name (so no pattern can name it).
    #[error(transparent)]
    BadHost(sandbox::policy::network::HostNameError),
    /// No `allow` pattern matches.
    #[error("not in the sandbox's network allowlist")]
    NotAllowed,
    /// A `deny` pattern matches.
    #[error("denied by the pattern {pattern:?}")]
    DeniedByPattern {
        /// The pattern.
        pattern: String,
    },
    /// Plain `http://` to a destination that carries TLS only (port 443 unless its pattern says
    /// otherwise, or `tunnel=tls-only`), as the egress proxy refuses it.
    #[error("the destination carries TLS only, and this is a plain http:// request")]
    PlainHttpToTlsOnly,
    /// The destination is allowed, this request to it is not (`methods=` / `paths=`).
    #[error("{request} is outside what its pattern allows ({allowed})")]
    RequestLimited {
        /// Method and target.
        request: String,
        /// What the patterns allow.
        allowed: String,
    },
}

/// Server-wide state of `http/request`.
pub struct HttpContext {
    clients: HttpClients,
    slots: Arc<Semaphore>,
}

impl HttpContext {
    /// The context of a server listening on `listeners` (never reachable without
    /// `allowOwnListeners`).
    pub fn new(listeners: Vec<SocketAddr>) -> Self {
        Self {
            clients: HttpClients::new(listeners),
            slots: Arc::new(Semaphore::new(MAX_HTTP_REQUESTS)),
        }
    }
}

/// One connection's `http/request` state: its slots and its active stream ids.
pub struct ConnectionHttp {
    slots: Arc<Semaphore>,
    streams: Arc<Mutex<HashSet<String>>>,
}

impl Default for ConnectionHttp {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(MAX_HTTP_REQUESTS_PER_CONNECTION)),
            streams: Arc::default(),
        }
    }
}

/// The slots a request holds (connection and server), released on drop.
pub struct Slots {
    _connection: OwnedSemaphorePermit,
    _server: OwnedSemaphorePermit,
}

/// A reserved stream id, freed on drop.
pub struct StreamReservation {
    streams: Arc<Mutex<HashSet<String>>>,
    request_id: String,
}

impl Drop for StreamReservation {
    fn drop(&mut self) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.request_id);
    }
}

/// The answer of an `http/request`, and for a streamed one the body still to send.
pub struct Started {
    /// The JSON-RPC result.
    pub result: HttpResponse,
    /// The body of a streamed request: run it after the result is queued.
    pub body: Option<BodyStream>,
}

/// `http/request`.
///
/// # Errors
/// See [`HttpError`].
pub async fn request(
    context: &HttpContext,
    connection: &ConnectionHttp,
    params: HttpRequestParams,
) -> Result<Started, HttpError> {
    let outgoing = validate(&params)?;
    let mut egress = None;
    if let Some(sandbox) = params.sandbox.as_ref().filter(|value| !value.is_null()) {
        let spec: sandbox::SandboxSpec =
            serde_json::from_value(sandbox.clone()).map_err(HttpError::SandboxShape)?;
        let policy = spec.resolve().map_err(HttpError::SandboxPolicy)?;
        if !policy.network_allowed() {
            return Err(HttpError::NetworkOff {
                url: params.url.clone(),
            });
        }
        egress = policy.egress().cloned();
    }
    let slots = take_slots(context, connection)?;
    let reservation = params
        .stream_response
        .then(|| reserve_stream(connection, &params.request_id))
        .transpose()?;
    let policy = TargetPolicy {
        allow_link_local: params.allow_link_local,
        allow_own_listeners: params.allow_own_listeners,
        egress,
    };
    let (timeout_ms, head_timeout_ms) = timeouts(params.timeout_ms, params.stream_response);
    let deadline = client::deadline(timeout_ms);
    let sent = context.clients.send(
        outgoing,
        &policy,
        params.redirect_policy,
        deadline,
        timeout_ms,
    );
    let mut response =
        tokio::time::timeout(std::time::Duration::from_millis(head_timeout_ms), sent)
            .await
            .map_err(|_| HttpError::TimedOut {
                timeout_ms: head_timeout_ms,
            })??;
    let status = response.status().as_u16();
    let headers = response_headers(response.headers());
    match reservation {
        Some(reservation) => Ok(Started {
            result: HttpResponse {
                status,
                headers,
                body_base64: String::new(),
            },
            body: Some(BodyStream::new(
                params.request_id,
                response,
                slots,
                reservation,
                timeout_ms,
            )),
        }),
        None => {
            let body =
                body::read_bounded(&mut response, MAX_HTTP_RESPONSE_BODY_BYTES, timeout_ms).await?;
            drop(slots);
            Ok(Started {
                result: HttpResponse {
                    status,
                    headers,
                    body_base64: base64_simd::STANDARD.encode_to_string(body),
                },
                body: None,
            })
        }
    }
}

/// The deadlines of a request that asked for `asked` ms: the whole request's (the client's, at
/// most [`HTTP_REQUEST_MAX_TIMEOUT_MS`]; without one, [`HTTP_REQUEST_DEFAULT_TIMEOUT_MS`] for a
/// buffered request and none for a streamed one's body), and its head's (status and headers:
/// the whole request's, else the default).
fn timeouts(asked: Option<u64>, stream_response: bool) -> (Option<u64>, u64) {
    let asked = asked.map(|ms| ms.min(HTTP_REQUEST_MAX_TIMEOUT_MS));
    let total = match asked {
        None if !stream_response => Some(HTTP_REQUEST_DEFAULT_TIMEOUT_MS),
        asked => asked,
    };
    (total, total.unwrap_or(HTTP_REQUEST_DEFAULT_TIMEOUT_MS))
}

/// Params → the first hop, or -32602 naming what is wrong.
fn validate(params: &HttpRequestParams) -> Result<Outgoing, HttpError> {
    if params.request_id.is_empty() || params.request_id.len() > MAX_HTTP_REQUEST_ID_BYTES {
        return Err(HttpError::RequestIdLength {
            length: params.request_id.len(),
            limit: MAX_HTTP_REQUEST_ID_BYTES,
        });
    }
    let method = Method::from_bytes(params.method.as_bytes()).map_err(|source| {
        HttpError::InvalidMethod {
            method: params.method.clone(),
            source,
        }
    })?;
    if method == Method::CONNECT {
        return Err(HttpError::ConnectMethod);
    }
    let url = Url::parse(&params.url).map_err(|source| HttpError::InvalidUrl {
        url: params.url.clone(),
        source,
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(HttpError::UnsupportedScheme {
            scheme: url.scheme().to_owned(),
        });
    }
    let mut headers = HeaderMap::new();
    for HttpHeader {
        name,
        value,
        value_env_var,
    } in &params.headers
    {
        if value_env_var.is_some() {
            return Err(HttpError::ValueEnvVar { name: name.clone() });
        }
        let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|source| {
            HttpError::InvalidHeaderName {
                name: name.clone(),
                source,
            }
        })?;
        let header_value =
            HeaderValue::from_str(value).map_err(|source| HttpError::InvalidHeaderValue {
                name: name.clone(),
                source,
            })?;
        headers.append(header_name, header_value);
    }
    let body = match &params.body_base64 {
        None => None,
        Some(text) => {
            // base64 is 4 characters per 3 bytes: refuse before decoding what cannot fit.
            if text.len() / 4 * 3 > MAX_HTTP_REQUEST_BODY_BYTES + 3 {
                return Err(request_body_too_large());
            }
            let body = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(HttpError::InvalidBase64)?;
            if body.len() > MAX_HTTP_REQUEST_BODY_BYTES {
                return Err(request_body_too_large());
            }
            Some(body)
        }
    };
    Ok(Outgoing {
        method,
        url,
        headers,
        body,
    })
}

fn request_body_too_large() -> HttpError {
    HttpError::TooLarge {
        what: "the request body",
        limit_name: "MAX_HTTP_REQUEST_BODY_BYTES",
        limit: MAX_HTTP_REQUEST_BODY_BYTES,
        hint: "",
    }
}

fn take_slots(context: &HttpContext, connection: &ConnectionHttp) -> Result<Slots, HttpError> {
    let connection_slot =
        connection
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| HttpError::TooMany {
                limit_name: "MAX_HTTP_REQUESTS_PER_CONNECTION",
                limit: MAX_HTTP_REQUESTS_PER_CONNECTION,
            })?;
    let server_slot =
        context
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| HttpError::TooMany {
                limit_name: "MAX_HTTP_REQUESTS",
                limit: MAX_HTTP_REQUESTS,
            })?;
    Ok(Slots {
        _connection: connection_slot,
        _server: server_slot,
    })
}

fn reserve_stream(
    connection: &ConnectionHttp,
    request_id: &str,
) -> Result<StreamReservation, HttpError> {
    let mut streams = connection.streams.lock().unwrap_or_else(|p| p.into_inner());
    if !streams.insert(request_id.to_owned()) {
        return Err(HttpError::DuplicateStream {
            request_id: request_id.to_owned(),
        });
    }
    Ok(StreamReservation {
        streams: connection.streams.clone(),
        request_id: request_id.to_owned(),
    })
}

/// Response headers in order; values that are not UTF-8 are left out (as the reference does).
fn response_headers(headers: &HeaderMap) -> Vec<HttpHeader> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            Some(HttpHeader {
                name: name.as_str().to_owned(),
                value: value.to_str().ok()?.to_owned(),
                value_env_var: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
