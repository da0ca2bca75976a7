//! `fs/copy`: copy a file, a symlink or a directory tree, by descriptor.
//!
//! Rules, in the order they are checked:
//! 1. The parents of the source and of the destination are each resolved once (following
//!    symlinks as named) into descriptors. Everything below them is reached one component at a
//!    time relative to a descriptor, never following a symlink, on both sides.
//! 2. The source's last component is examined with `lstat`: a symlink source is copied as a
//!    symlink. A directory source needs `recursive`.
//! 3. The destination must not be the source (same inode) nor, for a directory, lie inside it:
//!    the destination's parent is walked up through `..` by descriptor and compared with the
//!    source directory. While copying, a source directory that is one the copy created is
//!    skipped, so a tree moved into itself meanwhile cannot make the copy recurse forever.
//! 4. Symlinks at the destination are never followed: a link where a file, link or directory is
//!    to be written is replaced. Directories are created with `mkdirat` and opened with
//!    `O_NOFOLLOW`; files with `O_NOFOLLOW`; modes are set with `fchmod` on the open
//!    descriptor. A destination entry swapped for a symlink mid-copy stops the copy.
//! 5. FIFOs, sockets and devices are never opened. Inside a tree they are skipped; as the
//!    top-level source they are an error naming the path.
//! 6. Regular files keep their holes (only the data segments found with `SEEK_DATA`/`SEEK_HOLE`
//!    are copied, with `copy_file_range`), are copied up to the size they had when opened, and
//!    one call writes at most [`COPY_MAX_BYTES`]. A failure part-way leaves what was already
//!    copied in place.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, copy_file_range, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, mkdirat};
use nix::unistd::{UnlinkatFlags, Whence, lseek, symlinkat, unlinkat};

use crate::dirfd::{
    Named, directory_open_error, identity, kind, kind_name, list, open_below, stat_nofollow,
};
use crate::error::{FsError, FsOperation};
use crate::open::{open_regular_for_read_below, open_regular_for_write_below};
use crate::ops::MAX_TREE_DEPTH;

const OP: FsOperation = FsOperation::Copy;

/// Permission bits kept by a copy: read, write and execute for user, group and others. Set-id
/// and sticky bits are dropped, as `cp` does without `--preserve`.
const COPIED_MODE_BITS: u32 = 0o777;

/// Most data bytes one `fs/copy` writes, over all its files (16 GiB). Holes in sparse files do
/// not count.
///
/// One request must not keep the server copying without end: a huge tree, or a source file a
/// sandboxed command keeps growing. Larger copies are a job for a command (`cp`, `rsync`).
pub const COPY_MAX_BYTES: u64 = 16 * 1024 * 1024 * 1024;

/// Largest single `copy_file_range` or read/write step, in bytes: bounds how long one syscall
/// runs and the fallback's buffer.
const COPY_CHUNK_BYTES: usize = 1024 * 1024;

/// Mode a destination directory is created with, before its final mode is set at the end
/// (owner-only, so nobody else can use it while it is being filled).
const NEW_DIRECTORY_MODE: u32 = 0o700;

/// Most `..` steps taken when checking whether the destination lies inside the source: a path
/// has at most `PATH_MAX / 2` components.
const MAX_ANCESTORS: usize = 2048;

/// Copies `source` to `destination` (the new entry's own path, not a directory to copy into).
///
/// Regular files keep their permission bits and their holes, and overwrite an existing
/// destination file. Symlinks are copied as symlinks with the same target text, including a
/// top-level symlink source. A directory needs `recursive`; copying onto an existing directory
/// merges into it. FIFOs, sockets and devices inside a tree are skipped.
///
/// # Errors
/// - [`FsError::IsDirectoryNeedsRecursive`] for a directory source without `recursive`.
/// - [`FsError::CopyIntoItself`] if the destination is the source or lies inside it.
/// - [`FsError::UnsupportedFileType`] for a FIFO, socket or device as the source itself.
/// - [`FsError::InvalidPath`] if either path names no entry (`/`, or ends in `..`).
/// - [`FsError::NotRegularFile`] for a file copied onto a directory, FIFO, socket or device.
/// - [`FsError::SymlinkNotFollowed`] if a destination directory was swapped for a symlink.
/// - [`FsError::CopyTooLarge`] past [`COPY_MAX_BYTES`]; [`FsError::TreeTooDeep`] past
///   [`MAX_TREE_DEPTH`] levels.
/// - [`FsError::Io`] naming the entry that failed, for example `NotFound` for a missing source
///   or destination parent, `AlreadyExists` for a directory copied onto a file, `IsADirectory`
///   for a symlink copied onto a directory.
pub fn copy(source: &Path, destination: &Path, recursive: bool) -> Result<(), FsError> {
    copy_with_limit(source, destination, recursive, COPY_MAX_BYTES)
}

/// [`copy`] with another byte limit (tests use a small one).
pub(crate) fn copy_with_limit(
    source: &Path,
    destination: &Path,
    recursive: bool,
    max_bytes: u64,
) -> Result<(), FsError> {
    let from = Named::resolve(OP, source)?;
    let to = Named::resolve(OP, destination)?;
    let stat = stat_nofollow(&from.dir, &from.name).map_err(|e| FsError::io(OP, source, e))?;
    let is_dir = kind(&stat) == SFlag::S_IFDIR;
    if is_dir && !recursive {
        return Err(FsError::IsDirectoryNeedsRecursive {
            op: OP,
            path: source.to_path_buf(),
        });
    }
    let into_itself = || FsError::CopyIntoItself {
        source_path: source.to_path_buf(),
        destination_path: destination.to_path_buf(),
    };
    if let Ok(existing) = stat_nofollow(&to.dir, &to.name)
        && identity(&existing) == identity(&stat)
    {
        return Err(into_itself());
    }
    let mut copy = Copy {
        source,
        destination,
        max_bytes,
        written: 0,
        created: HashSet::new(),
    };
    let from_entry = At::new(&from.dir, &from.name, source);
    let to_entry = At::new(&to.dir, &to.name, destination);
    if !is_dir {
        return copy.entry(from_entry, to_entry, 0);
    }
    let source_dir = open_source_dir(from_entry)?;
    if is_inside(&to.dir, &source_dir).map_err(|e| FsError::io(OP, destination, e))? {
        return Err(into_itself());
    }
    copy.directory(source_dir, &stat, source, to_entry, 0)
}

/// One side of a copy step: the entry `name` of the directory `dir`, and its path for errors.
#[derive(Clone, Copy)]
struct At<'a> {
    dir: &'a OwnedFd,
    name: &'a OsStr,
    path: &'a Path,
}

impl<'a> At<'a> {
    fn new(dir: &'a OwnedFd, name: &'a OsStr, path: &'a Path) -> Self {
        At { dir, name, path }
    }

    fn error(&self, error: impl Into<io::Error>) -> FsError {
        FsError::io(OP, self.path, error.into())
    }
}

/// Whether `dir` is `ancestor` or lies below it, by walking `..` from `dir`.
fn is_inside(dir: &OwnedFd, ancestor: &OwnedFd) -> io::Result<bool> {
    let target = identity(&nix::sys::stat::fstat(ancestor)?);
    let mut current = open_dot(dir, ".")?;
    for _ in 0..MAX_ANCESTORS {
        let here = identity(&nix::sys::stat::fstat(&current)?);
        if here == target {
            return Ok(true);
        }
        let parent = open_dot(&current, "..")?;
        if identity(&nix::sys::stat::fstat(&parent)?) == here {
            return Ok(false); // the root is its own parent
        }
        current = parent;
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

fn open_dot(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

fn open_source_dir(from: At<'_>) -> Result<OwnedFd, FsError> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    open_below(from.dir, from.name, flags, Mode::empty())
        .map_err(|e| directory_open_error(OP, from.path, from.dir, from.name, e))
}

/// One copy in progress: its inputs (for errors), its byte budget, and the directories it
/// created (never descended into as sources).
struct Copy<'a> {
    source: &'a Path,
    destination: &'a Path,
    max_bytes: u64,
    written: u64,
    created: HashSet<(u64, u64)>,
}

impl Copy<'_> {
    /// Copies the entry `from` to `to`. `depth` is its level below the named source.
    fn entry(&mut self, from: At<'_>, to: At<'_>, depth: usize) -> Result<(), FsError> {
        let stat = stat_nofollow(from.dir, from.name).map_err(|e| from.error(e))?;
        match kind(&stat) {
            SFlag::S_IFREG => self.file(from, to),
            SFlag::S_IFLNK => copy_symlink(from, to),
            SFlag::S_IFDIR => {
                if self.created.contains(&identity(&stat)) {
                    return Ok(()); // a directory this copy made: the tree moved into itself
                }
                let dir = open_source_dir(from)?;
                self.directory(dir, &stat, from.path, to, depth)
            }
            // Inside a tree, special files are skipped; as the named source they are an error.
            _ if depth > 0 => Ok(()),
            _ => Err(FsError::UnsupportedFileType {
                op: OP,
                path: from.path.to_path_buf(),
                file_type: kind_name(&stat),
            }),
        }
    }

    /// Copies the opened directory `source_dir` (described by `stat`, at `source` for errors)
    /// to `to`.
    fn directory(
        &mut self,
        source_dir: OwnedFd,
        stat: &FileStat,
        source: &Path,
        to: At<'_>,
        depth: usize,
    ) -> Result<(), FsError> {
        if depth > MAX_TREE_DEPTH {
            return Err(FsError::TreeTooDeep {
                op: OP,
                path: source.to_path_buf(),
                limit: MAX_TREE_DEPTH,
            });
        }
        let (target, created) = make_destination_dir(to)?;
        if created {
            let target_stat = nix::sys::stat::fstat(&target).map_err(|e| to.error(e))?;
            self.created.insert(identity(&target_stat));
        }
        for entry in list(&source_dir).map_err(|e| FsError::io(OP, source, e))? {
            let (name, _) = entry.map_err(|e| FsError::io(OP, source, e))?;
            let (source_path, destination_path) = (source.join(&name), to.path.join(&name));
            let result = self.entry(
                At::new(&source_dir, &name, &source_path),
                At::new(&target, &name, &destination_path),
                depth + 1,
            );
            match result {
                // Removed from the source meanwhile: nothing to copy.
                Err(FsError::Io {
                    source: e, path, ..
                }) if e.kind() == io::ErrorKind::NotFound && path == source_path => {}
                other => other?,
            }
        }
        if created {
            // Set last, so a read-only source directory is still filled before it becomes
            // read-only. Through the descriptor: the name may point elsewhere by now.
            let mode = Mode::from_bits_truncate(stat.st_mode & COPIED_MODE_BITS);
            let dir = reopen_readable(&target).map_err(|e| to.error(e))?;
            nix::sys::stat::fchmod(&dir, mode).map_err(|e| to.error(e))?;
        }
        Ok(())
    }

    fn file(&mut self, from: At<'_>, to: At<'_>) -> Result<(), FsError> {
        let input = open_regular_for_read_below(OP, from.path, from.dir, from.name)?;
        let input_meta = input.metadata().map_err(|e| from.error(e))?;
        let mode = input_meta.permissions().mode() & COPIED_MODE_BITS;
        let open_output = || open_regular_for_write_below(OP, to.path, to.dir, to.name, 0o600);
        let output = match open_output() {
            // A symlink at the destination is replaced, never written through.
            Err(FsError::SymlinkNotFollowed { .. }) => {
                remove_non_directory(to)?;
                open_output()?
            }
            other => other?,
        };
        let output_meta = output.metadata().map_err(|e| to.error(e))?;
        if (output_meta.dev(), output_meta.ino()) == (input_meta.dev(), input_meta.ino()) {
            // The same file under another name (a hard link): copying would destroy it.
            return Err(FsError::CopyIntoItself {
                source_path: self.source.to_path_buf(),
                destination_path: self.destination.to_path_buf(),
            });
        }
        output.set_len(0).map_err(|e| to.error(e))?;
        self.data(&input, &output, input_meta.len(), to.path)?;
        // An existing destination keeps its old mode through open(); give it the source's.
        output
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| to.error(e))
    }

    /// Copies the data segments of `input`'s first `size` bytes, leaving holes as holes.
    fn data(
        &mut self,
        input: &File,
        output: &File,
        size: u64,
        destination: &Path,
    ) -> Result<(), FsError> {
        let error = |e: io::Error| FsError::io(OP, destination, e);
        let mut position = 0;
        let mut fallback = false;
        while position < size {
            let start = match lseek(input, offset(position), Whence::SeekData) {
                Ok(start) => start.unsigned_abs(),
                Err(Errno::ENXIO) => break, // only a hole is left
                // No hole support here: everything is data.
                Err(Errno::EINVAL | Errno::EOPNOTSUPP) => position,
                Err(e) => return Err(error(e.into())),
            };
            if start >= size {
                break;
            }
            let end = match lseek(input, offset(start), Whence::SeekHole) {
                Ok(end) => end.unsigned_abs().min(size),
                Err(_) => size,
            };
            match self.range(input, output, start, end, &mut fallback) {
                Ok(copied) if copied == end => position = end,
                // The source shrank meanwhile: the copy ends where its data ended.
                Ok(copied) => return output.set_len(copied).map_err(error),
                Err(RangeError::Limit) => {
                    return Err(FsError::CopyTooLarge {
                        source_path: self.source.to_path_buf(),
                        destination_path: self.destination.to_path_buf(),
                        limit: self.max_bytes,
                    });
                }
                Err(RangeError::Io(e)) => return Err(error(e)),
            }
        }
        // A trailing hole: extend without writing.
        output.set_len(size).map_err(error)
    }

    /// Copies `[start, end)`; returns where it stopped (before `end` only if the source ended).
    fn range(
        &mut self,
        input: &File,
        output: &File,
        start: u64,
        end: u64,
        fallback: &mut bool,
    ) -> Result<u64, RangeError> {
        let mut position = start;
        let mut buffer = Vec::new();
        while position < end {
            let len = usize::try_from(end - position)
                .unwrap_or(usize::MAX)
                .min(COPY_CHUNK_BYTES);
            if self.written.saturating_add(len as u64) > self.max_bytes {
                return Err(RangeError::Limit);
            }
            let copied = if *fallback {
                read_write(input, output, position, len, &mut buffer)?
            } else {
                let mut from = offset(position);
                let mut to = offset(position);
                match copy_file_range(input, Some(&mut from), output, Some(&mut to), len) {
                    Ok(copied) => copied,
                    // Not possible between these two files (another filesystem, an old
                    // kernel, a filesystem without it): read and write instead.
                    Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => {
                        *fallback = true;
                        continue;
                    }
                    Err(e) => return Err(RangeError::Io(e.into())),
                }
            };
            if copied == 0 {
                break;
            }
            self.written += copied as u64;
            position += copied as u64;
        }
        Ok(position)
    }
}

/// Why a range copy stopped.
enum RangeError {
    /// [`COPY_MAX_BYTES`] (or the test limit) would be passed.
    Limit,
    /// A read or write failed.
    Io(io::Error),
}

impl From<io::Error> for RangeError {
    fn from(error: io::Error) -> Self {
        RangeError::Io(error)
    }
}

/// One `pread` + `pwrite` of up to `len` bytes at `position`; returns the bytes copied.
fn read_write(
    input: &File,
    output: &File,
    position: u64,
    len: usize,
    buffer: &mut Vec<u8>,
) -> io::Result<usize> {
    buffer.resize(len, 0);
    let read = loop {
        match input.read_at(buffer, position) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => break other?,
        }
    };
    output.write_all_at(&buffer[..read], position)?;
    Ok(read)
}

/// A file offset for `lseek` and `copy_file_range` (sizes come from `fstat`, so they fit).
fn offset(position: u64) -> i64 {
    i64::try_from(position).unwrap_or(i64::MAX)
}

/// A readable descriptor of the directory `dir` (which may be `O_PATH`), for `fchmod`.
fn reopen_readable(dir: &OwnedFd) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Creates the destination directory `to` (or takes the existing one, replacing a symlink
/// there) and opens it without following links. Returns it and whether it was created.
fn make_destination_dir(to: At<'_>) -> Result<(OwnedFd, bool), FsError> {
    let create = || {
        mkdirat(
            to.dir,
            to.name,
            Mode::from_bits_truncate(NEW_DIRECTORY_MODE),
        )
    };
    let created = match create() {
        Ok(()) => true,
        Err(Errno::EEXIST) => match stat_nofollow(to.dir, to.name) {
            Ok(stat) if kind(&stat) == SFlag::S_IFDIR => false,
            Ok(stat) if kind(&stat) == SFlag::S_IFLNK => {
                remove_non_directory(to)?;
                create().map_err(|e| to.error(e))?;
                true
            }
            Ok(_) => return Err(to.error(Errno::EEXIST)),
            Err(e) => return Err(to.error(e)),
        },
        Err(e) => return Err(to.error(e)),
    };
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
    let dir = open_below(to.dir, to.name, flags, Mode::empty())
        .map_err(|e| directory_open_error(OP, to.path, to.dir, to.name, e))?;
    Ok((dir, created))
}

/// Unlinks `at` unless it is a directory (`EISDIR` then).
fn remove_non_directory(at: At<'_>) -> Result<(), FsError> {
    match unlinkat(at.dir, at.name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(at.error(e)),
    }
}

fn copy_symlink(from: At<'_>, to: At<'_>) -> Result<(), FsError> {
    let target = readlinkat(from.dir, from.name).map_err(|e| from.error(e))?;
    match stat_nofollow(to.dir, to.name) {
        Ok(existing) if kind(&existing) == SFlag::S_IFDIR => {
            return Err(to.error(Errno::EISDIR));
        }
        Ok(_) => remove_non_directory(to)?,
        Err(_) => {}
    }
    crate::dirfd::check_name(to.name).map_err(|e| to.error(e))?;
    symlinkat(target.as_os_str(), to.dir, to.name).map_err(|e| to.error(e))
}

#[cfg(test)]
mod tests;
