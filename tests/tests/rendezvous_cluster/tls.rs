//! TLS to NATS with the operator's CA, and the options a node refuses to start with.

use super::*;

/// Run `exec-rendezvous` with `args` (the test credentials) until it exits, within [`DEADLINE`]:
/// its exit code and stderr.
fn rendezvous_that_exits(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials.toml");
    std::fs::write(&credentials, tests::relay::credentials_toml()).unwrap();
    let mut child =
        std::process::Command::new(tests::exec_server_binary().with_file_name("exec-rendezvous"))
            .args(["--listen", "127.0.0.1:0", "--credentials"])
            .arg(&credentials)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("exec-rendezvous {args:?} still runs after {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// TLS to NATS goes through rustls with the operator's CA: nodes join a `nats-server --tls`
/// with `--cluster tls://...` and `--nats-ca-file`, and a registration through one is seen
/// through the other. Without the CA file (the system roots only) the node does not start: exit
/// 1 (NATS could not be reached) naming the NATS URL and the certificate problem, no fallback to
/// plain text; a `--nats-creds` file that does not exist is exit 2, naming the file.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_reach_nats_over_tls_with_the_operators_ca_and_refuse_without_it() {
    let ca = tests::relay::TestCa::generate();
    let nats = Nats::start_with(&[
        "--tls",
        "--tlscert",
        ca.cert_file.to_str().unwrap(),
        "--tlskey",
        ca.key_file.to_str().unwrap(),
    ]);
    let ca_file = ca.ca_file.to_str().unwrap();
    let tls_url = nats.tls_url();
    let cluster = ["--cluster", &tls_url, "--nats-ca-file", ca_file];
    let (a, b) = two_nodes(&cluster);
    registry(&a.first_line)
        .register("env-tls", &registration(8), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let refused = registry(&b.first_line)
        .register("env-tls", &registration(9), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(
        status(&refused),
        409,
        "node b does not share a's registry: {refused}"
    );

    let (code, stderr) = rendezvous_that_exits(&["--cluster", &tls_url, "--node-name", "c"]);
    assert_eq!(
        code,
        Some(1),
        "NATS not proven is a runtime failure:\n{stderr}"
    );
    assert!(
        stderr.contains(&tls_url) && stderr.to_lowercase().contains("certificate"),
        "the refusal names neither the URL nor the certificate:\n{stderr}"
    );
    let missing = ca.dir.path().join("no-such.creds");
    let (code, stderr) = rendezvous_that_exits(&[
        "--cluster",
        &tls_url,
        "--nats-ca-file",
        ca_file,
        "--node-name",
        "d",
        "--nats-creds",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--nats-creds") && stderr.contains("no-such.creds"),
        "{stderr}"
    );
}
