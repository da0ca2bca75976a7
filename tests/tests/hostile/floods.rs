//! Floods and slow or vanishing clients: unread requests, slowloris and oversized upgrade
//! heads, a client vanishing mid-frame.

use super::*;

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
