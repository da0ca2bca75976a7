//! Opening files without blocking and without being fooled about what they are.
//!
//! Reads by path ([`open_regular_for_read`]) follow symlinks, as `fs/readFile` and `fs/open`
//! promise. Opens below a directory descriptor (`*_below`) never follow one.
//!
//! Opening a FIFO for reading blocks until a writer appears, and opening one for writing blocks
//! until a reader appears. Every open here therefore:
//! 1. checks the path's type first (so a FIFO, socket or device is normally never opened at all),
//! 2. opens with `O_NONBLOCK | O_NOCTTY` (`O_CLOEXEC` is always set by std), so a path swapped for
//!    a FIFO between the check and the open still cannot block, and a terminal never becomes the
//!    controlling terminal,
//! 3. checks the type again with `fstat` on the opened descriptor (the answer that counts), and
//! 4. clears `O_NONBLOCK` again, so the returned [`File`] behaves normally.

use std::ffi::OsStr;
use std::fs::{self, File, FileType, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::stat::{Mode, SFlag};

use crate::dirfd::{kind, kind_name, open_below, stat_nofollow};
use crate::error::{Expected, FsError, FsOperation};

/// A human name for a file type, for error messages.
pub(crate) fn file_type_name(file_type: &FileType) -> &'static str {
    if file_type.is_file() {
        "regular file"
    } else if file_type.is_dir() {
        "directory"
    } else if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_fifo() {
        "FIFO"
    } else if file_type.is_socket() {
        "socket"
    } else if file_type.is_char_device() {
        "character device"
    } else if file_type.is_block_device() {
        "block device"
    } else {
        "file of unknown type"
    }
}

fn not_regular(op: FsOperation, path: &Path, file_type: &FileType) -> FsError {
    FsError::NotRegularFile {
        op,
        path: path.to_path_buf(),
        file_type: file_type_name(file_type),
    }
}

/// Maps an open error. `ENXIO` is what opening a socket, or a FIFO for writing with no reader,
/// returns: report it as "not a regular file" rather than a confusing "no such device".
fn open_error(op: FsOperation, path: &Path, error: io::Error) -> FsError {
    if error.raw_os_error() == Some(libc::ENXIO) {
        FsError::NotRegularFile {
            op,
            path: path.to_path_buf(),
            file_type: "special file",
        }
    } else {
        FsError::io(op, path, error)
    }
}

fn nonblocking_flags() -> i32 {
    libc::O_NONBLOCK | libc::O_NOCTTY
}

/// Checks the opened descriptor is a regular file and puts it back in blocking mode.
fn finish_open(op: FsOperation, path: &Path, file: File) -> Result<File, FsError> {
    let metadata = file.metadata().map_err(|e| FsError::io(op, path, e))?;
    if !metadata.file_type().is_file() {
        return Err(not_regular(op, path, &metadata.file_type()));
    }
    let flags = fcntl(&file, FcntlArg::F_GETFL).map_err(|e| FsError::io(op, path, e.into()))?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(&file, FcntlArg::F_SETFL(flags)).map_err(|e| FsError::io(op, path, e.into()))?;
    Ok(file)
}

/// Opens an existing regular file for reading, following symlinks, without ever blocking.
///
/// Errors: [`FsError::NotRegularFile`] for directories, FIFOs, sockets and devices;
/// [`FsError::Io`] when the path cannot be stat'ed or opened.
pub(crate) fn open_regular_for_read(op: FsOperation, path: &Path) -> Result<File, FsError> {
    let metadata = fs::metadata(path).map_err(|e| FsError::io(op, path, e))?;
    if !metadata.file_type().is_file() {
        return Err(not_regular(op, path, &metadata.file_type()));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nonblocking_flags())
        .open(path)
        .map_err(|e| open_error(op, path, e))?;
    finish_open(op, path, file)
}

/// Opens the regular file `name` in `dir` for reading without following a symlink and without
/// ever blocking. `path` is the entry's path, for errors only.
///
/// Errors: [`FsError::NotRegularFile`] if the entry is (or was swapped for) anything but a
/// regular file, a symlink included; [`FsError::Io`] when it cannot be opened.
pub(crate) fn open_regular_for_read_below(
    op: FsOperation,
    path: &Path,
    dir: impl AsFd,
    name: &OsStr,
) -> Result<File, FsError> {
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    match open_below(dir, name, flags, Mode::empty()) {
        Ok(fd) => finish_open(op, path, File::from(fd)),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => Err(FsError::NotRegularFile {
            op,
            path: path.to_path_buf(),
            file_type: "symlink",
        }),
        Err(error) => Err(open_error(op, path, error)),
    }
}

/// Opens the regular file `name` in `dir` for writing, creating it with `mode` (before umask),
/// without following a symlink and without ever blocking. An existing file is not truncated
/// (the caller does, once it knows which file it opened). `path` is the entry's path, for
/// errors only.
///
/// Errors: [`FsError::SymlinkNotFollowed`] if `name` is a symlink (the caller decides whether
/// to replace it); [`FsError::NotRegularFile`] for directories, FIFOs, sockets and devices;
/// [`FsError::Io`] otherwise.
pub(crate) fn open_regular_for_write_below(
    op: FsOperation,
    path: &Path,
    dir: impl AsFd,
    name: &OsStr,
    mode: u32,
) -> Result<File, FsError> {
    match stat_nofollow(dir.as_fd(), name) {
        Ok(stat) if kind(&stat) == SFlag::S_IFREG => {}
        Ok(stat) if kind(&stat) == SFlag::S_IFLNK => return Err(symlink_refused(op, path)),
        Ok(stat) => {
            return Err(FsError::NotRegularFile {
                op,
                path: path.to_path_buf(),
                file_type: kind_name(&stat),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(FsError::io(op, path, error)),
    }
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    match open_below(dir, name, flags, Mode::from_bits_truncate(mode)) {
        Ok(fd) => finish_open(op, path, File::from(fd)),
        // Swapped for a symlink after the check above.
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => Err(symlink_refused(op, path)),
        Err(error) if error.raw_os_error() == Some(libc::EISDIR) => Err(FsError::NotRegularFile {
            op,
            path: path.to_path_buf(),
            file_type: "directory",
        }),
        Err(error) => Err(open_error(op, path, error)),
    }
}

fn symlink_refused(op: FsOperation, path: &Path) -> FsError {
    FsError::SymlinkNotFollowed {
        op,
        path: path.to_path_buf(),
        expected: Expected::RegularFile,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::make_fifo;
    use pretty_assertions::assert_eq;

    /// The `fstat` check is what counts when the path changes between the type check and the
    /// open; feed it a FIFO opened behind the pre-check's back.
    #[test]
    fn fstat_check_refuses_fifo_that_slipped_past_the_path_check() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pipe");
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nonblocking_flags())
            .open(&fifo)
            .unwrap();
        let error = finish_open(FsOperation::ReadFile, &fifo, file).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
    }

    #[test]
    fn opened_file_is_back_in_blocking_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, b"x").unwrap();
        let file = open_regular_for_read(FsOperation::Open, &path).unwrap();
        let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL).unwrap());
        assert!(!flags.contains(OFlag::O_NONBLOCK));
    }

    #[test]
    fn write_open_below_refuses_a_link_and_leaves_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let parent = crate::dirfd::open_path_dir(dir.path()).unwrap();
        let error = open_regular_for_write_below(
            FsOperation::Copy,
            &link,
            &parent,
            OsStr::new("link"),
            0o644,
        )
        .unwrap_err();
        assert!(
            matches!(error, FsError::SymlinkNotFollowed { .. }),
            "{error:?}"
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let error =
            open_regular_for_read_below(FsOperation::Copy, &link, &parent, OsStr::new("link"))
                .unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile, "{error}");
    }
}
