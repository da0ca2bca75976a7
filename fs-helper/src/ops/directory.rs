//! `fs/createDirectory` and `fs/readDirectory`.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{FsError, FsOperation};

/// Creates the directory `path`.
///
/// With `recursive`, missing parents are created too and an existing directory (or a symlink to
/// one) is success. Without it, the parent must exist and an existing path is an error.
///
/// # Errors
/// - [`FsError::Io`] with kind `AlreadyExists` if `path` exists (with `recursive`: exists and is
///   not a directory), `NotFound` if the parent is missing (without `recursive`),
///   `NotADirectory` if a parent is a file, `PermissionDenied` on denial.
pub fn create_directory(path: &Path, recursive: bool) -> Result<(), FsError> {
    let result = if recursive {
        fs::create_dir_all(path)
    } else {
        fs::create_dir(path)
    };
    result.map_err(|e| FsError::io(FsOperation::CreateDirectory, path, e))
}

/// One entry of [`read_directory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (any bytes but `/` and NUL; not necessarily UTF-8).
    pub file_name: OsString,
    /// The entry is a directory, or a symlink that resolves to one.
    pub is_directory: bool,
    /// The entry is a regular file, or a symlink that resolves to one.
    pub is_file: bool,
    /// The entry itself is a symlink (resolving or dangling).
    pub is_symlink: bool,
}

/// Lists the directory `path` (following symlinks to it), sorted by name bytes.
///
/// Symlink entries report their target's kind; a dangling link (or one whose target cannot be
/// examined) is still listed, with `is_symlink` true and neither `is_directory` nor `is_file`.
/// FIFOs, sockets and devices are listed with all three flags false.
///
/// # Errors
/// [`FsError::Io`] if `path` is missing (`NotFound`), not a directory (`NotADirectory`), denied,
/// or an entry cannot be read.
pub fn read_directory(path: &Path) -> Result<Vec<DirEntry>, FsError> {
    let error = |e: io::Error| FsError::io(FsOperation::ReadDirectory, path, e);
    let mut entries = Vec::new();
    for entry in fs::read_dir(path).map_err(error)? {
        let entry = entry.map_err(error)?;
        let file_type = entry.file_type().map_err(error)?;
        let (is_directory, is_file) = if file_type.is_symlink() {
            match fs::metadata(entry.path()) {
                Ok(target) => (target.is_dir(), target.is_file()),
                Err(_) => (false, false),
            }
        } else {
            (file_type.is_dir(), file_type.is_file())
        };
        entries.push(DirEntry {
            file_name: entry.file_name(),
            is_directory,
            is_file,
            is_symlink: file_type.is_symlink(),
        });
    }
    entries.sort_by(|a, b| a.file_name.as_bytes().cmp(b.file_name.as_bytes()));
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;

    fn entry(name: &str, is_directory: bool, is_file: bool, is_symlink: bool) -> DirEntry {
        DirEntry {
            file_name: OsString::from(name),
            is_directory,
            is_file,
            is_symlink,
        }
    }

    #[test]
    fn create_directory_recursive_creates_parents_and_accepts_existing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("b");
        create_directory(&path, true).unwrap();
        assert!(path.is_dir());
        create_directory(&path, true).unwrap();
    }

    #[test]
    fn create_directory_recursive_accepts_symlink_to_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        symlink("real", dir.path().join("link")).unwrap();
        create_directory(&dir.path().join("link"), true).unwrap();
    }

    #[test]
    fn create_directory_over_existing_file_is_already_exists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        fs::write(&path, b"").unwrap();
        for recursive in [false, true] {
            let error = create_directory(&path, recursive).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::AlreadyExists, "{error}");
        }
    }

    #[test]
    fn create_directory_non_recursive_refuses_existing_and_missing_parent() {
        let dir = tempfile::tempdir().unwrap();
        let error = create_directory(dir.path(), false).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::AlreadyExists);
        assert_eq!(error.operation(), FsOperation::CreateDirectory);
        let error = create_directory(&dir.path().join("a").join("b"), false).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
    }

    #[test]
    fn create_directory_under_a_file_is_not_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"").unwrap();
        let error = create_directory(&dir.path().join("file").join("sub"), true).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotADirectory, "{error}");
    }

    #[test]
    fn create_directory_accepts_non_utf8_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(non_utf8_name()).join(non_utf8_name());
        create_directory(&path, true).unwrap();
        assert!(path.is_dir());
    }

    #[test]
    fn read_directory_lists_sorted_entries_with_kinds() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("b-file"), b"").unwrap();
        fs::create_dir(dir.path().join("a-dir")).unwrap();
        symlink("a-dir", dir.path().join("c-link-dir")).unwrap();
        symlink("b-file", dir.path().join("d-link-file")).unwrap();
        symlink("missing", dir.path().join("e-dangling")).unwrap();
        make_fifo(dir.path(), "f-fifo");
        assert_eq!(
            read_directory(dir.path()).unwrap(),
            vec![
                entry("a-dir", true, false, false),
                entry("b-file", false, true, false),
                entry("c-link-dir", true, false, true),
                entry("d-link-file", false, true, true),
                entry("e-dangling", false, false, true),
                entry("f-fifo", false, false, false),
            ]
        );
    }

    #[test]
    fn read_directory_sorts_by_name_bytes() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b", "B", "a", "ä"] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        let names: Vec<_> = read_directory(dir.path())
            .unwrap()
            .into_iter()
            .map(|e| e.file_name)
            .collect();
        assert_eq!(names, ["B", "a", "b", "ä"].map(OsString::from).to_vec());
    }

    #[test]
    fn read_directory_follows_symlink_to_directory() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        fs::write(dir.path().join("real").join("inside"), b"").unwrap();
        symlink("real", dir.path().join("link")).unwrap();
        assert_eq!(
            read_directory(&dir.path().join("link")).unwrap(),
            vec![entry("inside", false, true, false)]
        );
    }

    #[test]
    fn read_directory_reports_non_utf8_names() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(non_utf8_name()), b"").unwrap();
        let entries = read_directory(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].file_name, non_utf8_name());
    }

    #[test]
    fn read_directory_of_file_is_not_a_directory_and_missing_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let error = read_directory(&file).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotADirectory);
        let error = read_directory(&dir.path().join("missing")).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
        assert_eq!(error.operation(), FsOperation::ReadDirectory);
    }
}
