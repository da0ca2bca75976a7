//! Sessions that survive disconnects: the server's session rules (resume while attached, TTL
//! expiry, long-polls on a taken-over session) and the library client's recovery through a
//! proxy that cuts connections.
//!
//! The slow cases (the real 30 s TTL, the 50 MB stream under 20 cuts) live in this binary so
//! they run in parallel with each other, with the quick ones and with `limits`' real 30 s
//! retention.

use std::time::{Duration, Instant};

use serde_json::json;
use supervisor::{ConnectionState, ProcessEvent};
use tests::*;

/// Bytes of the numbered stream: 500 blocks of 10,000 ten-byte lines.
const STREAM_BLOCKS: u64 = 500;
const LINES_PER_BLOCK: u64 = 10_000;
const STREAM_BYTES: u64 = STREAM_BLOCKS * LINES_PER_BLOCK * 10;
const CUTS: u64 = 20;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

fn numbered_stream_script() -> String {
    // Paced (a 30 ms pause per 100 kB block: about 2.7 MB/s, well below what debug builds of
    // client and server move) so that what is in flight at a cut, plus what is written during
    // the recovery, stays well inside the server's 1 MiB output retention.
    format!(
        "echo pid=$$; i=0; while [ $i -lt {STREAM_BLOCKS} ]; do \
         /usr/bin/seq -f '%09.0f' $((i*{LINES_PER_BLOCK}+1)) $((i*{LINES_PER_BLOCK}+{LINES_PER_BLOCK})); \
         i=$((i+1)); /bin/sleep 0.03; done; echo pid=$$"
    )
}

fn expected_stream(pid: &str) -> Vec<u8> {
    let mut expected = Vec::with_capacity(STREAM_BYTES as usize + 64);
    expected.extend_from_slice(format!("pid={pid}\n").as_bytes());
    for n in 1..=STREAM_BLOCKS * LINES_PER_BLOCK {
        expected.extend_from_slice(format!("{n:09}\n").as_bytes());
    }
    expected.extend_from_slice(format!("pid={pid}\n").as_bytes());
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_cuts_during_a_50_mb_stream_lose_no_byte_and_keep_the_process() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let session = client.session_id().to_owned();
    let script = numbered_stream_script();
    let handle = client
        .start_process(start_params("stream", &sh(&script)))
        .await
        .unwrap();
    assert_eq!(handle.id(), "stream");
    let (_process, mut events) = handle.into_parts();

    let (progress_tx, mut progress) = tokio::sync::watch::channel(0u64);
    let consumer = tokio::spawn(async move {
        let mut stdout = Vec::with_capacity(STREAM_BYTES as usize + 64);
        let mut last_seq = 0;
        let mut exit = None;
        while let Some(event) = events.next().await {
            if let Some(seq) = event.seq() {
                assert_eq!(
                    seq,
                    last_seq + 1,
                    "events must come in seq order, each once"
                );
                last_seq = seq;
            }
            match event {
                ProcessEvent::Output { data, .. } => {
                    stdout.extend_from_slice(&data);
                    progress_tx.send_replace(stdout.len() as u64);
                }
                ProcessEvent::Exited { exit_code, .. } => exit = Some(exit_code),
                ProcessEvent::Closed { .. } => return (stdout, exit),
                ProcessEvent::Failed { error } => panic!("the stream process failed: {error}"),
                other => panic!("an unaudited process got {other:?}"),
            }
        }
        panic!("event stream ended without closed");
    });

    let mut recoveries = Vec::new();
    let stream_deadline = Duration::from_secs(120);
    for cut in 1..=CUTS {
        let threshold = STREAM_BYTES * cut / (CUTS + 1);
        tokio::time::timeout(
            stream_deadline,
            progress.wait_for(|bytes| *bytes >= threshold),
        )
        .await
        .unwrap_or_else(|_| panic!("stream did not reach {threshold} bytes before cut {cut}"))
        .unwrap();
        let ConnectionState::Connected { generation } = client.state() else {
            panic!("not connected before cut {cut}: {:?}", client.state());
        };
        let started = Instant::now();
        proxy.cut();
        wait_for_state(&client, Duration::from_secs(30), "reconnected", |state| {
            matches!(state, ConnectionState::Connected { generation: g } if *g > generation)
        })
        .await;
        recoveries.push(started.elapsed());
        eprintln!(
            "cut {cut}: recovered in {:?} at {} bytes",
            started.elapsed(),
            *progress.borrow()
        );
    }
    let (stdout, exit) = tokio::time::timeout(stream_deadline, consumer)
        .await
        .expect("stream finished")
        .unwrap();
    assert_eq!(exit, Some(0));
    assert_eq!(client.session_id(), session, "the session never changes");
    assert!(
        matches!(client.state(), ConnectionState::Connected { generation } if generation > CUTS),
        "a new connection after every cut: {:?}",
        client.state()
    );
    assert!(proxy.accepted() > CUTS, "{} connections", proxy.accepted());
    let first_line = stdout.split(|b| *b == b'\n').next().unwrap();
    let pid = String::from_utf8_lossy(first_line)
        .strip_prefix("pid=")
        .unwrap_or_else(|| panic!("first line is not pid=: {first_line:?}"))
        .to_owned();
    let expected = expected_stream(&pid);
    assert_eq!(stdout.len(), expected.len(), "byte count");
    // Identical bytes, and one pid line at each end: the process was never restarted.
    assert!(
        stdout == expected,
        "the bytes differ from what the process wrote"
    );
    let mut sorted = recoveries.clone();
    sorted.sort();
    println!(
        "recovery after a cut ({CUTS} cuts): median {:?}, min {:?}, max {:?}",
        median(&recoveries),
        sorted[0],
        sorted[sorted.len() - 1]
    );
}

#[tokio::test]
async fn resume_while_still_attached_is_session_attached() {
    let server = server();
    let client = library_client(server.url()).await;
    let options = supervisor::ExecServerClientConnectOptions::new(server.url())
        .with_resume_session_id(Some(client.session_id().to_owned()));
    let error = supervisor::ExecServerClient::connect(options)
        .await
        .err()
        .expect("resuming an attached session must fail");
    assert_eq!(error.rpc_code(), Some(-32010), "{error}");
    assert!(error.is_session_attached());
    assert!(error.to_string().contains("still attached"), "{error}");
}

async fn start_sleeper(client: &mut Client) -> i32 {
    client
        .start("sleeper", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    client
        .wait_for_output("sleeper", "\n")
        .await
        .trim()
        .parse()
        .unwrap()
}

async fn expect_unknown_session(server: &ExecServer, session: &str) {
    let mut client = server.connect().await;
    assert_rpc_error(
        client
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await,
        -32600,
        "unknownSession",
    );
}

/// `session` resumed on a new connection, retrying while the server still counts it attached
/// (-32010: the old connection's end not seen yet) until `deadline`.
async fn resume(server: &ExecServer, session: &str, deadline: Instant) -> Client {
    loop {
        let mut candidate = server.connect().await;
        match candidate
            .request(
                "initialize",
                json!({"clientName": "t", "resumeSessionId": session}),
            )
            .await
        {
            Ok(_) => return candidate,
            Err(error) if error.code == -32010 && Instant::now() < deadline => continue,
            Err(error) => panic!("resume failed: {error:?}"),
        }
    }
}

async fn detached_session_expires(server: ExecServer, ttl: Duration) {
    let mut client = server.connect().await;
    let session = client.initialize().await;
    let pid = start_sleeper(&mut client).await;
    client.close().await;
    let detached = Instant::now();
    assert!(
        !process_is_dead(pid),
        "processes keep running while detached"
    );
    let slack = Duration::from_secs(8); // SIGTERM grace (2 s) and scheduling
    tokio::task::spawn_blocking(move || {
        wait_process_dead(pid, ttl + slack, "process of the expired session")
    })
    .await
    .unwrap();
    let died_after = detached.elapsed();
    assert!(
        died_after >= ttl - Duration::from_millis(200),
        "the process died {died_after:?} after the detach, before the TTL {ttl:?}"
    );
    expect_unknown_session(&server, &session).await;
}

#[tokio::test]
async fn after_a_configured_ttl_the_processes_are_gone_and_the_id_is_unknown() {
    let server = ExecServer::start(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--detached-session-ttl",
        "2",
    ]);
    detached_session_expires(server, Duration::from_secs(2)).await;
}

/// The TTL counts from the latest detach: a session detached, resumed 1.2 s later and detached
/// again outlives the first detach's timer (2 s) and dies 2 s after the second.
#[tokio::test]
async fn the_ttl_counts_from_the_latest_detach_not_the_first() {
    let ttl = Duration::from_secs(2);
    let server = ExecServer::start(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--detached-session-ttl",
        "2",
    ]);
    let mut client = server.connect().await;
    let session = client.initialize().await;
    let pid = start_sleeper(&mut client).await;
    client.close().await;
    let first_detach = Instant::now();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let resumed = resume(&server, &session, first_detach + ttl).await;
    resumed.close().await;
    let second_detach = Instant::now();
    // Past the first detach's TTL (and its SIGTERM grace would not matter: sleep dies at once).
    let past_first = (first_detach + ttl + Duration::from_millis(800)).max(Instant::now());
    tokio::time::sleep_until(past_first.into()).await;
    assert!(
        second_detach.elapsed() < ttl,
        "the check came too late to tell the timers apart ({:?} after the second detach)",
        second_detach.elapsed()
    );
    assert!(
        !process_is_dead(pid),
        "the session died {:?} after its first detach although it was resumed and detached \
         again {:?} ago: the first detach's timer expired it",
        first_detach.elapsed(),
        second_detach.elapsed()
    );
    let slack = Duration::from_secs(8); // SIGTERM grace (2 s) and scheduling
    tokio::task::spawn_blocking(move || {
        wait_process_dead(pid, ttl + slack, "process of the expired session")
    })
    .await
    .unwrap();
    assert!(
        second_detach.elapsed() >= ttl - Duration::from_millis(200),
        "the process died {:?} after the second detach, before the TTL",
        second_detach.elapsed()
    );
    expect_unknown_session(&server, &session).await;
}

#[tokio::test]
async fn after_the_default_30_s_ttl_the_processes_are_gone_and_the_id_is_unknown() {
    detached_session_expires(server(), supervisor::limits::DETACHED_SESSION_TTL).await;
}

#[tokio::test]
async fn a_long_poll_on_the_old_connection_does_not_hold_up_the_takeover() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let mut old = Client::connect(&proxy.url()).await.unwrap();
    let session = old.initialize().await;
    start_sleeper(&mut old).await;
    let read = json!({"processId": "sleeper", "afterSeq": 1, "waitMs": 60000});
    let _pending = old.send_request("process/read", read).await;
    proxy.cut();
    let started = Instant::now();
    let mut new = resume(&server, &session, started + DEADLINE).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the takeover waited for the old long-poll ({:?})",
        started.elapsed()
    );
    let result = new
        .call(
            "process/read",
            json!({"processId": "sleeper", "afterSeq": 1, "waitMs": 0}),
        )
        .await;
    assert_eq!(result["nextSeq"], 2, "{result}");
    new.call("process/terminate", json!({"processId": "sleeper"}))
        .await;
    new.collect("sleeper").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_missed_output_exceeds_retention_fails_alone() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let flooded = dir.path().join("flooded");
    let wait_go = format!(
        "while [ ! -e '{}' ]; do /bin/sleep 0.02; done",
        go.display()
    );
    let big_script = format!(
        "echo pid=$$; {wait_go}; /usr/bin/head -c 3000000 /dev/zero; : > '{}'; exec /bin/sleep 1000",
        flooded.display()
    );
    let small_script = format!("echo ready; {wait_go}; echo after-outage; exec /bin/cat");
    let mut big = client
        .start_process(start_params("big", &sh(&big_script)))
        .await
        .unwrap();
    let mut params = start_params("small", &sh(&small_script));
    params.pipe_stdin = true;
    let mut small = client.start_process(params).await.unwrap();
    let pid: i32 = wait_for_event_output(&mut big, "\n", DEADLINE)
        .await
        .trim()
        .strip_prefix("pid=")
        .unwrap()
        .parse()
        .unwrap();
    wait_for_event_output(&mut small, "ready\n", DEADLINE).await;

    // Outage: 3 MB of output (three times the retention) while nobody is attached.
    proxy.pause();
    wait_for_state(&client, DEADLINE, "recovering", |state| {
        matches!(state, ConnectionState::Recovering { .. })
    })
    .await;
    std::fs::write(&go, b"").unwrap();
    let flag = flooded.clone();
    tokio::task::spawn_blocking(move || wait_for_file(&flag, DEADLINE))
        .await
        .unwrap();
    proxy.resume();
    wait_for_state(
        &client,
        DEADLINE,
        "reconnected",
        |state| matches!(state, ConnectionState::Connected { generation } if *generation > 1),
    )
    .await;

    let failure = loop {
        match next_event(&mut big, DEADLINE).await {
            ProcessEvent::Output { .. } => continue,
            ProcessEvent::Failed { error } => break error.to_string(),
            other => panic!("expected the flooded process to fail, got {other:?}"),
        }
    };
    assert!(
        failure.contains("no longer retained") && failure.contains("\"big\""),
        "unclear failure: {failure}"
    );
    wait_process_dead(
        pid,
        DEADLINE,
        "the failed process (terminated by the client)",
    );

    wait_for_event_output(&mut small, "after-outage\n", DEADLINE).await;
    small.process().write(b"still here\n").await.unwrap();
    wait_for_event_output(&mut small, "still here\n", DEADLINE).await;
    small.process().close_stdin().await.unwrap();
    let rest = tokio::time::timeout(DEADLINE, small.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_answer_was_lost_is_cleaned_up_not_adopted() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    proxy.hold_downstream(true);
    let script = format!("echo $$ > '{}'; exec /bin/sleep 1000", pid_file.display());
    let start = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .start_process(start_params("lost", &sh(&script)))
                .await
        })
    };
    let flag = pid_file.clone();
    tokio::task::spawn_blocking(move || wait_for_file(&flag, DEADLINE))
        .await
        .unwrap();
    let pid: i32 = loop {
        // The shell may not have finished writing the number yet.
        if let Ok(pid) = std::fs::read_to_string(&pid_file).unwrap().trim().parse() {
            break pid;
        }
        tokio::task::yield_now().await;
    };
    proxy.cut();
    // Release held bytes only once the cut connection is gone, so the answer cannot slip out.
    wait_for_state(&client, DEADLINE, "recovering", |state| {
        !matches!(state, ConnectionState::Connected { generation: 1 })
    })
    .await;
    proxy.hold_downstream(false);
    let error = tokio::time::timeout(DEADLINE, start)
        .await
        .unwrap()
        .unwrap()
        .err()
        .expect("a start whose answer was lost must not succeed");
    assert!(
        matches!(error, supervisor::ExecServerError::StartAmbiguous { .. }),
        "{error}"
    );
    wait_process_dead(pid, DEADLINE, "the process of the ambiguous start");
    // The client is usable again and the session is the same one.
    let output = client
        .start_process(start_params("next", &sh("echo fine")))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(output.stdout, b"fine\n");
}

/// A session whose client asked for `detachedSessionTtlSeconds` dies that long after its
/// connection, never later than the server's own TTL, and a later resume keeps what it asked.
#[tokio::test]
async fn a_client_asked_ttl_replaces_the_servers_and_is_capped_by_it() {
    let server = ExecServer::start(&[
        "--listen",
        "ws://127.0.0.1:0",
        "--detached-session-ttl",
        "3",
    ]);
    for (asked, expected) in [
        (0, Duration::ZERO),
        (1, Duration::from_secs(1)),
        (3600, Duration::from_secs(3)),
    ] {
        let mut client = server.connect().await;
        client
            .request(
                "initialize",
                json!({"clientName": "t", "detachedSessionTtlSeconds": asked}),
            )
            .await
            .unwrap();
        let pid = start_sleeper(&mut client).await;
        client.close().await;
        let detached = Instant::now();
        tokio::task::spawn_blocking(move || {
            wait_process_dead(
                pid,
                expected + Duration::from_secs(8),
                "process of the session",
            )
        })
        .await
        .unwrap();
        let died_after = detached.elapsed();
        assert!(
            died_after >= expected.saturating_sub(Duration::from_millis(200)),
            "asked {asked} s: died {died_after:?} after the detach, before {expected:?}"
        );
        if expected.is_zero() {
            // Terminated at once (SIGTERM answered by sleep's death), no TTL waited.
            assert!(
                died_after < Duration::from_secs(2),
                "asked 0 s: {died_after:?}"
            );
        }
    }
    // A negative or fractional TTL is not a number of seconds the server takes.
    let mut client = server.connect().await;
    let error = client
        .request(
            "initialize",
            json!({"clientName": "t", "detachedSessionTtlSeconds": -1}),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code, -32602, "{error:?}");
}
