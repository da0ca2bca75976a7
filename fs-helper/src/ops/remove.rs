//! `fs/remove`: remove a file, a symlink or a directory tree, never following symlinks.

use std::fs;
use std::io;
use std::path::Path;

use crate::error::{FsError, FsOperation};
use crate::ops::named_entry;

/// Removes `path`.
///
/// Symlinks are never followed: removing a link removes the link only, even with `recursive`
/// and even when the link points to a directory (a trailing `/` does not change that). Inside a
/// tree, links are removed, not descended into. With `force`, a missing path is success.
/// Without `recursive`, only files, links and empty directories can be removed.
///
/// # Errors
/// - [`FsError::InvalidPath`] if the path names no entry (`/`, or ends in `..`).
/// - [`FsError::Io`] with kind `NotFound` (without `force`), `DirectoryNotEmpty` (a non-empty
///   directory without `recursive`), `PermissionDenied`, ...
pub fn remove(path: &Path, recursive: bool, force: bool) -> Result<(), FsError> {
    let op = FsOperation::Remove;
    let entry = named_entry(op, path)?;
    let ignore_missing = |result: io::Result<()>| match result {
        Err(error) if force && error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(|e| FsError::io(op, path, e)),
    };
    let metadata = match fs::symlink_metadata(&entry) {
        Ok(metadata) => metadata,
        Err(error) => return ignore_missing(Err(error)),
    };
    let result = if metadata.file_type().is_dir() {
        if recursive {
            // std's remove_dir_all does not follow symlinks inside the tree (it works on
            // directory descriptors with O_NOFOLLOW), so a link to elsewhere is unlinked only.
            fs::remove_dir_all(&entry)
        } else {
            fs::remove_dir(&entry)
        }
    } else {
        fs::remove_file(&entry)
    };
    ignore_missing(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{entry_names, make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::ffi::OsString;
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
