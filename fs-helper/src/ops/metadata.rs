//! `fs/getMetadata` and `fs/canonicalize`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{FsError, FsOperation};

/// What [`get_metadata`] reports about a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The path is a directory, or a symlink that resolves to one.
    pub is_directory: bool,
    /// The path is a regular file, or a symlink that resolves to one.
    pub is_file: bool,
    /// The path itself is a symlink (resolving or dangling).
    pub is_symlink: bool,
    /// Size in bytes (of the target for a resolving symlink, of the link itself otherwise).
    pub size: u64,
    /// Creation (birth) time in milliseconds since the Unix epoch, when the filesystem records it.
    pub created_at_ms: Option<i64>,
    /// Modification time in milliseconds since the Unix epoch.
    pub modified_at_ms: Option<i64>,
}

/// Describes `path` without requiring it to resolve.
///
/// A symlink is examined with `lstat` first: `is_symlink` is true, and the directory/file kind,
/// size and times are the target's when the link resolves. A dangling link (or a loop) reports
/// `is_directory` and `is_file` false with the link's own size and times.
///
/// # Errors
/// [`FsError::Io`] if the path does not exist (`NotFound`), is denied, or the link's target
/// cannot be examined for another reason than not existing.
pub fn get_metadata(path: &Path) -> Result<Metadata, FsError> {
    let op = FsOperation::GetMetadata;
    let own = fs::symlink_metadata(path).map_err(|e| FsError::io(op, path, e))?;
    if !own.file_type().is_symlink() {
        return Ok(describe(&own, false));
    }
    match fs::metadata(path) {
        Ok(target) => Ok(describe(&target, true)),
        Err(error) if does_not_resolve(&error) => {
            let mut metadata = describe(&own, true);
            metadata.is_directory = false;
            metadata.is_file = false;
            Ok(metadata)
        }
        Err(error) => Err(FsError::io(op, path, error)),
    }
}

/// A link that points at nothing: missing target, a loop, or a file used as a directory.
fn does_not_resolve(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
    )
}

fn describe(metadata: &fs::Metadata, is_symlink: bool) -> Metadata {
    Metadata {
        is_directory: metadata.is_dir(),
        is_file: metadata.is_file(),
        is_symlink,
        size: metadata.len(),
        created_at_ms: metadata.created().ok().map(epoch_millis),
        modified_at_ms: metadata.modified().ok().map(epoch_millis),
    }
}

/// Milliseconds since the Unix epoch, negative before it, saturating at the `i64` range.
fn epoch_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis())
            .map(|ms| -ms)
            .unwrap_or(i64::MIN),
    }
}

/// Resolves `path` to an absolute path with no `.`, `..` or symlink components. The path must
/// exist.
///
/// # Errors
/// [`FsError::Io`] if a component is missing (`NotFound`), not a directory, denied, or part of a
/// symlink loop.
pub fn canonicalize(path: &Path) -> Result<PathBuf, FsError> {
    fs::canonicalize(path).map_err(|e| FsError::io(FsOperation::Canonicalize, path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::non_utf8_name;
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    #[test]
    fn get_metadata_describes_file_and_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"12345").unwrap();
        let metadata = get_metadata(&file).unwrap();
        assert!(metadata.is_file && !metadata.is_directory && !metadata.is_symlink);
        assert_eq!(metadata.size, 5);
        let modified = metadata.modified_at_ms.unwrap();
        let now = epoch_millis(SystemTime::now());
        assert!((now - modified).abs() < 60_000, "{modified} vs {now}");

        let metadata = get_metadata(dir.path()).unwrap();
        assert!(metadata.is_directory && !metadata.is_file && !metadata.is_symlink);
    }

    #[test]
    fn get_metadata_of_symlink_reports_target_kind_and_size() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("file"), b"12345").unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        symlink("file", dir.path().join("to-file")).unwrap();
        symlink("sub", dir.path().join("to-dir")).unwrap();

        let metadata = get_metadata(&dir.path().join("to-file")).unwrap();
        assert!(metadata.is_symlink && metadata.is_file && !metadata.is_directory);
        assert_eq!(metadata.size, 5);

        let metadata = get_metadata(&dir.path().join("to-dir")).unwrap();
        assert!(metadata.is_symlink && metadata.is_directory && !metadata.is_file);
    }

    #[test]
    fn get_metadata_of_dangling_symlink_reports_the_link_itself() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("dangling");
        symlink("no-such-target", &link).unwrap();
        let metadata = get_metadata(&link).unwrap();
        assert!(metadata.is_symlink);
        assert!(!metadata.is_file && !metadata.is_directory);
        assert_eq!(metadata.size, "no-such-target".len() as u64);
        assert!(metadata.modified_at_ms.is_some());
    }

    #[test]
    fn get_metadata_of_symlink_loop_reports_the_link_itself() {
        let dir = tempfile::tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let metadata = get_metadata(&dir.path().join("a")).unwrap();
        assert!(metadata.is_symlink && !metadata.is_file && !metadata.is_directory);
    }

    #[test]
    fn get_metadata_missing_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let error = get_metadata(&dir.path().join("missing")).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
        assert_eq!(error.operation(), FsOperation::GetMetadata);
    }

    #[test]
    fn get_metadata_accepts_non_utf8_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(non_utf8_name());
        fs::write(&path, b"abc").unwrap();
        assert_eq!(get_metadata(&path).unwrap().size, 3);
    }

    #[test]
    fn epoch_millis_handles_times_before_the_epoch() {
        assert_eq!(epoch_millis(UNIX_EPOCH + Duration::from_millis(1500)), 1500);
        assert_eq!(
            epoch_millis(UNIX_EPOCH - Duration::from_millis(1500)),
            -1500
        );
    }

    #[test]
    fn canonicalize_resolves_symlinks_and_dot_dot() {
        let dir = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir(real.join("sub")).unwrap();
        symlink("sub", real.join("link")).unwrap();
        let messy = real.join("link").join("..").join("link").join(".");
        assert_eq!(canonicalize(&messy).unwrap(), real.join("sub"));
    }

    #[test]
    fn canonicalize_missing_or_dangling_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        symlink("missing", dir.path().join("dangling")).unwrap();
        for path in [dir.path().join("missing"), dir.path().join("dangling")] {
            let error = canonicalize(&path).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::NotFound);
            assert_eq!(error.operation(), FsOperation::Canonicalize);
        }
    }

    #[test]
    fn canonicalize_keeps_non_utf8_names() {
        let dir = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(dir.path()).unwrap();
        let path = real.join(non_utf8_name());
        fs::write(&path, b"").unwrap();
        assert_eq!(canonicalize(&path).unwrap(), path);
    }
}
