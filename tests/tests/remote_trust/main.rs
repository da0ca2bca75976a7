//! Remote mode on a network one cannot trust, against the real binaries: separate executor and
//! harness credentials, the registry's key binding, a persistent executor identity, harnesses
//! that pin the executor's key, TLS with a CA made in the test, no token ever sent in clear to a
//! non-loopback host, an executor that is waited for, and a handshake flood that does not slow
//! another harness down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tests::DEADLINE;
use tests::relay::{
    ATTACKER_TOKEN, EXECUTOR_TOKEN, Process, RemoteClient, TOKEN, TestCa, client_tls, connect_args,
    registry_client, start_executor, start_executor_with, start_rendezvous, start_rendezvous_with,
    wait_registered, wait_registered_with,
};

mod floods;
mod keys;
mod transport;
mod waiting;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Run `exec-server exec` with these arguments (harness token in the environment unless
/// `token` is `None`): status, stdout, stderr.
async fn exec_cli(args: Vec<String>, token: Option<&str>) -> (Option<i32>, String, String) {
    let token = token.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new(tests::exec_server_binary());
        cmd.arg("exec")
            .args(&args)
            .env_remove(supervisor::relay::REGISTRY_TOKEN_ENV)
            .env_remove(supervisor::relay::EXECUTOR_TOKEN_ENV);
        if let Some(token) = token {
            cmd.env(supervisor::relay::REGISTRY_TOKEN_ENV, token);
        }
        let (status, out, err) = tests::output_within(&mut cmd, b"");
        (status.code(), out, err)
    })
    .await
    .unwrap()
}

fn remote_args(registry: &str, environment: &str, extra: &[&str], command: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--remote",
        registry,
        "--environment-id",
        environment,
        "--cwd",
        "/",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.push("--".into());
    args.extend(command.iter().map(|s| (*s).to_owned()));
    args
}

/// Wait until `process`'s stderr contains `text`.
async fn wait_stderr(process: &Process, text: &str) {
    let until = tokio::time::Instant::now() + DEADLINE;
    while !process.stderr().contains(text) {
        assert!(
            tokio::time::Instant::now() < until,
            "no {text:?} in stderr:\n{}",
            process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run_true(client: &mut RemoteClient, id: &str) {
    let started = client
        .call(
            "process/start",
            json!({"processId": id, "argv": ["/bin/true"], "cwd": "file:///tmp"}),
        )
        .await;
    assert!(started.is_ok(), "{started:?}");
}
