//! Noticing that a client left while the server is not reading its socket.
//!
//! A connection stops reading when its requests wait (every request slot busy, its in-flight
//! bytes full, its outbound queue full because the client does not read): that is how the
//! server pushes back. A client that closes or half-closes its socket meanwhile sends a FIN the
//! server would only see by reading, so the socket sat in CLOSE-WAIT, its requests kept being
//! worked on and its session stayed attached, for ever. [`PeerHangup`] watches a duplicate of
//! the socket's descriptor for the peer's end (read side shut down, or the connection reset)
//! without reading a byte, so whatever the client sent before its FIN stays unread in the
//! socket and nothing is buffered on its behalf. The connection loop and the unfinished-message
//! meter wait on it wherever they wait instead of reading.

use std::os::fd::{AsFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// Watches one connection's socket for the peer's close (see the module docs).
pub struct PeerHangup {
    fd: AsyncFd<OwnedFd>,
}

impl PeerHangup {
    /// Watch the socket behind `socket` through a duplicate of its descriptor (close-on-exec,
    /// registered with the runtime on its own, so the socket's own reads are unaffected).
    ///
    /// # Errors
    /// The `dup` or the registration failed (out of descriptors).
    pub fn watch(socket: &impl AsFd) -> std::io::Result<Self> {
        let duplicate = socket.as_fd().try_clone_to_owned()?;
        Ok(Self {
            fd: crate::sys::register_async_fd(duplicate)?,
        })
    }

    /// Resolves once the peer shut down its sending side or the connection broke; data arriving
    /// before that is left in the socket. Never resolves while the peer is only quiet.
    pub async fn gone(&self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return;
            };
            let ready = guard.ready();
            if ready.is_read_closed() || ready.is_write_closed() {
                return;
            }
            // Only data arrived: wait for the next event (the peer's FIN is one).
            guard.clear_ready();
        }
    }
}

/// Resolves when `hangup` does; never without one (a transport with no socket of its own, such
/// as a relay stream, ends through its own messages).
pub async fn peer_gone(hangup: Option<&PeerHangup>) {
    match hangup {
        Some(hangup) => hangup.gone().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (server, client)
    }

    #[tokio::test]
    async fn unread_data_is_not_a_hangup_and_a_half_close_behind_it_is() {
        let (server, mut client) = pair().await;
        let hangup = PeerHangup::watch(&server).unwrap();
        client.write_all(b"pipelined request").await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(200), hangup.gone()).await;
        assert!(quiet.is_err(), "data alone is not the peer leaving");
        client.shutdown().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), hangup.gone())
            .await
            .expect("the FIN is seen without reading the data before it");
        // The data before it is still there for the socket's own reader.
        let mut buffer = [0u8; 64];
        let n = server.try_read(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"pipelined request");
    }

    #[tokio::test]
    async fn a_closed_peer_is_seen_on_a_unix_socket_too() {
        let (server, client) = tokio::net::UnixStream::pair().unwrap();
        let hangup = PeerHangup::watch(&server).unwrap();
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), hangup.gone())
            .await
            .expect("the close is seen");
    }
}
