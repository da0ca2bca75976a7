//! Remote mode end to end on loopback: harness -> exec-rendezvous -> exec-server --remote.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tests::relay::{Faults, Proxy, RemoteClient, start_executor, start_rendezvous};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

fn uri(path: &std::path::Path) -> String {
    format!("file://{}", path.display())
}

fn output_of(client: &RemoteClient, process_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for n in &client.notifications {
        if n["method"] == "process/output" && n["params"]["processId"] == process_id {
            out.extend(unb64(n["params"]["chunk"].as_str().unwrap_or_default()));
        }
    }
    out
}

async fn run_pty_and_fs(client: &mut RemoteClient, dir: &std::path::Path) {
    let started = client
        .call(
            "process/start",
            json!({"processId": "p1", "argv": ["/bin/sh", "-c", "printf 'relay %s\\n' \"$((6*7))\"; tty"], "tty": true, "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
    client
        .wait_notification(|n| n["method"] == "process/closed" && n["params"]["processId"] == "p1")
        .await;
    let text = String::from_utf8_lossy(&output_of(client, "p1")).into_owned();
    assert!(text.contains("relay 42"), "{text:?}");
    assert!(text.contains("/dev/pts/"), "not a PTY: {text:?}");

    let file = dir.join("remote.txt");
    let content = b"written through the relay\n";
    let written = client
        .call(
            "fs/writeFile",
            json!({"path": uri(&file), "dataBase64": b64(content)}),
        )
        .await;
    assert!(written.is_ok(), "{written:?}");
    assert_eq!(std::fs::read(&file).unwrap(), content);
    let read = client
        .call("fs/readFile", json!({"path": uri(&file)}))
        .await
        .unwrap();
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), content);
}

#[tokio::test(flavor = "multi_thread")]
async fn harness_runs_a_pty_process_and_fs_calls_through_the_rendezvous() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-e2e").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&rendezvous.first_line, "env-e2e").await;
    run_pty_and_fs(&mut client, dir.path()).await;
    client.connection.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rendezvous_never_sees_a_method_name_or_file_content() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let upstream = rendezvous
        .first_line
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = Proxy::start(upstream, Faults::default(), true).await;
    drop(rendezvous);
    let rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
    let _executor = start_executor(&rendezvous.first_line, "env-rec").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&rendezvous.first_line, "env-rec").await;
    run_pty_and_fs(&mut client, dir.path()).await;
    let frames = proxy.recorded.lock().unwrap().clone();
    assert!(
        frames.len() > 10,
        "the proxy saw only {} frames",
        frames.len()
    );
    let needles: [&[u8]; 7] = [
        b"process/start",
        b"fs/writeFile",
        b"initialize",
        b"dataBase64",
        b"written through the relay",
        &b64(b"written through the relay\n").into_bytes(),
        b"relay 42",
    ];
    for frame in &frames {
        for needle in needles {
            assert!(
                !frame.windows(needle.len()).any(|w| w == needle),
                "a relay frame contains {:?} in plaintext",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_streams_of_one_executor_are_isolated_and_reset_independently() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-two").await;
    let mut a = RemoteClient::connect(&rendezvous.first_line, "env-two").await;
    let mut b = RemoteClient::connect(&rendezvous.first_line, "env-two").await;
    a.call(
        "process/start",
        json!({"processId": "same", "argv": ["/bin/echo", "from-a"], "cwd": "file:///tmp"}),
    )
    .await
    .unwrap();
    b.call(
        "process/start",
        json!({"processId": "same", "argv": ["/bin/echo", "from-b"], "cwd": "file:///tmp"}),
    )
    .await
    .unwrap();
    a.wait_notification(|n| n["method"] == "process/closed")
        .await;
    b.wait_notification(|n| n["method"] == "process/closed")
        .await;
    assert_eq!(output_of(&a, "same"), b"from-a\n");
    assert_eq!(output_of(&b, "same"), b"from-b\n");
    // Closing (resetting) a leaves b running.
    a.connection.close().await;
    let listed = b
        .call("process/start", json!({"processId": "again", "argv": ["/bin/echo", "still-here"], "cwd": "file:///tmp"}))
        .await;
    assert!(listed.is_ok(), "{listed:?}");
    b.wait_notification(|n| n["method"] == "process/closed" && n["params"]["processId"] == "again")
        .await;
    assert_eq!(output_of(&b, "again"), b"still-here\n");
}

/// 10,000 JSON-RPC messages of mixed sizes (some segmented, several MiB) through a proxy that
/// drops 20%, duplicates 10% and reorders/delays frames on both rendezvous links; then the
/// rendezvous is killed and restarted mid-stream and the same stream carries on.
#[tokio::test(flavor = "multi_thread")]
async fn lossy_links_and_a_rendezvous_restart_deliver_every_message_exactly_once() {
    if let Ok(filter) = std::env::var("RELAY_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    // The rendezvous is restarted on the same port later. A port from outside the kernel's
    // ephemeral range cannot be taken meanwhile by the other tests, which all bind port 0.
    let upstream = port_outside_the_ephemeral_range();
    let faults = Faults {
        drop_percent: std::env::var("F_DROP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20),
        duplicate_percent: std::env::var("F_DUP")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
        max_delay_ms: std::env::var("F_DELAY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    };
    let proxy = Proxy::start(upstream, faults, false).await;
    let mut rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
    let registry = rendezvous.first_line.clone();
    let executor = start_executor(&registry, "env-lossy").await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = RemoteClient::connect(&registry, "env-lossy").await;

    // Enough for every kind of loss to hit every kind of message many times over (hundreds of
    // drops, a restart halfway, four multi-MiB messages), at 20% loss still about 40 s: each
    // loss stalls the window for a retransmission timeout (10,000 took 94 s).
    const TOTAL: u64 = 4_000;
    const WINDOW: u64 = 256;
    let big_every = 1_000;
    let mut expected: std::collections::HashMap<u64, Vec<u8>> = Default::default();
    let mut outstanding = std::collections::VecDeque::new();
    let mut sent = 0u64;
    let mut restarted = false;
    while sent < TOTAL || !outstanding.is_empty() {
        while sent < TOTAL && (outstanding.len() as u64) < WINDOW {
            let n = sent;
            let id = if n % big_every == 500 {
                // A multi-MiB message each way: written, then read back.
                let content: Vec<u8> = (0..3 * 1024 * 1024 + n as usize)
                    .map(|i| (i * 7 + n as usize) as u8)
                    .collect();
                let file = dir.path().join(format!("big-{n}"));
                // Answered behind up to WINDOW queued messages on lossy links: the same 60 s
                // as every other reply, not the 10 s of a quiet call.
                let write = client
                    .send(
                        "fs/writeFile",
                        json!({"path": uri(&file), "dataBase64": b64(&content)}),
                    )
                    .await;
                client
                    .response_within(write, Duration::from_secs(60))
                    .await
                    .unwrap();
                let id = client
                    .send("fs/readFile", json!({"path": uri(&file)}))
                    .await;
                expected.insert(id, content);
                id
            } else if n % 10 == 3 {
                // Medium: 1 to 21 KB of padding in an unknown method's params.
                let pad = "x".repeat(((n as usize * 37) % 20_000) + 1_000);
                client.send("no/such-method", json!({"pad": pad})).await
            } else {
                client.send("no/such-method", json!({"n": n})).await
            };
            outstanding.push_back(id);
            sent += 1;
        }
        let id = outstanding.pop_front().unwrap();
        if id % 1000 == 0 {
            eprintln!("progress: {id} answered of {TOTAL}");
        }
        let reply = client.response_within(id, Duration::from_secs(60)).await;
        match expected.remove(&id) {
            Some(content) => {
                let result = reply.unwrap();
                assert!(
                    unb64(result["dataBase64"].as_str().unwrap()) == content,
                    "big file {id} corrupted"
                );
            }
            None => {
                let error: Value = reply.unwrap_err();
                assert_eq!(error["code"], -32601, "{error}");
            }
        }
        if sent >= TOTAL / 2 && !restarted {
            restarted = true;
            drop(rendezvous);
            tokio::time::sleep(Duration::from_millis(300)).await;
            rendezvous = start_rendezvous(&upstream.to_string(), Some(&proxy.url));
            tests::relay::wait_registered(&registry, "env-lossy", &executor).await;
        }
    }
    assert!(restarted);
    assert!(proxy.dropped.load(std::sync::atomic::Ordering::Relaxed) > 100);
    // The same stream still works after all that.
    let ok = client
        .call(
            "process/start",
            json!({"processId": "after", "argv": ["/bin/true"], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    drop(rendezvous);
}

/// A free loopback address whose port the kernel never hands out for port 0.
fn port_outside_the_ephemeral_range() -> std::net::SocketAddr {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(32768);
    let start = 10_000 + (std::process::id() % 5_000) as u16;
    (start..low)
        .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .find(|address| std::net::TcpListener::bind(address).is_ok())
        .expect("a free port below the ephemeral range")
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(tests::DEADLINE, future)
        .await
        .expect("client call did not finish within the deadline")
}

fn file_uri(path: &std::path::Path) -> proto::FileUri {
    proto::FileUri::from_path(path).unwrap()
}

/// The library client through the rendezvous, with the same calls as over a local websocket.
#[tokio::test(flavor = "multi_thread")]
async fn library_client_runs_a_pty_process_and_fs_calls_through_the_rendezvous() {
    use proto::methods::fs::{PathParams, ReadFileParams};
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-lib").await;
    let client = tests::relay::remote_library_client(&rendezvous.first_line, "env-lib").await;

    let mut params = tests::start_params(
        "tty",
        &tests::sh("printf 'relay %s\\n' \"$((6*7))\"; read x; stty size; tty"),
    );
    params.tty = true;
    let mut tty = within(client.start_process(params)).await.unwrap();
    tests::wait_for_event_output(&mut tty, "relay 42", tests::DEADLINE).await;
    within(tty.process().resize(100, 40)).await.unwrap();
    within(tty.process().write(b"\n")).await.unwrap();
    let output = within(tty.wait()).await.unwrap();
    let text = String::from_utf8_lossy(&output.pty);
    assert!(text.contains("40 100"), "resize not applied: {text:?}");
    assert!(text.contains("/dev/pts/"), "not a PTY: {text:?}");
    assert_eq!(output.exit_code, 0);

    let piped = within(client.start_process(tests::start_params(
        "piped",
        &tests::sh("echo out; echo err >&2; exit 3"),
    )))
    .await
    .unwrap();
    let output = within(piped.wait()).await.unwrap();
    assert_eq!(
        (
            output.stdout.as_slice(),
            output.stderr.as_slice(),
            output.exit_code
        ),
        (&b"out\n"[..], &b"err\n"[..], 3)
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("through-relay.txt");
    // Larger than one relay segment (64 KiB), so it is segmented both ways.
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    within(client.fs_write_file(file_uri(&file), &content, true, None))
        .await
        .unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), content);
    let read = within(client.fs_read_file(ReadFileParams {
        path: file_uri(&file),
        sandbox: None,
    }))
    .await
    .unwrap();
    assert_eq!(read, content);
    let metadata = within(client.fs_get_metadata(PathParams {
        path: file_uri(&file),
        sandbox: None,
    }))
    .await
    .unwrap();
    assert!(metadata.is_file && metadata.size == content.len() as u64);
    let missing = within(client.fs_read_file(ReadFileParams {
        path: file_uri(&dir.path().join("missing")),
        sandbox: None,
    }))
    .await
    .err()
    .unwrap();
    assert!(missing.is_not_found(), "{missing}");
    client.close();
}

#[tokio::test(flavor = "multi_thread")]
async fn library_client_reports_a_wrong_token_and_an_unknown_environment() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-known").await;
    let mut args = tests::relay::remote_client_args(&rendezvous.first_line, "env-known");
    args.relay.bearer_token = "wrong".into();
    let refused = within(supervisor::ExecServerClient::connect_remote(args))
        .await
        .err()
        .unwrap();
    assert!(refused.to_string().contains("401"), "{refused}");
    let mut unknown = tests::relay::remote_client_args(&rendezvous.first_line, "env-unknown");
    unknown.relay.registration_wait = Duration::from_millis(300);
    let unknown = within(supervisor::ExecServerClient::connect_remote(unknown))
        .await
        .err()
        .unwrap();
    assert!(unknown.to_string().contains("404"), "{unknown}");
}

/// A transport around [`supervisor::RelayTransport`] whose current connection can be ended on
/// demand, as a reset relay stream ends it.
struct CuttableRelay {
    inner: supervisor::RelayTransport,
    cut: tokio::sync::watch::Sender<u64>,
}

impl supervisor::client::Transport for CuttableRelay {
    fn connect(
        &self,
    ) -> supervisor::client::transport::BoxFuture<
        '_,
        Result<supervisor::client::TransportConnection, supervisor::ExecServerError>,
    > {
        Box::pin(async move {
            let mut cut = self.cut.subscribe();
            cut.mark_unchanged();
            let mut inner = self.inner.connect().await?;
            let mut from_inner =
                std::mem::replace(&mut inner.incoming, tokio::sync::mpsc::channel(1).1);
            let (to_client, incoming) = tokio::sync::mpsc::channel(256);
            let forward = tokio::spawn(async move {
                loop {
                    tokio::select! {
                        message = from_inner.recv() => match message {
                            Some(message) => if to_client.send(message).await.is_err() { return },
                            None => return,
                        },
                        _ = cut.changed() => return,
                    }
                }
            });
            let mut tasks = std::mem::take(&mut inner.tasks);
            tasks.push(forward.abort_handle());
            Ok(supervisor::client::TransportConnection {
                outgoing: inner.outgoing.clone(),
                incoming,
                tasks,
            })
        })
    }

    fn endpoint(&self) -> String {
        self.inner.endpoint()
    }
}

/// When a relay stream ends, the client resumes its session on a new stream: same session,
/// output written meanwhile delivered once and in order.
#[tokio::test(flavor = "multi_thread")]
async fn library_client_resumes_its_session_on_a_new_relay_stream() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-resume").await;
    let (transport, options) =
        tests::relay::remote_client_args(&rendezvous.first_line, "env-resume").into_parts();
    let (cut, _) = tokio::sync::watch::channel(0u64);
    let cuttable = std::sync::Arc::new(CuttableRelay {
        inner: transport,
        cut: cut.clone(),
    });
    let client = within(supervisor::ExecServerClient::connect_with_transport(
        cuttable, options,
    ))
    .await
    .unwrap();
    let session = client.session_id().to_owned();
    let mut params = tests::start_params(
        "counter",
        &tests::sh("echo first; read x; for i in 1 2 3 4 5; do echo line-$i; done; echo got-$x"),
    );
    params.pipe_stdin = true;
    let mut handle = within(client.start_process(params)).await.unwrap();
    tests::wait_for_event_output(&mut handle, "first", tests::DEADLINE).await;

    cut.send_modify(|n| *n += 1);
    tests::wait_for_state(&client, tests::DEADLINE, "recovering", |s| {
        matches!(s, supervisor::ConnectionState::Recovering { .. })
    })
    .await;
    // Written while (or right after) the client recovers: `process/write` is replayed safely.
    within(handle.process().write(b"after-cut\n"))
        .await
        .unwrap();
    let output = within(handle.wait()).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "line-1\nline-2\nline-3\nline-4\nline-5\ngot-after-cut\n"
    );
    assert_eq!(client.session_id(), session);
    assert!(
        matches!(client.state(), supervisor::ConnectionState::Connected { generation } if generation >= 2),
        "{:?}",
        client.state()
    );
}

/// Run `exec-server exec --remote ...` to completion (killed after the deadline): status,
/// stdout, stderr.
fn exec_remote(
    registry_url: &str,
    environment_id: &str,
    token: Option<&str>,
    command: &[&str],
) -> (std::process::ExitStatus, String, String) {
    let mut cmd = std::process::Command::new(tests::exec_server_binary());
    cmd.args([
        "exec",
        "--remote",
        registry_url,
        "--environment-id",
        environment_id,
        "--cwd",
        "/",
        "--",
    ])
    .args(command)
    .env_remove(supervisor::relay::REGISTRY_TOKEN_ENV);
    if let Some(token) = token {
        cmd.env(supervisor::relay::REGISTRY_TOKEN_ENV, token);
    }
    tests::output_within(&mut cmd, b"")
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_streams_stdout_and_stderr_and_passes_the_status_through() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let executor = start_executor(&rendezvous.first_line, "env-exec").await;
    let registry = rendezvous.first_line.clone();
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        exec_remote(
            &registry,
            "env-exec",
            Some(tests::relay::TOKEN),
            &tests::sh("echo out; echo err >&2; exit 3"),
        )
    })
    .await
    .unwrap();
    assert_eq!(status.code(), Some(3), "stderr: {stderr}");
    assert_eq!(stdout, "out\n");
    assert_eq!(stderr, "err\n");
    // exec closed its stream on the way out, so the executor freed it at once (not after the
    // 45 s liveness timeout).
    let until = tokio::time::Instant::now() + tests::DEADLINE;
    while !executor.stderr().contains("relay stream ended") {
        assert!(
            tokio::time::Instant::now() < until,
            "the executor still holds the stream of an exited exec:\n{}",
            executor.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_without_a_token_or_with_a_wrong_one_fails_with_255() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-exec-auth").await;
    let registry = rendezvous.first_line.clone();
    let (missing, wrong) = tokio::task::spawn_blocking(move || {
        (
            exec_remote(&registry, "env-exec-auth", None, &["/bin/true"]),
            exec_remote(&registry, "env-exec-auth", Some("wrong"), &["/bin/true"]),
        )
    })
    .await
    .unwrap();
    assert_eq!(missing.0.code(), Some(255));
    assert!(
        missing.2.contains("EXECWARD_REGISTRY_TOKEN"),
        "{}",
        missing.2
    );
    assert_eq!(wrong.0.code(), Some(255));
    assert!(wrong.2.contains("401"), "{}", wrong.2);
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_remote_to_an_unknown_environment_fails_with_255_after_the_registration_wait() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    // A registered executor under another id: the registry works, the id is just unknown.
    let _executor = start_executor(&rendezvous.first_line, "env-known").await;
    let registry = rendezvous.first_line.clone();
    let started = std::time::Instant::now();
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(tests::exec_server_binary());
        cmd.args([
            "exec",
            "--remote",
            &registry,
            "--environment-id",
            "env-nobody-registered",
            "--registration-wait",
            "1",
            "--cwd",
            "/",
            "--",
            "/bin/true",
        ])
        .env(supervisor::relay::REGISTRY_TOKEN_ENV, tests::relay::TOKEN);
        tests::output_within(&mut cmd, b"")
    })
    .await
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(status.code(), Some(255), "stderr: {stderr}");
    assert_eq!(stdout, "", "nothing ran");
    assert!(
        stderr.contains("env-nobody-registered"),
        "the error names the environment: {stderr}"
    );
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
        "waited {waited:?} for a 1 s registration wait"
    );
}
