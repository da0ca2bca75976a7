//! Sandboxed `fs/*`: writes inside the workspace and denials outside, symlink escapes, `.git`,
//! read-only, deny entries, walks and streaming reads.

use super::*;

#[tokio::test]
async fn workspace_write_allows_inside_and_denies_outside_for_every_write_operation() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = dirs.write_policy();

    // Allowed inside the workspace.
    let inside = dirs.ws("new.txt");
    fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&inside), "dataBase64": b64("ok")}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(&inside).unwrap(), b"ok");
    fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("d/e"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert!(dirs.ws("d/e").is_dir());
    fs_call(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&inside), "destinationPath": file_uri(dirs.ws("copy.txt"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dirs.ws("copy.txt")).unwrap(), b"ok");
    fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("copy.txt"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert!(!dirs.ws("copy.txt").exists());

    // Denied outside, and nothing changes there.
    let target = dirs.out("new.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&target), "dataBase64": b64("no")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &target);
    assert!(!target.exists());
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(dirs.out("secret.txt")), "dataBase64": b64("no")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &dirs.out("secret.txt"));
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.out("d"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.out("d"));
    assert!(!dirs.out("d").exists());
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.out("secret.txt"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/remove", &dirs.out("secret.txt"));
    let r = fs_call(
        &mut client,
        "fs/copy",
        json!({"sourcePath": file_uri(&inside), "destinationPath": file_uri(dirs.out("c.txt"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/copy", &dirs.out("c.txt"));
    assert!(!dirs.out("c.txt").exists());
    assert_eq!(
        std::fs::read(dirs.out("secret.txt")).unwrap(),
        b"outside",
        "outside file untouched"
    );
}

#[tokio::test]
async fn symlink_escapes_are_denied_for_writes_directories_and_copies() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = dirs.write_policy();
    let through = dirs.ws("escape/via-link.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&through), "dataBase64": b64("x")}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &through);
    assert!(!dirs.out("via-link.txt").exists());
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("escape/dir"))}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.ws("escape/dir"));
    assert!(!dirs.out("dir").exists());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("in.txt")), "destinationPath": file_uri(dirs.ws("escape/copied.txt"))}), policy.clone()).await;
    assert_denied(r, "fs/copy", &dirs.ws("escape/copied.txt"));
    assert!(!dirs.out("copied.txt").exists());
    // Removing the link removes the link only (allowed, inside); the outside stays.
    fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("escape"))}),
        policy.clone(),
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dirs.out("secret.txt")).unwrap(), b"outside");
}

#[tokio::test]
async fn git_inside_the_workspace_stays_read_only() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let head = dirs.ws(".git/HEAD");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&head), "dataBase64": b64("evil")}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &head);
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(dirs.ws(".git/hooks-new")), "dataBase64": b64("evil")}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &dirs.ws(".git/hooks-new"));
    assert!(
        !dirs.ws(".git/hooks-new").exists(),
        "the denied write landed"
    );
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(&head)}),
        dirs.write_policy(),
    )
    .await;
    assert_denied(r, "fs/remove", &head);
    assert_eq!(std::fs::read(&head).unwrap(), b"ref: refs/heads/main\n");
    // Reading it is fine.
    let read = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(&head)}),
        dirs.write_policy(),
    )
    .await
    .unwrap();
    assert_eq!(
        unb64(read["dataBase64"].as_str().unwrap()),
        b"ref: refs/heads/main\n"
    );
}

#[tokio::test]
async fn read_only_reads_everything_and_writes_nothing() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    for path in [dirs.ws("in.txt"), dirs.out("secret.txt")] {
        let read = fs_call(
            &mut client,
            "fs/readFile",
            json!({"path": file_uri(&path)}),
            read_only(),
        )
        .await
        .unwrap();
        assert!(!unb64(read["dataBase64"].as_str().unwrap()).is_empty());
    }
    let meta = fs_call(
        &mut client,
        "fs/getMetadata",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(meta["isFile"], json!(true));
    let listing = fs_call(
        &mut client,
        "fs/readDirectory",
        json!({"path": file_uri(dirs.workspace.path())}),
        read_only(),
    )
    .await
    .unwrap();
    assert!(
        listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["fileName"] == "in.txt")
    );
    let canonical = fs_call(
        &mut client,
        "fs/canonicalize",
        json!({"path": file_uri(dirs.ws("escape"))}),
        read_only(),
    )
    .await
    .unwrap();
    assert_eq!(
        canonical["path"],
        json!(file_uri(
            std::fs::canonicalize(dirs.outside.path()).unwrap()
        ))
    );
    let target = dirs.ws("blocked.txt");
    let r = fs_call(
        &mut client,
        "fs/writeFile",
        json!({"path": file_uri(&target), "dataBase64": b64("x")}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/writeFile", &target);
    assert!(!target.exists());
    let r = fs_call(
        &mut client,
        "fs/createDirectory",
        json!({"path": file_uri(dirs.ws("nd"))}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/createDirectory", &dirs.ws("nd"));
    assert!(!dirs.ws("nd").exists(), "the denied directory was created");
    let r = fs_call(
        &mut client,
        "fs/remove",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        read_only(),
    )
    .await;
    assert_denied(r, "fs/remove", &dirs.ws("in.txt"));
    assert!(dirs.ws("in.txt").exists());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("in.txt")), "destinationPath": file_uri(dirs.ws("c.txt"))}), read_only()).await;
    assert_denied(r, "fs/copy", &dirs.ws("c.txt"));
    assert!(!dirs.ws("c.txt").exists(), "the denied copy landed");
}

#[tokio::test]
async fn deny_entries_block_reads_listing_and_copy_sources_also_through_symlinks() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = deny_outside(&dirs);
    let spec_ok = fs_call(
        &mut client,
        "fs/readFile",
        json!({"path": file_uri(dirs.ws("in.txt"))}),
        policy.clone(),
    )
    .await;
    if let Err(error) = &spec_ok {
        panic!("the permissions profile shape should be accepted: {error:?}");
    }
    for path in [dirs.out("secret.txt"), dirs.ws("escape/secret.txt")] {
        let r = fs_call(
            &mut client,
            "fs/readFile",
            json!({"path": file_uri(&path)}),
            policy.clone(),
        )
        .await;
        assert_denied(r, "fs/readFile", &path);
    }
    let r = fs_call(
        &mut client,
        "fs/readDirectory",
        json!({"path": file_uri(dirs.outside.path())}),
        policy.clone(),
    )
    .await;
    assert_denied(r, "fs/readDirectory", dirs.outside.path());
    let r = fs_call(&mut client, "fs/copy", json!({"sourcePath": file_uri(dirs.ws("escape/secret.txt")), "destinationPath": file_uri(dirs.ws("stolen.txt"))}), policy.clone()).await;
    assert_denied(r, "fs/copy", &dirs.ws("escape/secret.txt"));
    assert!(!dirs.ws("stolen.txt").exists());
}

#[tokio::test]
async fn walk_under_a_sandbox_leaves_out_the_subtree_the_policy_hides() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let tree = dirs.ws("tree");
    std::fs::create_dir_all(tree.join("hidden/inner")).unwrap();
    std::fs::write(tree.join("hidden/inner/key.pem"), b"secret").unwrap();
    std::fs::create_dir(tree.join("visible")).unwrap();
    std::fs::write(tree.join("visible/b.txt"), b"b").unwrap();
    std::fs::write(tree.join("a.txt"), b"a").unwrap();
    let policy = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": tree.join("hidden")}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let listed = |result: &Value| -> Vec<String> {
        result["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["path"].as_str().expect("path").to_owned())
            .collect()
    };
    let r = fs_call(
        &mut client,
        "fs/walk",
        json!({"path": file_uri(&tree)}),
        policy,
    )
    .await;
    let result = r.expect("the walk succeeds around the hidden subtree");
    assert_eq!(result["truncated"], json!(false));
    assert_eq!(
        listed(&result),
        ["a.txt", "visible", "visible/b.txt"].map(|name| file_uri(tree.join(name)))
    );
    // Without the deny the same walk sees the subtree: its absence above is the policy's.
    let r = fs_call(
        &mut client,
        "fs/walk",
        json!({"path": file_uri(&tree)}),
        read_only(),
    )
    .await;
    let paths = listed(&r.expect("a read-only walk"));
    assert!(
        paths.contains(&file_uri(tree.join("hidden/inner/key.pem"))),
        "{paths:?}"
    );
}

#[tokio::test]
async fn sandboxed_streaming_read_works_through_a_passed_descriptor() {
    let dirs = Dirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(dirs.ws("big.bin"), &big).unwrap();
    fs_call(
        &mut client,
        "fs/open",
        json!({"handleId": "h", "path": file_uri(dirs.ws("big.bin"))}),
        read_only(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    loop {
        let block = client
            .call(
                "fs/readBlock",
                json!({"handleId": "h", "offset": got.len(), "len": 1 << 20}),
            )
            .await;
        got.extend(unb64(block["chunk"].as_str().unwrap()));
        if block["eof"] == json!(true) {
            break;
        }
    }
    assert_eq!(got, big);
    client.call("fs/close", json!({"handleId": "h"})).await;
    // Opening a denied file fails like any denial.
    let policy = json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": dirs.outside.path()}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    });
    let r = fs_call(
        &mut client,
        "fs/open",
        json!({"handleId": "h2", "path": file_uri(dirs.out("secret.txt"))}),
        policy,
    )
    .await;
    assert_denied(r, "fs/open", &dirs.out("secret.txt"));
    let r = client
        .request(
            "fs/readBlock",
            json!({"handleId": "h2", "offset": 0, "len": 10}),
        )
        .await;
    assert_rpc_error(r, -32004, "notFound");
}

/// A permissions profile: everything readable, the workspace writable, the outside denied.
pub(crate) fn deny_outside(dirs: &Dirs) -> Value {
    json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "path", "path": dirs.workspace.path()}, "access": "write"},
            {"path": {"type": "path", "path": dirs.outside.path()}, "access": "deny"}
        ]}},
        "cwd": file_uri(dirs.workspace.path())
    })
}

/// A file the policy denies is examined by the helper alone, which may not open it. The server
/// backed a read's answer from its own `stat` of the client's path before the helper's verdict:
/// with the memory budget nearly held by other clients, a denied 12 MiB file was refused as too
/// large for the budget (`limitExceeded`) while a denied small one was refused as denied, which
/// told a sandboxed client a denied file's existence and size class (and, filling the budget by
/// degrees, its size). Now both are denied alike; an allowed file as large still meets the
/// budget, from the size the helper found for it. Once the budget is free, the allowed files of
/// every size class (one exchange, a second one with the same helper, a bulk read after its
/// turn) are read whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_denied_files_size_shows_neither_in_the_answer_nor_in_a_refusal_of_the_memory_budget() {
    const MIB: usize = 1024 * 1024;
    let dirs = Dirs::new();
    // The smallest budget the server takes (MAX_FRAME_BYTES).
    let server = ExecServer::start(&["--memory-budget", "64M"]);
    std::fs::write(dirs.ws("hold.bin"), vec![7u8; 8 * MIB]).unwrap();
    // A 12 MiB file's answer (base64 twice while it is built) takes 32 MiB of the budget.
    std::fs::write(dirs.ws("big.bin"), vec![7u8; 12 * MIB]).unwrap();
    std::fs::write(dirs.out("big.bin"), vec![7u8; 12 * MIB]).unwrap();
    std::fs::write(dirs.out("small.txt"), b"small").unwrap();
    let medium: Vec<u8> = (0..200 * 1024).map(|i| (i % 241) as u8).collect();
    std::fs::write(dirs.ws("medium.bin"), &medium).unwrap();
    let bulk: Vec<u8> = (0..3 * MIB).map(|i| (i % 251) as u8).collect();
    std::fs::write(dirs.ws("bulk.bin"), &bulk).unwrap();
    // Clients that never read hold 8 MiB files' answers until 40 MiB of the budget is held:
    // then less than 32 MiB is left, with the reader's own 2 MiB allowance.
    let mut holders = Vec::new();
    let mut in_use = 0;
    while in_use < 40 * MIB as u64 {
        assert!(
            holders.len() < 12,
            "{} clients that never read hold {in_use} bytes of the budget",
            holders.len()
        );
        let mut holder = server.client().await;
        let hold = json!({"path": file_uri(dirs.ws("hold.bin"))});
        holder.send_request("fs/readFile", hold).await;
        holders.push(holder);
        // Until the answer is sent as far as it goes.
        let mut last = None;
        while last != Some(in_use) {
            last = Some(in_use);
            tokio::time::sleep(Duration::from_millis(200)).await;
            in_use = server.budget("memoryBytes").await["inUse"]
                .as_u64()
                .unwrap();
        }
    }

    let mut client = server.client().await;
    let policy = deny_outside(&dirs);
    let read = |path: PathBuf| json!({"path": file_uri(path)});
    // The control: an allowed 12 MiB file is refused by the budget.
    let allowed = fs_call(
        &mut client,
        "fs/readFile",
        read(dirs.ws("big.bin")),
        policy.clone(),
    )
    .await;
    assert_rpc_error(allowed, -32600, "limitExceeded");
    for path in [dirs.out("big.bin"), dirs.out("small.txt")] {
        let denied = fs_call(
            &mut client,
            "fs/readFile",
            read(path.clone()),
            policy.clone(),
        )
        .await;
        assert_denied(denied, "fs/readFile", &path);
    }
    // An allowed small file is read meanwhile.
    let small = fs_call(
        &mut client,
        "fs/readFile",
        read(dirs.ws("in.txt")),
        policy.clone(),
    )
    .await;
    assert_eq!(
        unb64(small.unwrap()["dataBase64"].as_str().unwrap()),
        b"inside"
    );
    drop(holders);
    // With the budget free again, every size class is read whole.
    for (name, contents) in [("medium.bin", &medium), ("bulk.bin", &bulk)] {
        let until = Instant::now() + Duration::from_secs(10);
        let data = loop {
            let answer = fs_call(
                &mut client,
                "fs/readFile",
                read(dirs.ws(name)),
                policy.clone(),
            );
            match answer.await {
                Ok(value) => break unb64(value["dataBase64"].as_str().unwrap()),
                // The holders' answers may take a moment to be given back.
                Err(error) if Instant::now() < until => {
                    eprintln!("{name}: {error:?}, again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => panic!("{name} was never read: {error:?}"),
            }
        };
        assert!(data == *contents, "{name}: {} bytes read", data.len());
    }
}
