//! Descriptor exhaustion.

use super::*;

/// RLIMIT_NOFILE (soft and hard) of the server in the exhaustion test: room for its own
/// descriptors (listener, epoll, guardian pipe, a few connections) and some handles, far fewer
/// than MAX_OPEN_HANDLES (128), so the limit is reached before the protocol's own caps.
const LOW_NOFILE: u64 = 64;

fn server_with_nofile(limit: u64) -> ExecServer {
    use std::os::unix::process::CommandExt;
    ExecServer::start_with(&[], |command| {
        // SAFETY: the closure runs in the forked child before exec and only calls setrlimit(2),
        // which is async-signal-safe and allocates nothing.
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

#[tokio::test]
async fn running_out_of_descriptors_gives_clear_errors_and_recovers_when_they_free_up() {
    let dir = workspace();
    let file = dir.path().join("f.txt");
    std::fs::write(&file, b"data").unwrap();
    let server = server_with_nofile(LOW_NOFILE);
    let mut client = server.client().await;
    let baseline = fd_count(server.pid());
    // Open handles until the process runs out of descriptors (before MAX_OPEN_HANDLES).
    let mut opened = 0;
    let exhausted = loop {
        let r = client
            .request(
                "fs/open",
                json!({"handleId": format!("h{opened}"), "path": file_uri(&file)}),
            )
            .await;
        match r {
            Ok(_) => opened += 1,
            Err(error) => break error,
        }
        assert!(
            opened < 128,
            "never ran out with RLIMIT_NOFILE {LOW_NOFILE}"
        );
    };
    assert_eq!(
        (exhausted.code, error_kind(&exhausted).as_str()),
        (-32603, "io"),
        "{exhausted:?}"
    );
    assert!(
        exhausted.message.contains("Too many open files"),
        "the message must name the cause: {exhausted:?}"
    );
    // Everything that needs a descriptor fails the same clear way; nothing crashes.
    let r = client.start("p", &["/bin/true"], json!({})).await;
    let error = r.expect_err("a start without descriptors");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    let r = client
        .request("fs/readFile", json!({"path": file_uri(&file)}))
        .await;
    let error = r.expect_err("a read without descriptors");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    let r = client
        .request(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    let error = r.expect_err("a sandboxed read without descriptors");
    assert_eq!(error_kind(&error), "helperFailed", "{error:?}");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    // A new connection cannot even be accepted now; it waits in the listen backlog.
    let url = server.url().to_owned();
    let waiting = tokio::spawn(async move { Client::connect(&url).await.map(|_| ()) });
    // Descriptors free up: the waiting connection is accepted and everything works again.
    for i in 0..opened {
        client
            .call("fs/close", json!({"handleId": format!("h{i}")}))
            .await;
    }
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("the waiting connection is accepted once descriptors are free")
        .unwrap()
        .expect("handshake");
    let out = client.run("p", &sh("echo back"), json!({})).await;
    assert_eq!(out.stdout_text(), "back\n");
    let read = client
        .call(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"data");
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    // No leak: with the extra connection gone and the helper retired, back to the baseline
    // (plus the pooled helper's socket and stderr pipe).
    let started = Instant::now();
    while fd_count(server.pid()) > baseline + 2 {
        assert!(
            started.elapsed() < DEADLINE,
            "descriptors: {} now, {baseline} at the start",
            fd_count(server.pid())
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }
}
