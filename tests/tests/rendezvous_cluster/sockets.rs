//! One credential's sockets counted across the cluster.

use super::*;

/// Open a websocket on `path` of `node` with `token` and keep it: its status (101, or the
/// refusal's) and, when open, the socket.
async fn hold_socket(
    node: &str,
    path: &str,
    token: &str,
) -> (
    u16,
    Option<tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStreamAsync>>>,
) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}{path}", node.replacen("http://", "ws://", 1));
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Authorization", format!("Bearer {token}").parse().unwrap());
    match tokio::time::timeout(DEADLINE, tokio_tungstenite::connect_async(request))
        .await
        .expect("websocket upgrade deadline")
    {
        Ok((socket, response)) => (response.status().as_u16(), Some(socket)),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            (response.status().as_u16(), None)
        }
        Err(other) => panic!("websocket to {path}: {other}"),
    }
}

type TcpStreamAsync = tokio::net::TcpStream;

/// `--max-sockets-per-credential` counts across the cluster: with a share of 2, one harness
/// socket through node A and one through node B fill it, and the third is refused (503 naming
/// the limit) through either node; another credential still gets one; a closed socket frees
/// its place. A count per node would let the third in (each node holds one).
#[tokio::test(flavor = "multi_thread")]
async fn one_credential_holds_at_most_its_share_of_sockets_across_the_cluster() {
    let nats = Nats::start();
    let share = [
        "--cluster",
        &nats.url(),
        "--max-sockets-per-credential",
        "2",
    ];
    let (a, b) = two_nodes(&share);
    registry(&a.first_line)
        .register("env-share", &registration(6), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let harness = "/v1/environments/env-share/harness";
    let (status, first) = hold_socket(&a.first_line, harness, TOKEN).await;
    assert_eq!(status, 101);
    let (status, _second) = hold_socket(&b.first_line, harness, TOKEN).await;
    assert_eq!(status, 101);
    for node in [&a.first_line, &b.first_line] {
        let (status, socket) = hold_socket(node, harness, TOKEN).await;
        assert_eq!(status, 503, "a third socket through {node} was let in");
        assert!(socket.is_none());
    }
    let (status, _other) = hold_socket(&b.first_line, harness, tests::relay::ATTACKER_TOKEN).await;
    assert_eq!(status, 101, "another credential was held back");
    drop(first);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, socket) = hold_socket(&b.first_line, harness, TOKEN).await;
        if status == 101 {
            drop(socket);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a closed socket never freed its place (still {status})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Concurrent admissions of one credential do not starve each other: 100 harness sockets opened
/// at once, half through node A and half through node B, are all let in (each node changes a
/// credential's count one admission at a time, so only the other node's writes make it retry;
/// before, 50 at once on one node raced their own compare-and-set and were refused with 503
/// "cluster registry unavailable"). The count stays exact: with a share of 100, the 101st is
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_one_credentials_sockets_through_two_nodes_is_admitted_and_counted_exactly() {
    const BURST: usize = 100;
    let nats = Nats::start();
    let share = [
        "--cluster",
        &nats.url(),
        "--max-sockets-per-credential",
        "100",
    ];
    let (a, b) = two_nodes(&share);
    registry(&a.first_line)
        .register("env-burst", &registration(7), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let harness = "/v1/environments/env-burst/harness";
    let opened = futures_util::future::join_all((0..BURST).map(|i| {
        let node = if i % 2 == 0 {
            &a.first_line
        } else {
            &b.first_line
        };
        hold_socket(node, harness, TOKEN)
    }))
    .await;
    let statuses: Vec<u16> = opened.iter().map(|(status, _)| *status).collect();
    assert!(
        statuses.iter().all(|status| *status == 101),
        "refused in a burst of {BURST}: {statuses:?}\nnode a:\n{}\nnode b:\n{}",
        a.stderr(),
        b.stderr()
    );
    let (status, socket) = hold_socket(&b.first_line, harness, TOKEN).await;
    assert_eq!(
        status,
        503,
        "socket {} of a share of {BURST} was let in",
        BURST + 1
    );
    assert!(socket.is_none());
}
