//! Opening files without blocking and without being fooled about what they are.
//!
//! Opening a FIFO for reading blocks until a writer appears, and opening one for writing blocks
//! until a reader appears. Every open here therefore:
//! 1. checks the path's type first (so a FIFO, socket or device is normally never opened at all),
//! 2. opens with `O_NONBLOCK | O_NOCTTY` (`O_CLOEXEC` is always set by std), so a path swapped for
//!    a FIFO between the check and the open still cannot block, and a terminal never becomes the
//!    controlling terminal,
//! 3. checks the type again with `fstat` on the opened descriptor (the answer that counts), and
//! 4. clears `O_NONBLOCK` again, so the returned [`File`] behaves normally.

use std::fs::{self, File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::error::{FsError, FsOperation};

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

/// How [`open_regular_for_write`] treats a symlink in the last path component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FinalSymlink {
    /// Write through the link to its target (like a shell redirection).
    Follow,
    /// Fail with `ELOOP` (the caller replaces links itself).
    Refuse,
}

/// Opens `path` for writing, creating it with `mode` (before umask) or truncating it, without
/// ever blocking. The path must be a regular file or not exist.
///
/// Errors: [`FsError::NotRegularFile`] for directories, FIFOs, sockets and devices;
/// [`FsError::Io`] otherwise (a missing parent is `ENOENT`).
pub(crate) fn open_regular_for_write(
    op: FsOperation,
    path: &Path,
    mode: u32,
    final_symlink: FinalSymlink,
) -> Result<File, FsError> {
    let existing = match final_symlink {
        FinalSymlink::Follow => fs::metadata(path),
        FinalSymlink::Refuse => fs::symlink_metadata(path),
    };
    match existing {
        Ok(metadata) if metadata.file_type().is_file() || metadata.file_type().is_symlink() => {}
        Ok(metadata) => return Err(not_regular(op, path, &metadata.file_type())),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(FsError::io(op, path, error)),
    }
    let mut flags = nonblocking_flags();
    if final_symlink == FinalSymlink::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| open_error(op, path, e))?;
    finish_open(op, path, file)
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
    fn write_open_refusing_symlinks_fails_on_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let error = open_regular_for_write(FsOperation::Copy, &link, 0o644, FinalSymlink::Refuse)
            .unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::Other, "{error}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}
