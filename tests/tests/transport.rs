//! The listener: HTTP endpoints, Origin and token checks, unix sockets, frame limits, shutdown,
//! and sessions that outlive their connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;

use nix::sys::signal::Signal;
use serde_json::json;
use tests::{
    Client, DEADLINE, ExecServer, assert_rpc_error, process_is_dead, sh, wait_process_dead,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;

/// `MAX_FRAME_BYTES` from docs/protocol.md.
const MAX_FRAME_BYTES: u64 = 64 * 1024 * 1024;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

/// Send a raw HTTP request and return everything the server answers until it closes (or the
/// head and a short body have arrived).
async fn raw_http(addr: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&answer);
            if let Some(head_end) = text.find("\r\n\r\n") {
                let length = text[..head_end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if answer.len() >= head_end + 4 + length {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(DEADLINE, read_all)
        .await
        .unwrap_or_else(|_| panic!("no complete HTTP answer to {request:?} within {DEADLINE:?}"));
    String::from_utf8_lossy(&answer).into_owned()
}

fn status_of(error: tungstenite::Error) -> u16 {
    match error {
        tungstenite::Error::Http(response) => response.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn readyz_answers_200_ok() {
    let server = server();
    let answer = raw_http(
        server.addr(),
        "GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    assert_eq!(body, "ok", "docs/protocol.md: body `ok`");
}

#[tokio::test]
async fn other_plain_http_is_404_and_garbage_head_is_400() {
    let server = server();
    let answer = raw_http(
        server.addr(),
        "GET /other HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer:?}");
    let answer = raw_http(server.addr(), "NOT HTTP AT ALL\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    server.client().await; // still serving
}

#[tokio::test]
async fn upgrade_with_origin_header_is_403() {
    let server = server();
    let refused = Client::connect_with_headers(server.url(), &[("Origin", "https://evil.example")])
        .await
        .err()
        .expect("upgrade with Origin must be refused");
    assert_eq!(status_of(refused), 403);
}

#[tokio::test]
async fn a_configured_token_must_be_right_when_sent_and_the_servers_own_user_needs_none() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let server = ExecServer::start(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--auth-token-file",
        token_file.to_str().unwrap(),
    ]);
    let wrong = Client::connect_with_headers(server.url(), &[("Authorization", "Bearer wrong")])
        .await
        .err()
        .expect("wrong token");
    assert_eq!(status_of(wrong), 401);
    let prefix = Client::connect_with_headers(server.url(), &[("Authorization", "Bearer s3cret")])
        .await
        .err()
        .expect("prefix of the token");
    assert_eq!(status_of(prefix), 401);
    let mut client =
        Client::connect_with_headers(server.url(), &[("Authorization", "Bearer s3cret-token")])
            .await
            .expect("the right token is accepted");
    client.initialize().await;
    // This test runs as the server's user: admitted without a token (another user is not:
    // tests/tests/listener_access.rs).
    Client::connect(server.url())
        .await
        .expect("the server's own user needs no token")
        .initialize()
        .await;
    // readyz needs no token.
    let answer = raw_http(
        server.addr(),
        "GET /readyz HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test]
async fn default_listen_is_loopback_on_an_ephemeral_port() {
    let server = ExecServer::start(&[]);
    assert!(
        server.url().starts_with("ws://127.0.0.1:"),
        "{}",
        server.url()
    );
    server.client().await;
}

#[tokio::test]
async fn unix_socket_listener_serves_the_protocol_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("exec.sock");
    let listen = format!("unix:{}", socket.display());
    let server = ExecServer::start(&["--listen", &listen]);
    assert_eq!(server.url(), listen);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let mut client = server.client().await;
    let out = client.run("hi", &sh("echo hi"), json!({})).await;
    assert_eq!(out.stdout_text(), "hi\n");
}

/// A websocket handshake done by hand so that a frame header can be written raw.
async fn raw_websocket(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(DEADLINE, async {
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(
                stream.read(&mut byte).await.unwrap(),
                1,
                "EOF during handshake"
            );
            head.push(byte[0]);
        }
    })
    .await
    .expect("handshake answer");
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

#[tokio::test]
async fn oversized_frame_closes_the_connection_with_1009_and_the_server_keeps_serving() {
    let server = server();
    let mut stream = raw_websocket(server.addr()).await;
    // Binary frame, FIN, masked, 64-bit length one past the limit; only a few payload bytes
    // follow: the server must refuse from the header alone, without buffering.
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&(MAX_FRAME_BYTES + 1).to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.extend_from_slice(&[0u8; 1024]);
    stream.write_all(&frame).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server must close the connection");
    assert!(
        answer.len() >= 4 && answer[0] == 0x88,
        "expected a close frame, got {answer:?}"
    );
    let code = u16::from_be_bytes([answer[2], answer[3]]);
    assert_eq!(code, 1009, "close code");
    // The server is alive and serves another client.
    let mut client = server.client().await;
    client
        .call("fs/getMetadata", json!({"path": "file:///"}))
        .await;
}

#[tokio::test]
async fn sigterm_exits_zero_and_leaves_no_child_behind() {
    let mut server = server();
    let mut client = server.client().await;
    let mut pids = Vec::new();
    for (id, script) in [
        ("a", "echo $$; exec /bin/sleep 1000"),
        ("b", "echo $$; exec /bin/sleep 1000"),
        ("stubborn", "trap '' TERM; echo $$; exec /bin/sleep 1000"),
    ] {
        client.start(id, &sh(script), json!({})).await.unwrap();
        let text = client.wait_for_output(id, "\n").await;
        pids.push(text.trim().parse::<i32>().unwrap());
    }
    client
        .start(
            "tty",
            &sh("echo $$; exec /bin/sleep 1000"),
            json!({"tty": true}),
        )
        .await
        .unwrap();
    let text = client.wait_for_output("tty", "\n").await;
    pids.push(text.trim().parse::<i32>().unwrap());
    for pid in &pids {
        assert!(!process_is_dead(*pid), "child {pid} should be running");
    }
    server.signal(Signal::SIGTERM);
    let status = server.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    for pid in pids {
        wait_process_dead(pid, DEADLINE, "child of the terminated server");
    }
}

#[tokio::test]
async fn sigkill_of_the_server_kills_its_children() {
    let mut server = server();
    let mut client = server.client().await;
    client
        .start("a", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid: i32 = client
        .wait_for_output("a", "\n")
        .await
        .trim()
        .parse()
        .unwrap();
    server.signal(Signal::SIGKILL);
    server.wait_exit(DEADLINE);
    wait_process_dead(pid, DEADLINE, "child of the killed server");
}

#[tokio::test]
async fn detached_session_keeps_running_and_resumes_with_the_same_id() {
    let server = server();
    let mut first = server.connect().await;
    let session = first.initialize().await;
    first
        .start("keep", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid: i32 = first
        .wait_for_output("keep", "\n")
        .await
        .trim()
        .parse()
        .unwrap();

    // While attached: -32010, retryable.
    let mut second = server.connect().await;
    assert_rpc_error(
        second
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await,
        -32010,
        "sessionAttached",
    );
    drop(second);

    first.close().await;
    // Detaching is asynchronous: retry while the server still reports it attached.
    let started = std::time::Instant::now();
    let (mut third, resumed) = loop {
        let mut candidate = server.connect().await;
        match candidate
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await
        {
            Ok(result) => break (candidate, result),
            Err(error) if error.code == -32010 && started.elapsed() < DEADLINE => continue,
            Err(error) => panic!("resume failed: {error:?}"),
        }
    };
    assert_eq!(resumed["sessionId"], session);
    assert!(
        !process_is_dead(pid),
        "the detached session's process must keep running"
    );
    let read = third
        .call("process/read", json!({"processId": "keep", "afterSeq": 0}))
        .await;
    assert_eq!(read["exited"], false, "{read}");
    assert!(!read["chunks"].as_array().unwrap().is_empty(), "{read}");
    assert_eq!(
        third
            .call("process/terminate", json!({"processId": "keep"}))
            .await,
        json!({"running": true})
    );
    third.collect("keep").await;
    wait_process_dead(pid, DEADLINE, "terminated process");
}

#[tokio::test]
async fn resuming_an_unknown_session_is_unknown_session() {
    let server = server();
    let mut client = server.connect().await;
    assert_rpc_error(
        client
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": "6f1c1a5e-0000-4000-8000-000000000000"}),
            )
            .await,
        -32600,
        "unknownSession",
    );
}

#[tokio::test]
async fn sigint_exits_zero_and_leaves_no_child_behind() {
    let mut server = server();
    let mut client = server.client().await;
    client
        .start("a", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid: i32 = client
        .wait_for_output("a", "\n")
        .await
        .trim()
        .parse()
        .unwrap();
    server.signal(Signal::SIGINT);
    let status = server.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "exit status {status:?}");
    wait_process_dead(pid, DEADLINE, "child of the interrupted server");
}

#[tokio::test]
async fn resume_recovers_output_written_while_detached() {
    let server = server();
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let mut first = server.connect().await;
    let session = first.initialize().await;
    let script = format!(
        "echo $$; while [ ! -e '{}' ]; do /bin/sleep 0.02; done; echo written-while-detached; \
         exec /bin/sleep 1000",
        flag.display()
    );
    first.start("p", &sh(&script), json!({})).await.unwrap();
    let pid: i32 = first
        .wait_for_output("p", "\n")
        .await
        .trim()
        .parse()
        .unwrap();
    first.close().await;
    std::fs::write(&flag, "").unwrap();
    // The shell execs sleep only after writing the line: then the output exists.
    let started = std::time::Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        != "sleep"
    {
        assert!(
            started.elapsed() < DEADLINE,
            "process never got past the flag"
        );
        std::thread::sleep(std::time::Duration::from_millis(5)); // polling interval
    }
    let mut second = loop {
        let mut candidate = server.connect().await;
        match candidate
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await
        {
            Ok(_) => break candidate,
            Err(error) if error.code == -32010 && started.elapsed() < DEADLINE => continue,
            Err(error) => panic!("resume failed: {error:?}"),
        }
    };
    let read = second
        .call("process/read", json!({"processId": "p", "afterSeq": 0}))
        .await;
    let text: String = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| String::from_utf8_lossy(&tests::unb64(c["chunk"].as_str().unwrap())).into_owned())
        .collect();
    assert!(text.contains("written-while-detached"), "{read}");
    second
        .call("process/terminate", json!({"processId": "p"}))
        .await;
}
