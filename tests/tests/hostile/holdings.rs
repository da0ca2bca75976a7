//! Budgets (see the parent module): what the server holds for a client: detached sessions,
//! unfinished messages, requests to a silent upstream, huge directory answers.

use super::*;

/// `MAX_DETACHED_SESSIONS_PER_CLIENT`: detached sessions one client (peer uid) keeps.
const MAX_DETACHED_SESSIONS_PER_CLIENT: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_churn_of_one_client_never_evicts_another_clients_detached_session() {
    // The case: after a victim's connection dropped, another client opening and closing
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
    // The case: 24 connections each holding an unfinished 62 MiB frame took the server
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
    // The case: eleven buffered http/requests to an upstream that never answers (85 MiB
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
    // The case: one fs/readDirectory of a large directory produced a 103 MiB answer and
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
