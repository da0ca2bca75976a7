//! Working by directory descriptor: the one place where a client path becomes descriptors.
//!
//! The rule every writing operation follows (docs/protocol.md, "Symlinks"):
//! 1. The named path's **parent** is resolved once, by the kernel, following symlinks as the
//!    client named them ([`Named::resolve`]). From then on the parent is a descriptor: renaming
//!    or replacing any ancestor afterwards changes nothing for this operation.
//! 2. Everything below that descriptor (the last component, and every entry of a tree that is
//!    copied, removed or created) is reached one component at a time with `*at` calls, never
//!    following a symlink ([`open_below`] uses `openat2` with `RESOLVE_BENEATH |
//!    RESOLVE_NO_SYMLINKS`, or `openat` with `O_NOFOLLOW` on kernels without `openat2`).
//! 3. Names used below a descriptor are single components: never empty, `.`, `..`, nor
//!    containing `/` ([`check_name`]), so no `*at` call can climb out of its directory.
//!
//! All descriptors are close-on-exec.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, open, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};

use crate::error::{Expected, FsError, FsOperation};

/// A client path split into its parent, opened as a descriptor, and its last component.
#[derive(Debug)]
pub(crate) struct Named {
    /// The parent directory, resolved once (symlinks followed), opened with `O_PATH`.
    pub dir: OwnedFd,
    /// The last component: a single name, never `.`/`..`.
    pub name: OsString,
}

impl Named {
    /// Splits `path` into parent and name (a trailing `/` or `/.` is dropped, so `link/` names
    /// the link itself) and opens the parent.
    ///
    /// # Errors
    /// [`FsError::InvalidPath`] if the path names no entry (empty, `/`, ending in `..`);
    /// [`FsError::Io`] naming `path` if the parent cannot be opened (`NotFound` for a missing
    /// parent, `NotADirectory` for a file in the way).
    pub(crate) fn resolve(op: FsOperation, path: &Path) -> Result<Named, FsError> {
        let (parent, name) = split_named(op, path)?;
        let dir = open_path_dir(&parent).map_err(|e| FsError::io(op, path, e))?;
        Ok(Named { dir, name })
    }
}

/// `path` as (parent, last name). A trailing `/` or `/.` is dropped: operations that must not
/// follow a symlink in the last component need this, because the kernel resolves `link/` to the
/// link's target. A relative path's parent may be `.`.
///
/// # Errors
/// [`FsError::InvalidPath`] if the path names no entry of a directory (empty, `/`, or ending in
/// `..`).
pub(crate) fn split_named(op: FsOperation, path: &Path) -> Result<(PathBuf, OsString), FsError> {
    let mut components: Vec<Component<'_>> = path.components().collect();
    match components.pop() {
        Some(Component::Normal(name)) => {
            let parent: PathBuf = components.into_iter().collect();
            let parent = if parent.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                parent
            };
            Ok((parent, name.to_os_string()))
        }
        _ => Err(FsError::InvalidPath {
            op,
            path: path.to_path_buf(),
            reason: "the path must end in the name of an entry (not empty, `/`, `.` or `..`)",
        }),
    }
}

/// Opens a directory by path, following symlinks, as an `O_PATH` descriptor (no read permission
/// needed; enough for every `*at` call).
pub(crate) fn open_path_dir(path: &Path) -> io::Result<OwnedFd> {
    open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Refuses names that are not exactly one component.
///
/// # Errors
/// `EINVAL` for an empty name, `.`, `..` or a name containing `/`.
pub(crate) fn check_name(name: &OsStr) -> io::Result<()> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(())
}

/// Set once `openat2` answered `ENOSYS` (a kernel before 5.6, or a seccomp filter refusing it):
/// from then on [`open_below`] goes straight to `openat`.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Opens `name` in `dir` without following a symlink and without leaving `dir`:
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it, `openat` with
/// `O_NOFOLLOW` otherwise (equivalent for the single component [`check_name`] allows).
/// `O_NOFOLLOW` and `O_CLOEXEC` are always added. `name` may be `.` only for `O_TMPFILE`.
///
/// A symlink fails with `ELOOP` (or `ENOTDIR` with `O_DIRECTORY`).
pub(crate) fn open_below(
    dir: impl AsFd,
    name: &OsStr,
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    if !(flags.contains(OFlag::O_TMPFILE) && name.as_bytes() == b".") {
        check_name(name)?;
    }
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let creates = flags.contains(OFlag::O_CREAT) || flags.contains(OFlag::O_TMPFILE);
    if !OPENAT2_MISSING.load(Ordering::Relaxed) {
        let mut how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        if creates {
            how = how.mode(mode);
        }
        match openat2(dir.as_fd(), name, how) {
            Err(Errno::ENOSYS) => OPENAT2_MISSING.store(true, Ordering::Relaxed),
            // RESOLVE_BENEATH refuses with EAGAIN when a rename anywhere on the system may
            // have moved the walk, and with EXDEV when the entry was moved out of `dir` while
            // it was opened. One checked component cannot escape `dir`: open it plainly (with
            // O_NOFOLLOW), which sees whatever is at `name` now.
            Err(Errno::EAGAIN | Errno::EXDEV) => {}
            other => return other.map_err(io::Error::from),
        }
    }
    openat(dir, name, flags, mode).map_err(io::Error::from)
}

/// The error for an `open_below` of a directory that failed with `error`: when the entry is (by
/// now) a symlink, [`FsError::SymlinkNotFollowed`] naming `path`; otherwise `error` itself.
pub(crate) fn directory_open_error(
    op: FsOperation,
    path: &Path,
    dir: impl AsFd,
    name: &OsStr,
    error: io::Error,
) -> FsError {
    let is_link = matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
        && stat_nofollow(dir, name).is_ok_and(|stat| kind(&stat) == SFlag::S_IFLNK);
    if is_link {
        FsError::SymlinkNotFollowed {
            op,
            path: path.to_path_buf(),
            expected: Expected::Directory,
        }
    } else {
        FsError::io(op, path, error)
    }
}

/// `fstatat` without following a symlink in `name`.
pub(crate) fn stat_nofollow(dir: impl AsFd, name: &OsStr) -> io::Result<FileStat> {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io::Error::from)
}

/// `fstatat` following a symlink in `name` (for reporting what a link points to; never used
/// before a write).
pub(crate) fn stat_follow(dir: impl AsFd, name: &OsStr) -> io::Result<FileStat> {
    fstatat(dir, name, AtFlags::empty()).map_err(io::Error::from)
}

/// The file type bits of a stat.
pub(crate) fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & libc::S_IFMT)
}

/// A human name for a file type, for error messages.
pub(crate) fn kind_name(stat: &FileStat) -> &'static str {
    match kind(stat) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "file of unknown type",
    }
}

/// The (device, inode) pair that identifies a file.
pub(crate) fn identity(stat: &FileStat) -> (u64, u64) {
    (stat.st_dev, stat.st_ino)
}

/// The entries of the directory `dir` (any descriptor of it, `O_PATH` included), without `.`
/// and `..`, each with its type when the filesystem reports it in the listing.
///
/// The listing reads through a descriptor of its own, streaming: memory stays bounded however
/// many entries a directory has, and the caller may remove or create entries in `dir` while
/// it iterates (as std's `remove_dir_all` does; entries added meanwhile may or may not be seen).
pub(crate) fn list(
    dir: impl AsFd,
) -> io::Result<impl Iterator<Item = io::Result<(OsString, Option<Type>)>>> {
    list_matching(dir, |_| true)
}

/// [`list`], keeping only the names for which `keep(name bytes)` is true (checked before a name
/// is copied, so skipping most entries of a large directory stays cheap).
pub(crate) fn list_matching(
    dir: impl AsFd,
    keep: impl Fn(&[u8]) -> bool + 'static,
) -> io::Result<impl Iterator<Item = io::Result<(OsString, Option<Type>)>>> {
    let listing = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let entries = Dir::from_fd(listing)?.into_iter().filter_map(move |entry| {
        let entry = match entry {
            Ok(entry) => entry,
            Err(errno) => return Some(Err(io::Error::from(errno))),
        };
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." || !keep(name) {
            return None;
        }
        Some(Ok((
            OsStr::from_bytes(name).to_os_string(),
            entry.file_type(),
        )))
    });
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;

    #[test]
    fn split_named_drops_trailing_slash_and_dot() {
        for (input, parent, name) in [
            ("/a/link/", "/a", "link"),
            ("/a/link/.", "/a", "link"),
            ("/a/./link//", "/a", "link"),
            ("/top", "/", "top"),
            ("rel/x", "rel", "x"),
            ("x", ".", "x"),
        ] {
            assert_eq!(
                split_named(FsOperation::Remove, Path::new(input)).unwrap(),
                (PathBuf::from(parent), OsString::from(name)),
                "{input}"
            );
        }
    }

    #[test]
    fn split_named_refuses_paths_without_a_name() {
        for input in ["", "/", "/a/..", ".", "./"] {
            let error = split_named(FsOperation::Remove, Path::new(input)).unwrap_err();
            assert_eq!(error.kind(), FsErrorKind::InvalidInput, "{input:?}");
        }
    }

    #[test]
    fn check_name_refuses_everything_but_one_component() {
        for bad in ["", ".", "..", "a/b", "/a"] {
            assert!(check_name(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        check_name(OsStr::new("...")).unwrap();
    }

    #[test]
    fn open_below_does_not_follow_a_symlink_to_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        symlink("real", dir.path().join("link")).unwrap();
        let parent = open_path_dir(dir.path()).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        open_below(&parent, OsStr::new("real"), flags, Mode::empty()).unwrap();
        let error = open_below(&parent, OsStr::new("link"), flags, Mode::empty()).unwrap_err();
        assert!(
            matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{error}"
        );
        let error = open_below(&parent, OsStr::new(".."), flags, Mode::empty()).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn list_skips_dot_entries_and_reads_through_an_o_path_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), b"").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut names: Vec<_> = list(open_path_dir(dir.path()).unwrap())
            .unwrap()
            .map(|entry| entry.unwrap().0)
            .collect();
        names.sort();
        assert_eq!(names, ["file", "sub"].map(OsString::from).to_vec());
    }
}
