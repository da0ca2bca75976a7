//! Exit statuses, `process/signal` and `process/terminate`.

use super::*;

#[tokio::test]
async fn exit_code_is_reported_without_signal() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("exit7", &sh("exit 7"), json!({})).await;
    assert_eq!((out.exit_code, out.signal), (Some(7), None));
}

#[tokio::test]
async fn death_by_signal_reports_128_plus_n_and_the_signal() {
    let server = server();
    let mut client = server.client().await;
    let out = client.run("killed", &sh("kill -KILL $$"), json!({})).await;
    assert_eq!((out.exit_code, out.signal), (Some(137), Some(9)));
}

/// Poll until `/proc/<pid>/comm` is `comm` (the shell has exec'd), so that a signal cannot
/// land in the shell's own handler before the exec.
fn wait_for_comm(pid: i32, comm: &str) {
    let started = Instant::now();
    loop {
        let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if now.trim() == comm {
            return;
        }
        assert!(
            started.elapsed() < tests::DEADLINE,
            "pid {pid} is {now:?}, not {comm:?}, after {:?}",
            tests::DEADLINE
        );
        std::thread::sleep(Duration::from_millis(5)); // polling interval, not a wait
    }
}

#[tokio::test]
async fn signal_interrupt_reports_sigint_exit() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("int", &sh("echo $$; exec /bin/sleep 1000"), json!({}))
        .await
        .unwrap();
    let pid = first_line_pid(&mut client, "int").await;
    wait_for_comm(pid, "sleep");
    let result = client
        .call(
            "process/signal",
            json!({"processId": "int", "signal": "interrupt"}),
        )
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("int").await;
    assert_eq!((out.exit_code, out.signal), (Some(130), Some(2)));
}

#[tokio::test]
async fn signal_reaches_the_whole_process_group() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "group",
            &sh("/bin/sleep 1000 & echo $$ $!; exec /bin/sleep 1000"),
            json!({}),
        )
        .await
        .unwrap();
    let text = client.wait_for_output("group", "\n").await;
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    for pid in &pids {
        wait_for_comm(*pid, "sleep");
    }
    client
        .call(
            "process/signal",
            json!({"processId": "group", "signal": "hangup"}),
        )
        .await;
    let out = client.collect("group").await;
    assert_eq!((out.exit_code, out.signal), (Some(129), Some(1)));
    tests::wait_process_dead(pids[1], tests::DEADLINE, "background member of the group");
}

#[tokio::test]
async fn signal_names_map_to_their_signals() {
    let server = server();
    let mut client = server.client().await;
    for (name, number) in [("terminate", 15), ("kill", 9), ("hangup", 1)] {
        client
            .start(name, &["/bin/sleep", "1000"], json!({}))
            .await
            .unwrap();
        client
            .call("process/signal", json!({"processId": name, "signal": name}))
            .await;
        let out = client.collect(name).await;
        assert_eq!(
            (out.exit_code, out.signal),
            (Some(128 + number), Some(number)),
            "{name}"
        );
    }
}

#[tokio::test]
async fn signal_to_exited_process_is_not_running_and_unknown_is_not_found() {
    let server = server();
    let mut client = server.client().await;
    client.run("done", &["/bin/true"], json!({})).await;
    let result = client
        .call(
            "process/signal",
            json!({"processId": "done", "signal": "kill"}),
        )
        .await;
    assert_eq!(result, json!({"running": false}));
    assert_rpc_error(
        client
            .request(
                "process/signal",
                json!({"processId": "nope", "signal": "kill"}),
            )
            .await,
        -32004,
        "notFound",
    );
    assert_rpc_error(
        client
            .request(
                "process/signal",
                json!({"processId": "done", "signal": "SIGKILL"}),
            )
            .await,
        -32602,
        "invalidParams",
    );
}

#[tokio::test]
async fn terminate_running_process_reports_running_then_the_real_exit_status() {
    let server = server();
    let mut client = server.client().await;
    client
        .start("t", &["/bin/sleep", "1000"], json!({}))
        .await
        .unwrap();
    let result = client
        .call("process/terminate", json!({"processId": "t"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("t").await;
    assert_eq!((out.exit_code, out.signal), (Some(143), Some(15)));
}

#[tokio::test]
async fn terminate_unknown_or_exited_process_reports_not_running() {
    let server = server();
    let mut client = server.client().await;
    let result = client
        .call("process/terminate", json!({"processId": "never"}))
        .await;
    assert_eq!(result, json!({"running": false}));
    client.run("gone", &["/bin/true"], json!({})).await;
    let result = client
        .call("process/terminate", json!({"processId": "gone"}))
        .await;
    assert_eq!(result, json!({"running": false}));
}

#[tokio::test]
async fn terminate_kills_a_child_that_ignores_sigterm_after_the_grace() {
    let server = server();
    let mut client = server.client().await;
    client
        .start(
            "stubborn",
            &sh("trap '' TERM; echo ready; exec /bin/sleep 1000"),
            json!({}),
        )
        .await
        .unwrap();
    client.wait_for_output("stubborn", "ready").await;
    let started = Instant::now();
    let result = client
        .call("process/terminate", json!({"processId": "stubborn"}))
        .await;
    assert_eq!(result, json!({"running": true}));
    let out = client.collect("stubborn").await;
    assert_eq!((out.exit_code, out.signal), (Some(137), Some(9)));
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "SIGKILL came before the grace period: {:?}",
        started.elapsed()
    );
    // TERMINATE_GRACE is 2 s (docs/protocol.md): the kill must not wait much longer than that.
    assert!(
        started.elapsed() < Duration::from_secs(2) + Duration::from_secs(3),
        "SIGKILL came {:?} after terminate, long past the 2 s grace",
        started.elapsed()
    );
}
