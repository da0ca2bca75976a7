//! The reference rendezvous's HTTP endpoints as a client sees them, against the real
//! `exec-rendezvous` binary: bearer-token auth, registration, lookup, the websocket endpoints'
//! refusals, and malformed input. Raw HTTP/1.1, so every status and body is checked as sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use serde_json::{Value, json};
use tests::DEADLINE;
use tests::relay::{ADMIN_TOKEN, EXECUTOR_TOKEN, TOKEN, start_rendezvous, start_rendezvous_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod access;
mod credentials;
mod registration;
mod sockets;

/// A response: status code and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Send one request (`token` as `Authorization: Bearer`, `extra` headers verbatim) and read the
/// whole response (`Connection: close`), or only the head of a `101` upgrade.
async fn http(
    registry: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[&str],
    body: &str,
) -> Answer {
    http_keep(registry, method, path, token, extra, body)
        .await
        .0
}

/// [`http`], keeping the connection (an upgraded websocket stays open while it is held).
async fn http_keep(
    registry: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    extra: &[&str],
    body: &str,
) -> (Answer, tokio::net::TcpStream) {
    let address = registry.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !extra.iter().any(|h| h.starts_with("Connection:")) {
        head.push_str("Connection: close\r\n");
    }
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    for header in extra {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let read = async {
        let mut response = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap();
            response.extend_from_slice(&chunk[..n]);
            let upgraded = response.starts_with(b"HTTP/1.1 101 ")
                && response.windows(4).any(|w| w == b"\r\n\r\n");
            if n == 0 || upgraded {
                return response;
            }
        }
    };
    let response = tokio::time::timeout(DEADLINE, read)
        .await
        .expect("response deadline");
    // Lossy: after a 101, the executor socket's key challenge (binary) may follow in the same
    // read.
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let answer = Answer {
        status,
        body: body.to_owned(),
    };
    (answer, stream)
}

fn public_key(fill: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([fill; 32])
}

const UPGRADE: [&str; 4] = [
    "Connection: Upgrade",
    "Upgrade: websocket",
    "Sec-WebSocket-Version: 13",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
];
