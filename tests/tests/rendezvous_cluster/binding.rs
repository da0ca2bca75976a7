//! The key binding, registration by role and the environment bound, cluster-wide.

use super::*;

/// The key binding is the cluster's: a registration with another key through another node is
/// refused (409), the same key is accepted there, and two nodes racing to bind one id with two
/// keys let exactly one win (compare-and-set). Control: two nodes on two separate NATS servers
/// (no shared registry) accept the other key, so the refusal is the shared registry's doing.
#[tokio::test(flavor = "multi_thread")]
async fn another_key_is_refused_through_every_node_and_racing_registrations_bind_one_key() {
    let nats = Nats::start();
    let a = start_node(&nats, "a", "127.0.0.1:0", None);
    let b = start_node(&nats, "b", "127.0.0.1:0", None);
    let (via_a, via_b) = (registry(&a.first_line), registry(&b.first_line));
    via_a
        .register("env-bound", &registration(1), EXECUTOR_TOKEN)
        .await
        .unwrap();
    via_b
        .register("env-bound", &registration(1), EXECUTOR_TOKEN)
        .await
        .unwrap();
    let refused = via_b
        .register("env-bound", &registration(2), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(status(&refused), 409, "{refused}");
    for node in [&via_a, &via_b] {
        let bound = node.connect("env-bound", TOKEN).await.unwrap();
        assert_eq!(bound.public_key, public_key(1));
    }
    for round in 0..8u8 {
        let id = format!("env-race-{round}");
        let (three, four) = (registration(3), registration(4));
        let (first, second) = tokio::join!(
            via_a.register(&id, &three, EXECUTOR_TOKEN),
            via_b.register(&id, &four, EXECUTOR_TOKEN),
        );
        let winner = match (&first, &second) {
            (Ok(_), Err(error)) => {
                assert_eq!(status(error), 409, "{error}");
                public_key(3)
            }
            (Err(error), Ok(_)) => {
                assert_eq!(status(error), 409, "{error}");
                public_key(4)
            }
            other => panic!("round {round}: expected exactly one winner, got {other:?}"),
        };
        for node in [&via_a, &via_b] {
            assert_eq!(node.connect(&id, TOKEN).await.unwrap().public_key, winner);
        }
    }

    // Control: a node of another cluster has its own registry and takes the other key.
    let elsewhere = Nats::start();
    let c = start_node(&elsewhere, "c", "127.0.0.1:0", None);
    registry(&c.first_line)
        .register("env-bound", &registration(2), EXECUTOR_TOKEN)
        .await
        .unwrap();
}

/// A harness credential registers through no node (403 from each), and nothing it tried is
/// visible through any node afterwards (404). Control: the executor credential registers
/// through the same nodes and the lookup then finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_harness_credential_cannot_register_through_any_node() {
    let nats = Nats::start();
    let nodes: Vec<Process> = ["a", "b", "c"]
        .into_iter()
        .map(|name| start_node(&nats, name, "127.0.0.1:0", None))
        .collect();
    let clients: Vec<RegistryClient> = nodes.iter().map(|n| registry(&n.first_line)).collect();
    for node in &clients {
        let refused = node
            .register("env-harness", &registration(5), TOKEN)
            .await
            .unwrap_err();
        assert_eq!(status(&refused), 403, "{refused}");
    }
    for node in &clients {
        let missing = node.connect("env-harness", TOKEN).await.unwrap_err();
        assert_eq!(status(&missing), 404, "{missing}");
    }
    clients[2]
        .register("env-harness", &registration(5), EXECUTOR_TOKEN)
        .await
        .unwrap();
    for node in &clients {
        assert_eq!(
            node.connect("env-harness", TOKEN).await.unwrap().public_key,
            public_key(5)
        );
    }
}

/// `--max-environments` holds cluster-wide: half the ids registered through node A and half
/// through node B fill it, and one more new id is refused through either node (naming the
/// option), while an id already bound still registers again. A count per node would let each
/// node take the bound (twice it in all), and the bindings bucket has no expiry, so an executor
/// credential granted `"*"` could grow it without end. The same option bounds a single node.
#[tokio::test(flavor = "multi_thread")]
async fn the_environment_bound_holds_across_the_cluster() {
    const BOUND: usize = 40;
    let nats = Nats::start();
    let bound = BOUND.to_string();
    let (a, b) = two_nodes(&["--cluster", &nats.url(), "--max-environments", &bound]);
    let (through_a, through_b) = (registry(&a.first_line), registry(&b.first_line));
    for i in 0..BOUND {
        let node = if i % 2 == 0 { &through_a } else { &through_b };
        node.register(&format!("env-many-{i}"), &registration(10), EXECUTOR_TOKEN)
            .await
            .unwrap_or_else(|e| panic!("registration {i} of {BOUND}: {e}"));
    }
    for node in [&through_a, &through_b] {
        let refused = node
            .register("env-one-too-many", &registration(10), EXECUTOR_TOKEN)
            .await
            .unwrap_err();
        assert_eq!(status(&refused), 400, "{refused}");
        assert!(
            refused.to_string().contains("--max-environments"),
            "{refused}"
        );
    }
    through_b
        .register("env-many-0", &registration(10), EXECUTOR_TOKEN)
        .await
        .expect("an id already bound registers again at the bound");

    let single = start_rendezvous_with("127.0.0.1:0", None, &["--max-environments", "2"]);
    let single = registry(&single.first_line);
    for i in 0..2 {
        single
            .register(
                &format!("env-single-{i}"),
                &registration(10),
                EXECUTOR_TOKEN,
            )
            .await
            .unwrap();
    }
    let refused = single
        .register("env-single-2", &registration(10), EXECUTOR_TOKEN)
        .await
        .unwrap_err();
    assert_eq!(status(&refused), 400, "{refused}");
}
