//! TLS with a test CA, and no token in clear to a non-loopback host.

use super::*;

/// The README walk-through over TLS: a rendezvous with a certificate from a CA made here, an
/// executor and `exec` that trust it through --ca-file; without it, the certificate is refused.
#[tokio::test(flavor = "multi_thread")]
async fn the_walkthrough_works_over_tls_with_a_test_ca() {
    let ca = TestCa::generate();
    let rendezvous = start_rendezvous_with(
        "https://127.0.0.1:0",
        None,
        &[
            "--tls-cert",
            ca.cert_file.to_str().unwrap(),
            "--tls-key",
            ca.key_file.to_str().unwrap(),
        ],
    );
    let registry = rendezvous.first_line.clone();
    assert!(registry.starts_with("https://127.0.0.1:"), "{registry}");
    let ca_file = ca.ca_file.to_str().unwrap();
    let identity = ca.dir.path().join("identity");
    let executor = start_executor_with(&registry, "env-tls", &identity, &["--ca-file", ca_file]);
    let client = registry_client(&registry, Some(&ca.ca_file));
    wait_registered_with(&client, "env-tls", &executor).await;
    let info = client.connect("env-tls", TOKEN).await.unwrap();
    assert!(
        info.rendezvous_url.starts_with("wss://"),
        "{}",
        info.rendezvous_url
    );
    let (status, stdout, stderr) = exec_cli(
        remote_args(
            &registry,
            "env-tls",
            &["--ca-file", ca_file],
            &["echo", "over tls"],
        ),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (status, stdout.as_str()),
        (Some(0), "over tls\n"),
        "{stderr}"
    );
    // Without the CA the rendezvous's certificate is not trusted.
    let (status, _, stderr) = exec_cli(
        remote_args(&registry, "env-tls", &[], &["/bin/true"]),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, Some(255), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
}

/// A listener that records whether anyone connected, at an address a client must refuse to use
/// in clear: 0.0.0.0 is not loopback, yet on Linux a connection to it would land here.
struct Tripwire {
    listener: std::net::TcpListener,
}

impl Tripwire {
    fn new() -> Tripwire {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        Tripwire { listener }
    }
    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }
    fn touched(&self) -> bool {
        self.listener.accept().is_ok()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_is_never_sent_in_clear_to_a_non_loopback_host() {
    let tripwire = Tripwire::new();
    let plain = format!("http://0.0.0.0:{}", tripwire.port());
    // The harness command line.
    let (status, _, stderr) = exec_cli(
        remote_args(&plain, "env-x", &[], &["/bin/true"]),
        Some(TOKEN),
    )
    .await;
    assert_eq!(status, Some(255), "{stderr}");
    assert!(stderr.contains("not loopback"), "{stderr}");
    // The executor refuses at start-up (exit 2), before it binds or registers anything.
    let dir = tempfile::tempdir().unwrap();
    let identity = dir.path().join("identity");
    let (status, stderr) = {
        let plain = plain.clone();
        let identity = identity.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(tests::exec_server_binary());
            cmd.args([
                "--remote",
                &plain,
                "--environment-id",
                "env-x",
                "--identity-file",
            ])
            .arg(&identity)
            .env(supervisor::relay::EXECUTOR_TOKEN_ENV, EXECUTOR_TOKEN);
            let (status, _, stderr) = tests::output_within(&mut cmd, b"");
            (status.code(), stderr)
        })
        .await
        .unwrap()
    };
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("not loopback"), "{stderr}");
    // A rendezvous (on loopback) that hands out a plain websocket URL on a non-loopback host:
    // the executor registers, then refuses to open its socket there.
    let rendezvous = start_rendezvous(
        "127.0.0.1:0",
        Some(&format!("ws://0.0.0.0:{}", tripwire.port())),
    );
    let executor = start_executor_with(
        &rendezvous.first_line,
        "env-y",
        &dir.path().join("identity-y"),
        &[],
    );
    wait_registered(&rendezvous.first_line, "env-y", &executor).await;
    wait_stderr(&executor, "not loopback").await;
    let refused = supervisor::relay::RelayHarnessConnection::connect(&connect_args(
        &rendezvous.first_line,
        "env-y",
    ))
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(refused.contains("not loopback"), "{refused}");
    assert!(
        !tripwire.touched(),
        "something connected to the non-loopback address"
    );
}
