//! Hostile clients against the real server: oversized and malformed frames, floods that do not
//! read, slow and vanishing connections, bad base64, path tricks and absurd numbers. Each gets a
//! clear error or a clean close, and the server keeps serving everyone else.
//!
//! Limits are the ones of docs/protocol.md; the numbers are repeated here as the wire contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::siege::Siege;
use tests::{
    Client, DEADLINE, ExecServer, RawEnd, assert_rpc_error, b64, fd_count, file_uri, opcode,
    raw_websocket, read_raw_frame, read_until_closed, rss_kib, sh, unb64, ws_frame,
    ws_frame_header,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `MAX_FRAME_BYTES`: larger messages or frames close the connection with 1009.
const MAX_FRAME_BYTES: u64 = 64 * 1024 * 1024;
/// `UPGRADE_HEAD_TIMEOUT`: the whole HTTP head must arrive within this.
const UPGRADE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// `MAX_UPGRADE_HEAD_BYTES`.
const MAX_UPGRADE_HEAD_BYTES: usize = 16 * 1024;
/// `READ_BLOCK_MAX_BYTES`.
const READ_BLOCK_MAX_BYTES: u64 = 1024 * 1024;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// A server for a case measured beside a neighbour (see `tests::siege::isolate_from_host_load`).
fn besieged_server(args: &[&str]) -> ExecServer {
    let mut all = vec!["--listen", "ws://127.0.0.1:0"];
    all.extend_from_slice(args);
    ExecServer::start_with(&all, tests::siege::isolate_from_host_load)
}

/// One round trip that touches the filesystem: the server is alive and serving `client`.
async fn assert_serving(client: &mut Client) {
    let started = Instant::now();
    client
        .call("fs/getMetadata", json!({"path": "file:///"}))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a trivial request took {:?}",
        started.elapsed()
    );
}

/// A `cat` with piped stdin on `client`: proves a session with a live process is unaffected.
async fn start_echo(client: &mut Client, id: &str) {
    client
        .start(id, &["/bin/cat"], json!({"pipeStdin": true}))
        .await
        .unwrap();
}

async fn assert_echoes(client: &mut Client, id: &str, text: &str) {
    client
        .call(
            "process/write",
            json!({"processId": id, "chunk": b64(text)}),
        )
        .await;
    client.wait_for_output(id, text).await;
}

/// The next message must be an error response with id -1 and code -32600.
async fn expect_envelope_error(client: &mut Client, what: &str) -> Value {
    let message = client
        .next_message(DEADLINE)
        .await
        .unwrap_or_else(|| panic!("no answer to {what} within {DEADLINE:?}"));
    assert_eq!(message["id"], -1, "{what}: {message}");
    assert_eq!(message["error"]["code"], -32600, "{what}: {message}");
    message
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn message_fragmented_past_the_frame_limit_closes_with_1009_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    start_echo(&mut other, "echo").await;
    // Frames of 8 MiB each are all under the limit; the message they add up to (72 MiB) is not.
    // The server must stop at the limit instead of buffering the whole message.
    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let upload = tokio::spawn(async move {
        let piece = vec![b'a'; 8 * 1024 * 1024];
        let frames = (MAX_FRAME_BYTES / piece.len() as u64) + 1;
        for i in 0..frames {
            let (fin, code) = (i + 1 == frames, if i == 0 { opcode::BINARY } else { 0 });
            let header = ws_frame_header(fin, code, piece.len() as u64);
            if writer.write_all(&header).await.is_err() || writer.write_all(&piece).await.is_err() {
                return i; // the server closed: it did not take the rest
            }
        }
        frames
    });
    // The other session is served while the upload is in progress.
    assert_echoes(&mut other, "echo", "during the upload\n").await;
    let end = read_until_closed(&mut reader, DEADLINE).await;
    assert_eq!(
        end,
        RawEnd::Close(1009),
        "close code for a too-large message"
    );
    tokio::time::timeout(DEADLINE, upload)
        .await
        .unwrap()
        .unwrap();
    assert_echoes(&mut other, "echo", "after the upload\n").await;
    assert_serving(&mut server.client().await).await;
}

#[tokio::test]
async fn frame_declaring_an_absurd_length_is_refused_from_its_header() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    for (what, len) in [
        (
            "2^63 - 1 bytes, the largest length RFC 6455 allows",
            i64::MAX as u64,
        ),
        ("one byte past MAX_FRAME_BYTES", MAX_FRAME_BYTES + 1),
    ] {
        let mut stream = raw_websocket(server.addr()).await;
        let mut frame = ws_frame_header(true, opcode::TEXT, len);
        frame.extend_from_slice(b"{\"id\":1");
        stream.write_all(&frame).await.unwrap();
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert_eq!(end, RawEnd::Close(1009), "{what}");
    }
    assert_serving(&mut other).await;
}

#[tokio::test]
async fn deeply_nested_json_gets_an_error_and_the_connection_keeps_serving() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    let depth = 100_000;
    let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    client.send_text(arrays).await;
    let error = expect_envelope_error(&mut client, "100,000 nested arrays").await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{error}"
    );
    // Deep params inside an otherwise valid request: the parser's depth limit answers it, the
    // server does not recurse 100,000 frames deep building or dropping the value.
    let params = format!("{}{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    client
        .send_text(format!(
            r#"{{"id":7,"method":"fs/getMetadata","params":{params}}}"#
        ))
        .await;
    expect_envelope_error(&mut client, "100,000 nested objects in params").await;
    // Unclosed nesting (a truncated document) is an error too.
    client.send_text("[".repeat(depth)).await;
    expect_envelope_error(&mut client, "100,000 unclosed arrays").await;
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn invalid_utf8_in_a_text_frame_closes_cleanly_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    start_echo(&mut other, "echo").await;
    for payload in [
        &b"{\"id\":1,\"method\":\"\xff\xfe\"}"[..],
        b"\xc0\xaf",                     // overlong encoding of '/'
        b"\xed\xa0\x80",                 // a UTF-16 surrogate
        b"{\"a\":\"\xf4\x90\x80\x80\"}", // past U+10FFFF
    ] {
        let mut stream = raw_websocket(server.addr()).await;
        stream
            .write_all(&ws_frame(true, opcode::TEXT, payload))
            .await
            .unwrap();
        // RFC 6455: invalid UTF-8 in a text frame closes with 1007, this connection only.
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert!(
            matches!(end, RawEnd::Close(1007)),
            "invalid UTF-8 {payload:?} in a text frame: {end:?}"
        );
    }
    // The same bytes in a binary frame are a JSON-RPC error, not a close.
    let mut client = server.client().await;
    client
        .send_binary(b"{\"id\":1,\"method\":\"\xff\xfe\"}".to_vec())
        .await;
    expect_envelope_error(&mut client, "invalid UTF-8 in a binary frame").await;
    assert_serving(&mut client).await;
    assert_echoes(&mut other, "echo", "still here\n").await;
}

/// Deterministic pseudo-random bytes (xorshift), so a failure can be replayed.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[tokio::test]
async fn binary_garbage_frames_get_errors_and_the_connection_keeps_serving() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    for seed in 1..=50u64 {
        let len = (seed as usize * 997) % 70_000 + 1;
        client.send_binary(garbage(seed, len)).await;
        expect_envelope_error(&mut client, &format!("garbage seed {seed} ({len} bytes)")).await;
    }
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn garbage_instead_of_websocket_frames_closes_the_connection_and_others_keep_working() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    let unmasked = {
        let mut frame = ws_frame(true, opcode::TEXT, b"{}");
        frame[1] &= 0x7F; // clear the mask bit; drop the key
        frame.drain(2..6);
        frame
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("reserved opcode 0x3", ws_frame(true, 0x3, b"x")),
        ("RSV1 set without an extension", {
            let mut frame = ws_frame(true, opcode::TEXT, b"{}");
            frame[0] |= 0x40;
            frame
        }),
        ("an unmasked client frame", unmasked),
        (
            "a continuation with nothing to continue",
            ws_frame(true, opcode::CONTINUATION, b"x"),
        ),
        ("a fragmented ping", ws_frame(false, 0x9, b"x")),
        ("random bytes", garbage(7, 4096)),
    ];
    for (what, bytes) in cases {
        let mut stream = raw_websocket(server.addr()).await;
        let _ = stream.write_all(&bytes).await;
        let end = read_until_closed(&mut stream, DEADLINE).await;
        assert!(
            matches!(end, RawEnd::Close(1002 | 1000) | RawEnd::Eof),
            "{what}: {end:?}"
        );
    }
    assert_serving(&mut other).await;
}

// ---------------------------------------------------------------------------------------------
// Floods and slow or vanishing clients
// ---------------------------------------------------------------------------------------------

/// `{"id":N,...}` → N without parsing the whole (large) response.
fn response_id(payload: &[u8]) -> Option<i64> {
    let rest = payload.strip_prefix(b"{\"id\":")?;
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit() && *b != b'-')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

#[tokio::test]
async fn ten_thousand_unread_requests_meet_backpressure_and_memory_stays_bounded() {
    let _turn = tests::siege::beside_sieges().await;
    const REQUESTS: i64 = 10_000;
    // Each response carries 8 KiB of file as base64: about 11 KB on the wire. If the server
    // buffered every response for a client that does not read, that is 10,000 x 11 KB = 105 MiB.
    // Bounded as documented it holds at most OUTBOUND_QUEUE_MESSAGES (1024) queued plus
    // MAX_INFLIGHT_REQUESTS (128) pending responses, about 13 MiB, and stops reading the socket.
    // Allowed growth: 40 MiB (that plus allocator slack and blocking-pool stacks), well under
    // the unbounded figure.
    const ALLOWED_GROWTH_KIB: u64 = 40 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("8k");
    std::fs::write(&file, garbage(3, 8 * 1024)).unwrap();
    let request = |id: i64| {
        json!({"id": id, "method": "fs/readFile", "params": {"path": file_uri(&file)}}).to_string()
    };
    let server = server();
    let mut other = server.client().await;

    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let init = r#"{"id":0,"method":"initialize","params":{"clientName":"flood"}}"#;
    writer
        .write_all(&ws_frame(true, opcode::TEXT, init.as_bytes()))
        .await
        .unwrap();
    let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response_id(&answer), Some(0));
    // Warm up: the blocking pool grows to MAX_INFLIGHT_REQUESTS threads and the allocator to its
    // working size, so the baseline below is the steady state.
    for id in 1..=300 {
        writer
            .write_all(&ws_frame(true, opcode::TEXT, request(id).as_bytes()))
            .await
            .unwrap();
    }
    for _ in 1..=300 {
        tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
            .await
            .unwrap()
            .unwrap();
    }
    let baseline = rss_kib(server.pid());

    let frames: Vec<u8> = (1000..1000 + REQUESTS)
        .flat_map(|id| ws_frame(true, opcode::TEXT, request(id).as_bytes()))
        .collect();
    let flood = tokio::spawn(async move {
        writer.write_all(&frames).await.unwrap();
        writer
    });
    // While the flood sits unread, watch the server's memory and keep another client served.
    let mut peak = baseline;
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        peak = peak.max(rss_kib(server.pid()));
        assert_serving(&mut other).await;
        tokio::time::sleep(Duration::from_millis(50)).await; // sampling interval
    }
    let growth = peak.saturating_sub(baseline);
    eprintln!(
        "RSS baseline {baseline} KiB, peak {peak} KiB while 10,000 responses were unread \
         (growth {growth} KiB, allowed {ALLOWED_GROWTH_KIB} KiB)"
    );
    assert!(
        growth <= ALLOWED_GROWTH_KIB,
        "server RSS grew by {growth} KiB (from {baseline} to {peak}) while a client did not \
         read; allowed {ALLOWED_GROWTH_KIB} KiB"
    );
    // Now read: every request is answered exactly once, nothing was dropped.
    let mut seen = HashSet::new();
    let drain = async {
        while seen.len() < REQUESTS as usize {
            let (_, payload) = read_raw_frame(&mut reader).await.expect("connection open");
            let id = response_id(&payload).unwrap_or_else(|| {
                panic!(
                    "unexpected frame {:?}",
                    String::from_utf8_lossy(&payload[..80])
                )
            });
            assert!(
                payload.windows(12).any(|w| w == b"\"dataBase64\""),
                "id {id} failed"
            );
            assert!(seen.insert(id), "response {id} arrived twice");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), drain)
        .await
        .unwrap_or_else(|_| panic!("only {} of {REQUESTS} responses arrived", seen.len()));
    tokio::time::timeout(DEADLINE, flood)
        .await
        .unwrap()
        .unwrap();
    assert_serving(&mut other).await;
}

#[tokio::test]
async fn slowloris_upgrade_is_dropped_at_the_head_timeout_while_others_are_served() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let connected = Instant::now();
    let head =
        b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n";
    // One byte a second; the server must drop the connection once UPGRADE_HEAD_TIMEOUT passed,
    // long before the head could ever complete.
    let slow = async {
        let mut answer = [0u8; 64];
        for byte in head.iter().cycle() {
            tokio::select! {
                read = stream.read(&mut answer) => return (read.map_or(0, |n| n), connected.elapsed()),
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if stream.write_all(&[*byte]).await.is_err() {
                return (0, connected.elapsed());
            }
        }
        unreachable!("the head cycles forever")
    };
    let others = async {
        // Meanwhile other clients connect, initialize and run processes as usual.
        let mut served = 0;
        while connected.elapsed() < UPGRADE_HEAD_TIMEOUT - Duration::from_millis(500) {
            let mut client = server.client().await;
            assert_serving(&mut client).await;
            let out = client.run("p", &sh("echo ok"), json!({})).await;
            assert_eq!(out.stdout_text(), "ok\n");
            served += 1;
            tokio::time::sleep(Duration::from_millis(100)).await; // pacing, not a wait
        }
        served
    };
    let deadline = UPGRADE_HEAD_TIMEOUT + Duration::from_secs(3);
    let ((answered, dropped_after), served) =
        tokio::time::timeout(deadline, async { tokio::join!(slow, others) })
            .await
            .unwrap_or_else(|_| panic!("the slow connection was still open after {deadline:?}"));
    assert_eq!(answered, 0, "the server must close without answering");
    assert!(
        dropped_after >= UPGRADE_HEAD_TIMEOUT - Duration::from_millis(500)
            && dropped_after <= UPGRADE_HEAD_TIMEOUT + Duration::from_secs(2),
        "dropped after {dropped_after:?}; expected about {UPGRADE_HEAD_TIMEOUT:?}"
    );
    assert!(served >= 3, "only {served} clients were served meanwhile");
}

#[tokio::test]
async fn oversized_upgrade_head_is_dropped_without_waiting_for_its_end() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let mut head = b"GET / HTTP/1.1\r\nX-Filler: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', MAX_UPGRADE_HEAD_BYTES + 4096));
    let started = Instant::now();
    let _ = stream.write_all(&head).await; // no blank line: the head never ends
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
        .await
        .expect("the server must close an oversized head");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "closed after {:?}, not at once",
        started.elapsed()
    );
    assert_serving(&mut server.client().await).await;
}

#[tokio::test]
async fn client_vanishing_mid_frame_detaches_its_session_and_frees_its_descriptors() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let baseline = fd_count(server.pid());
    let mut gone = server.connect().await;
    let session = gone.initialize().await;
    gone.start("sleeper", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    gone.call(
        "fs/open",
        json!({"handleId": "h", "path": "file:///etc/hostname"}),
    )
    .await;
    // Half a frame: a header announcing 1,000 bytes and 10 of them, then the socket is gone.
    let mut partial = ws_frame_header(true, opcode::TEXT, 1000);
    partial.extend_from_slice(b"{\"id\":99,\"");
    gone.send_raw_bytes(&partial).await;
    drop(gone);
    // The server notices: the session can be resumed from a new connection (not
    // sessionAttached forever), its process is still running, and nothing leaked.
    let mut back = server.connect().await;
    let started = Instant::now();
    loop {
        let resumed = back
            .request(
                "initialize",
                json!({"clientName": "back", "resumeSessionId": session}),
            )
            .await;
        match resumed {
            Ok(result) => {
                assert_eq!(result["sessionId"], session);
                break;
            }
            Err(error) if tests::error_kind(&error) == "sessionAttached" => {
                assert!(
                    started.elapsed() < DEADLINE,
                    "the vanished connection still holds its session after {DEADLINE:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await; // retry interval
            }
            Err(error) => panic!("resume failed: {error:?}"),
        }
    }
    let read = back
        .call("process/read", json!({"processId": "sleeper"}))
        .await;
    assert_eq!(read["exited"], false, "the process outlives its connection");
    let r = back
        .request(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 1}),
        )
        .await;
    assert_rpc_error(r, -32004, "notFound");
    back.call("process/terminate", json!({"processId": "sleeper"}))
        .await;
    back.collect("sleeper").await;
    back.close().await;
    let started = Instant::now();
    while fd_count(server.pid()) > baseline {
        assert!(
            started.elapsed() < DEADLINE,
            "server descriptors: {} now, {baseline} before the vanished client",
            fd_count(server.pid())
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }
}

// ---------------------------------------------------------------------------------------------
// Bad payloads and paths
// ---------------------------------------------------------------------------------------------

/// Strings that are not standard padded base64, each with what is wrong with it.
fn invalid_base64() -> Vec<(&'static str, String)> {
    vec![
        ("punctuation", "not base64!".into()),
        ("missing padding", "aGk".into()),
        ("padding in the middle", "aG==aGk=".into()),
        ("embedded whitespace", "aGVs bG8=".into()),
        ("a newline", "aGVs\nbG8=".into()),
        ("the URL-safe alphabet", "-_-_".into()),
        ("non-ASCII", "aGVsbG8é".into()),
        ("4 MiB of '*'", "*".repeat(4 * 1024 * 1024)),
    ]
}

#[tokio::test]
async fn invalid_base64_is_refused_and_never_truncates_the_target() {
    let _turn = tests::siege::beside_sieges().await;
    let workspace = tempfile::Builder::new()
        .prefix("ew-hostile-")
        .tempdir_in("/tmp")
        .unwrap();
    let target = workspace.path().join("target.txt");
    std::fs::write(&target, b"original").unwrap();
    let server = server();
    let mut client = server.client().await;
    start_echo(&mut client, "cat").await;
    let sandbox = json!({"profile": "workspace-write", "cwd": file_uri(workspace.path())});
    for (what, text) in invalid_base64() {
        for (how, sandbox) in [("unsandboxed", Value::Null), ("sandboxed", sandbox.clone())] {
            let r = client
                .request(
                    "fs/writeFile",
                    json!({"path": file_uri(&target), "dataBase64": text, "sandbox": sandbox}),
                )
                .await;
            let error = assert_rpc_error(r, -32602, "invalidBase64");
            assert!(error.message.contains("base64"), "{how} {what}: {error:?}");
            assert_eq!(std::fs::read(&target).unwrap(), b"original", "{how} {what}");
        }
        let r = client
            .request("process/write", json!({"processId": "cat", "chunk": text}))
            .await;
        let error = assert_rpc_error(r, -32602, "invalidBase64");
        assert!(
            error.message.contains("base64"),
            "process/write {what}: {error:?}"
        );
    }
    // Nothing half-decoded reached the process; a valid write still does.
    assert_echoes(&mut client, "cat", "valid\n").await;
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    let out = client.collect("cat").await;
    assert_eq!(
        out.stdout_text(),
        "",
        "only the valid write reached cat: {out:?}"
    );
}

/// A workspace under /tmp and a sentinel file outside every writable root.
struct Traversal {
    workspace: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Traversal {
    fn new() -> Traversal {
        let tests::SandboxDirs { workspace, outside } = tests::SandboxDirs::new();
        Traversal { workspace, outside }
    }

    /// `file://<workspace>/../../<rest>`: a URI that starts inside the workspace and climbs out.
    fn climbing(&self, rest: &Path, dots: &str) -> String {
        let ws = file_uri(self.workspace.path());
        let rest = file_uri(rest);
        format!("{ws}/{dots}/{dots}{}", rest.trim_start_matches("file://"))
    }

    fn secret(&self) -> PathBuf {
        self.outside.path().join("secret.txt")
    }
}

#[tokio::test]
async fn path_traversal_under_a_sandbox_cannot_write_outside() {
    let _turn = tests::siege::beside_sieges().await;
    let t = Traversal::new();
    // Probes in /etc are new names, never /etc/passwd itself: if the sandbox failed, the test
    // must not damage the machine it runs on. Removed below if they ever appear.
    let etc_probe = PathBuf::from(format!("/etc/ew-hostile-probe-{}", std::process::id()));
    let server = server();
    let mut client = server.client().await;
    let policies = [
        ("read-only", json!({"profile": "read-only"})),
        (
            "workspace-write",
            json!({"profile": "workspace-write", "cwd": file_uri(t.workspace.path())}),
        ),
    ];
    let mut attempts: Vec<(String, &str, Value)> = Vec::new();
    for dots in ["..", "%2E%2E", "%2e."] {
        let secret = t.climbing(&t.secret(), dots);
        let probe = t.climbing(&etc_probe, dots);
        attempts.extend([
            (
                format!("writeFile {secret}"),
                "fs/writeFile",
                json!({"path": secret, "dataBase64": b64("pwned")}),
            ),
            (
                format!("atomic writeFile {secret}"),
                "fs/writeFile",
                json!({"path": secret, "dataBase64": b64("pwned"), "atomic": true}),
            ),
            (
                format!("remove {secret}"),
                "fs/remove",
                json!({"path": secret}),
            ),
            (
                format!("copy onto {secret}"),
                "fs/copy",
                json!({"sourcePath": file_uri(t.workspace.path().join("..")), "destinationPath": secret, "recursive": true}),
            ),
            (
                format!("writeFile {probe}"),
                "fs/writeFile",
                json!({"path": probe, "dataBase64": b64("pwned")}),
            ),
            (
                format!("createDirectory {probe}"),
                "fs/createDirectory",
                json!({"path": probe}),
            ),
        ]);
    }
    attempts.push((
        "writeFile file:///tmp/../etc/<probe>".into(),
        "fs/writeFile",
        json!({"path": format!("file:///tmp/..{}", etc_probe.display()), "dataBase64": b64("x")}),
    ));
    let mut escaped = Vec::new();
    for (policy_name, policy) in &policies {
        for (what, method, params) in &attempts {
            let mut params = params.clone();
            params["sandbox"] = policy.clone();
            let r = client.request(method, params).await;
            match &r {
                Err(error) if tests::error_kind(error) == "sandboxDenied" => {}
                // A copy of /tmp fails on something it cannot read before reaching its
                // destination; that is a refusal too, as long as nothing was written.
                Err(error) if *method == "fs/copy" && error.code != 0 => {}
                other => escaped.push(format!("{policy_name}: {what} -> {other:?}")),
            }
        }
    }
    // A sandboxed process climbing out with `..` is stopped the same way.
    let script = format!(
        "echo pwned > {ws}/../..{secret}; echo pwned > /tmp/..{probe}; echo done",
        ws = t.workspace.path().display(),
        secret = t.secret().display(),
        probe = etc_probe.display()
    );
    let out = client
        .run(
            "climb",
            &sh(&script),
            json!({"sandbox": policies[1].1.clone()}),
        )
        .await;
    assert_eq!(out.stdout_text(), "done\n", "{out:?}");
    let probe_exists = etc_probe.exists();
    if probe_exists {
        let _ = std::fs::remove_file(&etc_probe);
        let _ = std::fs::remove_dir_all(&etc_probe);
    }
    assert_eq!(std::fs::read(t.secret()).unwrap(), b"outside");
    assert!(!probe_exists, "{} was created", etc_probe.display());
    assert!(escaped.is_empty(), "not denied:\n{}", escaped.join("\n"));
}

#[tokio::test]
async fn non_utf8_paths_are_served_inside_the_sandbox_and_denied_outside() {
    let _turn = tests::siege::beside_sieges().await;
    let t = Traversal::new();
    let ws = file_uri(t.workspace.path());
    let out = file_uri(t.outside.path());
    let server = server();
    let mut client = server.client().await;
    let sandbox = json!({"profile": "workspace-write", "cwd": ws});
    let name = "%FF%FEname%80.txt";
    client
        .call(
            "fs/writeFile",
            json!({"path": format!("{ws}/{name}"), "dataBase64": b64("bytes"), "sandbox": sandbox}),
        )
        .await;
    let listed = client
        .call("fs/readDirectory", json!({"path": ws, "sandbox": sandbox}))
        .await;
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec![format!("{ws}/{name}")], "exact non-UTF-8 path");
    let read = client
        .call("fs/readFile", json!({"path": paths[0], "sandbox": sandbox}))
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"bytes");
    let r = client
        .request(
            "fs/writeFile",
            json!({"path": format!("{out}/{name}"), "dataBase64": b64("x"), "sandbox": sandbox}),
        )
        .await;
    assert_rpc_error(r, -32600, "sandboxDenied");
    // A sandboxed start needs a UTF-8 cwd (sandbox-run takes it as an argument): a clear
    // refusal, never a start in some other directory.
    client
        .call(
            "fs/createDirectory",
            json!({"path": format!("{ws}/dir%FF"), "sandbox": sandbox}),
        )
        .await;
    let r = client
        .request(
            "process/start",
            json!({"processId": "p", "argv": ["/bin/pwd"], "cwd": format!("{ws}/dir%FF"),
                   "env": {}, "sandbox": {"profile": "read-only"}}),
        )
        .await;
    let error = assert_rpc_error(r, -32602, "invalidParams");
    assert!(error.message.contains("UTF-8"), "{error:?}");
    // Unsandboxed, the same directory is a fine cwd.
    let run = client
        .run("q", &["/bin/pwd"], json!({"cwd": format!("{ws}/dir%FF")}))
        .await;
    assert_eq!(
        run.stdout,
        [
            t.workspace.path().as_os_str().as_encoded_bytes(),
            b"/dir\xff\n"
        ]
        .concat()
    );
    // %00 can never name a path.
    let r = client
        .request("fs/getMetadata", json!({"path": format!("{ws}/a%00b")}))
        .await;
    assert_rpc_error(r, -32602, "invalidPath");
}

// ---------------------------------------------------------------------------------------------
// Absurd numbers
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn absurd_read_parameters_are_capped_or_refused_promptly() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    start_echo(&mut client, "cat").await;
    assert_echoes(&mut client, "cat", "line\n").await;
    let quick = Duration::from_secs(3);
    // Capped: u64::MAX bytes is MAX_READ_BYTES; the answer is immediate because output exists.
    let started = Instant::now();
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "cat", "maxBytes": u64::MAX, "waitMs": u64::MAX}),
            quick,
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"].as_array().unwrap().len(), 1, "{read}");
    assert!(started.elapsed() < quick);
    // A cursor past everything that will ever exist: an empty answer, not a crash.
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "cat", "afterSeq": u64::MAX}),
            quick,
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"], json!([]), "{read}");
    // A long-poll with an absurd waitMs returns as soon as output appears.
    let poll = client
        .send_request(
            "process/read",
            json!({"processId": "cat", "afterSeq": 1, "waitMs": u64::MAX}),
        )
        .await;
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("more\n")}),
        )
        .await;
    let read = client
        .response_within(&poll, quick, "long-poll woken by output")
        .await
        .unwrap();
    assert_eq!(read["chunks"][0]["seq"], 2, "{read}");
    // Out of the domain of the field: refused by name, never silently clamped.
    for (what, params) in [
        (
            "negative maxBytes",
            json!({"processId": "cat", "maxBytes": -1}),
        ),
        (
            "fractional waitMs",
            json!({"processId": "cat", "waitMs": 1.5}),
        ),
        (
            "waitMs past u64",
            json!({"processId": "cat", "waitMs": 1e30}),
        ),
        (
            "string afterSeq",
            json!({"processId": "cat", "afterSeq": "1"}),
        ),
    ] {
        let r = client.request_within("process/read", params, quick).await;
        assert_rpc_error(r, -32602, "invalidParams");
        let _ = what;
    }
    assert_serving(&mut client).await;
}

#[tokio::test]
async fn long_poll_on_a_closed_process_returns_at_once_whatever_wait_ms_says() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut client = server.client().await;
    let out = client.run("done", &sh("echo bye"), json!({})).await;
    let last = *tests::seqs(&out.events).last().unwrap();
    // Nothing can follow `closed`: waiting would only hold a request slot for MAX_WAIT_MS.
    let started = Instant::now();
    let read = client
        .request_within(
            "process/read",
            json!({"processId": "done", "afterSeq": last, "waitMs": u64::MAX}),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert_eq!(read["chunks"], json!([]), "{read}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn absurd_block_terminal_and_signal_parameters_get_clear_errors() {
    let _turn = tests::siege::beside_sieges().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"0123456789").unwrap();
    let server = server();
    let mut client = server.client().await;
    client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&file)}))
        .await;
    for len in [u64::MAX, READ_BLOCK_MAX_BYTES + 1] {
        let r = client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": 0, "len": len}),
            )
            .await;
        let error = assert_rpc_error(r, -32602, "invalidParams");
        assert!(error.message.contains("READ_BLOCK_MAX_BYTES"), "{error:?}");
    }
    // An offset far past the end is an empty block at EOF, or an out-of-range error: never a
    // hang or a crash.
    for offset in [u64::MAX, i64::MAX as u64, 1 << 40] {
        match client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": offset, "len": 10}),
            )
            .await
        {
            Ok(block) => assert_eq!(block, json!({"chunk": "", "eof": true}), "offset {offset}"),
            Err(error) => assert_eq!(error.code, -32602, "offset {offset}: {error:?}"),
        }
    }
    // Terminal sizes: u16 is the domain; 0 is refused by name, 65535 is a (huge) terminal.
    let r = client
        .start(
            "big",
            &["/bin/true"],
            json!({"tty": true, "cols": 70000, "rows": 1}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let out = client
        .run(
            "huge",
            &sh("stty size"),
            json!({"tty": true, "cols": 65535, "rows": 65535}),
        )
        .await;
    assert_eq!(out.pty_text().trim(), "65535 65535");
    client
        .start("tty", &["/bin/cat"], json!({"tty": true}))
        .await
        .unwrap();
    let r = client
        .request(
            "process/resize",
            json!({"processId": "tty", "cols": 0, "rows": 0}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let r = client
        .request(
            "process/signal",
            json!({"processId": "tty", "signal": "SIGKILL; rm -rf /"}),
        )
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    let r = client
        .request("process/signal", json!({"processId": "tty", "signal": 9}))
        .await;
    assert_rpc_error(r, -32602, "invalidParams");
    client
        .call("process/terminate", json!({"processId": "tty"}))
        .await;
    assert_serving(&mut client).await;
}

// ---------------------------------------------------------------------------------------------
// Budgets: each case runs beside a neighbour session (tests::siege) whose requests must all
// succeed with a p99 under 50 ms, with the server in a memory cgroup where the host allows, its
// RSS under the bound the case states, and its descriptors back to their baseline afterwards.
// ---------------------------------------------------------------------------------------------

/// `READ_FILE_MAX_BYTES`.
const READ_FILE_MAX_BYTES: usize = 32 * 1024 * 1024;
/// `MAX_INFLIGHT_BYTES_PER_CONNECTION`: requests and unwritten answers one connection holds.
const MAX_INFLIGHT_BYTES_PER_CONNECTION: u64 = 160 * 1024 * 1024;
/// `OUTBOUND_QUEUE_BYTES`: queued notifications per connection.
const OUTBOUND_QUEUE_BYTES: u64 = 8 * 1024 * 1024;
/// `MEMORY_BUDGET_BYTES`: requests and answers across all connections.
const MEMORY_BUDGET_BYTES: u64 = 1024 * 1024 * 1024;
/// `CONNECTION_MEMORY_ALLOWANCE`: what each connection holds outside the memory budget.
const CONNECTION_MEMORY_ALLOWANCE: u64 = 2 * 1024 * 1024;
/// Allocator slack, thread stacks and transient copies (an answer is serialized while its value
/// still exists; the websocket writer copies a frame into its buffer).
const RSS_SLACK: u64 = 64 * 1024 * 1024;
/// How long a case watches the server under attack.
const ATTACK_WINDOW: Duration = Duration::from_secs(3);

fn kib(bytes: u64) -> u64 {
    bytes / 1024
}

/// A raw websocket with `initialize` answered: the hostile client controls every byte.
async fn raw_session(
    server: &ExecServer,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
) {
    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let init = r#"{"id":0,"method":"initialize","params":{"clientName":"hostile"}}"#;
    writer
        .write_all(&ws_frame(true, opcode::TEXT, init.as_bytes()))
        .await
        .unwrap();
    let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        response_id(&answer),
        Some(0),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    (reader, writer)
}

/// Watch for `window` (the attack is underway meanwhile; the siege samples RSS).
async fn under_attack_for(window: Duration) {
    tokio::time::sleep(window).await; // observation window, not a wait for a condition
}

fn big_file(dir: &Path) -> PathBuf {
    let file = dir.join("32m");
    std::fs::write(&file, garbage(11, READ_FILE_MAX_BYTES)).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_reads_of_a_client_that_stops_reading_hold_one_connection_budget() {
    let dir = tempfile::tempdir().unwrap();
    let file = file_uri(big_file(dir.path()));
    let server = besieged_server(&[]);
    let bound = MAX_INFLIGHT_BYTES_PER_CONNECTION + OUTBOUND_QUEUE_BYTES + RSS_SLACK;
    let siege = Siege::begin(&server, "40 pipelined fs/readFile", bound * 3).await;
    let (reader, mut writer) = raw_session(&server).await;
    let frames: Vec<u8> = (1..=40)
        .flat_map(|id| {
            let request = json!({"id": id, "method": "fs/readFile", "params": {"path": file}});
            ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
        })
        .collect();
    writer.write_all(&frames).await.unwrap();
    under_attack_for(ATTACK_WINDOW).await;
    drop((reader, writer));
    let report = siege.end(&server).await;
    report.assert_held("40 pipelined 32 MiB reads, never read", kib(bound));
    // Gone, the client's buffered requests are not worked on: the reads in flight end and the
    // socket closes at once (serving them all for nobody kept it open for 7 s, 14 s under load).
    assert!(
        report.fds_settled_in < Duration::from_secs(2),
        "the server took {:?} to let go of a client that left with 40 reads pending",
        report.fds_settled_in
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_of_large_reads_meet_the_server_memory_budget() {
    const CONNECTIONS: u64 = 8;
    let dir = tempfile::tempdir().unwrap();
    let file = file_uri(big_file(dir.path()));
    let server = besieged_server(&[]);
    // Eight connections could hold 8 x MAX_INFLIGHT_BYTES_PER_CONNECTION (1.25 GiB); the
    // memory budget refuses what is past MEMORY_BUDGET_BYTES.
    let bound = MEMORY_BUDGET_BYTES
        + CONNECTIONS * (CONNECTION_MEMORY_ALLOWANCE + OUTBOUND_QUEUE_BYTES)
        + RSS_SLACK;
    let siege = Siege::begin(&server, "8 connections of reads", bound + RSS_SLACK).await;
    let mut hostile = Vec::new();
    for _ in 0..CONNECTIONS {
        let (reader, mut writer) = raw_session(&server).await;
        let frames: Vec<u8> = (1..=5)
            .flat_map(|id| {
                let request = json!({"id": id, "method": "fs/readFile", "params": {"path": file}});
                ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
            })
            .collect();
        writer.write_all(&frames).await.unwrap();
        hostile.push((reader, writer));
    }
    under_attack_for(ATTACK_WINDOW).await;
    // A client asking for a large read now gets the file or a retryable refusal that names
    // the budget, never a hang or a dead server.
    let (mut reader, mut writer) = raw_session(&server).await;
    let request = json!({"id": 1, "method": "fs/readFile", "params": {"path": file}});
    writer
        .write_all(&ws_frame(
            true,
            opcode::TEXT,
            request.to_string().as_bytes(),
        ))
        .await
        .unwrap();
    let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
        .await
        .unwrap()
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    if let Some(error) = answer.get("error") {
        assert_eq!(error["data"]["kind"], "limitExceeded", "{error}");
        assert_eq!(error["data"]["retryable"], true, "{error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("MEMORY_BUDGET_BYTES"),
            "{error}"
        );
    } else {
        assert_eq!(
            answer["result"]["dataBase64"].as_str().unwrap().len(),
            READ_FILE_MAX_BYTES.div_ceil(3) * 4
        );
    }
    drop((reader, writer, hostile));
    siege
        .end(&server)
        .await
        .assert_held("8 connections x 5 pipelined 32 MiB reads", kib(bound));
}

/// Start `sleep` with a stdin nobody reads: writes to it block once the pipe is full.
async fn blocked_stdin(client: &mut Client, id: &str) {
    client
        .start(id, &["/bin/sleep", "1000"], json!({"pipeStdin": true}))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_writes_hold_at_most_one_connection_budget_of_payload() {
    const WRITES: usize = 12;
    // Built before the siege starts: the test's own CPU work must not slow its neighbour.
    let chunk = b64(vec![b'w'; 30 * 1024 * 1024]);
    let frames: Vec<Vec<u8>> = (1..=WRITES)
        .map(|id| {
            let request = json!({"id": id, "method": "process/write",
                                 "params": {"processId": "stuck", "chunk": chunk}});
            ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
        })
        .collect();
    drop(chunk);
    let server = besieged_server(&[]);
    let bound = MAX_INFLIGHT_BYTES_PER_CONNECTION + RSS_SLACK;
    let siege = Siege::begin(&server, "blocked writes", bound * 2).await;
    let mut owner = server.connect().await;
    let session = owner.initialize().await;
    blocked_stdin(&mut owner, "stuck").await;
    // The hostile connection resumes nothing; it writes to the same session's process from a
    // second connection after the first detaches.
    owner.close().await;
    let stream = raw_websocket(server.addr()).await;
    let (mut reader, mut writer) = stream.into_split();
    let resume = json!({"id": 0, "method": "initialize",
                        "params": {"clientName": "hostile", "resumeSessionId": session}});
    let mut resumed = false;
    let started = Instant::now();
    while !resumed {
        writer
            .write_all(&ws_frame(true, opcode::TEXT, resume.to_string().as_bytes()))
            .await
            .unwrap();
        let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
            .await
            .unwrap()
            .unwrap();
        resumed = !String::from_utf8_lossy(&answer).contains("\"error\"");
        assert!(started.elapsed() < DEADLINE, "cannot resume the session");
    }
    // 12 writes of 30 MiB each: the first fills the pipe and blocks, the rest wait behind it.
    let upload = tokio::spawn(async move {
        for frame in frames {
            if writer.write_all(&frame).await.is_err() {
                break;
            }
        }
        writer
    });
    under_attack_for(ATTACK_WINDOW).await;
    // Killing the process unblocks the writes; the connection then reads and answers the rest.
    let mut killer = server.connect().await;
    killer.initialize().await;
    drop(killer);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            *tests::descendants(server.pid())
                .iter()
                .find(|pid| tests::cmdline(**pid).starts_with("/bin/sleep 1000"))
                .expect("the sleep"),
        ),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut answered = HashSet::new();
    tokio::time::timeout(Duration::from_secs(60), async {
        while answered.len() < WRITES {
            let (_, payload) = read_raw_frame(&mut reader).await.expect("connection open");
            if let Some(id) = response_id(&payload) {
                answered.insert(id);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {WRITES} writes were answered", answered.len()));
    drop(tokio::time::timeout(DEADLINE, upload).await);
    drop(reader);
    siege
        .end(&server)
        .await
        .assert_held("12 blocked process/write of 30 MiB", kib(bound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_write_ids_are_refused_before_any_work() {
    // Built before the siege starts: the test's own CPU work must not slow its neighbour.
    let requests = tests::siege::long_write_id_requests("cat");
    let server = besieged_server(&[]);
    let siege = Siege::begin(&server, "long writeIds", 1024 * 1024 * 1024).await;
    let mut client = server.client().await;
    start_echo(&mut client, "cat").await;
    // The ten ids, again and again for the window every case is watched for.
    let attack = Instant::now();
    let mut sent = 0;
    while sent < requests.len() || attack.elapsed() < ATTACK_WINDOW {
        // Ids are reused round after round: each is answered before the next is sent.
        let (id, request) = &requests[sent % requests.len()];
        client.send_text(request.clone()).await;
        let r = client.response(&json!(id)).await;
        let error = assert_rpc_error(r, -32600, "limitExceeded");
        assert!(error.message.contains("MAX_WRITE_ID_BYTES"), "{error:?}");
        assert!(error.message.len() < 4096, "the id is not echoed back");
        sent += 1;
    }
    // Nothing was written: the echo holds only the valid write below.
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": b64("valid\n"), "writeId": "w-1"}),
        )
        .await;
    let echoed = client.wait_for_output("cat", "valid\n").await;
    assert_eq!(echoed, "valid\n");
    client
        .call(
            "process/write",
            json!({"processId": "cat", "chunk": "", "close": true}),
        )
        .await;
    client.collect("cat").await;
    client.close().await;
    // Ten 30 MiB ids at rest were 696 MiB before; now nothing of them stays. Each frame is
    // handed on as the transport's own buffer (copying it, and freeing the original, on an
    // async worker stalled the neighbour to a p99 of about 37 ms; now about 15 ms).
    siege.end(&server).await.assert_held(
        "ten 30 MiB writeIds",
        kib(MAX_INFLIGHT_BYTES_PER_CONNECTION + RSS_SLACK),
    );
}

/// `MAX_PENDING_CONNECTIONS`: connections not yet initialized, server-wide.
const MAX_PENDING_CONNECTIONS: usize = 256;
/// `MAX_PENDING_PER_SOURCE`: of them, from one source address.
const MAX_PENDING_PER_SOURCE: usize = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_lock_out_clients_that_speak() {
    // The issue's number: 1,030 silent sockets filled every slot of the old server.
    const SILENT: usize = 1030;
    let server = besieged_server(&[]);
    let siege = Siege::begin(&server, "silent sockets", 512 * 1024 * 1024).await;
    let mut silent = Vec::with_capacity(SILENT);
    for _ in 0..SILENT {
        silent.push(tokio::net::TcpStream::connect(server.addr()).await.unwrap());
    }
    // Far more silent sockets than the pending pool holds: a new client still gets in, again
    // and again, while they stay connected.
    const { assert!(SILENT > 4 * MAX_PENDING_CONNECTIONS) };
    for _ in 0..5 {
        let started = Instant::now();
        let mut client = server.client().await;
        assert_serving(&mut client).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a speaking client waited {:?} behind silent sockets",
            started.elapsed()
        );
        client.close().await;
    }
    // The server holds at most the pending pool of them; the rest were closed (oldest first).
    let closed = tests::siege::closed_by_peer(&mut silent).await;
    assert!(
        closed >= SILENT - MAX_PENDING_CONNECTIONS - 5,
        "only {closed} of {SILENT} silent sockets were closed"
    );
    drop(silent);
    siege
        .end(&server)
        .await
        .assert_held("1,030 silent sockets", 64 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_clients_from_one_source_all_get_in() {
    // A harness opening 100 sessions at once from one host is not a flood: with a pending pool
    // of 16 per source, the load run's 100 concurrent sessions saw most closed before they
    // could initialize.
    const CLIENTS: usize = 100;
    const { assert!(CLIENTS < MAX_PENDING_PER_SOURCE) };
    let _turn = tests::siege::beside_sieges().await;
    let server = std::sync::Arc::new(server());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = server.client().await;
            assert_serving(&mut client).await;
            client
        }));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(
            task.await
                .expect("every client of the burst initializes and is served"),
        );
    }
    assert_eq!(clients.len(), CLIENTS);
    for client in clients {
        client.close().await;
    }
}

#[tokio::test]
async fn a_client_name_cannot_forge_log_lines_or_reach_the_terminal() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let forged = "2026-01-01T00:00:00.000000Z  INFO supervisor::server: forged line";
    let name = format!("evil\n{forged}\r\u{1b}]0;pwned\u{7}\u{9b}31m");
    let mut client = server.connect().await;
    client.call("initialize", json!({"clientName": name})).await;
    assert_serving(&mut client).await;
    client.close().await;
    // The server logs the name as the session starts, concurrently with the answer: wait for it.
    let until = Instant::now() + DEADLINE;
    let mut log = server.stderr();
    while !log.contains("forged line") && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
        log = server.stderr();
    }
    assert!(
        log.lines().any(|line| line.contains("forged line")),
        "the name is logged (escaped): {log}"
    );
    assert!(
        !log.lines().any(|line| line.starts_with(forged)),
        "a clientName forged a log line: {log}"
    );
    assert!(
        !log.contains("\u{1b}]"),
        "an OSC sequence reached the log: {log:?}"
    );
    assert!(!log.contains('\u{9b}'), "a C1 CSI reached the log: {log:?}");
    // Past MAX_CLIENT_NAME_BYTES the name is refused, not logged.
    let mut long = server.connect().await;
    let r = long
        .request("initialize", json!({"clientName": "n".repeat(10_000)}))
        .await;
    let error = assert_rpc_error(r, -32600, "limitExceeded");
    assert!(error.message.contains("MAX_CLIENT_NAME_BYTES"), "{error:?}");
    assert!(!server.stderr().contains(&"n".repeat(300)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_path_and_environment_are_refused_before_any_search() {
    let server = besieged_server(&[]);
    let siege = Siege::begin(&server, "huge PATH", 512 * 1024 * 1024).await;
    let mut client = server.client().await;
    // 6 MB of PATH entries (the issue's attack stalled every session for 7.6 s): refused as an
    // oversized environment value, without echoing it.
    let huge: String = (0..600_000)
        .map(|n| format!("/x{n:07}:"))
        .collect::<String>();
    for (id, path, limit) in [
        ("huge", huge.as_str(), "MAX_ARG_BYTES"),
        ("long", &huge[..64 * 1024], "MAX_PATH_SEARCH_BYTES"),
    ] {
        let started = Instant::now();
        let r = client
            .start(id, &["no-such-program"], json!({"env": {"PATH": path}}))
            .await;
        let error = assert_rpc_error(r, -32600, "limitExceeded");
        assert!(error.message.contains(limit), "{error:?}");
        assert!(error.message.len() < 4096, "the PATH is not echoed back");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refusing took {:?}",
            started.elapsed()
        );
    }
    // A PATH under the caps is searched as before.
    let out = client
        .run(
            "ok",
            &["true"],
            json!({"env": {"PATH": "/usr/bin:/bin:/usr/bin"}}),
        )
        .await;
    assert_eq!(out.exit_code, Some(0));
    client.close().await;
    siege.end(&server).await.assert_held(
        "6 MB PATH",
        kib(MAX_INFLIGHT_BYTES_PER_CONNECTION + RSS_SLACK),
    );
}

/// Start a server with an open-file limit of `limit` (and at the siege's priority).
fn server_with_open_file_limit(limit: u64) -> ExecServer {
    ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], move |command| {
        tests::siege::isolate_from_host_load(command);
        use std::os::unix::process::CommandExt as _;
        // SAFETY: setrlimit in the child between fork and exec; async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    limit,
                    limit,
                )
                .map_err(std::io::Error::from)
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_of_many_connections_meet_the_global_descriptor_budget() {
    // 4608 descriptors: the client budget is what DESCRIPTOR_RESERVE (2048), two per possible
    // connection (its socket and the duplicate watching for its close) and one per http/request
    // leave, about 1250; 16 connections of MAX_OPEN_HANDLES (128) ask for 2048.
    const CONNECTIONS: usize = 16;
    const HANDLES: usize = 128;
    let server = server_with_open_file_limit(4608);
    let siege = Siege::begin(&server, "handles", 512 * 1024 * 1024).await;
    let mut hostile = Vec::new();
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..CONNECTIONS {
        let (mut reader, mut writer) = raw_session(&server).await;
        let frames: Vec<u8> = (1..=HANDLES)
            .flat_map(|id| {
                let request = json!({"id": id, "method": "fs/open",
                                     "params": {"handleId": format!("h{id}"), "path": "file:///etc/hostname"}});
                ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
            })
            .collect();
        writer.write_all(&frames).await.unwrap();
        let mut answered = 0;
        while answered < HANDLES {
            let (_, payload) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
                .await
                .expect("fs/open answered")
                .expect("connection open");
            let answer: Value = serde_json::from_slice(&payload).unwrap();
            if answer.get("id").is_none() {
                continue;
            }
            answered += 1;
            match answer.get("error") {
                None => opened += 1,
                Some(error) => {
                    assert_eq!(error["data"]["kind"], "limitExceeded", "{error}");
                    assert_eq!(error["data"]["retryable"], true, "{error}");
                    refused += 1;
                }
            }
        }
        hostile.push((reader, writer));
    }
    assert!(
        refused > 0 && opened < CONNECTIONS * HANDLES,
        "{opened} opened, {refused} refused"
    );
    assert!(opened >= 1000, "only {opened} handles opened");
    eprintln!("fs/open: {opened} handles opened, {refused} refused");
    // With the client budget spent, the server still accepts, initializes and reads files
    // (the reserve); a spawn is refused with a retryable error, never EMFILE.
    let mut other = server.client().await;
    assert_serving(&mut other).await;
    let r = other.start("late", &["/bin/true"], json!({})).await;
    if let Err(error) = &r {
        assert_eq!(
            error.kind(),
            Some(proto::error::ErrorKind::LimitExceeded),
            "{error:?}"
        );
    }
    drop(hostile);
    // The handles go with their connections: processes start again.
    let started = Instant::now();
    loop {
        match other.start("after", &["/bin/true"], json!({})).await {
            Ok(_) => break,
            Err(error) => {
                assert!(
                    started.elapsed() < DEADLINE,
                    "spawns stay refused: {error:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await; // retry interval
            }
        }
    }
    other.collect("after").await;
    other.close().await;
    siege
        .end(&server)
        .await
        .assert_held("16 connections x 128 handles", 64 * 1024);
}

/// `MAX_LIVE_HELPERS`: fs-helpers alive at once, idle ones included.
const MAX_LIVE_HELPERS: usize = 64;

fn live_helpers(server: &ExecServer) -> usize {
    tests::descendants(server.pid())
        .into_iter()
        .filter(|pid| tests::cmdline(*pid).contains("fs-helper"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_policies_in_two_sessions_keep_helpers_within_the_global_cap() {
    // The issue's case: 100 policies in each of 2 sessions left 200 helpers alive.
    const POLICIES: usize = 100;
    let dirs: Vec<tempfile::TempDir> = (0..POLICIES)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let server = besieged_server(&[]);
    let siege = Siege::begin(&server, "many policies", 1024 * 1024 * 1024).await;
    let mut sessions = vec![server.client().await, server.client().await];
    let mut most = 0;
    for (n, dir) in dirs.iter().enumerate() {
        for client in &mut sessions {
            // A policy of its own per directory: its writable roots differ.
            let sandbox = json!({"profile": "workspace-write", "cwd": file_uri(dir.path()),
                                 "writableRoots": [file_uri(dir.path())], "excludeSlashTmp": true,
                                 "excludeTmpdirEnvVar": true});
            client
                .call(
                    "fs/writeFile",
                    json!({"path": file_uri(dir.path().join("f")), "dataBase64": b64("x"),
                           "sandbox": sandbox}),
                )
                .await;
        }
        if n % 10 == 9 {
            let live = live_helpers(&server);
            most = most.max(live);
            assert!(
                live <= MAX_LIVE_HELPERS,
                "{live} helpers alive after {} policies in 2 sessions",
                n + 1
            );
        }
    }
    eprintln!(
        "helpers alive at most {most} (sampled) for {} policies",
        2 * POLICIES
    );
    assert!(most > 0, "the requests ran in helpers");
    // A session's helpers are retired with it.
    for client in sessions {
        client.close().await;
    }
    let started = Instant::now();
    while live_helpers(&server) > 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "{} helpers outlive their sessions",
            live_helpers(&server)
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // polling interval
    }
    siege
        .end(&server)
        .await
        .assert_held("100 policies x 2 sessions", 64 * 1024);
}

/// `MAX_DETACHED_SESSIONS_PER_CLIENT`: detached sessions one client (peer uid) keeps.
const MAX_DETACHED_SESSIONS_PER_CLIENT: usize = 64;

/// `initialize` resuming `session` on `client`.
async fn resume(client: &mut Client, session: &str) -> Result<Value, tests::RpcError> {
    client
        .request(
            "initialize",
            json!({"clientName": "tests", "resumeSessionId": session}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_churn_of_one_client_never_evicts_another_clients_detached_session() {
    // The issue's case: after a victim's connection dropped, another client opening and closing
    // 64 sessions evicted the victim's detached session (and killed its process) within 0.5 s.
    const CHURN: usize = MAX_DETACHED_SESSIONS_PER_CLIENT + 32;
    // Another user needs the token; the server's own user (the churning client) does not.
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "victim-token").unwrap();
    let server = besieged_server(&["--auth-token-file", token_file.to_str().unwrap()]);
    let bearer = [("Authorization", "Bearer victim-token")];
    // The victim: another user on this host (its socket owned by uid 65534), one live `cat`.
    let mut victim = Client::connect_as_uid_with_headers(server.url(), 65534, &bearer)
        .await
        .unwrap();
    let victim_session = victim.initialize().await;
    start_echo(&mut victim, "victim").await;
    drop(victim);
    let siege = Siege::begin(&server, "session churn", 1024 * 1024 * 1024).await;
    let mut churned = Vec::new();
    for _ in 0..CHURN {
        let mut attacker = server.connect().await;
        churned.push(attacker.initialize().await);
        drop(attacker);
    }
    // `end` waits for the server's descriptors to come back: every churned connection was
    // closed, so every session of it was detached (and any eviction done).
    let report = siege.end(&server).await;
    report.assert_held("96 sessions opened and dropped", 64 * 1024);
    // The churning client's share is its own: its oldest sessions went...
    let mut probe = server.connect().await;
    assert_rpc_error(
        resume(&mut probe, &churned[0]).await,
        -32600,
        "unknownSession",
    );
    // ...its newest are still kept for a resume...
    let mut probe = server.connect().await;
    resume(&mut probe, churned.last().unwrap()).await.unwrap();
    // ...and the other client's session, and its process, are untouched.
    let mut back = Client::connect_as_uid_with_headers(server.url(), 65534, &bearer)
        .await
        .unwrap();
    resume(&mut back, &victim_session).await.unwrap();
    assert_echoes(&mut back, "victim", "still here\n").await;
}

/// `MESSAGE_COMPLETION_TIMEOUT`: a started websocket message must be complete within this.
const MESSAGE_COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_frames_of_many_connections_are_charged_to_the_memory_budget() {
    // The issue's case: 24 connections each holding an unfinished 62 MiB frame took the server
    // from 7 to 1,500 MiB; the frame was buffered before any budget charge.
    // The server runs with a quarter of the default budget (`--memory-budget 256M`): the same
    // accounting, a quarter of the bytes to fault in and copy while the neighbour is measured.
    const CONNECTIONS: usize = 24;
    const SENT: usize = 62 * 1024 * 1024;
    const BUDGET: u64 = 256 * 1024 * 1024;
    let server = besieged_server(&["--memory-budget", "256M"]);
    let held_at_most = BUDGET + CONNECTIONS as u64 * CONNECTION_MEMORY_ALLOWANCE;
    let bound = held_at_most + RSS_SLACK;
    let siege = Siege::begin(&server, "unfinished frames", bound + RSS_SLACK).await;
    let payload = std::sync::Arc::new(vec![b'a'; SENT]);
    let mut attackers = Vec::new();
    for _ in 0..CONNECTIONS {
        let (mut reader, mut writer) = raw_session(&server).await;
        let payload = payload.clone();
        attackers.push(tokio::spawn(async move {
            // A 63 MiB frame (under MAX_FRAME_BYTES) of which 62 MiB are sent, then nothing.
            let header = ws_frame_header(true, opcode::BINARY, (SENT + 1024 * 1024) as u64);
            let sent = async {
                writer.write_all(&header).await?;
                writer.write_all(&payload).await
            };
            // The server either holds the bytes (charged) or refuses the message: a close frame.
            let end = tokio::select! {
                end = read_until_closed(&mut reader, MESSAGE_COMPLETION_TIMEOUT * 2) => end,
                _ = sent => read_until_closed(&mut reader, MESSAGE_COMPLETION_TIMEOUT * 2).await,
            };
            drop(writer);
            end
        }));
    }
    let mut ends = Vec::new();
    for attacker in attackers {
        ends.push(
            tokio::time::timeout(DEADLINE * 2, attacker)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let refused = ends
        .iter()
        .filter(|end| **end == RawEnd::Close(1013))
        .count();
    let timed_out = ends
        .iter()
        .filter(|end| **end == RawEnd::Close(1008))
        .count();
    eprintln!("{refused} refused by the memory budget (1013), {timed_out} timed out (1008)");
    // 24 x 62 MiB is past the memory budget: some messages were refused as they arrived...
    assert!(refused > 0, "no unfinished message was refused: {ends:?}");
    // ...and the ones that fit were closed at the completion deadline, none left hanging.
    assert_eq!(refused + timed_out, CONNECTIONS, "{ends:?}");
    // No more fit than the budget given on the command line backs (the default would hold 17).
    assert!(
        timed_out as u64 <= held_at_most / SENT as u64,
        "{timed_out} unfinished messages were held, more than --memory-budget 256M backs"
    );
    siege
        .end(&server)
        .await
        .assert_held("24 unfinished 62 MiB frames", kib(bound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_message_not_finished_in_time_closes_its_connection_only() {
    let _turn = tests::siege::beside_sieges().await;
    let server = server();
    let mut other = server.client().await;
    start_echo(&mut other, "echo").await;
    let (mut reader, mut writer) = raw_session(&server).await;
    // The first fragment of a message, complete, then half of the second one.
    writer
        .write_all(&ws_frame(false, opcode::TEXT, &[b' '; 1000]))
        .await
        .unwrap();
    let mut half = ws_frame_header(true, opcode::CONTINUATION, 2000);
    half.extend_from_slice(&[b' '; 1000]);
    writer.write_all(&half).await.unwrap();
    let started = Instant::now();
    assert_echoes(&mut other, "echo", "while the message is held\n").await;
    let end = read_until_closed(&mut reader, MESSAGE_COMPLETION_TIMEOUT + DEADLINE).await;
    let waited = started.elapsed();
    assert_eq!(end, RawEnd::Close(1008), "after {waited:?}");
    assert!(
        waited > MESSAGE_COMPLETION_TIMEOUT - Duration::from_secs(1)
            && waited < MESSAGE_COMPLETION_TIMEOUT + Duration::from_secs(2),
        "closed after {waited:?}"
    );
    assert_echoes(&mut other, "echo", "after\n").await;
}

/// An upstream that accepts connections, reads what comes and never answers; the count of its
/// open connections.
async fn silent_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/never", listener.local_addr().unwrap());
    let open = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = open.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counter = counter.clone();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                while matches!(socket.read(&mut buffer).await, Ok(n) if n > 0) {}
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_requests_to_a_silent_upstream_end_with_their_client_and_free_the_budget() {
    use std::sync::atomic::Ordering;
    // The issue's case: eleven buffered http/requests to an upstream that never answers (85 MiB
    // reserved each) kept every other client's http/request refused after the attackers left.
    const ATTACKERS: usize = 11;
    let (url, open) = silent_upstream().await;
    let server = besieged_server(&[]);
    let bound = MEMORY_BUDGET_BYTES + RSS_SLACK;
    let siege = Siege::begin(&server, "silent upstream", bound + RSS_SLACK).await;
    let mut attackers = Vec::new();
    for n in 0..ATTACKERS {
        let mut attacker = server.client().await;
        attacker
            .send_request(
                "http/request",
                json!({"method": "GET", "url": url, "requestId": format!("r{n}")}),
            )
            .await;
        attackers.push(attacker);
    }
    let started = Instant::now();
    while open.load(Ordering::SeqCst) < ATTACKERS {
        assert!(
            started.elapsed() < DEADLINE,
            "only {} requests reached the upstream",
            open.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }
    drop(attackers);
    // Gone, their requests are cancelled: the upstream sees its sockets closed within 2 s...
    let left = Instant::now();
    while open.load(Ordering::SeqCst) > 0 {
        assert!(
            left.elapsed() < Duration::from_secs(2),
            "{} upstream connections outlived their clients by 2 s",
            open.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }
    // ...and their reserved memory is back: another client's buffered request is served (here:
    // runs to its own timeout) instead of being refused with limitExceeded.
    let mut other = server.client().await;
    let error = other
        .request(
            "http/request",
            json!({"method": "GET", "url": url, "requestId": "other", "timeoutMs": 300}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        tests::error_kind(&error),
        "timedOut",
        "the request after the attackers left: {error:?}"
    );
    drop(other);
    siege
        .end(&server)
        .await
        .assert_held("11 http/requests to a silent upstream", kib(bound));
}

/// `READ_DIRECTORY_MAX_ANSWER_BYTES`: entries of one `fs/readDirectory` answer, as JSON text.
const READ_DIRECTORY_MAX_ANSWER_BYTES: u64 = 8 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_directories_are_answered_truncated_within_the_answer_cap() {
    // The issue's case: one fs/readDirectory of a large directory produced a 103 MiB answer and
    // peaked at ~280 MiB; three at once peaked at ~660 MiB.
    const FILES: usize = 50_000;
    const READERS: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    // Long names: each entry is about 500 bytes of answer (its name and its full path), so the
    // whole directory would be about 25 MiB of answer.
    for n in 0..FILES {
        let name = format!("{n:06}{}", "x".repeat(200));
        std::fs::File::create(dir.path().join(name)).unwrap();
    }
    let uri = file_uri(dir.path());
    let server = besieged_server(&[]);
    // Each answer is built as a value and then as text: a few times its cap.
    let bound = READERS * 4 * READ_DIRECTORY_MAX_ANSWER_BYTES + RSS_SLACK;
    let siege = Siege::begin(&server, "huge directories", bound + RSS_SLACK).await;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let mut client = server.client().await;
        let uri = uri.clone();
        readers.push(tokio::spawn(async move {
            let answer = client.call("fs/readDirectory", json!({"path": uri})).await;
            drop(client);
            answer
        }));
    }
    for reader in readers {
        let answer = tokio::time::timeout(DEADLINE * 2, reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer["truncated"], true, "the answer says it was cut");
        let entries = answer["entries"].as_array().unwrap();
        let text = answer["entries"].to_string().len() as u64;
        assert!(
            text <= READ_DIRECTORY_MAX_ANSWER_BYTES && !entries.is_empty(),
            "{} entries, {text} bytes of entries",
            entries.len()
        );
        // The first entries by name, in order.
        for (n, entry) in entries.iter().enumerate() {
            let name = entry["fileName"].as_str().unwrap();
            assert!(name.starts_with(&format!("{n:06}")), "entry {n}: {name}");
        }
    }
    siege
        .end(&server)
        .await
        .assert_held("3 readDirectory of 50,000 long names", kib(bound));
    // A small directory is answered whole, without the flag.
    let mut client = server.client().await;
    let small = tempfile::tempdir().unwrap();
    std::fs::write(small.path().join("only"), b"").unwrap();
    let answer = client
        .call("fs/readDirectory", json!({"path": file_uri(small.path())}))
        .await;
    assert_eq!(answer["entries"].as_array().unwrap().len(), 1);
    assert!(answer.get("truncated").is_none(), "{answer}");
}

/// `RETAINED_OUTPUT_BUDGET_BYTES`: process output all sessions retain together (the default of
/// `--retained-output-bytes`), each chunk charged its bytes plus `RETAINED_CHUNK_OVERHEAD_BYTES`.
const RETAINED_OUTPUT_BUDGET_BYTES: u64 = 256 * 1024 * 1024;
/// What the server holds per live process besides its output (load.md: about 60 KiB).
const LIVE_PROCESS_BYTES: u64 = 64 * 1024;
/// The allocator's share beside retained output that goes oldest first while new chunks of
/// other sizes arrive: freed holes it cannot always reuse (measured peaks 287 to 379 MiB for
/// 253 MiB retained; main's server, with nothing capped, peaked at 1,166 MiB).
const RETENTION_FRAGMENTATION_SLACK: u64 = RETAINED_OUTPUT_BUDGET_BYTES / 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_output_of_1200_processes_stays_within_the_server_cap_and_the_drop_is_reported() {
    // The issue's case: one connection started 1,200 processes and disconnected; their retained
    // output (up to 1 MiB each, charged to nothing) took the server to ~1,230 MiB.
    const PROCESSES: usize = 1200;
    // Under one process's own retention (1 MiB): only the server's cap can drop any of it.
    const EACH: u64 = 1_000_000;
    let dir = tempfile::tempdir().unwrap();
    // Every process waits at this gate until all are started and their client has left, so
    // the output is all written while the session is detached (retained, never sent).
    let gate = dir.path().join("gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let gate_arg = gate.to_str().unwrap().to_owned();
    let script = format!(r#"read x < "$0"; exec head -c {EACH} /dev/zero"#);
    let server = besieged_server(&[]);
    let bound = RETAINED_OUTPUT_BUDGET_BYTES
        + RETENTION_FRAGMENTATION_SLACK
        + PROCESSES as u64 * LIVE_PROCESS_BYTES
        + RSS_SLACK;
    // The server's memory is capped; its children (in the same group until their own) need room.
    let siege = Siege::begin(&server, "retained output", bound + 2 * MEMORY_BUDGET_BYTES).await;
    let mut attacker = server.connect().await;
    let session = attacker.initialize().await;
    for n in 0..PROCESSES {
        attacker
            .start(
                &format!("p{n}"),
                // At the lowest priority: on a 2-core host, 1,200 writers woken at once would
                // otherwise take the CPU from the server and its neighbour alike (max 1.5 s
                // measured with main's server too); the case measures what the server holds.
                &[
                    "/usr/bin/nice",
                    "-n",
                    "39",
                    "/bin/sh",
                    "-c",
                    &script,
                    &gate_arg,
                ],
                json!({}),
            )
            .await
            .unwrap_or_else(|error| panic!("start {n}: {error:?}"));
    }
    drop(attacker);
    // Open the gate: every reader sees end of file once this writer closes.
    tokio::time::sleep(Duration::from_secs(1)).await; // the last shells reach the gate
    drop(std::fs::OpenOptions::new().write(true).open(&gate).unwrap());
    let marker = format!("head -c {EACH} /dev/zero");
    let started = Instant::now();
    loop {
        let left = tests::descendants(server.pid())
            .into_iter()
            .filter(|pid| {
                let line = tests::cmdline(*pid);
                line.contains(&marker) || line.contains(&gate_arg)
            })
            .count();
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{left} writers still running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // polling interval
    }
    let report = siege.end(&server).await;
    // The checks below are not measured: they only keep sieges from starting meanwhile.
    let _turn = tests::siege::beside_sieges().await;
    report.assert_held("1,200 processes' retained output", kib(bound));
    // Every process ran to its end (none was stopped for its output), and what was dropped is
    // reported: the oldest chunks of a process, counted in bytes and chunks.
    let mut back = server.connect().await;
    resume(&mut back, &session).await.unwrap();
    let (mut dropped_bytes, mut processes_with_drops) = (0u64, 0usize);
    for n in 0..PROCESSES {
        let id = format!("p{n}");
        // Past every chunk: only the exit and the drop report.
        let end = back
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": 1_000_000_000u64}),
            )
            .await;
        assert_eq!(end["exitCode"], 0, "{id}: {end}");
        assert_eq!(end["exitReason"], "exit", "{id}: {end}");
        let bytes = end["outputDroppedBytes"].as_u64().unwrap_or(0);
        if bytes == 0 {
            continue;
        }
        dropped_bytes += bytes;
        processes_with_drops += 1;
        if processes_with_drops % 25 != 1 {
            continue;
        }
        // From the start (for some of them: the answer carries a chunk): the gap is a prefix,
        // and the answer says where the output resumes.
        let read = back
            .call(
                "process/read",
                json!({"processId": id, "afterSeq": 0, "maxBytes": 1}),
            )
            .await;
        let chunks = read["outputDroppedChunks"].as_u64().unwrap();
        let first_retained = read["firstRetainedSeq"].as_u64().unwrap();
        assert_eq!(read["outputDropped"], true, "{id}: {read}");
        match read["chunks"].as_array().unwrap().first() {
            // What is left starts right after the dropped chunks.
            Some(chunk) => {
                assert_eq!(chunk["seq"], chunks + 1, "{id}: {read}");
                assert_eq!(first_retained, chunks + 1, "{id}: {read}");
            }
            // All of it went: the next event retained comes after every chunk.
            None => assert!(first_retained > chunks, "{id}: {read}"),
        }
    }
    let retained = PROCESSES as u64 * EACH - dropped_bytes;
    eprintln!(
        "retained {:.1} MiB of {:.1} MiB written; {processes_with_drops} processes lost their oldest output",
        retained as f64 / 1048576.0,
        (PROCESSES as u64 * EACH) as f64 / 1048576.0
    );
    assert!(
        retained <= RETAINED_OUTPUT_BUDGET_BYTES,
        "{retained} bytes retained, over the cap"
    );
    assert!(processes_with_drops > 0);
}

/// Server sockets in CLOSE-WAIT (the peer closed, the server has not) from `server_port` to
/// `peer_port`, in /proc/net/tcp and tcp6.
fn close_wait_sockets(server_port: u16, peer_port: u16) -> usize {
    const CLOSE_WAIT: &str = "08";
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| text.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |address: &str| {
                address
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            };
            fields.len() > 3
                && port(fields[1]) == Some(server_port)
                && port(fields[2]) == Some(peer_port)
                && fields[3] == CLOSE_WAIT
        })
        .count()
}

/// A raw session whose processes end with its connection (`detachedSessionTtlSeconds: 0`).
async fn raw_session_ending_with_connection(
    server: &ExecServer,
) -> (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
    u16,
) {
    let stream = raw_websocket(server.addr()).await;
    let port = stream.local_addr().unwrap().port();
    let (mut reader, mut writer) = stream.into_split();
    let init = json!({"id": 0, "method": "initialize",
                      "params": {"clientName": "leaver", "detachedSessionTtlSeconds": 0}});
    writer
        .write_all(&ws_frame(true, opcode::TEXT, init.to_string().as_bytes()))
        .await
        .unwrap();
    let (_, answer) = tokio::time::timeout(DEADLINE, read_raw_frame(&mut reader))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response_id(&answer), Some(0));
    (reader, writer, port)
}

/// Send `request` on a raw session and wait for its answer (notifications before it are
/// skipped).
async fn raw_call(
    reader: &mut tokio::net::tcp::OwnedReadHalf,
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    request: Value,
) {
    let id = request["id"].as_i64().unwrap();
    writer
        .write_all(&ws_frame(
            true,
            opcode::TEXT,
            request.to_string().as_bytes(),
        ))
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, async {
        loop {
            let (_, payload) = read_raw_frame(reader).await.expect("connection open");
            if response_id(&payload) == Some(id) {
                assert!(
                    !String::from_utf8_lossy(&payload).contains("\"error\""),
                    "{}",
                    String::from_utf8_lossy(&payload)
                );
                return;
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_and_leave_are_let_go_within_2_s() {
    // The issue's case: ~276 clients blocked their connections and closed their sockets; the
    // server never read again, so never saw them leave: 130 sockets sat in CLOSE-WAIT, their
    // processes outlived a 2 s TTL, and new clients were refused until a restart.
    // Control: the probe sees CLOSE-WAIT on a socket whose owner never looks (a plain listener
    // that accepts and never reads).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener_port = listener.local_addr().unwrap().port();
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", listener_port))
        .await
        .unwrap();
    let plain_port = plain.local_addr().unwrap().port();
    let (_accepted, _) = listener.accept().await.unwrap();
    plain.shutdown().await.unwrap();
    let started = Instant::now();
    while close_wait_sockets(listener_port, plain_port) == 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "the probe never saw CLOSE-WAIT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }

    let server = besieged_server(&[]);
    let server_port: u16 = server.addr().rsplit(':').next().unwrap().parse().unwrap();
    let bound = 2 * (MAX_INFLIGHT_BYTES_PER_CONNECTION + OUTBOUND_QUEUE_BYTES) + RSS_SLACK;
    let siege = Siege::begin(&server, "clients that leave", bound * 2).await;
    // Flooder: output it never reads (the server blocks writing to it), and long-polls that
    // take every request slot (the server stops reading it); then it half-closes (shuts down
    // its sending side) and never reads again.
    let (mut flood_reader, mut flood_writer, flood_port) =
        raw_session_ending_with_connection(&server).await;
    for (n, argv) in [
        ["/usr/bin/head", "-c", "1234567890", "/dev/zero"],
        ["/bin/sleep", "4243", "", ""],
    ]
    .iter()
    .enumerate()
    {
        let argv: Vec<&str> = argv.iter().copied().filter(|arg| !arg.is_empty()).collect();
        raw_call(
            &mut flood_reader,
            &mut flood_writer,
            json!({"id": 1 + n, "method": "process/start", "params": {
                "processId": format!("flood{n}"), "cwd": "file:///", "argv": argv}}),
        )
        .await;
    }
    // More long-polls than MAX_INFLIGHT_REQUESTS (128): the rest wait unread in the socket, a
    // few KiB, so its FIN behind them reaches the server.
    let reads: Vec<u8> = (0..200)
        .flat_map(|n| {
            let request = json!({"id": 100 + n, "method": "process/read", "params": {
                "processId": "flood1", "afterSeq": 0, "waitMs": 60_000}});
            ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
        })
        .collect();
    flood_writer.write_all(&reads).await.unwrap();
    // Quiet client: its request slots all wait (the issue's clients held theirs with stuck
    // process/writes; long-polls of a silent process hold them as surely, in any order), then
    // it closes its socket with nothing unread, so its FIN is all the server could see.
    let (mut stuck_reader, mut stuck_writer, stuck_port) =
        raw_session_ending_with_connection(&server).await;
    raw_call(
        &mut stuck_reader,
        &mut stuck_writer,
        json!({"id": 1, "method": "process/start", "params": {
            "processId": "stuck", "cwd": "file:///", "argv": ["/bin/sleep", "4242"]}}),
    )
    .await;
    let polls: Vec<u8> = (0..200)
        .flat_map(|n| {
            let request = json!({"id": 100 + n, "method": "process/read", "params": {
                "processId": "stuck", "afterSeq": 0, "waitMs": 60_000}});
            ws_frame(true, opcode::TEXT, request.to_string().as_bytes())
        })
        .collect();
    stuck_writer.write_all(&polls).await.unwrap();
    under_attack_for(ATTACK_WINDOW).await;
    // Both leave while the server is blocked on them.
    flood_writer.shutdown().await.unwrap();
    drop((stuck_reader, stuck_writer));
    let left = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await; // the promise: 2 s after they left
    let flood_waiting = close_wait_sockets(server_port, flood_port);
    let stuck_waiting = close_wait_sockets(server_port, stuck_port);
    let survivors: Vec<String> = tests::descendants(server.pid())
        .into_iter()
        .map(tests::cmdline)
        .filter(|line| line.contains("1234567890") || line.contains("sleep 4242"))
        .collect();
    eprintln!(
        "{:?} after leaving: CLOSE-WAIT sockets {flood_waiting} (half-closed flooder), \
         {stuck_waiting} (closed quiet client); processes left {survivors:?}",
        left.elapsed()
    );
    assert_eq!(
        (flood_waiting, stuck_waiting),
        (0, 0),
        "sockets still in CLOSE-WAIT 2 s after their clients left"
    );
    assert!(
        survivors.is_empty(),
        "processes of sessions whose clients left: {survivors:?}"
    );
    // Their descriptors (sockets, pipes, pidfds) are back, and the neighbour was served.
    let report = siege.end(&server).await;
    drop(flood_reader);
    report.assert_held("clients that stop reading and leave", kib(bound));
}
