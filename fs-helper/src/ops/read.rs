//! `fs/readFile`, `fs/open` and `fs/readBlock`: reading regular files, whole or in blocks.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{FsError, FsOperation};
use crate::open::open_regular_for_read;

/// Default size limit of [`read_file`] and largest block [`read_block`] returns: protocol limits
/// the client sizes its requests by, so they live in `proto`.
pub use proto::limits::{READ_BLOCK_MAX_BYTES, READ_FILE_MAX_BYTES};

/// Reads a whole regular file, following symlinks.
///
/// The file is opened with `O_NONBLOCK | O_CLOEXEC` and checked with `fstat`, so a FIFO never
/// blocks the call. At most `max_bytes + 1` bytes are read, so a file that grows while it is
/// read is caught too.
///
/// # Errors
/// - [`FsError::NotRegularFile`] if the path is a directory, FIFO, socket or device.
/// - [`FsError::TooLarge`] if the file holds more than `max_bytes` bytes.
/// - [`FsError::Io`] if the path cannot be resolved, opened or read.
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, FsError> {
    match read_file_unless_above(path, max_bytes, u64::MAX)? {
        ReadOrSize::Read(data) => Ok(data),
        ReadOrSize::Above(size) => unreachable!("no file holds more than u64::MAX bytes ({size})"),
    }
}

/// What [`read_file_unless_above`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOrSize {
    /// The file's contents.
    Read(Vec<u8>),
    /// The file's size (at most the read's `max_bytes`), which is above the threshold: it was
    /// opened and examined, not read.
    Above(u64),
}

/// [`read_file`], except that a file of more than `threshold` bytes (and at most `max_bytes`)
/// is opened and examined with all of `read_file`'s checks but not read: its size is returned
/// instead. Who backs the contents with memory learns a size only for a file it could read.
///
/// # Errors
/// As [`read_file`].
pub fn read_file_unless_above(
    path: &Path,
    max_bytes: u64,
    threshold: u64,
) -> Result<ReadOrSize, FsError> {
    let op = FsOperation::ReadFile;
    let file = open_regular_for_read(op, path)?;
    let size = file.metadata().map_err(|e| FsError::io(op, path, e))?.len();
    let too_large = |size| FsError::TooLarge {
        op,
        path: path.to_path_buf(),
        size,
        limit: max_bytes,
    };
    if size > max_bytes {
        return Err(too_large(size));
    }
    if size > threshold {
        return Ok(ReadOrSize::Above(size));
    }
    let capacity = usize::try_from(size).unwrap_or(0);
    let mut data = Vec::with_capacity(capacity);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| FsError::io(op, path, e))?;
    let read = data.len() as u64;
    if read > max_bytes {
        return Err(too_large(read));
    }
    Ok(ReadOrSize::Read(data))
}

/// Opens a regular file for [`read_block`], following symlinks, with the same non-blocking
/// open and `fstat` check as [`read_file`]. The returned file is in blocking mode.
///
/// # Errors
/// - [`FsError::NotRegularFile`] if the path is a directory, FIFO, socket or device.
/// - [`FsError::Io`] if the path cannot be resolved or opened.
pub fn open_for_streaming(path: &Path) -> Result<File, FsError> {
    open_regular_for_read(FsOperation::Open, path)
}

/// Reads up to `len` bytes at `offset` without moving any file position (`pread`), so one handle
/// can serve concurrent block reads.
///
/// Returns the bytes and whether the end of the file was reached: `eof` is true when
/// `offset + returned` is at or past the file's size. Fewer than `len` bytes are returned only
/// at the end of the file.
///
/// # Errors
/// - [`FsError::BlockTooLarge`] if `len` is over [`READ_BLOCK_MAX_BYTES`].
/// - [`FsError::BlockOutOfRange`] if `offset + len` is past the largest file offset.
/// - [`FsError::BlockIo`] if the read or the `fstat` fails.
pub fn read_block(file: &File, offset: u64, len: usize) -> Result<(Vec<u8>, bool), FsError> {
    if len > READ_BLOCK_MAX_BYTES {
        return Err(FsError::BlockTooLarge {
            len,
            limit: READ_BLOCK_MAX_BYTES,
        });
    }
    let out_of_range = FsError::BlockOutOfRange { offset, len };
    let end = offset
        .checked_add(len as u64)
        .filter(|end| i64::try_from(*end).is_ok());
    if end.is_none() {
        return Err(out_of_range);
    }
    let mut buffer = vec![0; len];
    let mut filled = 0;
    let mut hit_end = false;
    while filled < len {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => {
                hit_end = true;
                break;
            }
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => return Err(FsError::BlockIo { offset, source }),
        }
    }
    buffer.truncate(filled);
    let eof = hit_end || {
        let size = file
            .metadata()
            .map_err(|source| FsError::BlockIo { offset, source })?
            .len();
        offset + filled as u64 >= size
    };
    Ok((buffer, eof))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;
    use std::time::{Duration, Instant};

    /// Generous bound for "returns promptly": a blocking open would hang forever.
    const PROMPT: Duration = Duration::from_secs(5);

    #[test]
    fn read_file_returns_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, b"hello").unwrap();
        assert_eq!(read_file(&path, READ_FILE_MAX_BYTES).unwrap(), b"hello");
    }

    #[test]
    fn a_file_above_the_threshold_is_examined_with_every_check_but_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, b"hello").unwrap();
        let read = |max, threshold| read_file_unless_above(&path, max, threshold);
        assert_eq!(read(100, 5).unwrap(), ReadOrSize::Read(b"hello".to_vec()));
        assert_eq!(read(100, 4).unwrap(), ReadOrSize::Above(5));
        // Too large for the read is its error, whatever the threshold.
        assert_eq!(read(4, 0).unwrap_err().kind(), FsErrorKind::TooLarge);
        let missing = read_file_unless_above(&dir.path().join("none"), 100, 0);
        assert_eq!(missing.unwrap_err().kind(), FsErrorKind::NotFound);
        let error = read_file_unless_above(dir.path(), 100, 0).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
    }

    #[test]
    fn read_file_on_fifo_is_not_regular_file_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pipe");
        let started = Instant::now();
        let error = read_file(&fifo, READ_FILE_MAX_BYTES).unwrap_err();
        assert!(started.elapsed() < PROMPT);
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
        assert_eq!(error.path(), Some(fifo.as_path()));
        assert!(error.to_string().contains("FIFO"), "{error}");
    }

    #[test]
    fn read_file_through_symlink_to_fifo_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pipe");
        let link = dir.path().join("link");
        symlink(&fifo, &link).unwrap();
        let started = Instant::now();
        let error = read_file(&link, READ_FILE_MAX_BYTES).unwrap_err();
        assert!(started.elapsed() < PROMPT);
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
    }

    #[test]
    fn read_file_on_directory_socket_and_device_is_not_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let _listener = UnixListener::bind(&socket).unwrap();
        for path in [dir.path(), socket.as_path(), Path::new("/dev/null")] {
            let error = read_file(path, READ_FILE_MAX_BYTES).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::NotRegularFile, "{error}");
        }
    }

    #[test]
    fn read_file_follows_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"through the link").unwrap();
        let link = dir.path().join("link");
        symlink(&target, &link).unwrap();
        assert_eq!(
            read_file(&link, READ_FILE_MAX_BYTES).unwrap(),
            b"through the link"
        );
    }

    #[test]
    fn read_file_on_dangling_symlink_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        symlink(dir.path().join("missing"), &link).unwrap();
        let error = read_file(&link, READ_FILE_MAX_BYTES).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
    }

    #[test]
    fn read_file_over_limit_is_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, [7u8; 11]).unwrap();
        let error = read_file(&path, 10).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::TooLarge);
        assert!(
            matches!(
                error,
                FsError::TooLarge {
                    size: 11,
                    limit: 10,
                    ..
                }
            ),
            "{error:?}"
        );
        assert_eq!(read_file(&path, 11).unwrap().len(), 11);
    }

    #[test]
    fn read_file_missing_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let error = read_file(&dir.path().join("missing"), READ_FILE_MAX_BYTES).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
        assert_eq!(error.operation(), FsOperation::ReadFile);
    }

    #[test]
    fn read_file_accepts_non_utf8_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(non_utf8_name());
        std::fs::write(&path, b"bytes").unwrap();
        assert_eq!(read_file(&path, READ_FILE_MAX_BYTES).unwrap(), b"bytes");
    }

    #[test]
    fn open_for_streaming_refuses_fifo_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = make_fifo(dir.path(), "pipe");
        let started = Instant::now();
        let error = open_for_streaming(&fifo).unwrap_err();
        assert!(started.elapsed() < PROMPT);
        assert_eq!(error.kind(), FsErrorKind::NotRegularFile);
        assert_eq!(error.operation(), FsOperation::Open);
    }

    #[test]
    fn read_block_reads_blocks_and_reports_eof() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"0123456789").unwrap();
        let file = open_for_streaming(&path).unwrap();
        assert_eq!(read_block(&file, 0, 4).unwrap(), (b"0123".to_vec(), false));
        assert_eq!(read_block(&file, 4, 4).unwrap(), (b"4567".to_vec(), false));
        assert_eq!(read_block(&file, 8, 4).unwrap(), (b"89".to_vec(), true));
        assert_eq!(read_block(&file, 20, 4).unwrap(), (Vec::new(), true));
    }

    #[test]
    fn read_block_ending_exactly_at_end_of_file_reports_eof() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"01234567").unwrap();
        let file = open_for_streaming(&path).unwrap();
        assert_eq!(read_block(&file, 4, 4).unwrap(), (b"4567".to_vec(), true));
        assert_eq!(read_block(&file, 0, 0).unwrap(), (Vec::new(), false));
    }

    #[test]
    fn read_block_over_limit_is_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"x").unwrap();
        let file = open_for_streaming(&path).unwrap();
        let error = read_block(&file, 0, READ_BLOCK_MAX_BYTES + 1).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::InvalidInput);
        assert_eq!(error.operation(), FsOperation::ReadBlock);
        assert!(read_block(&file, 0, READ_BLOCK_MAX_BYTES).is_ok());
    }

    #[test]
    fn read_block_past_largest_offset_is_invalid_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, b"x").unwrap();
        let file = open_for_streaming(&path).unwrap();
        let error = read_block(&file, u64::MAX - 1, 4).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::InvalidInput);
    }
}
