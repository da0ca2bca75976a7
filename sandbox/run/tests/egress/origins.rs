//! The origin server on the host's 127.0.0.1 that most cases reach: it counts connections and
//! request bytes, records request lines, and serves a page, a package index and an endless
//! stream.

use super::*;

/// An origin server on the host's 127.0.0.1 that counts connections and request bytes.
///
/// Paths: `/hello`, `/simple/demo/` (a PEP 503 index), `/files/<wheel>`, `/stream` (endless
/// body; announces itself on `streams`); a connection that sends no request is held open until
/// the client closes it.
pub(crate) struct Origin {
    pub(crate) port: u16,
    pub(crate) connections: Arc<AtomicUsize>,
    pub(crate) bytes_in: Arc<AtomicUsize>,
    pub(crate) streams: Mutex<mpsc::Receiver<()>>,
    /// The request line of every request served, in order.
    pub(crate) requests: Arc<Mutex<Vec<String>>>,
}

impl Origin {
    pub(crate) fn start(wheel: Option<(String, Vec<u8>)>) -> Self {
        Self::start_on("127.0.0.1:0", wheel)
    }

    /// An origin listening on `bind` (`[::]:0`: every address of its network namespace).
    pub(crate) fn start_on(bind: &str, wheel: Option<(String, Vec<u8>)>) -> Self {
        let listener = TcpListener::bind(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let bytes_in = Arc::new(AtomicUsize::new(0));
        let (stream_tx, streams) = mpsc::channel();
        let (counted, bytes) = (Arc::clone(&connections), Arc::clone(&bytes_in));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        let wheel = Arc::new(wheel);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                let (bytes, wheel, stream_tx, recorded) = (
                    Arc::clone(&bytes),
                    Arc::clone(&wheel),
                    stream_tx.clone(),
                    Arc::clone(&recorded),
                );
                std::thread::spawn(move || serve(stream, &bytes, &wheel, &stream_tx, &recorded));
            }
        });
        Self {
            port,
            connections,
            bytes_in,
            streams: Mutex::new(streams),
            requests,
        }
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

pub(crate) fn serve(
    mut stream: TcpStream,
    bytes: &AtomicUsize,
    wheel: &Option<(String, Vec<u8>)>,
    streams: &mpsc::Sender<()>,
    requests: &Mutex<Vec<String>>,
) {
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                bytes.fetch_add(n, Ordering::SeqCst);
                head.extend_from_slice(&chunk[..n]);
            }
        }
    }
    let line = text(&head);
    requests
        .lock()
        .unwrap()
        .push(line.lines().next().unwrap_or_default().to_owned());
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let respond = |stream: &mut TcpStream, kind: &str, body: &[u8]| {
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(body);
    };
    match (path.as_str(), wheel) {
        ("/hello", _) => respond(&mut stream, "text/plain", b"hello from origin\n"),
        ("/simple/demo/", Some((name, _))) => {
            let page = format!(
                "<!DOCTYPE html><html><body><a href=\"/files/{name}\">{name}</a></body></html>"
            );
            respond(&mut stream, "text/html", page.as_bytes());
        }
        (files, Some((name, data))) if files == format!("/files/{name}") => {
            respond(&mut stream, "application/octet-stream", data);
        }
        ("/stream", _) => {
            // A framed body: an early end is an error for the client, not a complete file.
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                  Content-Length: 1099511627776\r\n\r\n",
            );
            let _ = streams.send(());
            let block = vec![b'x'; 64 * 1024];
            while stream.write_all(&block).is_ok() {}
        }
        _ => {
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        }
    }
}
