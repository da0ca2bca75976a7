//! `fs/writeFile`: create or truncate a file, in place or atomically.
//!
//! The parent directory is resolved once (following symlinks as named) into a descriptor; the
//! last component is never followed: a symlink there is refused, in both modes, so a link
//! planted or swapped in by someone else cannot redirect the write.
//!
//! An atomic write puts the data in a temporary file in the target's own directory (so the
//! rename cannot cross filesystems), `fsync`s it, then renames it over the target
//! ([`crate::temp`]). Readers see either the old or the new content, never a half-written file;
//! on any failure the target is untouched and no temporary file remains, even when the writer
//! is killed.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::Path;

use nix::sys::stat::SFlag;

use crate::dirfd::{Named, kind, kind_name, stat_nofollow};
use crate::error::{Expected, FsError, FsOperation};
use crate::open::open_regular_for_write_below;
use crate::temp::{self, NEW_FILE_MODE};

const OP: FsOperation = FsOperation::WriteFile;

/// Options of [`write_file`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Write a temporary file in the same directory, `fsync` it and rename it over the target,
    /// so no half-written target is ever visible. When false the target is truncated and
    /// written in place.
    pub atomic: bool,
}

/// Creates or truncates the regular file at `path` and writes `data` to it. Parent directories
/// are not created.
///
/// Symlinks in the parent path are followed, once, when the call starts; a symlink as the last
/// component is refused (never written through), in both modes. An existing file keeps its
/// permission bits (an atomic write copies them onto the new file; owner and group are not
/// copied). Non-regular targets (directories, FIFOs, sockets, devices) are refused without
/// blocking and without replacing them.
///
/// # Errors
/// - [`FsError::SymlinkNotFollowed`] if the last component is a symlink.
/// - [`FsError::NotRegularFile`] if the path exists and is not a regular file.
/// - [`FsError::InvalidPath`] if the path names no entry (`/`, or ends in `..`).
/// - [`FsError::Io`] if the parent is missing, access is denied, or writing fails.
pub fn write_file(path: &Path, data: &[u8], opts: &WriteOptions) -> Result<(), FsError> {
    let target = Named::resolve(OP, path)?;
    if !opts.atomic {
        let mut file =
            open_regular_for_write_below(OP, path, &target.dir, &target.name, NEW_FILE_MODE)?;
        return file
            .set_len(0)
            .and_then(|()| file.write_all(data))
            .map_err(|e| FsError::io(OP, path, e));
    }
    let mode = match stat_nofollow(&target.dir, &target.name) {
        Ok(stat) if kind(&stat) == SFlag::S_IFREG => Some(stat.st_mode & 0o777),
        Ok(stat) if kind(&stat) == SFlag::S_IFLNK => {
            return Err(FsError::SymlinkNotFollowed {
                op: OP,
                path: path.to_path_buf(),
                expected: Expected::RegularFile,
            });
        }
        Ok(stat) => {
            return Err(FsError::NotRegularFile {
                op: OP,
                path: path.to_path_buf(),
                file_type: kind_name(&stat),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(FsError::io(OP, path, error)),
    };
    // If the name is swapped for a symlink or a directory after the check, the rename replaces
    // the link itself (nothing is written through it) or fails on the directory.
    temp::replace(target.dir.as_fd(), &target.name, data, mode)
        .map_err(|e| FsError::io(OP, path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{entry_names, make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::ffi::OsString;
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::time::{Duration, Instant};

    const ATOMIC: WriteOptions = WriteOptions { atomic: true };
    const IN_PLACE: WriteOptions = WriteOptions { atomic: false };

    #[test]
    fn write_file_creates_and_truncates_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let path = dir.path().join(format!("file-{}", opts.atomic));
            write_file(&path, b"a longer first content", &opts).unwrap();
            write_file(&path, b"short", &opts).unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"short");
        }
    }

    #[test]
    fn write_file_does_not_create_parents() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let path = dir.path().join("missing").join("file");
            let error = write_file(&path, b"x", &opts).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::NotFound, "{error}");
            assert_eq!(error.path(), Some(path.as_path()));
        }
        assert_eq!(entry_names(dir.path()), Vec::<OsString>::new());
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target");
        write_file(&path, b"one", &ATOMIC).unwrap();
        write_file(&path, b"two", &ATOMIC).unwrap();
        assert_eq!(entry_names(dir.path()), vec![OsString::from("target")]);
    }

    #[test]
    fn atomic_write_whose_rename_fails_removes_temp_file_and_keeps_target() {
        // Renaming a file over a non-empty directory fails, which exercises the cleanup path
        // even when running as root (where permission-based failures cannot be provoked).
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("keep"), b"old").unwrap();
        let parent = crate::dirfd::open_path_dir(dir.path()).unwrap();
        for strategy in [temp::Strategy::Anonymous, temp::Strategy::Named] {
            let error = temp::replace_with(
                parent.as_fd(),
                std::ffi::OsStr::new("target"),
                b"new",
                Some(0o644),
                strategy,
                &mut || {},
            )
            .unwrap_err();
            assert!(
                matches!(
                    error.raw_os_error(),
                    Some(libc::EISDIR | libc::ENOTEMPTY | libc::EEXIST)
                ),
                "{strategy:?}: {error}"
            );
            assert_eq!(entry_names(dir.path()), vec![OsString::from("target")]);
            assert_eq!(fs::read(target.join("keep")).unwrap(), b"old");
        }
    }

    #[test]
    fn atomic_write_keeps_permission_bits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o750)).unwrap();
        write_file(&path, b"new", &ATOMIC).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
    }

    #[test]
    fn write_file_refuses_a_symlink_as_last_component_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"keep").unwrap();
        symlink("target", dir.path().join("link")).unwrap();
        symlink("missing", dir.path().join("dangling")).unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            for name in ["link", "dangling"] {
                let link = dir.path().join(name);
                let error = write_file(&link, b"new", &opts).unwrap_err();
                assert!(
                    matches!(&error, FsError::SymlinkNotFollowed { path, .. } if path == &link),
                    "{error:?}"
                );
                assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
                assert!(error.to_string().contains("fs/canonicalize"), "{error}");
                assert!(
                    fs::symlink_metadata(&link)
                        .unwrap()
                        .file_type()
                        .is_symlink()
                );
            }
        }
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        assert_eq!(
            entry_names(dir.path()),
            ["dangling", "link", "target"].map(OsString::from).to_vec()
        );
    }

    #[test]
    fn write_file_follows_symlinks_in_the_parent_path() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        symlink("real", dir.path().join("alias")).unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let name = format!("file-{}", opts.atomic);
            write_file(&dir.path().join("alias").join(&name), b"via", &opts).unwrap();
            assert_eq!(
                fs::read(dir.path().join("real").join(&name)).unwrap(),
                b"via"
            );
        }
    }

    #[test]
    fn write_file_trailing_slash_names_the_link_itself() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("real")).unwrap();
        symlink("real", dir.path().join("link")).unwrap();
        let mut path = dir.path().join("link").into_os_string();
        path.push("/");
        let error = write_file(Path::new(&path), b"x", &ATOMIC).unwrap_err();
        assert!(
            matches!(error, FsError::SymlinkNotFollowed { .. }),
            "{error:?}"
        );
    }

    #[test]
    fn write_file_refuses_fifo_without_blocking_or_replacing_it() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pipe");
        for opts in [IN_PLACE, ATOMIC] {
            let started = Instant::now();
            let error = write_file(&fifo, b"x", &opts).unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(5));
            assert_eq!(error.kind(), FsErrorKind::NotRegularFile, "{error}");
            assert!(is_fifo(&fifo));
        }
        assert_eq!(entry_names(dir.path()), vec![OsString::from("pipe")]);
    }

    #[test]
    fn write_file_refuses_directory() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let error = write_file(dir.path(), b"x", &opts).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::NotRegularFile, "{error}");
        }
    }

    #[test]
    fn write_file_accepts_non_utf8_name() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let path = dir.path().join(non_utf8_name());
            write_file(&path, b"bytes", &opts).unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"bytes");
        }
        assert_eq!(entry_names(dir.path()), vec![non_utf8_name()]);
    }

    fn is_fifo(path: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        fs::symlink_metadata(path).unwrap().file_type().is_fifo()
    }
}
