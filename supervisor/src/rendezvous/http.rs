//! Just enough HTTP/1.1 for the rendezvous: one request per connection, head and body bounded
//! in size and time, then a response or a websocket upgrade.

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::limits::{MAX_UPGRADE_HEAD_BYTES, UPGRADE_HEAD_TIMEOUT};

/// Largest request body (a registration is a few hundred bytes).
pub const MAX_REQUEST_BODY_BYTES: usize = 16 * 1024;

/// A parsed request.
#[derive(Debug)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without query.
    pub path: String,
    /// The `Authorization` header's bearer token, if any.
    pub bearer: Option<String>,
    /// `Sec-WebSocket-Key` when this is an upgrade.
    pub websocket_key: Option<String>,
    /// The body.
    pub body: Vec<u8>,
    /// Bytes read after the head and body (early websocket frames).
    pub leftover: Vec<u8>,
}

impl Request {
    /// Constant-time comparison of the bearer token.
    pub fn bearer_matches(&self, token: &[u8]) -> bool {
        self.bearer
            .as_deref()
            .is_some_and(|given| given.as_bytes().ct_eq(token).into())
    }
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Too slow.
    #[error("request not received within {UPGRADE_HEAD_TIMEOUT:?}")]
    Timeout,
    /// Head or body too large.
    #[error(
        "request head over {MAX_UPGRADE_HEAD_BYTES} bytes or body over {MAX_REQUEST_BODY_BYTES} bytes"
    )]
    TooLarge,
    /// Not HTTP.
    #[error("malformed HTTP request: {0}")]
    Malformed(String),
    /// I/O.
    #[error("reading the request: {0}")]
    Io(#[from] std::io::Error),
}

/// Read one request.
///
/// # Errors
/// [`RequestError`].
pub async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Request, RequestError> {
    tokio::time::timeout(UPGRADE_HEAD_TIMEOUT, read_inner(stream))
        .await
        .map_err(|_| RequestError::Timeout)?
}

async fn read_inner<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Request, RequestError> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buffer) {
            Ok(httparse::Status::Complete(head_len)) => {
                let mut content_length = 0usize;
                let mut bearer = None;
                let mut websocket_key = None;
                for header in parsed.headers.iter() {
                    let value = String::from_utf8_lossy(header.value).trim().to_owned();
                    if header.name.eq_ignore_ascii_case("content-length") {
                        content_length = value
                            .parse()
                            .map_err(|_| RequestError::Malformed("bad Content-Length".into()))?;
                    } else if header.name.eq_ignore_ascii_case("authorization") {
                        bearer = value.strip_prefix("Bearer ").map(str::to_owned);
                    } else if header.name.eq_ignore_ascii_case("sec-websocket-key") {
                        websocket_key = Some(value);
                    }
                }
                if content_length > MAX_REQUEST_BODY_BYTES {
                    return Err(RequestError::TooLarge);
                }
                let method = parsed.method.unwrap_or_default().to_owned();
                let path = parsed
                    .path
                    .unwrap_or_default()
                    .split('?')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                while buffer.len() < head_len + content_length {
                    let read = stream.read(&mut chunk).await?;
                    if read == 0 {
                        return Err(RequestError::Malformed("body ended early".into()));
                    }
                    buffer.extend_from_slice(&chunk[..read]);
                }
                let leftover = buffer.split_off(head_len + content_length);
                let body = buffer.split_off(head_len);
                return Ok(Request {
                    method,
                    path,
                    bearer,
                    websocket_key,
                    body,
                    leftover,
                });
            }
            Ok(httparse::Status::Partial) => {
                if buffer.len() > MAX_UPGRADE_HEAD_BYTES {
                    return Err(RequestError::TooLarge);
                }
            }
            Err(error) => return Err(RequestError::Malformed(error.to_string())),
        }
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(RequestError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// A response.
#[derive(Debug)]
pub struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    /// Plain text.
    pub fn text(status: u16, reason: &'static str, body: &str) -> Self {
        Self {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
        }
    }

    /// 200 with a JSON body.
    pub fn json<T: serde::Serialize>(value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self {
                status: 200,
                reason: "OK",
                content_type: "application/json",
                body,
            },
            Err(error) => Self::text(500, "Internal Server Error", &error.to_string()),
        }
    }
}

/// Write a response and close.
///
/// # Errors
/// The I/O error.
pub async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    response: &Response,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.reason,
        response.content_type,
        response.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&response.body).await?;
    stream.shutdown().await
}
