//! A TCP proxy that can cut, refuse and hold connections.

use std::sync::Arc;
use std::time::Duration;

/// A TCP proxy on `127.0.0.1:0` in front of a `ws://` server, to break connections on purpose.
///
/// - [`CutProxy::cut`] closes every proxied connection at once (both sides), as a network
///   failure would; new connections are accepted again right away.
/// - [`CutProxy::pause`] cuts and then refuses (accepts and immediately closes) new connections
///   until [`CutProxy::resume`]: an outage.
/// - [`CutProxy::hold_downstream`] stops forwarding server-to-client bytes without closing
///   anything (requests still reach the server, answers are held back).
pub struct CutProxy {
    addr: std::net::SocketAddr,
    shared: Arc<ProxyShared>,
    accept: tokio::task::JoinHandle<()>,
}

struct ProxyShared {
    /// Bumped by every cut; each connection task ends when it changes.
    cuts: tokio::sync::watch::Sender<u64>,
    /// While true, new connections are closed right after accept.
    paused: std::sync::atomic::AtomicBool,
    /// While true, server-to-client bytes are not forwarded.
    hold_down: tokio::sync::watch::Sender<bool>,
    accepted: std::sync::atomic::AtomicU64,
    refused: tokio::sync::watch::Sender<u64>,
}

impl CutProxy {
    /// Start a proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(ProxyShared {
            cuts: tokio::sync::watch::channel(0).0,
            paused: std::sync::atomic::AtomicBool::new(false),
            hold_down: tokio::sync::watch::channel(false).0,
            accepted: std::sync::atomic::AtomicU64::new(0),
            refused: tokio::sync::watch::channel(0).0,
        });
        let upstream = upstream.to_owned();
        let accept_shared = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let shared = accept_shared.clone();
                if shared.paused.load(std::sync::atomic::Ordering::SeqCst) {
                    shared.refused.send_modify(|n| *n += 1);
                    drop(client);
                    continue;
                }
                shared
                    .accepted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let mut cut = shared.cuts.subscribe();
                    cut.borrow_and_update();
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pipe(client_read, server_write, None);
                    let down = pipe(
                        server_read,
                        client_write,
                        Some(shared.hold_down.subscribe()),
                    );
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                        _ = cut.changed() => {}
                    }
                    // Dropping the halves closes both sockets.
                });
            }
        });
        CutProxy {
            addr,
            shared,
            accept,
        }
    }

    /// `ws://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Close every proxied connection now.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// Cut, and refuse new connections until [`CutProxy::resume`].
    pub fn pause(&self) {
        self.shared
            .paused
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
    }

    /// Accept connections again.
    pub fn resume(&self) {
        self.shared
            .paused
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Hold (true) or release (false) server-to-client bytes.
    pub fn hold_downstream(&self, hold: bool) {
        self.shared.hold_down.send_replace(hold);
    }

    /// Connections accepted and forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared
            .accepted
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Wait until at least `n` connections were refused while paused.
    pub async fn wait_refused(&self, n: u64, deadline: Duration) {
        let mut refused = self.shared.refused.subscribe();
        tokio::time::timeout(deadline, refused.wait_for(|count| *count >= n))
            .await
            .unwrap_or_else(|_| panic!("no {n} refused connection attempts within {deadline:?}"))
            .unwrap();
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut hold: Option<tokio::sync::watch::Receiver<bool>>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                // Held bytes wait here; a cut drops them.
                if let Some(hold) = &mut hold
                    && hold.wait_for(|held| !*held).await.is_err()
                {
                    return;
                }
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
