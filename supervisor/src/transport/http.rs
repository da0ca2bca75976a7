//! The HTTP head of a new connection, read and judged by hand before any websocket state exists:
//! `/readyz`, the `Origin` refusal, the bearer token (checked when sent; when none is, who may
//! connect is decided by the peer's owner, [`super::access`]), and the `101` upgrade response.
//! `GET /status` and `GET /metrics` pass the same checks as an upgrade ([`HeadDecision::Page`]).
//!
//! Reading the head ourselves (bounded in size and time) means a slow or hostile client costs a
//! fixed amount of memory and is dropped after [`UPGRADE_HEAD_TIMEOUT`].

use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::limits::{MAX_UPGRADE_HEAD_BYTES, UPGRADE_HEAD_TIMEOUT};
pub use crate::observe::status::Page;

/// What to do with a connection after its head was read.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadDecision {
    /// Upgrade to a websocket; `leftover` are bytes read past the head (early frames).
    Upgrade {
        /// The `Sec-WebSocket-Key` to answer.
        key: String,
        /// Bytes after the head.
        leftover: Vec<u8>,
        /// Whether the server's bearer token was presented (a wrong one is refused here).
        token: TokenPresented,
    },
    /// Serve a page (`GET /status`, `GET /metrics`) once the peer is admitted as an upgrade
    /// would be.
    Page {
        /// Which page.
        page: Page,
        /// Whether the server's bearer token was presented (a wrong one is refused here).
        token: TokenPresented,
    },
    /// Answer with this status and close.
    Reject {
        /// HTTP status line text, e.g. `403 Forbidden`.
        status: &'static str,
        /// Plain-text body.
        body: &'static str,
    },
}

/// Whether an upgrade carried the server's bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPresented {
    /// The right token: admitted whoever the peer is.
    Valid,
    /// No `Authorization` header (or no token configured, when one sent is ignored): the
    /// peer's owner decides.
    None,
}

/// Why a head could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// The client did not finish the head in time.
    #[error("HTTP head not received within {UPGRADE_HEAD_TIMEOUT:?}")]
    Timeout,
    /// The head is larger than the limit.
    #[error("HTTP head larger than {MAX_UPGRADE_HEAD_BYTES} bytes")]
    TooLarge,
    /// The client closed or the socket failed.
    #[error("reading the HTTP head: {0}")]
    Io(#[from] std::io::Error),
}

/// Read the head (bounded) and decide.
///
/// # Errors
/// [`HeadError`] on timeout, oversize head, or I/O failure; the caller drops the connection.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    token: Option<&[u8]>,
) -> Result<HeadDecision, HeadError> {
    let mut buffer = Vec::with_capacity(1024);
    let head_end = tokio::time::timeout(UPGRADE_HEAD_TIMEOUT, async {
        let mut chunk = [0u8; 2048];
        loop {
            if let Some(end) = find_head_end(&buffer) {
                return Ok(end);
            }
            if buffer.len() > MAX_UPGRADE_HEAD_BYTES {
                return Err(HeadError::TooLarge);
            }
            let read = stream.read(&mut chunk).await?;
            if read == 0 {
                return Err(HeadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            buffer.extend_from_slice(&chunk[..read]);
        }
    })
    .await
    .map_err(|_| HeadError::Timeout)??;
    if head_end > MAX_UPGRADE_HEAD_BYTES {
        return Err(HeadError::TooLarge);
    }
    let leftover = buffer.split_off(head_end);
    Ok(decide(&buffer, leftover, token))
}

fn find_head_end(buffer: &[u8]) -> Option<usize> {
    buffer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

const BAD_REQUEST: HeadDecision = HeadDecision::Reject {
    status: "400 Bad Request",
    body: "malformed HTTP request\n",
};

fn decide(head: &[u8], leftover: Vec<u8>, token: Option<&[u8]>) -> HeadDecision {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(_)) = request.parse(head) else {
        return BAD_REQUEST;
    };
    let header = |name: &str| {
        request
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let path = request.path.unwrap_or("/");
    let is_upgrade = header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case(b"websocket"));
    if request.method != Some("GET") {
        return HeadDecision::Reject {
            status: "405 Method Not Allowed",
            body: "only GET is served\n",
        };
    }
    // The pages are judged exactly as an upgrade is: the same Origin refusal, the same token
    // check, and then the same owner check (`transport::handle_stream`).
    let page = Page::at(path);
    if !is_upgrade && page.is_none() {
        return if path == "/readyz" {
            HeadDecision::Reject {
                status: "200 OK",
                body: "ok",
            }
        } else {
            HeadDecision::Reject {
                status: "404 Not Found",
                body: "not found; connect with a websocket, or GET /readyz, /status or /metrics\n",
            }
        };
    }
    let token = match authenticate(header("origin"), header("authorization"), token) {
        Ok(token) => token,
        Err(rejection) => return rejection,
    };
    if let Some(page) = page.filter(|_| !is_upgrade) {
        return HeadDecision::Page { page, token };
    }
    let version_ok = header("sec-websocket-version").is_some_and(|v| v == b"13");
    match header("sec-websocket-key").and_then(|key| std::str::from_utf8(key).ok()) {
        Some(key) if version_ok => HeadDecision::Upgrade {
            key: key.trim().to_owned(),
            leftover,
            token,
        },
        _ => BAD_REQUEST,
    }
}

/// The checks every admitted request passes (an upgrade, `/status`, `/metrics`): no `Origin`
/// header, and a bearer token that is right when one is sent.
fn authenticate(
    origin: Option<&[u8]>,
    authorization: Option<&[u8]>,
    token: Option<&[u8]>,
) -> Result<TokenPresented, HeadDecision> {
    if origin.is_some() {
        return Err(HeadDecision::Reject {
            status: "403 Forbidden",
            body: "requests with an Origin header are refused: browser pages may not reach this server\n",
        });
    }
    match (token, authorization) {
        (_, None) => Ok(TokenPresented::None),
        (Some(expected), Some(value)) => {
            let presented = value
                .strip_prefix(b"Bearer ".as_slice())
                .unwrap_or_default();
            let matches: bool =
                presented.len() == expected.len() && bool::from(presented.ct_eq(expected));
            if !matches {
                return Err(HeadDecision::Reject {
                    status: "401 Unauthorized",
                    body: "wrong bearer token\n",
                });
            }
            Ok(TokenPresented::Valid)
        }
        // A server without a token ignores one: the peer's owner decides.
        (None, Some(_)) => Ok(TokenPresented::None),
    }
}

/// Write a page (`GET /status`, `GET /metrics`) and shut the socket down.
pub async fn write_page<S: AsyncWrite + Unpin>(
    stream: &mut S,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Write a plain response and shut the socket down.
pub async fn write_rejection<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    body: &str,
) -> std::io::Result<()> {
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("401") {
        response.push_str("WWW-Authenticate: Bearer\r\n");
    }
    response.push_str("\r\n");
    response.push_str(body);
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Write the `101 Switching Protocols` answer to `key`.
pub async fn write_upgrade<S: AsyncWrite + Unpin>(
    stream: &mut S,
    key: &str,
) -> std::io::Result<()> {
    let accept = derive_accept_key(key.as_bytes());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPGRADE: &str = "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";

    fn head(extra: &str) -> Vec<u8> {
        format!("{UPGRADE}{extra}\r\n").into_bytes()
    }

    #[test]
    fn readyz_is_answered_without_upgrade() {
        let decision = decide(
            b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
            vec![],
            Some(b"t"),
        );
        assert_eq!(
            decision,
            HeadDecision::Reject {
                status: "200 OK",
                body: "ok"
            }
        );
    }

    #[test]
    fn origin_is_forbidden_even_with_a_token() {
        let decision = decide(
            &head("Origin: http://evil\r\nAuthorization: Bearer t\r\n"),
            vec![],
            Some(b"t"),
        );
        assert!(matches!(
            decision,
            HeadDecision::Reject {
                status: "403 Forbidden",
                ..
            }
        ));
    }

    #[test]
    fn a_sent_token_must_be_right_and_a_missing_one_is_left_to_the_owner_check() {
        let missing = decide(&head(""), vec![], Some(b"secret"));
        let wrong = decide(
            &head("Authorization: Bearer secreT\r\n"),
            vec![],
            Some(b"secret"),
        );
        let ignored = decide(&head("Authorization: Bearer secret\r\n"), vec![], None);
        let right = decide(
            &head("Authorization: Bearer secret\r\n"),
            vec![1],
            Some(b"secret"),
        );
        assert!(matches!(
            missing,
            HeadDecision::Upgrade {
                token: TokenPresented::None,
                ..
            }
        ));
        assert!(matches!(
            wrong,
            HeadDecision::Reject {
                status: "401 Unauthorized",
                ..
            }
        ));
        assert!(matches!(
            ignored,
            HeadDecision::Upgrade {
                token: TokenPresented::None,
                ..
            }
        ));
        assert_eq!(
            right,
            HeadDecision::Upgrade {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into(),
                leftover: vec![1],
                token: TokenPresented::Valid,
            }
        );
    }

    #[test]
    fn status_and_metrics_pass_the_upgrades_checks_and_nothing_else_is_served() {
        let get = |path: &str, extra: &str| {
            decide(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").as_bytes(),
                vec![],
                Some(b"secret"),
            )
        };
        assert_eq!(
            get("/status", ""),
            HeadDecision::Page {
                page: Page::Status,
                token: TokenPresented::None
            }
        );
        assert_eq!(
            get("/metrics?x=1", "Authorization: Bearer secret\r\n"),
            HeadDecision::Page {
                page: Page::Metrics,
                token: TokenPresented::Valid
            }
        );
        for (path, extra, status) in [
            (
                "/status",
                "Authorization: Bearer wrong\r\n",
                "401 Unauthorized",
            ),
            ("/metrics", "Origin: http://evil\r\n", "403 Forbidden"),
            (
                "/status",
                "Origin: http://evil\r\nAuthorization: Bearer secret\r\n",
                "403 Forbidden",
            ),
            ("/statusx", "", "404 Not Found"),
        ] {
            assert!(
                matches!(get(path, extra), HeadDecision::Reject { status: s, .. } if s == status),
                "{path} {extra:?}: {:?}",
                get(path, extra)
            );
        }
    }

    #[test]
    fn garbage_is_a_bad_request() {
        assert_eq!(decide(b"\x00\x01\r\n\r\n", vec![], None), BAD_REQUEST);
    }
}
