//! Raw websocket frames for the hostile-client, fault and load tests: masked client frames
//! built by hand, a hand-made handshake, and reading server frames until the close.

use std::time::Duration;

use tokio::io::AsyncRead;

use crate::DEADLINE;

/// Websocket opcodes for [`ws_frame`].
pub mod opcode {
    /// Continuation frame.
    pub const CONTINUATION: u8 = 0x0;
    /// Text frame.
    pub const TEXT: u8 = 0x1;
    /// Binary frame.
    pub const BINARY: u8 = 0x2;
}

/// The bytes of one masked client frame (`fin`, `opcode`, `payload`), as RFC 6455 §5.2 lays
/// them out. The mask key is fixed: these frames test the server, not the masking.
pub fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = ws_frame_header(fin, opcode, payload.len() as u64);
    let key = [0x12, 0x34, 0x56, 0x78];
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// The header (including the mask key 12 34 56 78) of a masked client frame whose payload is
/// `len` bytes; the payload itself is not included.
pub fn ws_frame_header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut frame = vec![u8::from(fin) << 7 | opcode];
    match len {
        0..=125 => frame.push(0x80 | len as u8),
        126..=0xFFFF => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&len.to_be_bytes());
        }
    }
    frame.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    frame
}

/// A websocket handshake on a plain TCP stream done by hand, so that frames can be written raw.
/// Panics unless the server answers `101` within [`DEADLINE`].
pub async fn raw_websocket(addr: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .expect("write the upgrade request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(DEADLINE, async {
        while !head.ends_with(b"\r\n\r\n") {
            let n = stream
                .read(&mut byte)
                .await
                .expect("read the upgrade answer");
            assert_eq!(n, 1, "EOF during the handshake after {head:?}");
            head.push(byte[0]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no upgrade answer within {DEADLINE:?}"));
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// How the server ended a raw connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawEnd {
    /// A close frame with this code (and then EOF or a reset).
    Close(u16),
    /// EOF or a reset without a close frame.
    Eof,
}

/// Read one (unmasked) server frame from a raw websocket stream: `(opcode, payload)`, or `None`
/// at EOF or a reset. Continuation frames are returned as they come.
pub async fn read_raw_frame(stream: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.ok()?;
    let len = match head[1] & 0x7F {
        126 => {
            let mut ext = [0u8; 2];
            stream.read_exact(&mut ext).await.ok()?;
            u64::from(u16::from_be_bytes(ext))
        }
        127 => {
            let mut ext = [0u8; 8];
            stream.read_exact(&mut ext).await.ok()?;
            u64::from_be_bytes(ext)
        }
        short => u64::from(short),
    };
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[0] & 0x0F, payload))
}

/// Read a raw websocket stream until the server closes it, within `deadline`; returns the close
/// code of the first close frame (frames before it are skipped), or [`RawEnd::Eof`] when the
/// stream ended without one. Panics on timeout.
pub async fn read_until_closed(
    stream: &mut (impl AsyncRead + Unpin),
    deadline: Duration,
) -> RawEnd {
    let read_all = async {
        while let Some((opcode, payload)) = read_raw_frame(stream).await {
            if opcode == 0x8 {
                return match payload.get(..2) {
                    Some(code) => RawEnd::Close(u16::from_be_bytes([code[0], code[1]])),
                    None => RawEnd::Close(1005),
                };
            }
        }
        RawEnd::Eof
    };
    tokio::time::timeout(deadline, read_all)
        .await
        .unwrap_or_else(|_| panic!("the server did not close the connection within {deadline:?}"))
}
