//! `process/start` under an allowlist: the command reaches only what it names, refusals are
//! `process/denied` notifications without root, and the server's own listener is refused even
//! when a pattern allows it.

use super::*;

#[tokio::test]
async fn a_sandboxed_process_reaches_only_what_its_allowlist_names() {
    let origin = Origin::start();
    let other = Origin::start();
    for uid in identities() {
        let setup = Setup::new(uid);
        let server = setup.start(uid);
        let mut client = server.client().await;
        let script = format!(
            "curl -sS -f -m 10 http://127.0.0.1:{}/; echo \"allowed=$?\"; \
             curl -sS -f -m 10 http://127.0.0.1:{}/; echo \"other=$?\"",
            origin.port, other.port
        );
        let out = client
            .run(
                "egress",
                &["/bin/sh", "-c", &script],
                json!({
                    "sandbox": setup.sandbox(&[format!("127.0.0.1:{}", origin.port)]),
                    "cwd": file_uri(&setup.workspace),
                }),
            )
            .await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            stdout.contains("hello from origin\nallowed=0") && stdout.contains("other=22"),
            "{uid:?}: {stdout} / {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(other.connections.load(Ordering::SeqCst), 0, "{uid:?}");
    }
}

#[tokio::test]
async fn proxy_refusals_are_process_denied_notifications_without_root() {
    let origin = Origin::start();
    // Unprivileged: the kernel audit is out of reach (and is not switched on machine-wide),
    // yet the proxy's refusals are reported.
    let uid = nix::unistd::geteuid().is_root().then_some(NOBODY);
    let setup = Setup::new(uid);
    let server = setup.start(uid);
    let mut client = server.client().await;
    let url = format!("http://127.0.0.1:{}/", origin.port);
    client
        .start(
            "denied",
            &["curl", "-sS", "-m", "10", &url],
            json!({
                "sandbox": setup.sandbox(&["pypi.org".to_owned()]),
                "cwd": file_uri(&setup.workspace),
                "auditDenials": true,
            }),
        )
        .await
        .unwrap();
    let denied = client
        .wait_for_notification(
            "a process/denied notification from the proxy",
            Duration::from_secs(20),
            |n| n["method"] == "process/denied" && n["params"]["denial"]["layer"] == "proxy",
        )
        .await;
    let denial = &denied["params"]["denial"];
    assert_eq!(denial["operation"], "net.connect", "{denial}");
    assert_eq!(
        denial["address"],
        format!("127.0.0.1:{}", origin.port),
        "{denial}"
    );
    assert_eq!(
        denial["allow_rule"],
        format!("--allow-domain 127.0.0.1:{}", origin.port),
        "{denial}"
    );
    let out = client.collect("denied").await;
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(origin.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_servers_own_listener_is_refused_even_when_a_pattern_allows_it() {
    for uid in identities() {
        let setup = Setup::new(uid);
        let server = setup.start(uid);
        let port = server.addr().rsplit_once(':').unwrap().1.to_owned();
        let mut client = server.client().await;
        let allow = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
        assert_proxy_refuses_listener(&mut client, &setup, &port, &allow, uid).await;
    }
}

/// Another execward server of the same user is refused like this server's own listener, even
/// when a pattern names its address: a loopback listener without a token admits every process
/// of its user, the egress proxy included, which would otherwise drive that server for the
/// command. The proxy refuses every registered server's ports.
#[tokio::test]
async fn another_servers_listener_is_refused_even_when_a_pattern_allows_it() {
    for uid in identities() {
        let setup = Setup::new(uid);
        let server = setup.start(uid);
        let other = setup.start(uid);
        let port = other.addr().rsplit_once(':').unwrap().1.to_owned();
        let mut client = server.client().await;
        let allow = [format!("127.0.0.1:{port}")];
        assert_proxy_refuses_listener(&mut client, &setup, &port, &allow, uid).await;
    }
}

/// `curl` of `/readyz` at the loopback `port`, under an allowlist of `allow`, is refused by the
/// proxy as an execward server's listener.
async fn assert_proxy_refuses_listener(
    client: &mut tests::Client,
    setup: &Setup,
    port: &str,
    allow: &[String],
    uid: Option<u32>,
) {
    let url = format!("http://127.0.0.1:{port}/readyz");
    let out = client
        .run(
            "listener",
            &["curl", "-sS", "-m", "10", &url],
            json!({"sandbox": setup.sandbox(allow), "cwd": file_uri(&setup.workspace)}),
        )
        .await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("is an execward server's listener"),
        "{uid:?}: {stdout} / {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
