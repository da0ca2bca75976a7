use super::*;
use crate::error::FsErrorKind;
use crate::test_support::{entry_names, make_fifo, non_utf8_name};
use pretty_assertions::assert_eq;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn link_target(path: &Path) -> PathBuf {
    assert!(fs::symlink_metadata(path).unwrap().file_type().is_symlink());
    fs::read_link(path).unwrap()
}

#[test]
fn copy_file_keeps_permission_bits_and_drops_setuid() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("script");
    fs::write(&source, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&source, fs::Permissions::from_mode(0o4751)).unwrap();
    let destination = dir.path().join("copy");
    copy(&source, &destination, false).unwrap();
    assert_eq!(fs::read(&destination).unwrap(), b"#!/bin/sh\n");
    assert_eq!(mode_of(&destination), 0o751);
}

#[test]
fn copy_file_overwrites_existing_destination_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    let destination = dir.path().join("destination");
    fs::write(&source, b"new").unwrap();
    fs::write(&destination, b"old and longer").unwrap();
    fs::set_permissions(&destination, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&source, fs::Permissions::from_mode(0o644)).unwrap();
    copy(&source, &destination, false).unwrap();
    assert_eq!(fs::read(&destination).unwrap(), b"new");
    assert_eq!(mode_of(&destination), 0o644);
}

#[test]
fn copy_file_replaces_destination_symlink_instead_of_writing_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    fs::write(&precious, b"keep me").unwrap();
    let source = dir.path().join("source");
    fs::write(&source, b"new").unwrap();
    let destination = dir.path().join("destination");
    symlink(&precious, &destination).unwrap();
    copy(&source, &destination, false).unwrap();
    assert!(fs::symlink_metadata(&destination).unwrap().is_file());
    assert_eq!(fs::read(&destination).unwrap(), b"new");
    assert_eq!(fs::read(&precious).unwrap(), b"keep me");
}

#[test]
fn copy_directory_without_recursive_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    let error = copy(&source, &dir.path().join("copy"), false).unwrap_err();
    assert!(
        matches!(&error, FsError::IsDirectoryNeedsRecursive { path, .. } if path == &source),
        "{error:?}"
    );
    assert_eq!(error.kind(), FsErrorKind::IsADirectory);
    assert_eq!(entry_names(dir.path()), vec![OsString::from("tree")]);
}

#[test]
fn copy_directory_recursive_copies_files_directories_and_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir_all(source.join("sub").join("empty")).unwrap();
    fs::write(source.join("top"), b"top").unwrap();
    fs::write(source.join("sub").join("inner"), b"inner").unwrap();
    symlink("../top", source.join("sub").join("relative-link")).unwrap();
    symlink("/nonexistent/target", source.join("dangling")).unwrap();
    fs::set_permissions(source.join("sub"), fs::Permissions::from_mode(0o750)).unwrap();

    let destination = dir.path().join("copy");
    copy(&source, &destination, true).unwrap();

    assert_eq!(
        entry_names(&destination),
        ["dangling", "sub", "top"].map(OsString::from).to_vec()
    );
    assert_eq!(
        entry_names(&destination.join("sub")),
        ["empty", "inner", "relative-link"]
            .map(OsString::from)
            .to_vec()
    );
    assert_eq!(fs::read(destination.join("top")).unwrap(), b"top");
    assert_eq!(
        fs::read(destination.join("sub").join("inner")).unwrap(),
        b"inner"
    );
    assert_eq!(
        link_target(&destination.join("sub").join("relative-link")),
        PathBuf::from("../top")
    );
    assert_eq!(
        link_target(&destination.join("dangling")),
        PathBuf::from("/nonexistent/target")
    );
    assert_eq!(mode_of(&destination.join("sub")), 0o750);
}

#[test]
fn copy_does_not_follow_symlink_to_directory_inside_tree() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"").unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    symlink(&outside, source.join("escape")).unwrap();
    let destination = dir.path().join("copy");
    copy(&source, &destination, true).unwrap();
    assert_eq!(link_target(&destination.join("escape")), outside);
}

#[test]
fn copy_top_level_symlink_copies_the_link() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("real-dir")).unwrap();
    symlink("real-dir", dir.path().join("to-dir")).unwrap();
    symlink("missing", dir.path().join("dangling")).unwrap();
    for name in ["to-dir", "dangling"] {
        let destination = dir.path().join(format!("{name}-copy"));
        copy(&dir.path().join(name), &destination, false).unwrap();
        assert_eq!(
            link_target(&destination),
            link_target(&dir.path().join(name))
        );
    }
}

#[test]
fn copy_symlink_overwrites_existing_file_but_not_directory() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("link");
    symlink("anywhere", &link).unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    copy(&link, &file, false).unwrap();
    assert_eq!(link_target(&file), PathBuf::from("anywhere"));

    let directory = dir.path().join("directory");
    fs::create_dir(&directory).unwrap();
    let error = copy(&link, &directory, false).unwrap_err();
    assert_eq!(error.kind(), FsErrorKind::IsADirectory);
    assert!(directory.is_dir());
}

#[test]
fn copy_into_own_descendant_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir_all(source.join("sub")).unwrap();
    for destination in [
        source.join("sub").join("new"),
        source.join("sub"),
        source.clone(),
    ] {
        let error = copy(&source, &destination, true).unwrap_err();
        assert!(
            matches!(error, FsError::CopyIntoItself { .. }),
            "{destination:?}: {error:?}"
        );
        assert_eq!(error.kind(), FsErrorKind::InvalidInput);
    }
    assert_eq!(entry_names(&source), vec![OsString::from("sub")]);
    assert_eq!(entry_names(&source.join("sub")), Vec::<OsString>::new());
}

#[test]
fn copy_into_descendant_through_symlinked_parent_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir_all(source.join("sub")).unwrap();
    let alias = dir.path().join("alias");
    symlink(source.join("sub"), &alias).unwrap();
    let error = copy(&source, &alias.join("new"), true).unwrap_err();
    assert!(matches!(error, FsError::CopyIntoItself { .. }), "{error:?}");
    assert!(!source.join("sub").join("new").exists());
}

#[test]
fn copy_to_sibling_with_common_name_prefix_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    copy(&source, &dir.path().join("tree-copy"), true).unwrap();
    assert!(dir.path().join("tree-copy").is_dir());
}

#[test]
fn copy_file_onto_itself_or_a_hard_link_to_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("file");
    fs::write(&source, b"data").unwrap();
    let hard_link = dir.path().join("hard-link");
    fs::hard_link(&source, &hard_link).unwrap();
    for destination in [&source, &hard_link] {
        let error = copy(&source, destination, false).unwrap_err();
        assert!(matches!(error, FsError::CopyIntoItself { .. }), "{error:?}");
    }
    assert_eq!(fs::read(&source).unwrap(), b"data");
}

#[test]
fn copy_tree_skips_fifos_and_sockets_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    make_fifo(&source, "pipe");
    let _listener = std::os::unix::net::UnixListener::bind(source.join("sock")).unwrap();
    fs::write(source.join("file"), b"kept").unwrap();
    let started = Instant::now();
    copy(&source, &dir.path().join("copy"), true).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        entry_names(&dir.path().join("copy")),
        vec![OsString::from("file")]
    );
}

#[test]
fn copy_keeps_holes_of_a_sparse_file() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("sparse");
    let file = fs::File::create(&source).unwrap();
    let block = vec![0x5a_u8; 64 * 1024];
    let size: u64 = 256 * 1024 * 1024;
    file.write_all_at(&block, 0).unwrap();
    file.write_all_at(&block, 100 * 1024 * 1024).unwrap();
    file.set_len(size).unwrap();
    drop(file);
    let allocated = |path: &Path| fs::metadata(path).unwrap().blocks() * 512;
    if allocated(&source) >= size {
        panic!("this filesystem does not make sparse files; the test needs one");
    }
    let destination = dir.path().join("copy");
    copy(&source, &destination, false).unwrap();
    assert_eq!(fs::metadata(&destination).unwrap().len(), size);
    assert!(
        allocated(&destination) <= allocated(&source) + 1024 * 1024,
        "holes were written out: {} bytes allocated for {} of data",
        allocated(&destination),
        2 * block.len()
    );
    assert_eq!(fs::read(&destination).unwrap(), fs::read(&source).unwrap());
}

#[test]
fn copy_over_the_byte_limit_stops_with_limit_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    for name in ["a", "b", "c"] {
        fs::write(source.join(name), vec![1_u8; 4096]).unwrap();
    }
    let destination = dir.path().join("copy");
    let error = copy_with_limit(&source, &destination, true, 10_000).unwrap_err();
    assert!(
        matches!(error, FsError::CopyTooLarge { limit: 10_000, .. }),
        "{error:?}"
    );
    assert_eq!(error.kind(), FsErrorKind::TooLarge);
    assert_eq!(error.limit(), Some(10_000));
    copy_with_limit(&source, &dir.path().join("fits"), true, 3 * 4096).unwrap();
}

#[test]
fn copy_and_remove_refuse_trees_deeper_than_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("deep");
    let mut deepest = source.clone();
    for _ in 0..=MAX_TREE_DEPTH + 1 {
        deepest.push("d");
    }
    fs::create_dir_all(&deepest).unwrap();
    let error = copy(&source, &dir.path().join("copy"), true).unwrap_err();
    assert!(matches!(error, FsError::TreeTooDeep { .. }), "{error:?}");
    assert_eq!(error.kind(), FsErrorKind::TooLarge);
    let error = crate::remove(&source, true, false).unwrap_err();
    assert!(matches!(error, FsError::TreeTooDeep { .. }), "{error:?}");
    assert!(deepest.is_dir(), "nothing past the limit was removed");
}

#[test]
fn copy_to_a_destination_that_is_a_hard_link_to_the_source_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("file"), b"data").unwrap();
    let destination = dir.path().join("copy");
    fs::create_dir(&destination).unwrap();
    fs::hard_link(source.join("file"), destination.join("file")).unwrap();
    let error = copy(&source, &destination, true).unwrap_err();
    assert!(matches!(error, FsError::CopyIntoItself { .. }), "{error:?}");
    assert_eq!(fs::read(source.join("file")).unwrap(), b"data");
}

#[test]
fn copy_follows_symlinks_in_the_parents_but_not_in_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    fs::create_dir_all(real.join("tree")).unwrap();
    fs::write(real.join("tree").join("file"), b"data").unwrap();
    symlink("real", dir.path().join("alias")).unwrap();
    let source = dir.path().join("alias").join("tree");
    let destination = dir.path().join("alias").join("copy");
    copy(&source, &destination, true).unwrap();
    assert_eq!(fs::read(real.join("copy").join("file")).unwrap(), b"data");
}

#[test]
fn copy_top_level_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = make_fifo(dir.path(), "pipe");
    let started = Instant::now();
    let error = copy(&fifo, &dir.path().join("copy"), true).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
    assert_eq!(entry_names(dir.path()), vec![OsString::from("pipe")]);
}

#[test]
fn copy_directory_onto_existing_directory_merges() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("new"), b"from source").unwrap();
    fs::write(source.join("both"), b"from source").unwrap();
    let destination = dir.path().join("existing");
    fs::create_dir(&destination).unwrap();
    fs::write(destination.join("old"), b"kept").unwrap();
    fs::write(destination.join("both"), b"replaced").unwrap();
    copy(&source, &destination, true).unwrap();
    assert_eq!(
        entry_names(&destination),
        ["both", "new", "old"].map(OsString::from).to_vec()
    );
    assert_eq!(fs::read(destination.join("both")).unwrap(), b"from source");
    assert_eq!(fs::read(destination.join("old")).unwrap(), b"kept");
}

#[test]
fn copy_merge_does_not_write_through_symlinks_in_destination() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("file"), b"keep me").unwrap();
    let source = dir.path().join("tree");
    fs::create_dir_all(source.join("sub")).unwrap();
    fs::write(source.join("sub").join("file"), b"copied").unwrap();
    fs::write(source.join("file"), b"copied").unwrap();
    let destination = dir.path().join("existing");
    fs::create_dir(&destination).unwrap();
    symlink(&outside, destination.join("sub")).unwrap();
    symlink(outside.join("file"), destination.join("file")).unwrap();

    copy(&source, &destination, true).unwrap();

    assert_eq!(fs::read(outside.join("file")).unwrap(), b"keep me");
    assert!(
        fs::symlink_metadata(destination.join("sub"))
            .unwrap()
            .is_dir()
    );
    assert!(
        fs::symlink_metadata(destination.join("file"))
            .unwrap()
            .is_file()
    );
    assert_eq!(
        fs::read(destination.join("sub").join("file")).unwrap(),
        b"copied"
    );
}

#[test]
fn copy_directory_onto_file_is_already_exists() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tree");
    fs::create_dir(&source).unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"keep").unwrap();
    let error = copy(&source, &file, true).unwrap_err();
    assert_eq!(error.kind(), FsErrorKind::AlreadyExists);
    assert_eq!(fs::read(&file).unwrap(), b"keep");
}

#[test]
fn copy_file_onto_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("file");
    fs::write(&source, b"").unwrap();
    let directory = dir.path().join("directory");
    fs::create_dir(&directory).unwrap();
    let error = copy(&source, &directory, false).unwrap_err();
    assert_eq!(error.kind(), FsErrorKind::NotRegularFile, "{error}");
    assert!(directory.is_dir());
}

#[test]
fn copy_missing_source_or_destination_parent_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let error = copy(&missing, &dir.path().join("copy"), true).unwrap_err();
    assert_eq!(error.kind(), FsErrorKind::NotFound);
    assert_eq!(error.path(), Some(missing.as_path()));

    let source = dir.path().join("file");
    fs::write(&source, b"").unwrap();
    let error = copy(&source, &missing.join("copy"), false).unwrap_err();
    assert_eq!(error.kind(), FsErrorKind::NotFound);
}

#[test]
fn copy_accepts_non_utf8_names() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join(non_utf8_name());
    fs::create_dir(&source).unwrap();
    fs::write(source.join(non_utf8_name()), b"bytes").unwrap();
    let mut copy_name = non_utf8_name();
    copy_name.push("-copy");
    let destination = dir.path().join(copy_name);
    copy(&source, &destination, true).unwrap();
    assert_eq!(
        fs::read(destination.join(non_utf8_name())).unwrap(),
        b"bytes"
    );
}
