//! Recursive `fs/createDirectory` under swaps.

use super::*;

/// Components `fs/createDirectory` creates per round.
const MKDIR_DEPTH: usize = 16;

/// `a/b/c/...`, `depth` components.
fn mkdir_chain(depth: usize) -> PathBuf {
    (b'a'..)
        .take(depth)
        .map(|c| char::from(c).to_string())
        .collect()
}

#[tokio::test]
async fn recursive_create_directory_under_swaps_creates_nothing_outside_the_named_tree() {
    fn base(arena: &Arena, round: usize) -> PathBuf {
        arena.ws(&format!("mkdir-{round}"))
    }
    both_modes(
        "fs/createDirectory {recursive}",
        |arena, round| {
            let base = base(arena, round);
            // Every component the call creates, deepest first: each one can only be swapped
            // in the short time between its creation and the creation of the next.
            dirs(
                (1..MKDIR_DEPTH)
                    .rev()
                    .map(|depth| base.join(mkdir_chain(depth))),
            )
            .collect()
        },
        no_scan,
        |arena, _mode, round| {
            let base = base(arena, round);
            std::fs::create_dir(&base).unwrap();
            (
                "fs/createDirectory",
                json!({"path": file_uri(base.join(mkdir_chain(MKDIR_DEPTH))), "recursive": true}),
            )
        },
    )
    .await;
}
