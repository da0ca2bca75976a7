//! `fs/remove`: remove a file, a symlink or a directory tree, never following symlinks.
//!
//! The parent is resolved once (following symlinks as named) into a descriptor; the named
//! entry and everything below it are removed by descriptor, the way std's `remove_dir_all`
//! works: each directory is opened with `O_NOFOLLOW` relative to its parent's descriptor,
//! emptied through its own descriptor, then removed by name from the parent's. A directory
//! swapped for a symlink at any point is unlinked as a link (its target untouched), and a
//! directory moved elsewhere while it is being emptied is emptied where it now is: nothing
//! outside the named tree is ever removed.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::dir::Type;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::dirfd::{Named, kind, list, open_below, stat_nofollow};
use crate::error::{FsError, FsOperation};
use crate::ops::MAX_TREE_DEPTH;

const OP: FsOperation = FsOperation::Remove;

/// Removes `path`.
///
/// Symlinks are never followed: removing a link removes the link only, even with `recursive`
/// and even when the link points to a directory (a trailing `/` does not change that). Inside a
/// tree, links are removed, not descended into. With `force`, a missing path is success.
/// Without `recursive`, only files, links and empty directories can be removed.
///
/// # Errors
/// - [`FsError::InvalidPath`] if the path names no entry (`/`, or ends in `..`).
/// - [`FsError::TreeTooDeep`] past [`MAX_TREE_DEPTH`] levels (what was removed stays removed).
/// - [`FsError::Io`] with kind `NotFound` (without `force`), `DirectoryNotEmpty` (a non-empty
///   directory without `recursive`, or entries added while it was emptied),
///   `PermissionDenied`, ...
pub fn remove(path: &Path, recursive: bool, force: bool) -> Result<(), FsError> {
    let ignore_missing = |result: Result<(), FsError>| match result {
        Err(FsError::Io { source, .. }) if force && source.kind() == io::ErrorKind::NotFound => {
            Ok(())
        }
        other => other,
    };
    let target = match Named::resolve(OP, path) {
        Ok(target) => target,
        Err(error) => return ignore_missing(Err(error)),
    };
    let is_dir = match stat_nofollow(&target.dir, &target.name) {
        Ok(stat) => kind(&stat) == SFlag::S_IFDIR,
        Err(error) => return ignore_missing(Err(FsError::io(OP, path, error))),
    };
    let result = if !is_dir {
        unlink_entry(&target.dir, &target.name, path, recursive, 0)
    } else if recursive {
        remove_tree(&target.dir, &target.name, path, 0)
    } else {
        unlinkat(
            &target.dir,
            target.name.as_os_str(),
            UnlinkatFlags::RemoveDir,
        )
        .map_err(|e| FsError::io(OP, path, e.into()))
    };
    ignore_missing(result)
}

/// Unlinks a non-directory. If it turned into a directory meanwhile, removes that as a tree
/// when `recursive` allows it.
fn unlink_entry(
    dir: &OwnedFd,
    name: &OsStr,
    path: &Path,
    recursive: bool,
    depth: usize,
) -> Result<(), FsError> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EISDIR) if recursive => remove_tree(dir, name, path, depth),
        Err(error) => Err(FsError::io(OP, path, error.into())),
    }
}

/// Empties and removes the directory `name` of `dir`. `depth` is its level below the named
/// path (0 for the named directory itself).
fn remove_tree(dir: &OwnedFd, name: &OsStr, path: &Path, depth: usize) -> Result<(), FsError> {
    if depth > MAX_TREE_DEPTH {
        return Err(FsError::TreeTooDeep {
            op: OP,
            path: path.to_path_buf(),
            limit: MAX_TREE_DEPTH,
        });
    }
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let child = match open_below(dir, name, flags, Mode::empty()) {
        Ok(child) => child,
        // Swapped for a symlink or a file after it was seen as a directory: remove that entry
        // itself, never what a link points to.
        Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return unlink_entry(dir, name, path, false, depth);
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(FsError::io(OP, path, error)),
    };
    for entry in list(child.as_fd()).map_err(|e| FsError::io(OP, path, e))? {
        let (entry, file_type) = entry.map_err(|e| FsError::io(OP, path, e))?;
        let entry_path = path.join(&entry);
        let result = if file_type == Some(Type::Directory) {
            remove_tree(&child, &entry, &entry_path, depth + 1)
        } else {
            unlink_entry(&child, &entry, &entry_path, true, depth + 1)
        };
        match result {
            // Removed by someone else meanwhile: that is what we wanted.
            Err(FsError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(error) => Err(FsError::io(OP, path, error.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{entry_names, make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::ffi::OsString;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// A directory with one file, outside the tree being removed, that must survive.
    fn precious_directory(root: &Path) -> std::path::PathBuf {
        let precious = root.join("precious");
        fs::create_dir(&precious).unwrap();
        fs::write(precious.join("keep"), b"keep me").unwrap();
        precious
    }

    #[test]
    fn remove_deletes_file_and_empty_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        fs::create_dir(dir.path().join("empty")).unwrap();
        remove(&dir.path().join("file"), false, false).unwrap();
        remove(&dir.path().join("empty"), false, false).unwrap();
        assert_eq!(entry_names(dir.path()), Vec::<OsString>::new());
    }

    #[test]
    fn remove_recursive_deletes_tree() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("a").join("b")).unwrap();
        fs::write(tree.join("a").join("b").join("file"), b"").unwrap();
        make_fifo(&tree, "fifo");
        remove(&tree, true, false).unwrap();
        assert!(!tree.exists());
    }

    #[test]
    fn remove_non_recursive_non_empty_directory_is_directory_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("file"), b"").unwrap();
        let error = remove(&tree, false, true).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::DirectoryNotEmpty);
        assert_eq!(error.operation(), FsOperation::Remove);
        assert!(tree.join("file").exists());
    }

    #[test]
    fn remove_missing_is_ok_with_force_and_not_found_without() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        remove(&missing, true, true).unwrap();
        let error = remove(&missing, true, false).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
        assert_eq!(error.path(), Some(missing.as_path()));
    }

    #[test]
    fn remove_symlink_to_directory_removes_only_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let precious = precious_directory(dir.path());
        for (name, path_suffix) in [("link", ""), ("link-slash", "/"), ("link-dot", "/.")] {
            symlink(&precious, dir.path().join(name)).unwrap();
            let mut path = dir.path().join(name).into_os_string();
            path.push(path_suffix);
            remove(Path::new(&path), true, false).unwrap();
            assert!(
                fs::symlink_metadata(dir.path().join(name)).is_err(),
                "{name}"
            );
            assert_eq!(fs::read(precious.join("keep")).unwrap(), b"keep me");
        }
    }

    #[test]
    fn remove_recursive_does_not_descend_into_symlinks_inside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let precious = precious_directory(dir.path());
        let tree = dir.path().join("tree");
        fs::create_dir(&tree).unwrap();
        symlink(&precious, tree.join("escape")).unwrap();
        remove(&tree, true, false).unwrap();
        assert!(!tree.exists());
        assert_eq!(fs::read(precious.join("keep")).unwrap(), b"keep me");
    }

    #[test]
    fn remove_dangling_symlink_removes_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("dangling");
        symlink("missing", &link).unwrap();
        remove(&link, false, false).unwrap();
        assert_eq!(entry_names(dir.path()), Vec::<OsString>::new());
    }

    #[test]
    fn remove_symlink_to_file_keeps_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"data").unwrap();
        symlink("file", dir.path().join("link")).unwrap();
        remove(&dir.path().join("link"), false, false).unwrap();
        assert_eq!(entry_names(dir.path()), vec![OsString::from("file")]);
    }

    #[test]
    fn remove_refuses_paths_that_name_no_entry() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let error = remove(&sub.join(".."), true, true).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::InvalidInput);
        assert!(sub.exists());
        let error = remove(Path::new("/"), true, true).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::InvalidInput);
    }

    #[test]
    fn remove_accepts_non_utf8_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(non_utf8_name());
        fs::create_dir(&path).unwrap();
        fs::write(path.join(non_utf8_name()), b"").unwrap();
        remove(&path, true, false).unwrap();
        assert!(!path.exists());
    }
}
