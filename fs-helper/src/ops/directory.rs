//! `fs/createDirectory` and `fs/readDirectory`.
//!
//! Creating: the deepest existing directory of the named path is resolved once (following
//! symlinks as named) into a descriptor; every missing component is then created with
//! `mkdirat` and opened with `O_NOFOLLOW` relative to the one before, so a component swapped
//! for a symlink while the chain is built stops the call instead of redirecting it.
//!
//! Listing follows symlinks (it reads, never writes) and examines every entry relative to the
//! listed directory's descriptor.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::{Mode, SFlag, mkdirat};

use crate::dirfd::{
    Named, directory_open_error, kind, list, open_below, open_path_dir, stat_follow,
};
use crate::error::{FsError, FsOperation};

const CREATE: FsOperation = FsOperation::CreateDirectory;

/// Mode of a new directory before the umask, as for `mkdir(1)`.
const NEW_DIRECTORY_MODE: u32 = 0o777;

/// Creates the directory `path`.
///
/// With `recursive`, missing parents are created too and an existing directory (or a symlink to
/// one) is success. Without it, the parent must exist and an existing path is an error.
/// Symlinks among the components that exist when the call starts are followed; the components
/// it creates are never followed.
///
/// # Errors
/// - [`FsError::Io`] with kind `AlreadyExists` if `path` exists (with `recursive`: exists and
///   is not a directory), `NotFound` if the parent is missing (without `recursive`),
///   `NotADirectory` if a parent is a file, `PermissionDenied` on denial.
/// - [`FsError::SymlinkNotFollowed`] if a component this call created was replaced by a
///   symlink before the next one was created in it.
/// - [`FsError::InvalidPath`] if the path ends in `..`, or has `..` after a missing component.
pub fn create_directory(path: &Path, recursive: bool) -> Result<(), FsError> {
    let error = |e: io::Error| FsError::io(CREATE, path, e);
    if !recursive {
        let target = Named::resolve(CREATE, path)?;
        return make_directory(&target.dir, &target.name).map_err(error);
    }
    match stat_follow(nix::fcntl::AT_FDCWD, path.as_os_str()) {
        Ok(stat) if kind(&stat) == SFlag::S_IFDIR => return Ok(()),
        Ok(_) => return Err(error(io::Error::from_raw_os_error(libc::EEXIST))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(error(e)),
    }
    let (mut dir, mut created, missing) = deepest_existing(path)?;
    for (index, name) in missing.iter().enumerate() {
        created.push(name);
        match make_directory(&dir, name) {
            Ok(()) => {}
            // Created meanwhile by someone else: fine if it is a directory, checked below.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(error(e)),
        }
        if index + 1 == missing.len() {
            return match stat_follow(&dir, name) {
                Ok(stat) if kind(&stat) == SFlag::S_IFDIR => Ok(()),
                Ok(_) => Err(error(io::Error::from_raw_os_error(libc::EEXIST))),
                Err(e) => Err(error(e)),
            };
        }
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        dir = open_below(&dir, name, flags, Mode::empty())
            .map_err(|e| directory_open_error(CREATE, &created, &dir, name, e))?;
    }
    Ok(())
}

fn make_directory(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    crate::dirfd::check_name(name)?;
    mkdirat(dir, name, Mode::from_bits_truncate(NEW_DIRECTORY_MODE)).map_err(io::Error::from)
}

/// The deepest ancestor of `path` that exists, opened (following symlinks), its path, and the
/// names below it that are missing, in order.
fn deepest_existing(path: &Path) -> Result<(OwnedFd, PathBuf, Vec<OsString>), FsError> {
    let invalid = |reason| FsError::InvalidPath {
        op: CREATE,
        path: path.to_path_buf(),
        reason,
    };
    let components: Vec<Component<'_>> = path.components().collect();
    for existing in (0..components.len()).rev() {
        let prefix: PathBuf = components[..existing].iter().collect();
        let prefix = if prefix.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            prefix
        };
        match open_path_dir(&prefix) {
            Ok(dir) => {
                let mut missing = Vec::new();
                for component in &components[existing..] {
                    match component {
                        Component::Normal(name) => missing.push(name.to_os_string()),
                        _ => {
                            return Err(invalid(
                                "`..` after a directory that does not exist yet cannot be                                  created; name the directory without `..`",
                            ));
                        }
                    }
                }
                return Ok((dir, prefix, missing));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(FsError::io(CREATE, path, e)),
        }
    }
    Err(FsError::io(
        CREATE,
        path,
        io::Error::from_raw_os_error(libc::ENOENT),
    ))
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
    read_directory_at_most(path, usize::MAX).map(|(entries, _)| entries)
}

/// [`read_directory`] keeping only the first `max_entries` entries by name bytes (only that many
/// are held while the directory is read); the flag says whether any were left out.
///
/// # Errors
/// As [`read_directory`].
pub fn read_directory_at_most(
    path: &Path,
    max_entries: usize,
) -> Result<(Vec<DirEntry>, bool), FsError> {
    let error = |e: io::Error| FsError::io(FsOperation::ReadDirectory, path, e);
    let dir = open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| error(e.into()))?;
    // A max-heap by name: past `max_entries` the largest name goes.
    let mut entries = std::collections::BinaryHeap::new();
    let mut truncated = false;
    for entry in list(dir.as_fd()).map_err(error)? {
        let (file_name, file_type) = entry.map_err(error)?;
        let file_type = match file_type {
            Some(file_type) => file_type,
            None => match crate::dirfd::stat_nofollow(&dir, &file_name) {
                Ok(stat) => type_of(kind(&stat)),
                // Removed since the listing: not an entry any more.
                Err(e) if e.raw_os_error() == Some(Errno::ENOENT as i32) => continue,
                Err(e) => return Err(error(e)),
            },
        };
        let is_symlink = file_type == Type::Symlink;
        let (is_directory, is_file) = if is_symlink {
            match stat_follow(&dir, &file_name) {
                Ok(target) => (
                    kind(&target) == SFlag::S_IFDIR,
                    kind(&target) == SFlag::S_IFREG,
                ),
                Err(_) => (false, false),
            }
        } else {
            (file_type == Type::Directory, file_type == Type::File)
        };
        entries.push(ByName(DirEntry {
            file_name,
            is_directory,
            is_file,
            is_symlink,
        }));
        if entries.len() > max_entries {
            entries.pop();
            truncated = true;
        }
    }
    let entries = entries
        .into_sorted_vec()
        .into_iter()
        .map(|ByName(entry)| entry)
        .collect();
    Ok((entries, truncated))
}

/// A directory entry ordered by its name's bytes.
struct ByName(DirEntry);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.file_name == other.0.file_name
    }
}

impl Eq for ByName {}

impl PartialOrd for ByName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0
            .file_name
            .as_bytes()
            .cmp(other.0.file_name.as_bytes())
    }
}

/// The directory-entry type for a stat's file type bits.
pub(crate) fn type_of(kind: SFlag) -> Type {
    match kind {
        SFlag::S_IFDIR => Type::Directory,
        SFlag::S_IFREG => Type::File,
        SFlag::S_IFLNK => Type::Symlink,
        SFlag::S_IFIFO => Type::Fifo,
        SFlag::S_IFSOCK => Type::Socket,
        SFlag::S_IFCHR => Type::CharacterDevice,
        _ => Type::BlockDevice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::{make_fifo, non_utf8_name};
    use pretty_assertions::assert_eq;
    use std::fs;
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
    fn read_directory_at_most_keeps_the_first_names_and_says_it_cut() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["d", "b", "e", "a", "c"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let (entries, truncated) = read_directory_at_most(dir.path(), 3).unwrap();
        let names: Vec<_> = entries.iter().map(|e| e.file_name.clone()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(truncated);
        let (entries, truncated) = read_directory_at_most(dir.path(), 5).unwrap();
        assert_eq!(entries.len(), 5);
        assert!(!truncated);
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
