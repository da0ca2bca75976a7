//! Remote mode carries binary output frames end to end, and both Noise ciphers: harness ->
//! exec-rendezvous -> exec-server --remote on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use proto::relay::noise::CIPHER_REFUSED;
use proto::relay::{Cipher, CipherChoice};
use serde_json::{Value, json};
use tests::relay::{RemoteClient, connect_args, start_executor, start_rendezvous};
use tests::{b64, unb64};

/// `(seq, stream, bytes)` of every `process/output` of `process_id`, in arrival order.
fn outputs(client: &RemoteClient, process_id: &str) -> Vec<(u64, String, Vec<u8>)> {
    client
        .notifications
        .iter()
        .filter(|n| n["method"] == "process/output" && n["params"]["processId"] == process_id)
        .map(|n| {
            let p = &n["params"];
            (
                p["seq"].as_u64().unwrap(),
                p["stream"].as_str().unwrap().to_owned(),
                unb64(p["chunk"].as_str().unwrap()),
            )
        })
        .collect()
}

/// How the `process/output` notifications of `process_id` came: `"binary"` or JSON (`null`).
fn forms(client: &RemoteClient, process_id: &str) -> Vec<Value> {
    client
        .notifications
        .iter()
        .filter(|n| n["method"] == "process/output" && n["params"]["processId"] == process_id)
        .map(|n| n["frame"].clone())
        .collect()
}

fn stream_bytes(outputs: &[(u64, String, Vec<u8>)], stream: &str) -> Vec<u8> {
    outputs
        .iter()
        .filter(|(_, s, _)| s == stream)
        .flat_map(|(_, _, bytes)| bytes.iter().copied())
        .collect()
}

/// Every seq the process's events carried (output, exited, closed), in arrival order.
fn event_seqs(client: &RemoteClient, process_id: &str) -> Vec<u64> {
    client
        .notifications
        .iter()
        .filter(|n| n["params"]["processId"] == process_id)
        .filter_map(|n| n["params"]["seq"].as_u64())
        .collect()
}

async fn run_to_closed(client: &mut RemoteClient, process_id: &str, script: &str) {
    let started = client
        .call(
            "process/start",
            json!({"processId": process_id, "argv": ["/bin/sh", "-c", script], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
    client
        .wait_notification(|n| {
            n["method"] == "process/closed" && n["params"]["processId"] == process_id
        })
        .await;
}

/// A harness that asks for binary output gets every byte (not UTF-8, and a MiB at once) as
/// binary frames with the seqs `process/read` returns; a JSON harness on the same executor at
/// the same time gets the same bytes as JSON, as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_binary_harness_gets_exact_bytes_and_a_json_harness_beside_it_gets_json() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-bin").await;
    let args = connect_args(&rendezvous.first_line, "env-bin");
    let mut binary = RemoteClient::connect_initializing(
        &args,
        json!({"clientName": "binary", "binaryOutput": true}),
    )
    .await;
    assert_eq!(
        binary.initialized["binaryOutput"], true,
        "{}",
        binary.initialized
    );
    let mut plain = RemoteClient::connect(&rendezvous.first_line, "env-bin").await;
    assert!(
        plain.initialized.get("binaryOutput").is_none(),
        "{}",
        plain.initialized
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.bin");
    let mut content = b"a\xff\x00b\xc3(".to_vec();
    content.extend((0..1024 * 1024u32).map(|i| (i % 251) as u8));
    content.extend_from_slice(b"\xfe end");
    std::fs::write(&file, &content).unwrap();
    let script = format!("cat '{}'; printf 'e\\376' >&2", file.display());

    let (b, j) = tokio::join!(
        run_to_closed(&mut binary, "b", &script),
        run_to_closed(&mut plain, "j", &script)
    );
    let ((), ()) = (b, j);

    let from_frames = outputs(&binary, "b");
    assert!(!from_frames.is_empty());
    assert!(
        forms(&binary, "b").iter().all(|f| f == "binary"),
        "JSON output reached the binary harness"
    );
    assert!(
        stream_bytes(&from_frames, "stdout") == content,
        "stdout bytes differ"
    );
    assert_eq!(stream_bytes(&from_frames, "stderr"), b"e\xfe");
    let seqs = event_seqs(&binary, "b");
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    // `process/read` (JSON) returns the same chunks under the same seqs (the retained tail).
    let read = binary
        .call("process/read", json!({"processId": "b", "afterSeq": 0}))
        .await
        .unwrap();
    let from_read: Vec<(u64, String, Vec<u8>)> = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["seq"].as_u64().unwrap(),
                c["stream"].as_str().unwrap().to_owned(),
                unb64(c["chunk"].as_str().unwrap()),
            )
        })
        .collect();
    assert!(!from_read.is_empty());
    assert!(
        from_frames.ends_with(&from_read),
        "process/read disagrees with the frames"
    );

    let from_json = outputs(&plain, "j");
    assert!(forms(&plain, "j").iter().all(Value::is_null));
    assert!(
        stream_bytes(&from_json, "stdout") == content,
        "JSON stdout bytes differ"
    );
    assert_eq!(stream_bytes(&from_json, "stderr"), b"e\xfe");
    assert_eq!(binary.unclaimed() + plain.unclaimed(), 0);
}

/// `initialize`, retrying while the old stream still holds the session (-32010).
async fn initialize_resuming(
    args: &supervisor::relay::RemoteConnectArgs,
    params: Value,
) -> RemoteClient {
    let started = Instant::now();
    loop {
        let mut client = RemoteClient::open(args).await;
        match client.call("initialize", params.clone()).await {
            Ok(result) => {
                client.initialized = result;
                client.notify("initialized", json!({})).await;
                return client;
            }
            Err(error) if error["data"]["kind"] == "sessionAttached" => {
                assert!(started.elapsed() < tests::DEADLINE, "{error}");
                tokio::time::sleep(Duration::from_millis(20)).await; // retry interval
            }
            Err(error) => panic!("initialize {params}: {error}"),
        }
    }
}

/// Seqs continue across a resume on a new relay stream, in the form the new stream asked for.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_binary_harness_continues_the_seqs_in_binary_frames() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let _executor = start_executor(&rendezvous.first_line, "env-resume").await;
    let args = connect_args(&rendezvous.first_line, "env-resume");
    let mut first = RemoteClient::connect_initializing(
        &args,
        json!({"clientName": "binary", "binaryOutput": true}),
    )
    .await;
    let session = first.initialized["sessionId"].as_str().unwrap().to_owned();
    let started = first
        .call(
            "process/start",
            json!({"processId": "cat", "argv": ["/bin/cat"], "pipeStdin": true, "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
    let write = |text: &[u8]| json!({"processId": "cat", "chunk": b64(text)});
    first
        .call("process/write", write(b"one\xff\n"))
        .await
        .unwrap();
    let one = first
        .wait_notification(|n| n["method"] == "process/output")
        .await;
    assert_eq!(one["frame"], "binary", "{one}");
    assert_eq!(
        unb64(one["params"]["chunk"].as_str().unwrap()),
        b"one\xff\n"
    );
    let one_seq = one["params"]["seq"].as_u64().unwrap();
    first.connection.close().await;

    let mut second = initialize_resuming(
        &args,
        json!({"clientName": "binary", "binaryOutput": true, "resumeSessionId": session}),
    )
    .await;
    assert_eq!(second.initialized["binaryOutput"], true);
    second
        .call("process/write", write(b"two\x00\n"))
        .await
        .unwrap();
    let two = second
        .wait_notification(|n| n["method"] == "process/output")
        .await;
    assert_eq!(two["frame"], "binary", "{two}");
    assert_eq!(
        unb64(two["params"]["chunk"].as_str().unwrap()),
        b"two\x00\n"
    );
    assert_eq!(two["params"]["seq"].as_u64().unwrap(), one_seq + 1);
    let read = second
        .call("process/read", json!({"processId": "cat", "afterSeq": 0}))
        .await
        .unwrap();
    let chunks: Vec<(u64, Vec<u8>)> = read["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["seq"].as_u64().unwrap(),
                unb64(c["chunk"].as_str().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        chunks,
        vec![
            (one_seq, b"one\xff\n".to_vec()),
            (one_seq + 1, b"two\x00\n".to_vec())
        ]
    );
}

async fn echo_through(args: &supervisor::relay::RemoteConnectArgs) -> Cipher {
    let mut client = RemoteClient::connect_initializing(
        args,
        json!({"clientName": "cipher", "binaryOutput": true}),
    )
    .await;
    run_to_closed(&mut client, "p", "printf 'ciphered\\377'").await;
    assert_eq!(
        stream_bytes(&outputs(&client, "p"), "stdout"),
        b"ciphered\xff"
    );
    client.connection.cipher()
}

/// Both ciphers carry a stream; a cipher the environment refuses fails at once with its
/// reason when the harness named it, and falls back to ChaCha20-Poly1305 when it did not.
#[tokio::test(flavor = "multi_thread")]
async fn both_ciphers_interoperate_and_a_refused_cipher_fails_fast_with_the_reason() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let dir = tempfile::tempdir().unwrap();
    let start = |id: &str, policy: &str| {
        tests::relay::start_executor_with(
            registry,
            id,
            &dir.path().join(id),
            &["--relay-ciphers", policy],
        )
    };
    let any = start("env-any", "any");
    let chacha = start("env-chacha", "chachapoly");
    tests::relay::wait_registered(registry, "env-any", &any).await;
    tests::relay::wait_registered(registry, "env-chacha", &chacha).await;

    for cipher in Cipher::ALL {
        let args = connect_args(registry, "env-any").with_cipher(CipherChoice::Only(cipher));
        assert_eq!(echo_through(&args).await, cipher);
    }
    let args =
        connect_args(registry, "env-chacha").with_cipher(CipherChoice::Only(Cipher::ChaChaPoly));
    assert_eq!(echo_through(&args).await, Cipher::ChaChaPoly);
    // Auto: this machine's preference, refused (when it is AES-GCM) and replaced.
    let args = connect_args(registry, "env-chacha");
    assert_eq!(echo_through(&args).await, Cipher::ChaChaPoly);

    let refused_args =
        connect_args(registry, "env-chacha").with_cipher(CipherChoice::Only(Cipher::AesGcm));
    let started = Instant::now();
    let refused = supervisor::relay::RelayHarnessConnection::connect(&refused_args)
        .await
        .err()
        .expect("an AES-GCM stream to a chachapoly-only environment");
    let text = refused.to_string();
    assert!(
        text.contains(CIPHER_REFUSED) && text.contains("aesgcm") && text.contains("chachapoly"),
        "{text}"
    );
    // An answer, not the handshake timeout (20 s).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
