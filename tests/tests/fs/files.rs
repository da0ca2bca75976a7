//! Whole files and directories made: `fs/writeFile` and `fs/readFile` round trips and errors,
//! `fs/createDirectory`.

use super::*;

#[tokio::test]
async fn write_file_then_read_file_round_trips_every_byte() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("data.bin");
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let result = client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(&path), "dataBase64": b64(&data)}),
        )
        .await;
    assert_eq!(result, json!({}));
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(read_file(&mut client, &path).await.unwrap(), data);
    // Truncates on overwrite.
    client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(&path), "dataBase64": b64("short")}),
        )
        .await;
    assert_eq!(std::fs::read(&path).unwrap(), b"short");
}

#[tokio::test]
async fn atomic_write_file_replaces_the_target() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("a.txt");
    std::fs::write(&path, "old").unwrap();
    let old_inode = std::fs::metadata(&path).unwrap().ino();
    client
        .call(
            "fs/writeFile",
            json!({"path": file_uri(&path), "dataBase64": b64("new"), "atomic": true}),
        )
        .await;
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_ne!(
        std::fs::metadata(&path).unwrap().ino(),
        old_inode,
        "rename, not rewrite"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![OsStr::new("a.txt").to_owned()],
        "no temporary file left behind"
    );
}

#[tokio::test]
async fn non_utf8_file_names_round_trip() {
    let (_server, mut client, dir) = setup().await;
    let name = OsStr::from_bytes(b"caf\xe9 \xff.txt");
    let path = dir.path().join(name);
    let uri = file_uri(&path);
    assert!(uri.contains("%E9") || uri.contains("%e9"), "{uri}");
    client
        .call(
            "fs/writeFile",
            json!({"path": uri, "dataBase64": b64("bytes")}),
        )
        .await;
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"bytes",
        "the exact byte name was created"
    );
    assert_eq!(read_file(&mut client, &path).await.unwrap(), b"bytes");
    let listing = client
        .call("fs/readDirectory", json!({"path": file_uri(dir.path())}))
        .await;
    let entries = listing["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listing}");
    assert_eq!(
        entries[0]["path"], uri,
        "entry path must be exact: {listing}"
    );
    assert_eq!(entries[0]["isFile"], true);
    // The reported path can be used as is.
    let again = entries[0]["path"].as_str().unwrap().to_owned();
    let result = client.call("fs/readFile", json!({"path": again})).await;
    assert_eq!(unb64(result["dataBase64"].as_str().unwrap()), b"bytes");
}

#[tokio::test]
async fn write_file_with_missing_parent_is_not_found() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("no/such/file");
    let error = assert_rpc_error(
        client
            .request(
                "fs/writeFile",
                json!({"path": file_uri(&path), "dataBase64": ""}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_eq!(
        error.data.unwrap().operation.as_deref(),
        Some("fs/writeFile")
    );
}

#[tokio::test]
async fn write_file_with_invalid_base64_is_invalid_base64() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("x");
    assert_rpc_error(
        client
            .request(
                "fs/writeFile",
                json!({"path": file_uri(&path), "dataBase64": "@@@"}),
            )
            .await,
        -32602,
        "invalidBase64",
    );
    assert!(!path.exists());
}

#[tokio::test]
async fn read_file_of_missing_path_is_not_found_naming_operation_and_path() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("missing");
    let error = assert_rpc_error(
        read_file(&mut client, &path).await.map(|_| json!(null)),
        -32004,
        "notFound",
    );
    let data = error.data.unwrap();
    assert_eq!(data.operation.as_deref(), Some("fs/readFile"));
    assert_eq!(data.path.as_deref(), Some(file_uri(&path).as_str()));
}

#[tokio::test]
async fn read_file_of_a_fifo_is_not_a_file_without_blocking() {
    let (_server, mut client, dir) = setup().await;
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let started = Instant::now();
    let result = client
        .request_within(
            "fs/readFile",
            json!({"path": file_uri(&fifo)}),
            Duration::from_secs(5),
        )
        .await;
    assert_rpc_error(result, -32600, "notAFile");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // fs/open refuses it the same way.
    assert_rpc_error(
        client
            .request_within(
                "fs/open",
                json!({"handleId": "f", "path": file_uri(&fifo)}),
                Duration::from_secs(5),
            )
            .await,
        -32600,
        "notAFile",
    );
}

#[tokio::test]
async fn read_file_of_a_directory_is_not_a_file() {
    let (_server, mut client, dir) = setup().await;
    assert_rpc_error(
        read_file(&mut client, dir.path())
            .await
            .map(|_| json!(null)),
        -32600,
        "notAFile",
    );
}

#[tokio::test]
async fn read_file_over_the_limit_is_limit_exceeded() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("sparse");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(READ_FILE_MAX_BYTES + 1).unwrap();
    let error = assert_rpc_error(
        read_file(&mut client, &path).await.map(|_| json!(null)),
        -32600,
        "limitExceeded",
    );
    assert_eq!(error.data.unwrap().limit, Some(READ_FILE_MAX_BYTES));
}

#[tokio::test]
async fn create_directory_is_recursive_by_default() {
    let (_server, mut client, dir) = setup().await;
    let path = dir.path().join("a/b/c");
    assert_eq!(
        client
            .call("fs/createDirectory", json!({"path": file_uri(&path)}))
            .await,
        json!({})
    );
    assert!(path.is_dir());
    // Recursive on an existing directory is fine.
    client
        .call("fs/createDirectory", json!({"path": file_uri(&path)}))
        .await;
}

#[tokio::test]
async fn create_directory_non_recursive_needs_parent_and_a_free_name() {
    let (_server, mut client, dir) = setup().await;
    let nested = dir.path().join("x/y");
    assert_rpc_error(
        client
            .request(
                "fs/createDirectory",
                json!({"path": file_uri(&nested), "recursive": false}),
            )
            .await,
        -32004,
        "notFound",
    );
    let single = dir.path().join("x");
    client
        .call(
            "fs/createDirectory",
            json!({"path": file_uri(&single), "recursive": false}),
        )
        .await;
    assert!(single.is_dir());
    assert_rpc_error(
        client
            .request(
                "fs/createDirectory",
                json!({"path": file_uri(&single), "recursive": false}),
            )
            .await,
        -32600,
        "alreadyExists",
    );
}
