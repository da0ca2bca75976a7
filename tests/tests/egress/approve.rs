//! `egress/approve`: the declaring client is asked per connection and per session; a client
//! without `egressApprove` is never asked.

use super::*;

/// Starts `process_id` running `script` and serves the server's `egress/approve` requests
/// with `plan` in turn (`None`: never answer) until the process closes: its output and the
/// requests' params.
async fn run_answering(
    client: &mut tests::Client,
    process_id: &str,
    script: &str,
    sandbox: Value,
    cwd: &std::path::Path,
    plan: &[Option<&str>],
) -> (tests::ProcessOutput, Vec<Value>) {
    let start = client
        .send_request(
            "process/start",
            json!({
                "processId": process_id,
                "argv": ["/bin/sh", "-c", script],
                "cwd": file_uri(cwd),
                "env": {"PATH": "/usr/bin:/bin"},
                "sandbox": sandbox,
            }),
        )
        .await;
    let mut plan = plan.iter();
    let (mut events, mut asked) = (Vec::new(), Vec::new());
    loop {
        let message = client
            .next_message(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{process_id}: no message within 30 s; events {events:?}"));
        if message["id"] == start {
            assert!(message.get("error").is_none(), "{process_id}: {message}");
        } else if message["method"] == "egress/approve" {
            asked.push(message["params"].clone());
            if let Some(Some(decision)) = plan.next() {
                client
                    .send_json(&json!({"id": message["id"], "result": {"decision": decision}}))
                    .await;
            }
        } else if message["params"]["processId"] == process_id {
            let closed = message["method"] == "process/closed";
            events.push(message);
            if closed {
                return (tests::decode_events(events), asked);
            }
        }
    }
}

/// `network.ask` through exec-server (as root and as 65534, with launchers and with
/// `--one-shot-sandbox`): a destination the allowlist refuses is asked of the client that
/// declared `egressApprove` as an `egress/approve` request naming the process, host, port,
/// method, path and the rule that would allow it. "connection" lets that connection through
/// and the next one is asked again ("deny": refused); "session" lets it through and a later
/// process of the session is not asked again. A client without the capability is never sent a
/// request and its process is refused at once. The control: the allowed origin is reached
/// without a question.
#[tokio::test]
async fn egress_approve_asks_the_declaring_client_per_connection_and_per_session() {
    let allowed = Origin::start();
    let asked = Origin::start();
    let fetch = format!("curl -sS -m 10 http://127.0.0.1:{}/ask", asked.port);
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let setup = Setup::new(uid);
            let server = setup.start_with(uid, args);
            let sandbox = json!({
                "profile": "workspace-write",
                "cwd": file_uri(&setup.workspace),
                "network": {"allow": [format!("127.0.0.1:{}", allowed.port)], "ask": true},
            });
            let mut client = server.connect().await;
            client
                .request(
                    "initialize",
                    json!({"clientName": "approver", "egressApprove": true}),
                )
                .await
                .unwrap();
            client.notify("initialized", json!({})).await;
            let hello =
                |out: &tests::ProcessOutput| out.stdout_text().matches("hello from origin").count();

            // Control: the allowed origin, no question.
            let control = format!("curl -sS -m 10 http://127.0.0.1:{}/", allowed.port);
            let (out, questions) = run_answering(
                &mut client,
                "control",
                &control,
                sandbox.clone(),
                &setup.workspace,
                &[],
            )
            .await;
            assert_eq!(hello(&out), 1, "{uid:?} {args:?}: {out:?}");
            assert!(questions.is_empty(), "{uid:?} {args:?}: {questions:?}");

            // Once for the connection, then deny.
            let before = asked.connections.load(Ordering::SeqCst);
            let (out, questions) = run_answering(
                &mut client,
                "once",
                &format!("{fetch}; {fetch}"),
                sandbox.clone(),
                &setup.workspace,
                &[Some("connection"), Some("deny")],
            )
            .await;
            assert_eq!(hello(&out), 1, "{uid:?} {args:?}: {out:?}");
            assert_eq!(asked.connections.load(Ordering::SeqCst) - before, 1);
            assert_eq!(questions.len(), 2, "{uid:?} {args:?}: {questions:?}");
            assert_eq!(questions[0]["processId"], "once", "{questions:?}");
            assert_eq!(questions[0]["host"], "127.0.0.1", "{questions:?}");
            assert_eq!(questions[0]["port"], asked.port, "{questions:?}");
            assert_eq!(questions[0]["method"], "GET", "{questions:?}");
            assert_eq!(questions[0]["path"], "/ask", "{questions:?}");
            assert_eq!(
                questions[0]["rule"],
                format!("--allow-domain 127.0.0.1:{}", asked.port),
                "{questions:?}"
            );
            assert!(
                out.stdout_text()
                    .contains("refused when asked (by the client)"),
                "{uid:?} {args:?}: {out:?}"
            );

            // For the session: asked once, then a later process is not asked.
            let (out, questions) = run_answering(
                &mut client,
                "session-1",
                &fetch,
                sandbox.clone(),
                &setup.workspace,
                &[Some("session")],
            )
            .await;
            assert_eq!(hello(&out), 1, "{uid:?} {args:?}: {out:?}");
            assert_eq!(questions.len(), 1, "{uid:?} {args:?}: {questions:?}");
            let (out, questions) = run_answering(
                &mut client,
                "session-2",
                &fetch,
                sandbox.clone(),
                &setup.workspace,
                &[],
            )
            .await;
            assert_eq!(hello(&out), 1, "{uid:?} {args:?}: {out:?}");
            assert!(questions.is_empty(), "{uid:?} {args:?}: {questions:?}");

            // A client without the capability: no request, refused at once.
            let mut plain = server.client().await;
            let began = std::time::Instant::now();
            let (out, questions) = run_answering(
                &mut plain,
                "plain",
                &fetch,
                sandbox.clone(),
                &setup.workspace,
                &[Some("connection")],
            )
            .await;
            assert!(questions.is_empty(), "{uid:?} {args:?}: {questions:?}");
            assert_eq!(hello(&out), 0, "{uid:?} {args:?}: {out:?}");
            assert!(
                out.stdout_text()
                    .contains("no attached client declared egressApprove"),
                "{uid:?} {args:?}: {out:?}"
            );
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "{uid:?} {args:?}"
            );
        }
    }
}
