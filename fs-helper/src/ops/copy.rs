//! `fs/copy`: copy a file, a symlink or a directory tree.
//!
//! Rules, in the order they are checked:
//! 1. The source is examined with `lstat`: a symlink source is copied as a symlink.
//! 2. A directory source needs `recursive`.
//! 3. The destination must not be the source (same inode) nor, for a directory, lie inside it.
//!    The destination's parent is canonicalized and its name appended, so the check also works
//!    for a destination that does not exist yet and sees through symlinked parents.
//! 4. Symlinks at the destination are never followed: a link where a file, link or directory is
//!    to be written is replaced, so a copy cannot be redirected outside its destination.
//! 5. FIFOs, sockets and devices are never opened: inside a recursive copy they are skipped (the
//!    rest of the tree is copied, as the reference server does); as the top-level source they
//!    are refused. A failure part-way leaves what was already copied in place.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::error::{FsError, FsOperation};
use crate::open::{FinalSymlink, file_type_name, open_regular_for_read, open_regular_for_write};
use crate::ops::named_entry;

const OP: FsOperation = FsOperation::Copy;

/// Permission bits kept by a copy: read, write and execute for user, group and others. Set-id
/// and sticky bits are dropped, as `cp` does without `--preserve`.
const COPIED_MODE_BITS: u32 = 0o777;

/// Copies `source` to `destination` (the new entry's own path, not a directory to copy into).
///
/// Regular files keep their permission bits and overwrite an existing destination file.
/// Symlinks are copied as symlinks with the same target text, including a top-level symlink
/// source. A directory needs `recursive`; copying onto an existing directory merges into it.
///
/// # Errors
/// - [`FsError::IsDirectoryNeedsRecursive`] for a directory source without `recursive`.
/// - [`FsError::CopyIntoItself`] if the destination is the source or lies inside it.
/// - [`FsError::UnsupportedFileType`] for a FIFO, socket or device as the source (inside a
///   directory tree they are skipped).
/// - [`FsError::InvalidPath`] if either path names no entry (`/`, or ends in `..`).
/// - [`FsError::NotRegularFile`] for a file copied onto a directory, FIFO, socket or device.
/// - [`FsError::Io`] naming the entry that failed, for example `NotFound` for a missing source
///   or destination parent, `AlreadyExists` for a directory copied onto a file, `IsADirectory`
///   for a symlink copied onto a directory.
pub fn copy(source: &Path, destination: &Path, recursive: bool) -> Result<(), FsError> {
    let source_entry = named_entry(OP, source)?;
    let destination_entry = named_entry(OP, destination)?;
    let metadata = fs::symlink_metadata(&source_entry).map_err(|e| FsError::io(OP, source, e))?;
    if metadata.is_dir() && !recursive {
        return Err(FsError::IsDirectoryNeedsRecursive {
            op: OP,
            path: source.to_path_buf(),
        });
    }
    let into_itself = || FsError::CopyIntoItself {
        source_path: source.to_path_buf(),
        destination_path: destination.to_path_buf(),
    };
    if let Ok(existing) = fs::symlink_metadata(&destination_entry)
        && (existing.dev(), existing.ino()) == (metadata.dev(), metadata.ino())
    {
        return Err(into_itself());
    }
    if metadata.is_dir() {
        let source_real =
            fs::canonicalize(&source_entry).map_err(|e| FsError::io(OP, source, e))?;
        let destination_real =
            resolve_parent(&destination_entry).map_err(|e| FsError::io(OP, destination, e))?;
        if destination_real.starts_with(&source_real) {
            return Err(into_itself());
        }
    }
    copy_entry(&source_entry, &destination_entry, &metadata)
}

/// `path` with its parent canonicalized and its own last component kept as is (not followed).
fn resolve_parent(path: &Path) -> io::Result<PathBuf> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut resolved = fs::canonicalize(parent)?;
    if let Some(name) = path.file_name() {
        resolved.push(name);
    }
    Ok(resolved)
}

fn copy_entry(source: &Path, destination: &Path, metadata: &Metadata) -> Result<(), FsError> {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        copy_symlink(source, destination)
    } else if file_type.is_dir() {
        copy_directory(source, destination, metadata)
    } else if file_type.is_file() {
        copy_file(source, destination, metadata)
    } else {
        Err(FsError::UnsupportedFileType {
            op: OP,
            path: source.to_path_buf(),
            file_type: file_type_name(&file_type),
        })
    }
}

/// A FIFO, socket or device: skipped inside a recursive copy.
fn is_special(metadata: &Metadata) -> bool {
    let file_type = metadata.file_type();
    !(file_type.is_file() || file_type.is_dir() || file_type.is_symlink())
}

/// Removes a symlink at `path` (never its target) so something else can be created there.
fn replace_symlink(path: &Path) -> Result<(), FsError> {
    match fs::symlink_metadata(path) {
        Ok(existing) if existing.file_type().is_symlink() => {
            fs::remove_file(path).map_err(|e| FsError::io(OP, path, e))
        }
        _ => Ok(()),
    }
}

fn copy_file(source: &Path, destination: &Path, metadata: &Metadata) -> Result<(), FsError> {
    let mode = metadata.permissions().mode() & COPIED_MODE_BITS;
    let mut input = open_regular_for_read(OP, source)?;
    replace_symlink(destination)?;
    let mut output = open_regular_for_write(OP, destination, mode, FinalSymlink::Refuse)?;
    io::copy(&mut input, &mut output).map_err(|e| FsError::io(OP, destination, e))?;
    // An existing destination keeps its old mode through open(); give it the source's.
    output
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| FsError::io(OP, destination, e))
}

fn copy_symlink(source: &Path, destination: &Path) -> Result<(), FsError> {
    let target = fs::read_link(source).map_err(|e| FsError::io(OP, source, e))?;
    match fs::symlink_metadata(destination) {
        Ok(existing) if existing.is_dir() => {
            return Err(FsError::io(
                OP,
                destination,
                io::Error::from_raw_os_error(libc::EISDIR),
            ));
        }
        Ok(_) => fs::remove_file(destination).map_err(|e| FsError::io(OP, destination, e))?,
        Err(_) => {}
    }
    symlink(&target, destination).map_err(|e| FsError::io(OP, destination, e))
}

fn copy_directory(source: &Path, destination: &Path, metadata: &Metadata) -> Result<(), FsError> {
    replace_symlink(destination)?;
    let created = match fs::create_dir(destination) {
        Ok(()) => true,
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            match fs::symlink_metadata(destination) {
                Ok(existing) if existing.is_dir() => false,
                _ => return Err(FsError::io(OP, destination, error)),
            }
        }
        Err(error) => return Err(FsError::io(OP, destination, error)),
    };
    let entries = fs::read_dir(source).map_err(|e| FsError::io(OP, source, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| FsError::io(OP, source, e))?;
        let child_source = entry.path();
        let child_metadata =
            fs::symlink_metadata(&child_source).map_err(|e| FsError::io(OP, &child_source, e))?;
        if is_special(&child_metadata) {
            continue;
        }
        copy_entry(
            &child_source,
            &destination.join(entry.file_name()),
            &child_metadata,
        )?;
    }
    if created {
        // Set last, so a read-only source directory is still filled before it becomes read-only.
        let mode = metadata.permissions().mode() & COPIED_MODE_BITS;
        fs::set_permissions(destination, fs::Permissions::from_mode(mode))
            .map_err(|e| FsError::io(OP, destination, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{entry_names, make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::ffi::OsString;
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
    fn copy_tree_skips_fifos_and_sockets_and_copies_the_rest_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("tree");
        fs::create_dir_all(source.join("sub")).unwrap();
        make_fifo(&source, "pipe");
        make_fifo(&source.join("sub"), "nested-pipe");
        let _socket = std::os::unix::net::UnixListener::bind(source.join("socket")).unwrap();
        fs::write(source.join("file"), b"data").unwrap();
        fs::write(source.join("sub").join("inner"), b"inner").unwrap();
        let destination = dir.path().join("copy");
        let started = Instant::now();
        copy(&source, &destination, true).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            entry_names(&destination),
            ["file", "sub"].map(OsString::from).to_vec()
        );
        assert_eq!(
            entry_names(&destination.join("sub")),
            vec![OsString::from("inner")]
        );
        assert_eq!(fs::read(destination.join("file")).unwrap(), b"data");
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
}
