//! The one error type of the library, its classification and the operation names.
//!
//! Every variant names the operation that failed and carries its inputs, so a caller can build a
//! message or a wire error (`data.kind`, `operation`, `path`) without parsing text.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A filesystem operation, as named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsOperation {
    /// `fs/readFile`: read a whole regular file.
    ReadFile,
    /// `fs/writeFile`: create or truncate a file and write data to it.
    WriteFile,
    /// `fs/createDirectory`: create a directory, optionally with its parents.
    CreateDirectory,
    /// `fs/getMetadata`: describe a path.
    GetMetadata,
    /// `fs/canonicalize`: resolve a path to its absolute form without symlinks.
    Canonicalize,
    /// `fs/readDirectory`: list a directory.
    ReadDirectory,
    /// `fs/remove`: remove a file, link or directory tree.
    Remove,
    /// `fs/copy`: copy a file, link or directory tree.
    Copy,
    /// `fs/open`: open a regular file for block reads.
    Open,
    /// `fs/readBlock`: read a block from an opened file.
    ReadBlock,
    /// `fs/walk`: list a directory tree.
    Walk,
}

impl FsOperation {
    /// Every operation, in wire-documentation order.
    pub const ALL: [FsOperation; 11] = [
        FsOperation::ReadFile,
        FsOperation::WriteFile,
        FsOperation::CreateDirectory,
        FsOperation::GetMetadata,
        FsOperation::Canonicalize,
        FsOperation::ReadDirectory,
        FsOperation::Remove,
        FsOperation::Copy,
        FsOperation::Open,
        FsOperation::ReadBlock,
        FsOperation::Walk,
    ];

    /// The JSON-RPC method name, for example `"fs/readFile"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FsOperation::ReadFile => "fs/readFile",
            FsOperation::WriteFile => "fs/writeFile",
            FsOperation::CreateDirectory => "fs/createDirectory",
            FsOperation::GetMetadata => "fs/getMetadata",
            FsOperation::Canonicalize => "fs/canonicalize",
            FsOperation::ReadDirectory => "fs/readDirectory",
            FsOperation::Remove => "fs/remove",
            FsOperation::Copy => "fs/copy",
            FsOperation::Open => "fs/open",
            FsOperation::ReadBlock => "fs/readBlock",
            FsOperation::Walk => "fs/walk",
        }
    }

    /// A short verb phrase for messages, for example `"read file"`.
    pub fn verb(self) -> &'static str {
        match self {
            FsOperation::ReadFile => "read file",
            FsOperation::WriteFile => "write file",
            FsOperation::CreateDirectory => "create directory",
            FsOperation::GetMetadata => "get metadata of",
            FsOperation::Canonicalize => "canonicalize",
            FsOperation::ReadDirectory => "read directory",
            FsOperation::Remove => "remove",
            FsOperation::Copy => "copy",
            FsOperation::Open => "open",
            FsOperation::ReadBlock => "read block from",
            FsOperation::Walk => "walk",
        }
    }

    /// The operation for a wire method name, or `None` if it is not an `fs/*` method.
    pub fn from_method(method: &str) -> Option<FsOperation> {
        FsOperation::ALL
            .into_iter()
            .find(|op| op.as_str() == method)
    }
}

impl fmt::Display for FsOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A coarse classification of an [`FsError`], for mapping to wire error kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FsErrorKind {
    /// The path (or one of its parents) does not exist (`ENOENT`).
    NotFound,
    /// The OS refused access: `EACCES`, `EPERM` or `EROFS` (a sandbox denial looks like this).
    PermissionDenied,
    /// The path already exists (`EEXIST`).
    AlreadyExists,
    /// A directory was expected (`ENOTDIR`).
    NotADirectory,
    /// The path is a directory where something else was expected (`EISDIR`), or a directory was
    /// given to an operation that needs `recursive` for it.
    IsADirectory,
    /// A non-recursive removal of a directory that has entries (`ENOTEMPTY`).
    DirectoryNotEmpty,
    /// The path is a FIFO, socket, device or directory where a regular file was expected.
    NotRegularFile,
    /// A size limit was exceeded.
    TooLarge,
    /// The request itself is invalid (a block length over its limit, a path that names no entry,
    /// a copy into itself).
    InvalidInput,
    /// Anything else (I/O errors, symlink loops, full disks, ...).
    Other,
}

impl FsErrorKind {
    /// Classifies an OS error by its errno, falling back to [`io::ErrorKind`].
    pub fn from_io(error: &io::Error) -> FsErrorKind {
        if let Some(errno) = error.raw_os_error() {
            return match errno {
                libc::ENOENT => FsErrorKind::NotFound,
                libc::EACCES | libc::EPERM | libc::EROFS => FsErrorKind::PermissionDenied,
                libc::EEXIST => FsErrorKind::AlreadyExists,
                libc::ENOTDIR => FsErrorKind::NotADirectory,
                libc::EISDIR => FsErrorKind::IsADirectory,
                libc::ENOTEMPTY => FsErrorKind::DirectoryNotEmpty,
                libc::EFBIG => FsErrorKind::TooLarge,
                libc::EINVAL | libc::ENAMETOOLONG => FsErrorKind::InvalidInput,
                libc::ENXIO => FsErrorKind::NotRegularFile,
                _ => FsErrorKind::Other,
            };
        }
        match error.kind() {
            io::ErrorKind::NotFound => FsErrorKind::NotFound,
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                FsErrorKind::PermissionDenied
            }
            io::ErrorKind::AlreadyExists => FsErrorKind::AlreadyExists,
            io::ErrorKind::NotADirectory => FsErrorKind::NotADirectory,
            io::ErrorKind::IsADirectory => FsErrorKind::IsADirectory,
            io::ErrorKind::DirectoryNotEmpty => FsErrorKind::DirectoryNotEmpty,
            io::ErrorKind::FileTooLarge => FsErrorKind::TooLarge,
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => {
                FsErrorKind::InvalidInput
            }
            _ => FsErrorKind::Other,
        }
    }
}

/// What an operation needed where it found a symlink ([`FsError::SymlinkNotFollowed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// A directory to create entries in, list or remove.
    Directory,
    /// A regular file to write.
    RegularFile,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expected::Directory => "directory",
            Expected::RegularFile => "regular file",
        })
    }
}

/// An error from one filesystem operation.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The OS call failed on `path`.
    #[error("{op}: cannot {verb} {path}: {source}", verb = op.verb(), path = path.display())]
    Io {
        /// The operation that failed.
        op: FsOperation,
        /// The path the failing call was made on (for `copy`, the entry that failed).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A regular file was expected and `path` is something else.
    #[error(
        "{op}: {path} is a {file_type}, expected a regular file",
        path = path.display()
    )]
    NotRegularFile {
        /// The operation that failed.
        op: FsOperation,
        /// The offending path.
        path: PathBuf,
        /// What the path is instead (`"FIFO"`, `"directory"`, `"socket"`, ...).
        file_type: &'static str,
    },
    /// A directory tree holds an entry that cannot be copied.
    #[error(
        "{op}: cannot copy {path}: it is a {file_type}; only regular files, directories and \
         symlinks can be copied",
        path = path.display()
    )]
    UnsupportedFileType {
        /// The operation that failed.
        op: FsOperation,
        /// The offending entry.
        path: PathBuf,
        /// What the entry is (`"FIFO"`, `"socket"`, `"character device"`, ...).
        file_type: &'static str,
    },
    /// The file is larger than the limit the caller set.
    #[error(
        "{op}: {path} is {size} bytes or more, over the limit of {limit} bytes",
        path = path.display()
    )]
    TooLarge {
        /// The operation that failed.
        op: FsOperation,
        /// The file.
        path: PathBuf,
        /// The size seen (at least `limit + 1`).
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A directory was given to an operation that needs `recursive: true` for it.
    #[error(
        "{op}: {path} is a directory; pass recursive: true to {verb} a directory",
        verb = op.verb(),
        path = path.display()
    )]
    IsDirectoryNeedsRecursive {
        /// The operation that failed.
        op: FsOperation,
        /// The directory.
        path: PathBuf,
    },
    /// A symlink where the operation needs a directory or a regular file it may write. Writing
    /// operations never follow a symlink in the last component or anywhere below the named
    /// path's parent (docs/protocol.md, "Symlinks"), so a link that was there, or that was
    /// swapped in while the operation ran, stops it instead of redirecting it.
    #[error(
        "{op}: {path} is a symlink where a {expected} was expected; {op} does not follow \
         symlinks in the last component or below it (name the path the link points to, as \
         fs/canonicalize reports it)",
        path = path.display()
    )]
    SymlinkNotFollowed {
        /// The operation that failed.
        op: FsOperation,
        /// The symlink's path.
        path: PathBuf,
        /// What the operation needed there.
        expected: Expected,
    },
    /// A tree is deeper than [`crate::MAX_TREE_DEPTH`].
    #[error(
        "{op}: {path} is more than {limit} directories below the named path (MAX_TREE_DEPTH); \
         {verb} deeper trees in smaller steps",
        verb = op.verb(),
        path = path.display()
    )]
    TreeTooDeep {
        /// The operation that failed.
        op: FsOperation,
        /// The first directory past the limit.
        path: PathBuf,
        /// The limit in directory levels.
        limit: usize,
    },
    /// A copy would write more than [`crate::COPY_MAX_BYTES`].
    #[error(
        "fs/copy: copying {src} to {dst} would write more than {limit} bytes \
         (COPY_MAX_BYTES); what was copied so far stays; copy larger trees with a command",
        src = source_path.display(),
        dst = destination_path.display()
    )]
    CopyTooLarge {
        /// The source path as given.
        source_path: PathBuf,
        /// The destination path as given.
        destination_path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
    /// A copy whose destination is the source itself or lies inside the source tree.
    #[error(
        "fs/copy: cannot copy {src} into itself: destination {dst} is the source or \
         lies inside it",
        src = source_path.display(),
        dst = destination_path.display()
    )]
    CopyIntoItself {
        /// The source path as given. (Not named `source`: thiserror reserves that name for the
        /// underlying error.)
        source_path: PathBuf,
        /// The destination path as given.
        destination_path: PathBuf,
    },
    /// The path cannot be used for this operation (for example it names no entry, like `/` or
    /// a path ending in `..`).
    #[error("{op}: invalid path {path}: {reason}", path = path.display())]
    InvalidPath {
        /// The operation that failed.
        op: FsOperation,
        /// The path as given.
        path: PathBuf,
        /// What is wrong and what is expected.
        reason: &'static str,
    },
    /// A block read asked for more than the per-call limit.
    #[error("fs/readBlock: len {len} is over the limit of {limit} bytes per block")]
    BlockTooLarge {
        /// The requested length.
        len: usize,
        /// The limit ([`crate::READ_BLOCK_MAX_BYTES`]).
        limit: usize,
    },
    /// A block read's `offset + len` does not fit in a file offset.
    #[error("fs/readBlock: offset {offset} + len {len} is past the largest file offset")]
    BlockOutOfRange {
        /// The requested offset.
        offset: u64,
        /// The requested length.
        len: usize,
    },
    /// Reading from an already opened file failed.
    #[error("fs/readBlock: cannot read at offset {offset}: {source}")]
    BlockIo {
        /// The requested offset.
        offset: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl FsError {
    pub(crate) fn io(op: FsOperation, path: impl Into<PathBuf>, source: io::Error) -> FsError {
        FsError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// Classifies the error.
    pub fn kind(&self) -> FsErrorKind {
        match self {
            FsError::Io { source, .. } | FsError::BlockIo { source, .. } => {
                FsErrorKind::from_io(source)
            }
            FsError::NotRegularFile { .. } | FsError::UnsupportedFileType { .. } => {
                FsErrorKind::NotRegularFile
            }
            FsError::SymlinkNotFollowed {
                expected: Expected::Directory,
                ..
            } => FsErrorKind::NotADirectory,
            FsError::SymlinkNotFollowed {
                expected: Expected::RegularFile,
                ..
            } => FsErrorKind::NotRegularFile,
            FsError::TooLarge { .. }
            | FsError::TreeTooDeep { .. }
            | FsError::CopyTooLarge { .. } => FsErrorKind::TooLarge,
            FsError::IsDirectoryNeedsRecursive { .. } => FsErrorKind::IsADirectory,
            FsError::CopyIntoItself { .. }
            | FsError::InvalidPath { .. }
            | FsError::BlockTooLarge { .. }
            | FsError::BlockOutOfRange { .. } => FsErrorKind::InvalidInput,
        }
    }

    /// The path the error is about, or `None` for errors on an already opened file
    /// (`read_block`), where the caller knows which path the handle was opened for.
    ///
    /// For [`FsError::CopyIntoItself`] this is the destination.
    pub fn path(&self) -> Option<&Path> {
        match self {
            FsError::Io { path, .. }
            | FsError::NotRegularFile { path, .. }
            | FsError::UnsupportedFileType { path, .. }
            | FsError::TooLarge { path, .. }
            | FsError::IsDirectoryNeedsRecursive { path, .. }
            | FsError::SymlinkNotFollowed { path, .. }
            | FsError::TreeTooDeep { path, .. }
            | FsError::InvalidPath { path, .. } => Some(path),
            FsError::CopyIntoItself {
                destination_path, ..
            }
            | FsError::CopyTooLarge {
                destination_path, ..
            } => Some(destination_path),
            FsError::BlockTooLarge { .. }
            | FsError::BlockOutOfRange { .. }
            | FsError::BlockIo { .. } => None,
        }
    }

    /// The limit that was exceeded, for the errors of kind [`FsErrorKind::TooLarge`] that come
    /// from a named limit (bytes, or directory levels for [`FsError::TreeTooDeep`]).
    pub fn limit(&self) -> Option<u64> {
        match self {
            FsError::TooLarge { limit, .. } | FsError::CopyTooLarge { limit, .. } => Some(*limit),
            FsError::TreeTooDeep { limit, .. } => u64::try_from(*limit).ok(),
            _ => None,
        }
    }

    /// The operation that failed.
    pub fn operation(&self) -> FsOperation {
        match self {
            FsError::Io { op, .. }
            | FsError::NotRegularFile { op, .. }
            | FsError::UnsupportedFileType { op, .. }
            | FsError::TooLarge { op, .. }
            | FsError::IsDirectoryNeedsRecursive { op, .. }
            | FsError::SymlinkNotFollowed { op, .. }
            | FsError::TreeTooDeep { op, .. }
            | FsError::InvalidPath { op, .. } => *op,
            FsError::CopyIntoItself { .. } | FsError::CopyTooLarge { .. } => FsOperation::Copy,
            FsError::BlockTooLarge { .. }
            | FsError::BlockOutOfRange { .. }
            | FsError::BlockIo { .. } => FsOperation::ReadBlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn io_error(errno: i32) -> FsError {
        FsError::io(
            FsOperation::ReadFile,
            "/x",
            io::Error::from_raw_os_error(errno),
        )
    }

    #[test]
    fn kind_classifies_errno_values() {
        let cases = [
            (libc::ENOENT, FsErrorKind::NotFound),
            (libc::EACCES, FsErrorKind::PermissionDenied),
            (libc::EPERM, FsErrorKind::PermissionDenied),
            (libc::EROFS, FsErrorKind::PermissionDenied),
            (libc::EEXIST, FsErrorKind::AlreadyExists),
            (libc::ENOTDIR, FsErrorKind::NotADirectory),
            (libc::EISDIR, FsErrorKind::IsADirectory),
            (libc::ENOTEMPTY, FsErrorKind::DirectoryNotEmpty),
            (libc::EINVAL, FsErrorKind::InvalidInput),
            (libc::ELOOP, FsErrorKind::Other),
            (libc::EIO, FsErrorKind::Other),
        ];
        for (errno, expected) in cases {
            assert_eq!(io_error(errno).kind(), expected, "errno {errno}");
        }
    }

    #[test]
    fn kind_classifies_errors_without_errno_by_io_kind() {
        let error = FsError::io(
            FsOperation::Remove,
            "/x",
            io::Error::from(io::ErrorKind::NotFound),
        );
        assert_eq!(error.kind(), FsErrorKind::NotFound);
    }

    #[test]
    fn kind_classifies_library_variants() {
        let path = PathBuf::from("/p");
        let cases = [
            (
                FsError::NotRegularFile {
                    op: FsOperation::ReadFile,
                    path: path.clone(),
                    file_type: "FIFO",
                },
                FsErrorKind::NotRegularFile,
            ),
            (
                FsError::TooLarge {
                    op: FsOperation::ReadFile,
                    path: path.clone(),
                    size: 11,
                    limit: 10,
                },
                FsErrorKind::TooLarge,
            ),
            (
                FsError::IsDirectoryNeedsRecursive {
                    op: FsOperation::Copy,
                    path: path.clone(),
                },
                FsErrorKind::IsADirectory,
            ),
            (
                FsError::CopyIntoItself {
                    source_path: path.clone(),
                    destination_path: path.join("x"),
                },
                FsErrorKind::InvalidInput,
            ),
            (
                FsError::BlockTooLarge { len: 2, limit: 1 },
                FsErrorKind::InvalidInput,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(error.kind(), expected, "{error}");
        }
    }

    #[test]
    fn error_reports_operation_and_path() {
        let error = FsError::CopyIntoItself {
            source_path: PathBuf::from("/a"),
            destination_path: PathBuf::from("/a/b"),
        };
        assert_eq!(error.operation(), FsOperation::Copy);
        assert_eq!(error.path(), Some(Path::new("/a/b")));

        let error = FsError::BlockTooLarge { len: 2, limit: 1 };
        assert_eq!(error.operation(), FsOperation::ReadBlock);
        assert_eq!(error.path(), None);
    }

    #[test]
    fn message_names_operation_path_and_cause() {
        let error = FsError::io(
            FsOperation::ReadFile,
            "/missing",
            io::Error::from_raw_os_error(libc::ENOENT),
        );
        let message = error.to_string();
        assert!(
            message.starts_with("fs/readFile: cannot read file /missing: "),
            "{message}"
        );
    }

    #[test]
    fn operation_names_round_trip_through_method_names() {
        for op in FsOperation::ALL {
            assert_eq!(FsOperation::from_method(op.as_str()), Some(op));
        }
        assert_eq!(FsOperation::from_method("fs/close"), None);
    }
}
