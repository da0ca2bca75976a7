//! `environment/info` with absent, null and empty params; fs: a recursive copy with special
//! files, and the codes the reference client maps to invalid input.

use super::*;

#[tokio::test]
async fn environment_info_answers_absent_null_and_empty_params() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().canonicalize().unwrap();
    let server = ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.current_dir(&cwd);
    });
    let mut client = server.client().await;
    for params in [Value::Null, json!({}), json!({"future": true})] {
        let info = client.call("environment/info", params).await;
        let path = info["shell"]["path"].as_str().unwrap();
        assert!(
            Path::new(path).is_absolute() && Path::new(path).is_file(),
            "{info}"
        );
        assert_eq!(
            info["shell"]["name"].as_str(),
            Path::new(path).file_name().and_then(|name| name.to_str()),
            "{info}"
        );
        let passwd = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .unwrap()
            .unwrap()
            .shell;
        if passwd.is_file() {
            assert_eq!(Path::new(path), passwd, "the user's login shell");
        }
        assert_eq!(info["cwd"], json!(file_uri(&cwd)));
        assert_eq!(info["os"], json!(std::env::consts::OS));
        assert_eq!(info["arch"], json!(std::env::consts::ARCH));
    }
    // What sandbox-run itself reports on this host.
    let sandbox_run = exec_server_binary().with_file_name("sandbox-run");
    let explain = std::process::Command::new(sandbox_run)
        .args(["--policy", "read-only", "--explain", "--", "true"])
        .output()
        .unwrap();
    let explain: Value = serde_json::from_slice(&explain.stdout).unwrap();
    let info = client.call("environment/info", Value::Null).await;
    let sandbox = &info["sandbox"];
    assert_eq!(sandbox["available"], json!(true), "{info}");
    assert_eq!(sandbox["landlockAbi"], explain["layers"]["landlock"]["abi"]);
    assert_eq!(
        sandbox["userNamespaces"],
        explain["layers"]["namespaces"]["available"]
    );
    assert_eq!(
        sandbox["auditDenials"],
        json!(nix::unistd::geteuid().is_root())
    );
    assert_eq!(sandbox["networkModes"], json!(["off", "on"]));
}

#[tokio::test]
async fn recursive_copy_skips_a_fifo_and_copies_the_rest() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    std::fs::write(source.join("file"), "data").unwrap();
    std::fs::write(source.join("sub/inner"), "inner").unwrap();
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    nix::unistd::mkfifo(&source.join("pipe"), mode).unwrap();
    nix::unistd::mkfifo(&source.join("sub/pipe"), mode).unwrap();
    let destination = dir.path().join("copy");
    let result = client
        .call(
            "fs/copy",
            json!({"sourcePath": file_uri(&source), "destinationPath": file_uri(&destination),
                   "recursive": true, "sandbox": null}),
        )
        .await;
    assert_eq!(result, json!({}));
    let names = |path: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&destination), ["file", "sub"]);
    assert_eq!(names(&destination.join("sub")), ["inner"]);
    assert_eq!(
        std::fs::read(destination.join("sub/inner")).unwrap(),
        b"inner"
    );

    // A FIFO as the top-level source is still refused.
    let top = client
        .request(
            "fs/copy",
            json!({"sourcePath": file_uri(source.join("pipe")),
                   "destinationPath": file_uri(dir.path().join("pipe-copy")), "recursive": true}),
        )
        .await;
    assert_rpc_error(top, -32600, "notAFile");
}

#[tokio::test]
async fn codes_the_reference_client_maps_to_invalid_input_are_minus_32600() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    std::fs::create_dir_all(source.join("sub")).unwrap();
    let into_itself = client
        .request(
            "fs/copy",
            json!({"sourcePath": file_uri(&source),
                   "destinationPath": file_uri(source.join("sub/copy")), "recursive": true}),
        )
        .await;
    assert_rpc_error(into_itself, -32600, "invalidRequest");
    assert!(!source.join("sub/copy").exists());

    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let long_id = "h".repeat(33);
    let open = client
        .request(
            "fs/open",
            json!({"handleId": long_id, "path": file_uri(&file), "sandbox": null}),
        )
        .await;
    let error = assert_rpc_error(open, -32600, "limitExceeded");
    assert!(error.message.contains("MAX_HANDLE_ID_BYTES"), "{error:?}");
    let ok = client
        .call(
            "fs/open",
            json!({"handleId": "h".repeat(32), "path": file_uri(&file)}),
        )
        .await;
    assert_eq!(ok, json!({"handleId": "h".repeat(32)}));
}
