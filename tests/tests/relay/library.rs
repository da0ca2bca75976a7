//! The library client (`supervisor::client`) over a relay stream: calls, errors, resuming on a new stream.

use super::*;

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
        max_bytes: None,
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
        max_bytes: None,
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
