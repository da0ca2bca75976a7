use super::*;

#[test]
fn write_ids_remember_the_newest_write_id_memory_ids() {
    let mut ids = WriteIds::default();
    for n in 0..=WRITE_ID_MEMORY {
        ids.remember(&n.to_string());
    }
    assert!(!ids.contains("0"), "the oldest id is forgotten");
    assert!(ids.contains("1"));
    assert!(ids.contains(&WRITE_ID_MEMORY.to_string()));
    assert_eq!(ids.order.len(), WRITE_ID_MEMORY);
    assert_eq!(ids.set.len(), WRITE_ID_MEMORY);
    // Remembering a known id again does not evict anything.
    ids.remember("1");
    assert!(ids.contains("1") && ids.contains("2"));
}

#[test]
fn denials_are_bounded_in_bytes_and_read_by_cursor_within_a_budget() {
    let mut log = DenialLog::default();
    let record = |n: u64| serde_json::json!({"n": n});
    let size = MAX_DENIAL_BYTES_RETAINED / 8;
    for n in 1..=10 {
        log.push(record(n), size);
    }
    // Only 8 records fit the byte retention; the two oldest were dropped.
    assert_eq!(log.records.len(), 8);
    assert_eq!(log.dropped, 2);
    let first = log.read(0, (2 * size) as u64, true);
    assert_eq!(first.records, vec![record(3), record(4)]);
    assert_eq!((first.next, first.bytes), (5, (2 * size) as u64));
    // Continue from the cursor; a budget smaller than one record still returns one when
    // nothing else is returned.
    let next = log.read(first.next - 1, 1, true);
    assert_eq!((next.records, next.next), (vec![record(5)], 6));
    let none = log.read(first.next - 1, 1, false);
    assert_eq!((none.records.len(), none.next), (0, 5));
    // Past the end: nothing, and the cursor stays.
    let end = log.read(10, u64::MAX, true);
    assert_eq!((end.records.len(), end.next), (0, 11));
}

#[test]
fn many_small_denials_are_bounded_in_count() {
    let mut log = DenialLog::default();
    for n in 0..(MAX_DENIALS_RETAINED as u64 + 5) {
        log.push(serde_json::json!(n), 10);
    }
    assert_eq!(log.records.len(), MAX_DENIALS_RETAINED);
    assert_eq!(log.dropped, 5);
}
