//! Budgets (see the parent module): pending connections, client names, huge paths, descriptors
//! and fs-helpers across many connections.

use super::*;

/// `MAX_PENDING_CONNECTIONS`: connections not yet initialized, server-wide.
const MAX_PENDING_CONNECTIONS: usize = 256;
/// `MAX_PENDING_PER_SOURCE`: of them, from one source address.
const MAX_PENDING_PER_SOURCE: usize = 128;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_lock_out_clients_that_speak() {
    // The number: 1,030 silent sockets filled every slot of the old server.
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
    // 6 MB of PATH entries (the attack stalled every session for 7.6 s): refused as an
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
    // The case: 100 policies in each of 2 sessions left 200 helpers alive.
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
