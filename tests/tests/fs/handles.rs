//! Handles: `fs/open`, `fs/readBlock`, `fs/close` and their limits; a restricting sandbox is
//! enforced, never ignored.

use super::*;

#[tokio::test]
async fn open_read_block_and_close() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let result = client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&path)}))
        .await;
    assert_eq!(result, json!({"handleId": "h"}));
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 1000}),
        )
        .await;
    assert_eq!(unb64(block["chunk"].as_str().unwrap()), &data[..1000]);
    assert_eq!(block["eof"], false);
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 2500, "len": 1000}),
        )
        .await;
    assert_eq!(unb64(block["chunk"].as_str().unwrap()), &data[2500..]);
    assert_eq!(block["eof"], true);
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 5000, "len": 10}),
        )
        .await;
    assert_eq!(
        (block["chunk"].as_str(), &block["eof"]),
        (Some(""), &json!(true))
    );
    assert_eq!(
        client.call("fs/close", json!({"handleId": "h"})).await,
        json!({})
    );
    assert_rpc_error(
        client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": 0, "len": 1}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_rpc_error(
        client.request("fs/close", json!({"handleId": "h"})).await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn read_block_len_must_be_between_one_and_the_limit() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("f");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(READ_BLOCK_MAX_BYTES + 10)
        .unwrap();
    client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&path)}))
        .await;
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": READ_BLOCK_MAX_BYTES}),
        )
        .await;
    assert_eq!(
        unb64(block["chunk"].as_str().unwrap()).len() as u64,
        READ_BLOCK_MAX_BYTES
    );
    for len in [0, READ_BLOCK_MAX_BYTES + 1] {
        let error = client
            .request(
                "fs/readBlock",
                json!({"handleId": "h", "offset": 0, "len": len}),
            )
            .await
            .expect_err("len out of range must be refused");
        // docs/protocol.md: "len from 1 to READ_BLOCK_MAX_BYTES"; either an invalid param or a
        // named limit is a faithful reading.
        let kind = error_kind(&error);
        assert!(
            (error.code, kind.as_str()) == (-32602, "invalidParams")
                || (error.code, kind.as_str()) == (-32600, "limitExceeded"),
            "len {len}: {error:?}"
        );
    }
}

#[tokio::test]
async fn open_with_a_handle_id_in_use_is_already_exists() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("f");
    std::fs::write(&path, "x").unwrap();
    client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&path)}))
        .await;
    assert_rpc_error(
        client
            .request("fs/open", json!({"handleId": "h", "path": file_uri(&path)}))
            .await,
        -32600,
        "alreadyExists",
    );
    assert_rpc_error(
        client
            .request(
                "fs/open",
                json!({"handleId": "m", "path": file_uri(dir.path().join("no"))}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_rpc_error(
        client
            .request(
                "fs/open",
                json!({"handleId": "d", "path": file_uri(dir.path())}),
            )
            .await,
        -32600,
        "notAFile",
    );
}

#[tokio::test]
async fn the_129th_open_handle_is_refused_until_one_is_closed() {
    let (server, mut client, dir) = setup().await;
    let path = dir.path().join("f");
    std::fs::write(&path, "x").unwrap();
    let mut ids = Vec::new();
    for i in 0..MAX_OPEN_HANDLES {
        ids.push(
            client
                .send_request(
                    "fs/open",
                    json!({"handleId": format!("h{i}"), "path": file_uri(&path)}),
                )
                .await,
        );
    }
    for id in &ids {
        client.response(id).await.unwrap();
    }
    let error = assert_rpc_error(
        client
            .request(
                "fs/open",
                json!({"handleId": "one-too-many", "path": file_uri(&path)}),
            )
            .await,
        -32600,
        "limitExceeded",
    );
    assert_eq!(error.data.unwrap().limit, Some(MAX_OPEN_HANDLES as u64));
    client.call("fs/close", json!({"handleId": "h0"})).await;
    client
        .call(
            "fs/open",
            json!({"handleId": "one-too-many", "path": file_uri(&path)}),
        )
        .await;
    // Handles belong to the connection: another one starts with none.
    let mut other = server.client().await;
    assert_rpc_error(
        other
            .request(
                "fs/readBlock",
                json!({"handleId": "h1", "offset": 0, "len": 1}),
            )
            .await,
        -32004,
        "notFound",
    );
    other
        .call(
            "fs/open",
            json!({"handleId": "h1", "path": file_uri(&path)}),
        )
        .await;
}

#[tokio::test]
async fn read_block_after_the_path_was_replaced_reads_the_opened_inode() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("f");
    std::fs::write(&path, "original").unwrap();
    client
        .call("fs/open", json!({"handleId": "h", "path": file_uri(&path)}))
        .await;
    let replacement = dir.path().join("g");
    std::fs::write(&replacement, "replaced!").unwrap();
    std::fs::rename(&replacement, &path).unwrap();
    let block = client
        .call(
            "fs/readBlock",
            json!({"handleId": "h", "offset": 0, "len": 100}),
        )
        .await;
    assert_eq!(unb64(block["chunk"].as_str().unwrap()), b"original");
}

#[tokio::test]
async fn restricting_sandbox_on_fs_is_enforced_never_silently_ignored() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("written");
    let result = client
        .request(
            "fs/writeFile",
            json!({"path": file_uri(&path), "dataBase64": b64("x"),
                   "sandbox": {"profile": "read-only"}}),
        )
        .await;
    assert_rpc_error(result, -32600, "sandboxDenied");
    assert!(!path.exists(), "the write must not have happened");
    // The same request without the sandbox writes (the denial above is the policy's).
    client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(&path), "dataBase64": b64("x")}),
        )
        .await;
    assert_eq!(std::fs::read(&path).unwrap(), b"x");
    // A read-only policy reads.
    let read = client
        .call(
            "fs/readFile",
            json!({"path": file_uri(&path), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"x");
}
