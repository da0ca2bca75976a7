//! Recursive `fs/copy` and `fs/remove` under swaps.

use super::*;

#[tokio::test]
async fn recursive_copy_under_swaps_writes_nothing_outside_the_named_tree() {
    fn source(arena: &Arena, round: usize) -> PathBuf {
        arena.ws(&format!("src-{round}"))
    }
    fn destination(arena: &Arena, round: usize) -> PathBuf {
        arena.ws(&format!("dst-{round}"))
    }
    both_modes(
        "recursive fs/copy",
        |arena, round| {
            let (src, dst) = (source(arena, round), destination(arena, round));
            dirs([
                dst.clone(),
                dst.join("a"),
                dst.join("a/b"),
                dst.join("c"),
                src.join("a/b"),
                src.join("c"),
            ])
            .chain(files([dst.join("top"), dst.join("a/f1")]))
            .collect()
        },
        no_scan,
        |arena, _mode, round| {
            let src = source(arena, round);
            std::fs::create_dir_all(src.join("a/b")).unwrap();
            std::fs::create_dir_all(src.join("c")).unwrap();
            std::fs::write(src.join("top"), b"top").unwrap();
            std::fs::write(src.join("a/f1"), b"f1").unwrap();
            std::fs::write(src.join("a/b/f2"), b"f2").unwrap();
            std::fs::write(src.join("c/f3"), b"f3").unwrap();
            (
                "fs/copy",
                json!({"sourcePath": file_uri(&src),
                       "destinationPath": file_uri(destination(arena, round)),
                       "recursive": true}),
            )
        },
    )
    .await;
}

#[tokio::test]
async fn recursive_remove_under_swaps_removes_nothing_outside_the_named_tree() {
    fn tree(arena: &Arena, round: usize) -> PathBuf {
        arena.ws(&format!("tree-{round}"))
    }
    both_modes(
        "recursive fs/remove",
        |arena, round| {
            let tree = tree(arena, round);
            dirs([
                tree.join("a/b"),
                tree.join("a"),
                tree.join("c"),
                tree.clone(),
            ])
            .chain(files([tree.join("c/f3"), tree.join("top")]))
            .collect()
        },
        no_scan,
        |arena, _mode, round| {
            let tree = tree(arena, round);
            std::fs::create_dir_all(tree.join("a/b")).unwrap();
            std::fs::create_dir_all(tree.join("c")).unwrap();
            std::fs::write(tree.join("top"), b"top").unwrap();
            std::fs::write(tree.join("a/b/f2"), b"f2").unwrap();
            std::fs::write(tree.join("c/f3"), b"f3").unwrap();
            (
                "fs/remove",
                json!({"path": file_uri(&tree), "recursive": true, "force": true}),
            )
        },
    )
    .await;
}
