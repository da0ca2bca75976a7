//! `fs/*` methods against a real directory tree: data round trips, symlinks, FIFOs, non-UTF-8
//! names, handles and their limits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tests::{Client, ExecServer, RpcError, assert_rpc_error, b64, error_kind, file_uri, unb64};

/// `MAX_OPEN_HANDLES` from docs/protocol.md.
const MAX_OPEN_HANDLES: usize = 128;
/// `READ_BLOCK_MAX_BYTES` from docs/protocol.md.
const READ_BLOCK_MAX_BYTES: u64 = 1024 * 1024;
/// `READ_FILE_MAX_BYTES` from docs/protocol.md.
const READ_FILE_MAX_BYTES: u64 = 32 * 1024 * 1024;

async fn setup() -> (ExecServer, Client, tempfile::TempDir) {
    let server = ExecServer::start(&["--listen", "ws://127.0.0.1:0"]);
    let client = server.client().await;
    (server, client, tempfile::tempdir().unwrap())
}

async fn read_file(client: &mut Client, path: &Path) -> Result<Vec<u8>, RpcError> {
    let result = client
        .request("fs/readFile", json!({"path": file_uri(path)}))
        .await?;
    Ok(unb64(result["dataBase64"].as_str().expect("dataBase64")))
}

async fn metadata(client: &mut Client, path: &Path) -> Result<Value, RpcError> {
    client
        .request("fs/getMetadata", json!({"path": file_uri(path)}))
        .await
}

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

#[tokio::test]
async fn get_metadata_of_file_and_directory() {
    let (_server, mut client, dir) = setup().await;
    let file = dir.path().join("f");
    std::fs::write(&file, "12345").unwrap();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let m = metadata(&mut client, &file).await.unwrap();
    assert_eq!(
        (&m["isFile"], &m["isDirectory"], &m["isSymlink"], &m["size"]),
        (&json!(true), &json!(false), &json!(false), &json!(5)),
        "{m}"
    );
    let modified = m["modifiedAtMs"].as_i64().expect("modifiedAtMs");
    assert!(
        (modified - now_ms).abs() < 60_000,
        "modifiedAtMs {modified} vs now {now_ms}"
    );
    assert!(m["createdAtMs"].is_i64(), "{m}");
    let d = metadata(&mut client, dir.path()).await.unwrap();
    assert_eq!(
        (&d["isFile"], &d["isDirectory"]),
        (&json!(false), &json!(true)),
        "{d}"
    );
    assert_rpc_error(
        metadata(&mut client, &dir.path().join("missing")).await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn get_metadata_of_a_symlink_follows_it_and_reports_is_symlink() {
    let (_server, mut client, dir) = setup().await;
    std::fs::write(dir.path().join("target"), "abc").unwrap();
    symlink("target", dir.path().join("link")).unwrap();
    symlink(dir.path(), dir.path().join("dirlink")).unwrap();
    let m = metadata(&mut client, &dir.path().join("link"))
        .await
        .unwrap();
    assert_eq!(
        (&m["isFile"], &m["isDirectory"], &m["isSymlink"], &m["size"]),
        (&json!(true), &json!(false), &json!(true), &json!(3)),
        "{m}"
    );
    let m = metadata(&mut client, &dir.path().join("dirlink"))
        .await
        .unwrap();
    assert_eq!(
        (&m["isDirectory"], &m["isSymlink"]),
        (&json!(true), &json!(true)),
        "{m}"
    );
}

#[tokio::test]
async fn get_metadata_of_a_dangling_symlink_reports_the_link_or_not_found() {
    // docs/protocol.md does not say which; both are consistent with "follows a symlink for the
    // kind" and with readDirectory's "dangling symlinks are listed with both kinds false".
    let (_server, mut client, dir) = setup().await;
    symlink("missing", dir.path().join("dangling")).unwrap();
    match metadata(&mut client, &dir.path().join("dangling")).await {
        Ok(m) => assert_eq!(
            (&m["isFile"], &m["isDirectory"], &m["isSymlink"]),
            (&json!(false), &json!(false), &json!(true)),
            "{m}"
        ),
        Err(error) => {
            assert_rpc_error(Err(error), -32004, "notFound");
        }
    }
}

#[tokio::test]
async fn canonicalize_resolves_symlinks_dot_and_dot_dot() {
    let (_server, mut client, dir) = setup().await;
    let real = dir.path().canonicalize().unwrap();
    std::fs::create_dir(real.join("sub")).unwrap();
    symlink(real.join("sub"), real.join("link")).unwrap();
    let input = format!("{}/link/./../sub/.", file_uri(&real));
    let result = client.call("fs/canonicalize", json!({"path": input})).await;
    assert_eq!(result, json!({"path": file_uri(real.join("sub"))}));
    let via_link = client
        .call(
            "fs/canonicalize",
            json!({"path": file_uri(real.join("link"))}),
        )
        .await;
    assert_eq!(via_link["path"], file_uri(real.join("sub")));
    assert_rpc_error(
        client
            .request(
                "fs/canonicalize",
                json!({"path": file_uri(real.join("missing"))}),
            )
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn read_directory_lists_sorted_entries_including_dangling_links() {
    let (_server, mut client, dir) = setup().await;
    let d = dir.path();
    std::fs::write(d.join("b-file"), "").unwrap();
    std::fs::create_dir(d.join("a-dir")).unwrap();
    symlink("a-dir", d.join("c-dirlink")).unwrap();
    symlink("missing", d.join("d-dangling")).unwrap();
    let result = client
        .call("fs/readDirectory", json!({"path": file_uri(d)}))
        .await;
    let entries: Vec<Value> = result["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            json!([
                e["fileName"],
                e["path"],
                e["isDirectory"],
                e["isFile"],
                e["isSymlink"]
            ])
        })
        .collect();
    let entry = |name: &str, dir: bool, file: bool, link: bool| {
        json!([name, file_uri(d.join(name)), dir, file, link])
    };
    assert_eq!(
        entries,
        vec![
            entry("a-dir", true, false, false),
            entry("b-file", false, true, false),
            entry("c-dirlink", true, false, true),
            entry("d-dangling", false, false, true),
        ]
    );
    assert_rpc_error(
        client
            .request(
                "fs/readDirectory",
                json!({"path": file_uri(d.join("missing"))}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_rpc_error(
        client
            .request(
                "fs/readDirectory",
                json!({"path": file_uri(d.join("b-file"))}),
            )
            .await,
        -32600,
        "notADirectory",
    );
}

#[tokio::test]
async fn remove_of_a_symlink_to_a_directory_removes_only_the_link() {
    let (_server, mut client, dir) = setup().await;
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), "precious").unwrap();
    let link = dir.path().join("link");
    symlink(&target, &link).unwrap();
    client
        .call(
            "fs/remove",
            json!({"path": file_uri(&link), "recursive": true}),
        )
        .await;
    assert!(std::fs::symlink_metadata(&link).is_err(), "link removed");
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"precious");
}

#[tokio::test]
async fn recursive_remove_does_not_follow_symlinks_inside_the_tree() {
    let (_server, mut client, dir) = setup().await;
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "precious").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    symlink(&outside, tree.join("sub/escape")).unwrap();
    std::fs::write(tree.join("sub/file"), "").unwrap();
    client
        .call("fs/remove", json!({"path": file_uri(&tree)}))
        .await;
    assert!(!tree.exists());
    assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"precious");
}

#[tokio::test]
async fn remove_non_empty_directory_without_recursive_is_directory_not_empty() {
    let (_server, mut client, dir) = setup().await;
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), "").unwrap();
    assert_rpc_error(
        client
            .request(
                "fs/remove",
                json!({"path": file_uri(&tree), "recursive": false}),
            )
            .await,
        -32600,
        "directoryNotEmpty",
    );
    assert!(tree.join("f").exists());
}

#[tokio::test]
async fn remove_of_missing_path_succeeds_with_force_and_is_not_found_without() {
    let (_server, mut client, dir) = setup().await;
    let missing = dir.path().join("missing");
    assert_eq!(
        client
            .call("fs/remove", json!({"path": file_uri(&missing)}))
            .await,
        json!({})
    );
    assert_rpc_error(
        client
            .request(
                "fs/remove",
                json!({"path": file_uri(&missing), "force": false}),
            )
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn copy_file_copies_contents() {
    let (_server, mut client, dir) = setup().await;
    let source = dir.path().join("s");
    std::fs::write(&source, "contents").unwrap();
    let destination = dir.path().join("d");
    client
        .call(
            "fs/copy",
            json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination)}),
        )
        .await;
    assert_eq!(std::fs::read(&destination).unwrap(), b"contents");
    assert_rpc_error(
        client
            .request(
                "fs/copy",
                json!({"sourcePath": file_uri(dir.path().join("missing")),
                       "destinationPath": file_uri(dir.path().join("d2"))}),
            )
            .await,
        -32004,
        "notFound",
    );
}

#[tokio::test]
async fn copy_of_a_directory_without_recursive_is_refused() {
    let (_server, mut client, dir) = setup().await;
    let source = dir.path().join("src");
    std::fs::create_dir(&source).unwrap();
    let destination = dir.path().join("dst");
    assert_rpc_error(
        client
            .request(
                "fs/copy",
                json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination)}),
            )
            .await,
        -32600,
        "isADirectory",
    );
    assert!(!destination.exists());
}

#[tokio::test]
async fn copy_into_its_own_descendant_is_refused() {
    let (_server, mut client, dir) = setup().await;
    let source = dir.path().join("src");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let destination = source.join("sub/copy");
    let error = client
        .request(
            "fs/copy",
            json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination),
                   "recursive": true}),
        )
        .await
        .expect_err("copy into own descendant must be refused");
    // docs/protocol.md names no code or kind for this: a refused request (-32600) and an
    // invalid source/destination pair (-32602) are both faithful readings.
    assert!([-32600, -32602].contains(&error.code), "{error:?}");
    assert!(!error_kind(&error).is_empty(), "{error:?}");
    assert!(!destination.exists(), "nothing was created");
}

#[tokio::test]
async fn recursive_copy_keeps_symlinks_as_symlinks() {
    let (_server, mut client, dir) = setup().await;
    let source = dir.path().join("src");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("sub/file"), "data").unwrap();
    std::fs::set_permissions(
        source.join("sub/file"),
        std::fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    symlink("sub/file", source.join("rel-link")).unwrap();
    symlink("/nonexistent/target", source.join("dangling")).unwrap();
    let destination = dir.path().join("dst");
    client
        .call(
            "fs/copy",
            json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination),
                   "recursive": true}),
        )
        .await;
    assert_eq!(
        std::fs::read(destination.join("sub/file")).unwrap(),
        b"data"
    );
    for (name, target) in [
        ("rel-link", "sub/file"),
        ("dangling", "/nonexistent/target"),
    ] {
        let link = destination.join(name);
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink(),
            "{name}"
        );
        assert_eq!(std::fs::read_link(&link).unwrap(), Path::new(target));
    }
    assert_eq!(
        std::fs::metadata(destination.join("sub/file"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o751
    );
}

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

/// `fs/walk`'s entries as `[path relative to root, depth, isDirectory, isFile, isSymlink]`.
fn walk_summary(root: &Path, result: &Value) -> Vec<Value> {
    let prefix = format!("{}/", file_uri(root));
    result["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let path = e["path"].as_str().expect("path");
            let relative = path.strip_prefix(&prefix).expect("below the root");
            json!([
                relative,
                e["depth"],
                e["isDirectory"],
                e["isFile"],
                e["isSymlink"]
            ])
        })
        .collect()
}

#[tokio::test]
async fn walk_lists_the_tree_depth_first_sorted_by_name_with_depths_and_kinds() {
    let (_server, mut client, dir) = setup().await;
    let d = dir.path();
    std::fs::create_dir_all(d.join("b-dir/inner")).unwrap();
    std::fs::write(d.join("b-dir/inner/deep.txt"), "").unwrap();
    std::fs::write(d.join("b-dir/a.txt"), "").unwrap();
    std::fs::write(d.join("a.txt"), "").unwrap();
    std::fs::write(d.join("c.txt"), "").unwrap();
    let result = client.call("fs/walk", json!({"path": file_uri(d)})).await;
    assert_eq!(result["truncated"], json!(false));
    assert_eq!(
        walk_summary(d, &result),
        vec![
            json!(["a.txt", 1, false, true, false]),
            json!(["b-dir", 1, true, false, false]),
            json!(["b-dir/a.txt", 2, false, true, false]),
            json!(["b-dir/inner", 2, true, false, false]),
            json!(["b-dir/inner/deep.txt", 3, false, true, false]),
            json!(["c.txt", 1, false, true, false]),
        ]
    );
    let shallow = client
        .call("fs/walk", json!({"path": file_uri(d), "maxDepth": 1}))
        .await;
    assert_eq!(
        walk_summary(d, &shallow),
        vec![
            json!(["a.txt", 1, false, true, false]),
            json!(["b-dir", 1, true, false, false]),
            json!(["c.txt", 1, false, true, false]),
        ]
    );
}

#[tokio::test]
async fn walk_lists_a_symlink_to_an_outside_directory_without_entering_it() {
    let (_server, mut client, dir) = setup().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    symlink(outside.path(), tree.join("escape")).unwrap();
    std::fs::write(tree.join("file"), "").unwrap();
    let result = client
        .call("fs/walk", json!({"path": file_uri(&tree)}))
        .await;
    assert_eq!(
        walk_summary(&tree, &result),
        vec![
            json!(["escape", 1, false, false, true]),
            json!(["file", 1, false, true, false]),
        ]
    );
}

#[tokio::test]
async fn walk_past_max_entries_is_truncated_and_limits_out_of_range_are_invalid_params() {
    let (_server, mut client, dir) = setup().await;
    let d = dir.path();
    for name in ["a", "b", "c", "d", "e"] {
        std::fs::write(d.join(name), "").unwrap();
    }
    let cut = client
        .call("fs/walk", json!({"path": file_uri(d), "maxEntries": 3}))
        .await;
    assert_eq!(cut["truncated"], json!(true));
    let names: Vec<Value> = walk_summary(d, &cut).iter().map(|e| e[0].clone()).collect();
    assert_eq!(names, vec![json!("a"), json!("b"), json!("c")]);
    let exact = client
        .call("fs/walk", json!({"path": file_uri(d), "maxEntries": 5}))
        .await;
    assert_eq!(exact["truncated"], json!(false));
    assert_eq!(exact["entries"].as_array().unwrap().len(), 5);
    for params in [
        json!({"path": file_uri(d), "maxEntries": 100_001}),
        json!({"path": file_uri(d), "maxEntries": 0}),
        json!({"path": file_uri(d), "maxDepth": 257}),
    ] {
        let error = assert_rpc_error(
            client.request("fs/walk", params.clone()).await,
            -32602,
            "invalidParams",
        );
        assert!(
            error.message.contains("WALK_MAX_ENTRIES") || error.message.contains("MAX_TREE_DEPTH"),
            "{params}: {error:?}"
        );
    }
}

#[tokio::test]
async fn walk_of_a_missing_path_is_not_found() {
    let (_server, mut client, dir) = setup().await;
    let missing = dir.path().join("missing");
    let error = assert_rpc_error(
        client
            .request("fs/walk", json!({"path": file_uri(&missing)}))
            .await,
        -32004,
        "notFound",
    );
    let data = error.data.expect("data");
    assert_eq!(data.operation.as_deref(), Some("fs/walk"));
}
