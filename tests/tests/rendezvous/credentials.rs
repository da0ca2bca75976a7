//! What each credential may do, and SIGHUP rereading the credentials file.

use pretty_assertions::assert_eq;

use super::*;

#[tokio::test]
async fn each_credential_may_do_only_what_its_role_allows() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = &rendezvous.first_line;
    let register = json!({"name": "n", "publicKey": public_key(1)}).to_string();
    // A harness credential can never register, nor open an executor socket.
    let by_harness = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(by_harness.status, 403, "{by_harness:?}");
    assert!(
        by_harness.body.contains("needs an executor credential"),
        "{by_harness:?}"
    );
    // An executor credential registers; it is not a harness credential.
    let by_executor = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(EXECUTOR_TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(by_executor.status, 200, "{by_executor:?}");
    let socket = http(
        registry,
        "GET",
        "/v1/environments/env-a/executor",
        Some(TOKEN),
        &UPGRADE,
        "",
    )
    .await;
    assert_eq!(socket.status, 403, "{socket:?}");
    let lookup = http(
        registry,
        "POST",
        "/v1/environments/env-a/connect",
        Some(EXECUTOR_TOKEN),
        &[],
        "",
    )
    .await;
    assert_eq!(lookup.status, 403, "{lookup:?}");
    // A credential granted one environment is refused another.
    let narrow = http(
        registry,
        "POST",
        "/v1/environments/env-a",
        Some(tests::relay::NARROW_EXECUTOR_TOKEN),
        &[],
        &register,
    )
    .await;
    assert_eq!(narrow.status, 403, "{narrow:?}");
    assert!(narrow.body.contains("not granted"), "{narrow:?}");
}

#[tokio::test]
async fn sighup_rereads_the_credentials_file() {
    let rendezvous = start_rendezvous("127.0.0.1:0", None);
    let registry = rendezvous.first_line.clone();
    let path = rendezvous
        .dir
        .as_ref()
        .unwrap()
        .path()
        .join("credentials.toml");
    let new_token = "relay-test-rotated-harness";
    let lookup = |token: &'static str| {
        let registry = registry.clone();
        async move {
            http(
                &registry,
                "POST",
                "/v1/environments/x/connect",
                Some(token),
                &[],
                "",
            )
            .await
            .status
        }
    };
    assert_eq!(lookup(new_token).await, 401);
    std::fs::write(
        &path,
        tests::relay::credentials_toml().replace(TOKEN, new_token),
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rendezvous.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let until = tokio::time::Instant::now() + DEADLINE;
    while lookup(new_token).await != 404 {
        assert!(
            tokio::time::Instant::now() < until,
            "SIGHUP did not reload:\n{}",
            rendezvous.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(TOKEN).await, 401, "the replaced token still works");
    // A broken file is refused and the credentials in force stay.
    std::fs::write(&path, "not toml [").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rendezvous.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let until = tokio::time::Instant::now() + DEADLINE;
    while !rendezvous.stderr().contains("credentials not reloaded") {
        assert!(
            tokio::time::Instant::now() < until,
            "{}",
            rendezvous.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(new_token).await, 404);
}
