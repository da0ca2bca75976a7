use super::*;

fn budgets() -> Arc<Budgets> {
    Arc::new(Budgets::new(0, 0))
}

#[test]
fn descriptor_budget_leaves_the_reserve_and_connection_descriptors_free() {
    let fixed =
        DESCRIPTOR_RESERVE + 2 * (MAX_PENDING_CONNECTIONS + MAX_CONNECTIONS) + MAX_HTTP_REQUESTS;
    assert_eq!(client_descriptor_budget(12_000, 30), 12_000 - fixed - 30);
    assert_eq!(
        client_descriptor_budget(1_000_000, 30),
        MAX_CLIENT_DESCRIPTORS
    );
    assert_eq!(client_descriptor_budget(1024, 30), MIN_CLIENT_DESCRIPTORS);
}

#[test]
fn descriptors_are_refused_past_the_budget_and_given_back_on_drop() {
    let budgets = budgets();
    let all = budgets.descriptors(MIN_CLIENT_DESCRIPTORS).unwrap();
    assert!(matches!(
        budgets.descriptors(1),
        Err(BudgetError::Descriptors { .. })
    ));
    assert_eq!(budgets.descriptors_in_use(), MIN_CLIENT_DESCRIPTORS);
    drop(all);
    assert_eq!(budgets.descriptors_in_use(), 0);
    budgets.descriptors(1).unwrap();
}

#[tokio::test]
async fn small_reservations_use_the_allowance_and_large_ones_the_server_budget() {
    let budgets = budgets();
    let connection = ConnectionBudget::new(budgets.clone());
    let small = connection.reserve(1000, 1000).await.unwrap();
    assert_eq!(budgets.memory.available_permits(), MEMORY_BUDGET_BYTES);
    let large_bytes = CONNECTION_MEMORY_ALLOWANCE * 4;
    let large = connection.reserve(large_bytes, large_bytes).await.unwrap();
    assert_eq!(
        budgets.memory.available_permits(),
        MEMORY_BUDGET_BYTES - large_bytes
    );
    drop((small, large));
    assert_eq!(budgets.memory.available_permits(), MEMORY_BUDGET_BYTES);
}

#[tokio::test]
async fn the_server_budget_refuses_instead_of_waiting() {
    let budgets = budgets();
    let mut held = Vec::new();
    let big = MAX_INFLIGHT_BYTES_PER_CONNECTION;
    for _ in 0..MEMORY_BUDGET_BYTES / big {
        let connection = ConnectionBudget::new(budgets.clone());
        held.push(connection.reserve(big, big).await.unwrap());
    }
    let other = ConnectionBudget::new(budgets.clone());
    let needed = CONNECTION_MEMORY_ALLOWANCE + MEMORY_BUDGET_BYTES % big + 1;
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        other.reserve(needed, needed),
    )
    .await
    .expect("a refusal, not a wait");
    assert!(matches!(refused, Err(BudgetError::Memory { .. })));
    // Small work on the same connection is still served from its allowance.
    other.reserve(64 * 1024, 64 * 1024).await.unwrap();
}

#[tokio::test]
async fn a_connection_waits_for_its_own_in_flight_bytes_whatever_is_backed() {
    let connection = ConnectionBudget::new(budgets());
    // The worst case of an answer counts in flight before any memory backs it.
    let first = connection
        .reserve(MAX_INFLIGHT_BYTES_PER_CONNECTION, 0)
        .await
        .unwrap();
    assert_eq!(first.bytes(), 0);
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(50),
        connection.reserve(1, 1),
    )
    .await;
    assert!(waiting.is_err(), "the second reservation must wait");
    drop(first);
    connection.reserve(1, 1).await.unwrap();
}

#[tokio::test]
async fn split_back_and_shrink_give_back_what_is_not_kept() {
    let budgets = budgets();
    let connection = ConnectionBudget::new(budgets.clone());
    let mib = 1024 * 1024;
    let mut charge = connection.reserve(10 * mib, 4 * mib).await.unwrap();
    let request = charge.split(4 * mib);
    assert_eq!(
        (request.inflight_bytes(), request.bytes()),
        (4 * mib, 4 * mib)
    );
    assert_eq!((charge.inflight_bytes(), charge.bytes()), (6 * mib, 0));
    drop(request);
    charge.back(&connection, 3 * mib).unwrap();
    assert_eq!(charge.bytes(), 3 * mib);
    charge.shrink_to(1000);
    assert_eq!((charge.inflight_bytes(), charge.bytes()), (1000, 1000));
    drop(charge);
    assert_eq!(budgets.memory.available_permits(), MEMORY_BUDGET_BYTES);
    assert_eq!(
        connection.inflight.available_permits(),
        MAX_INFLIGHT_BYTES_PER_CONNECTION
    );
    assert_eq!(
        connection.allowance.available_permits(),
        CONNECTION_MEMORY_ALLOWANCE
    );
}
