//! `fs/writeFile`, atomic and in place, under swaps.

use super::*;

fn write_dir(arena: &Arena, round: usize) -> PathBuf {
    arena.ws(&format!("write-{round}"))
}

fn write_targets(arena: &Arena, round: usize) -> Vec<Target> {
    files([write_dir(arena, round).join("target")]).collect()
}

fn write_scan(arena: &Arena, round: usize) -> Vec<PathBuf> {
    vec![write_dir(arena, round)]
}

fn prepare_write(arena: &Arena, atomic: bool, round: usize) -> (&'static str, Value) {
    let dir = write_dir(arena, round);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("target"), b"old").unwrap();
    (
        "fs/writeFile",
        json!({"path": file_uri(dir.join("target")), "dataBase64": b64(b"new content"),
               "atomic": atomic}),
    )
}

#[tokio::test]
async fn atomic_write_file_under_swaps_writes_nothing_outside_the_named_tree() {
    both_modes(
        "atomic fs/writeFile",
        write_targets,
        write_scan,
        |arena, _mode, round| prepare_write(arena, true, round),
    )
    .await;
}

#[tokio::test]
async fn in_place_write_file_under_swaps_writes_nothing_outside_the_named_tree() {
    both_modes(
        "in-place fs/writeFile",
        write_targets,
        write_scan,
        |arena, _mode, round| prepare_write(arena, false, round),
    )
    .await;
}
