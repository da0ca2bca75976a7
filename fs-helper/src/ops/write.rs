//! `fs/writeFile`: create or truncate a file, in place or atomically.
//!
//! An atomic write puts the data in a temporary file in the target's own directory (so the
//! rename cannot cross filesystems), `fsync`s it, then renames it over the target. Readers see
//! either the old or the new content, never a half-written file; on any failure the temporary
//! file is removed and the target is untouched.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{FsError, FsOperation};
use crate::open::{FinalSymlink, file_type_name, open_regular_for_write};

/// Most symlinks followed when resolving an atomic write's target, like the kernel's own limit
/// (`MAXSYMLINKS` is 40 on Linux); a longer chain fails with `ELOOP`.
const MAX_SYMLINK_HOPS: usize = 40;

/// Attempts at finding an unused temporary file name before giving up; names include the pid, a
/// counter and the clock, so a collision means something else is creating the same names.
const TEMP_NAME_ATTEMPTS: usize = 16;

/// Prefix of the temporary files an atomic write creates next to its target.
pub const ATOMIC_TEMP_PREFIX: &str = ".execward-write-";

/// Mode of a newly created file before the umask, as for `open(2)` in a shell redirection.
const NEW_FILE_MODE: u32 = 0o666;

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
/// Symlinks are followed in both modes: the file the link points to is written (an atomic write
/// renames over the link's final target, so the link stays a link). An existing file keeps its
/// permission bits (an atomic write copies them onto the new file; owner and group are not
/// copied). Non-regular targets (directories, FIFOs, sockets, devices) are refused without
/// blocking and without replacing them.
///
/// # Errors
/// - [`FsError::NotRegularFile`] if the path exists and is not a regular file.
/// - [`FsError::Io`] if the parent is missing, access is denied, or writing fails.
pub fn write_file(path: &Path, data: &[u8], opts: &WriteOptions) -> Result<(), FsError> {
    let op = FsOperation::WriteFile;
    if !opts.atomic {
        let mut file = open_regular_for_write(op, path, NEW_FILE_MODE, FinalSymlink::Follow)?;
        return file.write_all(data).map_err(|e| FsError::io(op, path, e));
    }
    let target = resolve_final_symlinks(path).map_err(|e| FsError::io(op, path, e))?;
    let mode = match fs::symlink_metadata(&target) {
        Ok(metadata) if metadata.file_type().is_file() => Some(metadata.permissions().mode()),
        Ok(metadata) => {
            return Err(FsError::NotRegularFile {
                op,
                path: path.to_path_buf(),
                file_type: file_type_name(&metadata.file_type()),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(FsError::io(op, path, error)),
    };
    atomic_replace(path, &target, data, mode)
}

/// Follows symlinks in the last component of `path` until it names a non-link or nothing.
/// A dangling link resolves to the path it points to (the write creates that file, as a
/// non-atomic `open(O_CREAT)` through the link would).
fn resolve_final_symlinks(path: &Path) -> io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_SYMLINK_HOPS {
        match fs::symlink_metadata(&current) {
            Ok(metadata) if metadata.file_type().is_symlink() => {
                let target = fs::read_link(&current)?;
                current = match current.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
                };
            }
            Ok(_) => return Ok(current),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(current),
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// Writes `data` to a new temporary file beside `target`, syncs it and renames it over
/// `target`. `mode` is the permission bits to give the new file (`None`: the default mode for a
/// new file). The temporary file is removed on every failure. Errors name `path`, the path the
/// caller asked for.
fn atomic_replace(
    path: &Path,
    target: &Path,
    data: &[u8],
    mode: Option<u32>,
) -> Result<(), FsError> {
    let op = FsOperation::WriteFile;
    let directory = match target.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let (temp_path, mut temp_file) =
        create_temp_file(directory).map_err(|e| FsError::io(op, path, e))?;
    let written = (|| {
        if let Some(mode) = mode {
            temp_file.set_permissions(fs::Permissions::from_mode(mode & 0o777))?;
        }
        temp_file.write_all(data)?;
        temp_file.sync_all()?;
        fs::rename(&temp_path, target)
    })();
    if let Err(error) = written {
        // Best effort: the write already failed, and that error is the one to report.
        let _ = fs::remove_file(&temp_path);
        return Err(FsError::io(op, path, error));
    }
    // Make the rename itself durable. The target is already replaced at this point, so a failure
    // here (some filesystems refuse fsync on directories) is not reported as a failed write.
    if let Ok(dir) = File::open(directory) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Creates a new, empty temporary file in `directory` with `O_EXCL | O_NOFOLLOW`, so it can
/// never be a file (or link) that already existed.
fn create_temp_file(directory: &Path) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last_error = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..TEMP_NAME_ATTEMPTS {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut name = OsString::from(ATOMIC_TEMP_PREFIX);
        name.push(format!(
            "{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let temp_path = directory.join(name);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(NEW_FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temp_path)
        {
            Ok(file) => return Ok((temp_path, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = error,
            Err(error) => return Err(error),
        }
    }
    Err(last_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{entry_names, make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;
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
        let error = atomic_replace(&target, &target, b"new", None).unwrap_err();
        assert_eq!(error.operation(), FsOperation::WriteFile);
        assert_eq!(entry_names(dir.path()), vec![OsString::from("target")]);
        assert_eq!(fs::read(target.join("keep")).unwrap(), b"old");
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
    fn write_file_writes_through_symlink_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        let link = dir.path().join("link");
        symlink("target", &link).unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let data = format!("atomic={}", opts.atomic);
            write_file(&link, data.as_bytes(), &opts).unwrap();
            assert!(
                fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            assert_eq!(fs::read(&target).unwrap(), data.as_bytes());
        }
        assert_eq!(
            entry_names(dir.path()),
            vec![OsString::from("link"), OsString::from("target")]
        );
    }

    #[test]
    fn write_file_through_dangling_symlink_creates_its_target() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [IN_PLACE, ATOMIC] {
            let name = format!("target-{}", opts.atomic);
            let link = dir.path().join(format!("link-{}", opts.atomic));
            symlink(&name, &link).unwrap();
            write_file(&link, b"created", &opts).unwrap();
            assert_eq!(fs::read(dir.path().join(&name)).unwrap(), b"created");
            assert!(
                fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
        }
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
