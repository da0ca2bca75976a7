//! Helpers for the library client (`supervisor::ExecServerClient`): `process/start` params,
//! connecting, and waiting for process events and connection states.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::DEADLINE;

/// `process/start` params for the library client: cwd `/`, env `PATH=/usr/bin:/bin`.
pub fn start_params(process_id: &str, argv: &[&str]) -> proto::methods::process::StartParams {
    proto::methods::process::StartParams::new(
        process_id,
        argv.iter().copied(),
        proto::FileUri::from_path(Path::new("/")).unwrap(),
    )
    .with_env_var("PATH", "/usr/bin:/bin")
}

/// Connect an `ExecServerClient` to `url`, panicking with context on failure.
pub async fn library_client(url: &str) -> supervisor::ExecServerClient {
    let options = supervisor::ExecServerClientConnectOptions::new(url).with_client_name("tests");
    tokio::time::timeout(DEADLINE, supervisor::ExecServerClient::connect(options))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} took over {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The next event of a process handle, within `deadline`.
pub async fn next_event(
    handle: &mut supervisor::ProcessHandle,
    deadline: Duration,
) -> supervisor::ProcessEvent {
    tokio::time::timeout(deadline, handle.next_event())
        .await
        .unwrap_or_else(|_| panic!("no event of {} within {deadline:?}", handle.id()))
        .unwrap_or_else(|| panic!("the event stream of {} ended", handle.id()))
}

/// Read events until the decoded output of any stream contains `needle`; returns that output.
pub async fn wait_for_event_output(
    handle: &mut supervisor::ProcessHandle,
    needle: &str,
    deadline: Duration,
) -> String {
    let started = Instant::now();
    let mut text = String::new();
    loop {
        let remaining = deadline.saturating_sub(started.elapsed());
        match next_event(handle, remaining).await {
            supervisor::ProcessEvent::Output { data, .. } => {
                text.push_str(&String::from_utf8_lossy(&data));
                if text.contains(needle) {
                    return text;
                }
            }
            other => panic!(
                "waiting for {needle:?} in {}, got {other:?}; so far: {text:?}",
                handle.id()
            ),
        }
    }
}

/// Wait until the client's state satisfies `pred`.
pub async fn wait_for_state(
    client: &supervisor::ExecServerClient,
    deadline: Duration,
    what: &str,
    pred: impl FnMut(&supervisor::ConnectionState) -> bool,
) -> supervisor::ConnectionState {
    let mut state = client.subscribe_state();
    tokio::time::timeout(deadline, state.wait_for(pred))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "client not {what} within {deadline:?}: {:?}",
                client.state()
            )
        })
        .unwrap()
        .clone()
}
