//! `fs/walk`: depth-first order, symlinks not entered, truncation and limits.

use super::*;

/// `fs/walk`'s entries as `[path relative to root, depth, isDirectory, isFile, isSymlink]`.
fn walk_summary(root: &Path, result: &Value) -> Vec<Value> {
    let prefix = format!("{}/", file_uri(root));
    result["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let path = e["path"].as_str().expect("path");
            let relative = path.strip_prefix(&prefix).expect("below the root");
            json!([
                relative,
                e["depth"],
                e["isDirectory"],
                e["isFile"],
                e["isSymlink"]
            ])
        })
        .collect()
}

#[tokio::test]
async fn walk_lists_the_tree_depth_first_sorted_by_name_with_depths_and_kinds() {
    let (_server, mut client, dir) = setup().await;
    let d = dir.path();
    std::fs::create_dir_all(d.join("b-dir/inner")).unwrap();
    std::fs::write(d.join("b-dir/inner/deep.txt"), "").unwrap();
    std::fs::write(d.join("b-dir/a.txt"), "").unwrap();
    std::fs::write(d.join("a.txt"), "").unwrap();
    std::fs::write(d.join("c.txt"), "").unwrap();
    let result = client.call("fs/walk", json!({"path": file_uri(d)})).await;
    assert_eq!(result["truncated"], json!(false));
    assert_eq!(
        walk_summary(d, &result),
        vec![
            json!(["a.txt", 1, false, true, false]),
            json!(["b-dir", 1, true, false, false]),
            json!(["b-dir/a.txt", 2, false, true, false]),
            json!(["b-dir/inner", 2, true, false, false]),
            json!(["b-dir/inner/deep.txt", 3, false, true, false]),
            json!(["c.txt", 1, false, true, false]),
        ]
    );
    let shallow = client
        .call("fs/walk", json!({"path": file_uri(d), "maxDepth": 1}))
        .await;
    assert_eq!(
        walk_summary(d, &shallow),
        vec![
            json!(["a.txt", 1, false, true, false]),
            json!(["b-dir", 1, true, false, false]),
            json!(["c.txt", 1, false, true, false]),
        ]
    );
}

#[tokio::test]
async fn walk_lists_a_symlink_to_an_outside_directory_without_entering_it() {
    let (_server, mut client, dir) = setup().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "").unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    symlink(outside.path(), tree.join("escape")).unwrap();
    std::fs::write(tree.join("file"), "").unwrap();
    let result = client
        .call("fs/walk", json!({"path": file_uri(&tree)}))
        .await;
    assert_eq!(
        walk_summary(&tree, &result),
        vec![
            json!(["escape", 1, false, false, true]),
            json!(["file", 1, false, true, false]),
        ]
    );
}

#[tokio::test]
async fn walk_past_max_entries_is_truncated_and_limits_out_of_range_are_invalid_params() {
    let (_server, mut client, dir) = setup().await;
    let d = dir.path();
    for name in ["a", "b", "c", "d", "e"] {
        std::fs::write(d.join(name), "").unwrap();
    }
    let cut = client
        .call("fs/walk", json!({"path": file_uri(d), "maxEntries": 3}))
        .await;
    assert_eq!(cut["truncated"], json!(true));
    let names: Vec<Value> = walk_summary(d, &cut).iter().map(|e| e[0].clone()).collect();
    assert_eq!(names, vec![json!("a"), json!("b"), json!("c")]);
    let exact = client
        .call("fs/walk", json!({"path": file_uri(d), "maxEntries": 5}))
        .await;
    assert_eq!(exact["truncated"], json!(false));
    assert_eq!(exact["entries"].as_array().unwrap().len(), 5);
    for params in [
        json!({"path": file_uri(d), "maxEntries": 100_001}),
        json!({"path": file_uri(d), "maxEntries": 0}),
        json!({"path": file_uri(d), "maxDepth": 257}),
    ] {
        let error = assert_rpc_error(
            client.request("fs/walk", params.clone()).await,
            -32602,
            "invalidParams",
        );
        assert!(
            error.message.contains("WALK_MAX_ENTRIES") || error.message.contains("MAX_TREE_DEPTH"),
            "{params}: {error:?}"
        );
    }
}

#[tokio::test]
async fn walk_of_a_missing_path_is_not_found() {
    let (_server, mut client, dir) = setup().await;
    let missing = dir.path().join("missing");
    let error = assert_rpc_error(
        client
            .request("fs/walk", json!({"path": file_uri(&missing)}))
            .await,
        -32004,
        "notFound",
    );
    let data = error.data.expect("data");
    assert_eq!(data.operation.as_deref(), Some("fs/walk"));
}
