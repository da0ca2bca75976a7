//! Budgets (see the parent module): retained output and clients that stop reading and leave.

use super::*;

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
