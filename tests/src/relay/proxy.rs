//! A websocket proxy on the links to the rendezvous that records frames and injects faults
//! (drop, duplicate, reorder, delay).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

use super::client_tls;

/// What the proxy does to each binary frame, per direction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Percent of frames dropped.
    pub drop_percent: u64,
    /// Percent of frames sent twice.
    pub duplicate_percent: u64,
    /// Each frame is delayed by a random 0..=this many ms (reorders within that window).
    pub max_delay_ms: u64,
}

/// A websocket proxy in front of the rendezvous's websocket endpoints.
pub struct Proxy {
    /// `ws://127.0.0.1:PORT`, to pass as the rendezvous's `--public-url`.
    pub url: String,
    /// Every binary frame seen, when recording.
    pub recorded: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Frames dropped by fault injection.
    pub dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

impl Proxy {
    /// Start a proxy forwarding to the rendezvous at `upstream` (`IP:PORT`).
    pub async fn start(upstream: SocketAddr, faults: Faults, record: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}", listener.local_addr().unwrap());
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicU64::new(0));
        let (rec, drops) = (recorded.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            while let Ok((stream, _)) = listener.accept().await {
                seed = seed.wrapping_add(0x1234_5678_9abc_def1);
                let rec = record.then(|| rec.clone());
                tokio::spawn(proxy_connection(
                    stream,
                    upstream,
                    faults,
                    rec,
                    drops.clone(),
                    seed,
                ));
            }
        });
        Proxy {
            url,
            recorded,
            dropped,
            task,
        }
    }
}

#[allow(clippy::result_large_err)] // tungstenite's callback signature
async fn proxy_connection(
    stream: tokio::net::TcpStream,
    upstream: SocketAddr,
    faults: Faults,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    dropped: Arc<AtomicU64>,
    seed: u64,
) {
    let head: Arc<Mutex<Option<(String, String)>>> = Arc::default();
    let captured = head.clone();
    let callback = move |request: &Request, response: Response| {
        let auth = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        *captured.lock().unwrap() = Some((request.uri().path().to_owned(), auth));
        Ok(response)
    };
    let config = supervisor::relay::driver::relay_websocket_config();
    let Ok(downstream) =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await
    else {
        return;
    };
    let Some((path, auth)) = head.lock().unwrap().clone() else {
        return;
    };
    let token = auth.strip_prefix("Bearer ").unwrap_or_default().to_owned();
    let tls = client_tls("http://127.0.0.1:1", None);
    let Ok(upstream) =
        supervisor::relay::driver::connect_socket(&format!("ws://{upstream}{path}"), &token, &tls)
            .await
    else {
        return;
    };
    let (down_sink, down_stream) = downstream.split();
    let (up_sink, up_stream) = upstream.split();
    let a = pipe(
        down_stream,
        up_sink,
        faults,
        record.clone(),
        dropped.clone(),
        seed,
    );
    let b = pipe(
        up_stream,
        down_sink,
        faults,
        record,
        dropped,
        seed ^ 0xdead_beef,
    );
    // When either side ends, drop both.
    tokio::select! {
        () = a => {}
        () = b => {}
    }
}

async fn pipe<R, W>(
    mut from: R,
    mut to: W,
    faults: Faults,
    record: Option<Arc<Mutex<Vec<Vec<u8>>>>>,
    dropped: Arc<AtomicU64>,
    seed: u64,
) where
    R: futures_util::Stream<Item = Result<WsMessage, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
    W: futures_util::Sink<WsMessage> + Unpin + Send + 'static,
{
    let mut rng = Rng(seed | 1);
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if to.send(WsMessage::binary(frame)).await.is_err() {
                break;
            }
        }
    });
    while let Some(Ok(message)) = from.next().await {
        let WsMessage::Binary(bytes) = message else {
            if matches!(message, WsMessage::Close(_)) {
                break;
            }
            continue;
        };
        if let Some(record) = &record {
            record.lock().unwrap().push(bytes.to_vec());
        }
        if rng.next() % 100 < faults.drop_percent {
            dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let copies = if rng.next() % 100 < faults.duplicate_percent {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = if faults.max_delay_ms == 0 {
                0
            } else {
                rng.next() % (faults.max_delay_ms + 1)
            };
            let tx = tx.clone();
            let frame = bytes.to_vec();
            if delay == 0 {
                let _ = tx.send(frame);
            } else {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let _ = tx.send(frame);
                });
            }
        }
    }
    writer.abort();
}
