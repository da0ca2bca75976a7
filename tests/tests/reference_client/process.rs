//! `process/start` (every reference field, `envPolicy` null or full, native `cwd`, unknown fields,
//! managed network) and `process/write` statuses.

use super::*;

#[tokio::test]
async fn start_with_every_reference_field_and_null_env_policy_gets_exactly_env() {
    let server = server();
    let mut client = server.client().await;
    client
        .call(
            "process/start",
            reference_start("p", &["/usr/bin/env"], "file:///", Value::Null),
        )
        .await;
    let output = client.collect("p").await;
    assert_eq!(
        parse_env(&output.stdout_text()),
        map(&[("FROM_ENV", "1"), ("PATH", "/usr/bin:/bin")])
    );
}

/// The server's own environment for the envPolicy tests.
const SERVER_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/home/server"),
    ("LANG", "C.UTF-8"),
    ("EDITOR", "vi"),
    ("MY_API_KEY", "sk-secret"),
    ("GH_TOKEN", "ghp-secret"),
    ("aws_secret_access", "secret"),
    ("KEEP_ME", "kept"),
];

fn server_with_env() -> ExecServer {
    ExecServer::start_with(&["--listen", "ws://127.0.0.1:0"], |command| {
        command.env_clear().envs(SERVER_ENV.iter().copied());
    })
}

async fn child_env(
    client: &mut Client,
    process_id: &str,
    env_policy: Value,
) -> BTreeMap<String, String> {
    let mut params = reference_start(process_id, &["/usr/bin/env"], "file:///", env_policy);
    params["env"] = json!({"HOME": "/overlay", "FROM_ENV": "1"});
    client.call("process/start", params).await;
    parse_env(&client.collect(process_id).await.stdout_text())
}

#[tokio::test]
async fn full_env_policy_builds_the_environment_from_the_servers_own() {
    let server = server_with_env();
    let mut client = server.client().await;

    let all = child_env(
        &mut client,
        "all",
        json!({"inherit": "all", "ignoreDefaultExcludes": false, "exclude": ["EDIT*"],
               "set": {"FROM_SET": "1"}, "includeOnly": []}),
    )
    .await;
    assert_eq!(
        all,
        map(&[
            ("FROM_ENV", "1"),
            ("FROM_SET", "1"),
            ("HOME", "/overlay"),
            ("KEEP_ME", "kept"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let core = child_env(
        &mut client,
        "core",
        json!({"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [], "set": {},
               "includeOnly": []}),
    )
    .await;
    assert_eq!(
        core,
        map(&[
            ("FROM_ENV", "1"),
            ("HOME", "/overlay"),
            ("LANG", "C.UTF-8"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let secrets = child_env(
        &mut client,
        "secrets",
        json!({"inherit": "all", "ignoreDefaultExcludes": true, "exclude": [], "set": {},
               "includeOnly": ["*key*", "*TOKEN", "path"]}),
    )
    .await;
    assert_eq!(
        secrets,
        map(&[
            ("FROM_ENV", "1"),
            ("GH_TOKEN", "ghp-secret"),
            ("HOME", "/overlay"),
            ("MY_API_KEY", "sk-secret"),
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ])
    );

    let none = child_env(
        &mut client,
        "none",
        json!({"inherit": "none", "ignoreDefaultExcludes": false, "exclude": [],
               "set": {"ONLY": "set"}, "includeOnly": []}),
    )
    .await;
    assert_eq!(
        none,
        map(&[("FROM_ENV", "1"), ("HOME", "/overlay"), ("ONLY", "set")])
    );
}

#[tokio::test]
async fn process_start_takes_a_native_cwd_but_fs_paths_stay_uris() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    let cwd = real.to_str().unwrap();
    client
        .call(
            "process/start",
            reference_start("pwd", &["/bin/pwd"], cwd, Value::Null),
        )
        .await;
    assert_eq!(
        client.collect("pwd").await.stdout_text(),
        format!("{cwd}\n")
    );

    let relative = client
        .request(
            "process/start",
            reference_start("rel", &["/bin/pwd"], "tmp", Value::Null),
        )
        .await;
    let error = assert_rpc_error(relative, -32602, "invalidPath");
    assert!(error.message.contains("absolute native path"), "{error:?}");

    let native = client
        .request("fs/readFile", json!({"path": cwd, "sandbox": null}))
        .await;
    let error = assert_rpc_error(native, -32602, "invalidPath");
    assert!(error.message.contains("file:///"), "{error:?}");
}

#[tokio::test]
async fn unknown_top_level_fields_are_tolerated_but_never_inside_sandbox() {
    let server = server();
    let mut client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "data").unwrap();
    let read = client
        .call(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": null, "futureOption": 1}),
        )
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"data");
    let strict = client
        .request(
            "fs/readFile",
            json!({"path": file_uri(&file),
                   "sandbox": {"profile": "read-only", "futureOption": 1}}),
        )
        .await;
    let error = assert_rpc_error(strict, -32602, "invalidParams");
    assert!(error.message.contains("futureOption"), "{error:?}");
}

#[tokio::test]
async fn enforce_managed_network_is_refused_unless_the_network_is_off() {
    let server = server();
    let mut client = server.client().await;
    let mut open = reference_start("open", &["/bin/true"], "file:///", Value::Null);
    open["enforceManagedNetwork"] = json!(true);
    let error = assert_rpc_error(
        client.request("process/start", open).await,
        -32600,
        "unsupported",
    );
    assert!(error.message.contains("enforceManagedNetwork"), "{error:?}");

    let mut closed = reference_start("closed", &["/bin/true"], "file:///", Value::Null);
    closed["enforceManagedNetwork"] = json!(true);
    closed["sandbox"] = json!({"profile": "read-only"});
    client.call("process/start", closed).await;
    assert_eq!(client.collect("closed").await.exit_code, Some(0));
}

#[tokio::test]
async fn process_write_answers_with_statuses_not_errors() {
    let server = server();
    let mut client = server.client().await;
    let write = |process_id: &str, chunk: &[u8], extra: Value| {
        let mut params = json!({"processId": process_id, "chunk": b64(chunk),
                                "writeId": uuid_like(process_id, chunk)});
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        params
    };
    assert_eq!(
        client
            .call("process/write", write("nobody", b"x", json!({})))
            .await,
        json!({"status": "unknownProcess"})
    );

    client
        .call(
            "process/start",
            json!({"processId": "no-stdin", "argv": ["/bin/sleep", "30"], "cwd": "/",
                   "env": {}, "tty": false, "pipeStdin": false}),
        )
        .await;
    assert_eq!(
        client
            .call("process/write", write("no-stdin", b"x", json!({})))
            .await,
        json!({"status": "stdinClosed"})
    );
    client
        .call("process/terminate", json!({"processId": "no-stdin"}))
        .await;

    client
        .call(
            "process/start",
            json!({"processId": "cat", "argv": ["/bin/cat"], "cwd": "/", "env": {},
                   "tty": false, "pipeStdin": true}),
        )
        .await;
    let first = write("cat", b"hello\n", json!({}));
    assert_eq!(
        client.call("process/write", first.clone()).await,
        json!({"status": "accepted"})
    );
    // A retry with the same writeId is accepted and applied once.
    assert_eq!(
        client.call("process/write", first).await,
        json!({"status": "accepted"})
    );
    assert_eq!(
        client
            .call("process/write", write("cat", b"", json!({"close": true})))
            .await,
        json!({"status": "accepted"})
    );
    assert_eq!(
        client
            .call("process/write", write("cat", b"late\n", json!({})))
            .await,
        json!({"status": "stdinClosed"})
    );
    let output = client.collect("cat").await;
    assert_eq!(output.stdout_text(), "hello\n");

    let bad = client
        .request(
            "process/write",
            json!({"processId": "cat", "chunk": "!!", "writeId": "w"}),
        )
        .await;
    assert_rpc_error(bad, -32602, "invalidBase64");
}

fn uuid_like(process_id: &str, chunk: &[u8]) -> String {
    format!("{process_id}-{}", b64(chunk))
}
