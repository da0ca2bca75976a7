//! Budgets (see the parent module): what one connection holds in flight, pipelined large reads,
//! blocked writes and long write ids.

use super::*;

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
    large_reads_meet_the_server_memory_budget(Value::Null).await;
}

/// Sandboxed, a read's answer is backed in the same blocking job that resolves the policy and
/// exchanges with the helper: it must meet the same budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_of_large_sandboxed_reads_meet_the_server_memory_budget() {
    large_reads_meet_the_server_memory_budget(json!({"profile": "read-only"})).await;
}

async fn large_reads_meet_the_server_memory_budget(sandbox: Value) {
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
                let params = json!({"path": file, "sandbox": sandbox});
                let request = json!({"id": id, "method": "fs/readFile", "params": params});
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
    let params = json!({"path": file, "sandbox": sandbox});
    let request = json!({"id": 1, "method": "fs/readFile", "params": params});
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
