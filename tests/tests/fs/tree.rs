//! The tree: `fs/getMetadata`, `fs/canonicalize`, `fs/readDirectory`, `fs/remove` and `fs/copy`,
//! with symlinks followed or kept as the method says.

use super::*;

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
