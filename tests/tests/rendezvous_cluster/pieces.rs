//! Relay frames longer than a NATS piece cross the cluster whole, both ways.

use tests::{b64, file_uri, unb64};

use super::*;

/// A 1 MiB file written by a harness on node B to an executor on node A, and read back: every
/// relay frame of both messages is a full Noise segment (about 64 KiB), so each crosses NATS as
/// several pieces, on the executor's subject one way and the harness socket's the other. The
/// links drop and duplicate frames, so whole frames go missing and come again; the bytes must
/// still arrive exactly, in both directions, with nothing spliced from two frames.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_write_and_read_cross_two_nodes_in_pieces_and_arrive_exactly() {
    let nats = Nats::start();
    let faults = Faults {
        drop_percent: 5,
        duplicate_percent: 5,
        max_delay_ms: 1,
    };
    let (nodes, _proxies) = nodes_behind_faulty_proxies(&nats, &["a", "b"], faults).await;
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let executor = start_executor_with(&nodes[0].first_line, "env-pieces", &identity, &[]);
    wait_registered(&nodes[1].first_line, "env-pieces", &executor).await;
    let mut client = RemoteClient::connect(&nodes[1].first_line, "env-pieces").await;

    let content: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let file = dir.path().join("large.bin");
    let written = client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(&file), "dataBase64": b64(&content)}),
        )
        .await;
    assert!(written.is_ok(), "{written:?}");
    assert!(
        std::fs::read(&file).unwrap() == content,
        "the file written through two nodes differs from what the harness sent"
    );
    let read = client
        .call("fs/readFile", json!({"path": file_uri(&file)}))
        .await
        .unwrap();
    assert!(
        unb64(read["dataBase64"].as_str().unwrap()) == content,
        "the file read through two nodes differs from the one on disk"
    );
}
