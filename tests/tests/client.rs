//! The library client against the real server: processes, out-of-order completion, fs calls,
//! streaming reads, tokens and unix sockets, and calls that wait through a recovery.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proto::FileUri;
use proto::methods::fs::{
    CopyParams, CreateDirectoryParams, PathParams, ReadFileParams, RemoveParams,
};
use proto::methods::process::SignalName;
use supervisor::{ConnectionState, ExecServerClient, ExecServerClientConnectOptions, ProcessEvent};
use tests::*;
use tokio::io::AsyncReadExt;

fn server() -> ExecServer {
    ExecServer::start(&["--listen", "ws://127.0.0.1:0"])
}

fn uri(path: &std::path::Path) -> FileUri {
    FileUri::from_path(path).unwrap()
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("client call did not finish within the deadline")
}

#[tokio::test]
async fn process_output_lands_on_its_streams_with_the_exit_code() {
    let server = server();
    let client = library_client(server.url()).await;
    let handle = client
        .start_process(start_params("p", &sh("echo out; echo err >&2; exit 3")))
        .await
        .unwrap();
    let output = within(handle.wait()).await.unwrap();
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.exit_code, 3);
}

#[tokio::test]
async fn binary_and_json_output_deliver_every_byte_on_its_stream() {
    let server = server();
    // Every byte value, on both streams, in chunks of whatever sizes the pipes give.
    let dir = tempfile::tempdir().unwrap();
    let expected: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(dir.path().join("bytes"), &expected).unwrap();
    for binary in [true, false] {
        let client = ExecServerClient::connect(
            ExecServerClientConnectOptions::new(server.url()).with_binary_output(binary),
        )
        .await
        .unwrap();
        let mut params = start_params("p", &sh("cat bytes; cat bytes >&2; exit 5"));
        params.cwd = uri(dir.path());
        let output = within(client.start_process(params).await.unwrap().wait())
            .await
            .unwrap();
        assert_eq!(output.exit_code, 5, "binary {binary}");
        assert!(output.stdout == expected, "binary {binary}: stdout differs");
        assert!(output.stderr == expected, "binary {binary}: stderr differs");
    }
}

#[tokio::test]
async fn events_come_in_seq_order_ending_with_closed() {
    let server = server();
    let client = library_client(server.url()).await;
    let mut handle = client
        .start_process(start_params("p", &sh("for i in 1 2 3; do echo $i; done")))
        .await
        .unwrap();
    let mut seqs = Vec::new();
    loop {
        let event = next_event(&mut handle, DEADLINE).await;
        seqs.push(event.seq().unwrap());
        if event.is_terminal() {
            assert!(matches!(event, ProcessEvent::Closed { .. }), "{event:?}");
            break;
        }
    }
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected);
}

#[tokio::test]
async fn unread_events_are_bounded_and_end_with_a_failure_naming_the_limit() {
    let server = server();
    let client = library_client(server.url()).await;
    let limit = supervisor::CLIENT_EVENT_BUFFER_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("flood-written");
    let mark = mark.to_str().unwrap();
    // Nobody reads the events while 1.5x the limit is written.
    let mut flood = client
        .start_process(start_params(
            "flood",
            &sh(&format!(
                "head -c {} /dev/zero; touch {mark}",
                limit + limit / 2
            )),
        ))
        .await
        .unwrap();
    // A second process, read promptly, is unaffected. It ends after the flood was written,
    // and head could only finish once the server had sent all but its bounded outbound queue
    // (8 MiB) to this client: more than the limit has arrived unread by then.
    let neighbour = client
        .start_process(start_params(
            "neighbour",
            &sh(&format!(
                "while [ ! -e {mark} ]; do sleep 0.05; done; echo fine"
            )),
        ))
        .await
        .unwrap();
    let output = within(neighbour.wait()).await.unwrap();
    assert_eq!(output.stdout, b"fine\n");
    let mut received = 0usize;
    let last = loop {
        let event = next_event(&mut flood, DEADLINE).await;
        match event {
            ProcessEvent::Output { data, .. } => received += data.len(),
            other => break other,
        }
    };
    let ProcessEvent::Failed { error } = last else {
        panic!("expected Failed after the buffer overflowed, got {last:?} after {received} bytes");
    };
    assert!(
        error.to_string().contains("CLIENT_EVENT_BUFFER_BYTES"),
        "{error}"
    );
    assert!(
        received <= limit,
        "{received} bytes buffered, limit {limit}"
    );
    assert!(
        received > limit / 2,
        "only {received} bytes arrived before the failure"
    );
    // The connection is still good.
    let again = client
        .start_process(start_params("after", &["/bin/echo", "ok"]))
        .await
        .unwrap();
    assert_eq!(within(again.wait()).await.unwrap().stdout, b"ok\n");
}

#[tokio::test]
async fn requests_complete_out_of_order() {
    let server = server();
    let client = library_client(server.url()).await;
    let mut params = start_params("quiet", &["/bin/cat"]);
    params.pipe_stdin = true;
    let handle = client.start_process(params).await.unwrap();
    let process = handle.process().clone();
    let long_poll = {
        let process = process.clone();
        tokio::spawn(async move { process.read(Some(0), None, Some(30_000)).await })
    };
    // A later request completes while the long-poll is still waiting.
    let metadata = within(client.fs_get_metadata(PathParams {
        path: uri(std::path::Path::new("/")),
        sandbox: None,
    }))
    .await
    .unwrap();
    assert!(metadata.is_directory);
    assert!(!long_poll.is_finished());
    process.write(b"wake\n").await.unwrap();
    let read = within(long_poll).await.unwrap().unwrap();
    assert_eq!(read.chunks.len(), 1, "{read:?}");
    process.close_stdin().await.unwrap();
    within(handle.wait()).await.unwrap();
}

#[tokio::test]
async fn stdin_writes_round_trip_and_close_ends_the_process() {
    let server = server();
    let client = library_client(server.url()).await;
    let mut params = start_params("cat", &["/bin/cat"]);
    params.pipe_stdin = true;
    let handle = client.start_process(params).await.unwrap();
    handle.process().write(b"hello ").await.unwrap();
    handle.process().write_and_close(b"world").await.unwrap();
    let output = within(handle.wait()).await.unwrap();
    assert_eq!(output.stdout, b"hello world");
    assert_eq!(output.exit_code, 0);
}

#[tokio::test]
async fn a_repeated_write_id_is_applied_once() {
    let server = server();
    let client = library_client(server.url()).await;
    let mut params = start_params("cat", &["/bin/cat"]);
    params.pipe_stdin = true;
    let handle = client.start_process(params).await.unwrap();
    for _ in 0..3 {
        handle
            .process()
            .write_with_id(b"once\n", "the-same-id", false)
            .await
            .unwrap();
    }
    handle.process().close_stdin().await.unwrap();
    assert_eq!(within(handle.wait()).await.unwrap().stdout, b"once\n");
}

#[tokio::test]
async fn resize_signal_and_terminate() {
    let server = server();
    let client = library_client(server.url()).await;
    let mut params = start_params(
        "tty",
        &sh("echo ready; read x; stty size; exec /bin/sleep 1000"),
    );
    params.tty = true;
    let mut tty = client.start_process(params).await.unwrap();
    wait_for_event_output(&mut tty, "ready", DEADLINE).await;
    tty.process().resize(100, 40).await.unwrap();
    tty.process().write(b"\n").await.unwrap();
    wait_for_event_output(&mut tty, "40 100", DEADLINE).await;
    assert!(tty.process().terminate().await.unwrap());
    let ended = within(tty.wait()).await.unwrap();
    assert_eq!((ended.exit_code, ended.signal), (143, Some(15)));

    let interrupted = client
        .start_process(start_params("int", &sh("echo $$; exec /bin/sleep 1000")))
        .await
        .unwrap();
    let (process, mut events) = interrupted.into_parts();
    assert!(matches!(
        within(events.next()).await,
        Some(ProcessEvent::Output { .. })
    ));
    assert!(process.signal(SignalName::Interrupt).await.unwrap());
    let mut exit = None;
    while let Some(event) = within(events.next()).await {
        if let ProcessEvent::Exited { exit_code, .. } = event {
            exit = Some(exit_code);
        }
    }
    assert_eq!(exit, Some(130));
}

#[tokio::test]
async fn server_errors_keep_their_code_and_kind() {
    let server = server();
    let client = library_client(server.url()).await;
    let error = client
        .start_process(start_params("missing", &["/nonexistent/program"]))
        .await
        .err()
        .unwrap();
    assert_eq!(error.rpc_code(), Some(-32004), "{error}");
    let error = client.process("nobody").terminate().await.unwrap();
    assert!(
        !error,
        "terminating an unknown process reports running: false"
    );
    let error = client
        .fs_read_file(ReadFileParams {
            path: uri(std::path::Path::new("/nonexistent/file")),
            sandbox: None,
            max_bytes: None,
        })
        .await
        .err()
        .unwrap();
    assert!(error.is_not_found(), "{error}");
}

#[tokio::test]
async fn every_fs_method_round_trips() {
    let server = server();
    let client = library_client(server.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    let file = sub.join("a.txt");
    within(client.fs_create_directory(CreateDirectoryParams {
        path: uri(&sub),
        recursive: true,
        sandbox: None,
    }))
    .await
    .unwrap();
    within(client.fs_write_file(uri(&file), b"content", true, None))
        .await
        .unwrap();
    let read = client
        .fs_read_file(ReadFileParams {
            path: uri(&file),
            sandbox: None,
            max_bytes: None,
        })
        .await
        .unwrap();
    assert_eq!(read, b"content");
    let metadata = client
        .fs_get_metadata(PathParams {
            path: uri(&file),
            sandbox: None,
        })
        .await
        .unwrap();
    assert!(metadata.is_file && metadata.size == 7);
    let copy = sub.join("b.txt");
    client
        .fs_copy(CopyParams {
            source_path: uri(&file),
            destination_path: uri(&copy),
            recursive: false,
            sandbox: None,
        })
        .await
        .unwrap();
    let entries = client
        .fs_read_directory(PathParams {
            path: uri(&sub),
            sandbox: None,
        })
        .await
        .unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e.file_name.as_str()).collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
    let canonical = client
        .fs_canonicalize(PathParams {
            path: uri(&sub.join("..").join("sub").join("b.txt")),
            sandbox: None,
        })
        .await
        .unwrap();
    assert_eq!(canonical, uri(&std::fs::canonicalize(&copy).unwrap()));
    client
        .fs_remove(RemoveParams {
            path: uri(&sub),
            recursive: true,
            force: false,
            sandbox: None,
        })
        .await
        .unwrap();
    assert!(!sub.exists());
}

#[tokio::test]
async fn a_large_file_streams_through_async_read() {
    let server = server();
    let client = library_client(server.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let data: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let mut reader = within(client.fs_open(uri(&path), None)).await.unwrap();
    let mut read = Vec::new();
    within(reader.read_to_end(&mut read)).await.unwrap();
    assert!(
        read == data,
        "streamed bytes differ ({} vs {})",
        read.len(),
        data.len()
    );
}

#[tokio::test]
async fn token_and_unix_socket_connections() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let socket = dir.path().join("exec.sock");
    let server = ExecServer::start(&[
        "--listen",
        &format!("unix:{}", socket.display()),
        "--auth-token-file",
        token.to_str().unwrap(),
    ]);
    let refused = ExecServerClient::connect(
        ExecServerClientConnectOptions::new(server.url()).with_auth_token(Some("wrong".into())),
    )
    .await
    .err()
    .unwrap();
    assert!(refused.to_string().contains("401"), "{refused}");
    let client = ExecServerClient::connect(
        ExecServerClientConnectOptions::new(server.url()).with_auth_token(Some("s3cret".into())),
    )
    .await
    .unwrap();
    let output = client
        .start_process(start_params("p", &["/bin/echo", "via unix"]))
        .await
        .unwrap()
        .wait()
        .await
        .unwrap();
    assert_eq!(output.stdout, b"via unix\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_while_recovering_wait_and_the_session_is_the_same() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let client = library_client(&proxy.url()).await;
    let session = client.session_id().to_owned();
    proxy.pause();
    wait_for_state(&client, DEADLINE, "recovering", |s| {
        matches!(s, ConnectionState::Recovering { .. })
    })
    .await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .start_process(start_params("later", &["/bin/echo", "after"]))
                .await
        })
    };
    proxy.wait_refused(1, DEADLINE).await;
    assert!(!waiting.is_finished(), "calls wait while recovering");
    proxy.resume();
    let handle = within(waiting).await.unwrap().unwrap();
    assert_eq!(within(handle.wait()).await.unwrap().stdout, b"after\n");
    assert_eq!(client.session_id(), session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fails_for_good_when_the_session_is_gone() {
    let server = server();
    let proxy = CutProxy::start(server.addr()).await;
    let mut options = ExecServerClientConnectOptions::new(proxy.url());
    options.recovery_timeout = Duration::from_secs(1);
    let client = ExecServerClient::connect(options).await.unwrap();
    let handle = client
        .start_process(start_params("p", &sh("exec /bin/sleep 1000")))
        .await
        .unwrap();
    proxy.pause();
    let state = wait_for_state(&client, Duration::from_secs(5), "failed", |s| {
        matches!(s, ConnectionState::Failed { .. })
    })
    .await;
    assert!(
        format!("{state:?}").contains("RECOVERY_DEADLINE"),
        "{state:?}"
    );
    let error = within(handle.wait()).await.err().unwrap();
    assert!(
        error.to_string().contains("could not be recovered"),
        "{error}"
    );
    proxy.resume();
    let later = client.fs_get_metadata(PathParams {
        path: uri(std::path::Path::new("/")),
        sandbox: None,
    });
    assert!(within(later).await.is_err(), "a failed client stays failed");
}
