//! `fs/walk`: a depth-first listing of the tree below a directory, never following a symlink
//! below it.
//!
//! The named directory is opened once, following symlinks as named (like `fs/readDirectory`).
//! Every directory below it is opened relative to its parent's descriptor with
//! [`open_below`] (`O_NOFOLLOW`, `RESOLVE_BENEATH`): a symlink is listed as a link and never
//! entered, and a directory swapped for a link while the walk runs is not followed either.
//! Each directory is read whole and sorted by name bytes before the walk descends, so the walk
//! holds one descriptor per level and the names of the directories on its path.
//!
//! A directory the walk may not open (`EACCES`/`EPERM`: under a sandbox, one the policy hides)
//! is left out, with everything below it; the walk goes on.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Type;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;

use crate::dirfd::{kind, list, open_below, stat_nofollow};
use crate::error::{FsError, FsOperation};
use crate::ops::directory::type_of;

const OP: FsOperation = FsOperation::Walk;

/// Largest number of entries one `fs/walk` returns (`maxEntries` may not exceed it).
///
/// The answer is built in memory (about 150 bytes of JSON per entry with short paths), so this
/// and [`WALK_MAX_PATH_BYTES`] bound it; larger trees are walked in parts.
pub const WALK_MAX_ENTRIES: usize = 100_000;

/// Largest total of the entries' path bytes one `fs/walk` returns; past it the walk stops with
/// `truncated`, as past `maxEntries`. Deep trees with long names would otherwise make an answer
/// of hundreds of MiB within [`WALK_MAX_ENTRIES`] (100,000 paths of 4 KiB); with this, the
/// answer stays under about 40 MiB (paths as percent-encoded URIs plus the other fields), below
/// the 64 MiB helper frame limit.
pub const WALK_MAX_PATH_BYTES: usize = 8 * 1024 * 1024;

/// Entries one `fs/walk` returns when the request does not say.
pub const WALK_DEFAULT_ENTRIES: usize = 10_000;

/// One entry of a [`walk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkEntry {
    /// The entry's path: the walked path joined with the names below it.
    pub path: PathBuf,
    /// Its level below the walked directory (1 for the directory's own entries).
    pub depth: usize,
    /// It is a directory (a symlink never is: it is not followed).
    pub is_directory: bool,
    /// It is a regular file.
    pub is_file: bool,
    /// It is a symlink (listed, not followed).
    pub is_symlink: bool,
}

/// The result of a [`walk`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// The entries, depth-first, sorted by name bytes within each directory.
    pub entries: Vec<WalkEntry>,
    /// The tree has more entries than the walk was allowed to return.
    pub truncated: bool,
}

/// Lists the tree below the directory `path` (following symlinks to it), depth-first, down to
/// `max_depth` levels and at most `max_entries` entries (then `truncated`).
///
/// Below `path`, symlinks are listed and never followed. Directories that cannot be opened for
/// lack of permission are left out with their contents; entries that vanish while the walk runs
/// are skipped. The caller bounds `max_depth` (at most [`crate::MAX_TREE_DEPTH`]) and
/// `max_entries` (at most [`WALK_MAX_ENTRIES`]).
///
/// # Errors
/// [`FsError::Io`] naming `path` if it is missing (`NotFound`), not a directory
/// (`NotADirectory`) or denied; naming the directory being read if reading it fails otherwise.
pub fn walk(path: &Path, max_depth: usize, max_entries: usize) -> Result<Walk, FsError> {
    let root = open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FsError::io(OP, path, e.into()))?;
    let mut walk = Walk::default();
    let limits = Limits {
        max_depth,
        max_entries,
        max_path_bytes: WALK_MAX_PATH_BYTES,
    };
    let mut path_bytes = 0;
    walk_directory(&root, path, 1, &limits, &mut walk, &mut path_bytes)?;
    Ok(walk)
}

struct Limits {
    max_depth: usize,
    max_entries: usize,
    max_path_bytes: usize,
}

/// Appends the entries of the directory `dir` (at `path`), whose entries are at `depth`, and
/// of the directories below it. Stops once `walk` is truncated. `path_bytes` counts the path
/// bytes listed so far.
fn walk_directory(
    dir: &OwnedFd,
    path: &Path,
    depth: usize,
    limits: &Limits,
    walk: &mut Walk,
    path_bytes: &mut usize,
) -> Result<(), FsError> {
    let error = |e: io::Error| FsError::io(OP, path, e);
    let mut names: Vec<(OsString, Option<Type>)> = list(dir.as_fd())
        .map_err(error)?
        .collect::<io::Result<_>>()
        .map_err(error)?;
    names.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for (name, file_type) in names {
        let file_type = match file_type {
            Some(file_type) => file_type,
            None => match stat_nofollow(dir, &name) {
                Ok(stat) => type_of(kind(&stat)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(FsError::io(OP, path.join(&name), e)),
            },
        };
        let entry_path = path.join(&name);
        let mut child = None;
        let mut file_type = file_type;
        if file_type == Type::Directory {
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
            match open_below(dir, &name, flags, Mode::empty()) {
                Ok(opened) => child = Some(opened),
                // Hidden by the policy (or unreadable): not listed, not entered.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                // Replaced by a symlink or a file since it was listed: list what is there now.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                    match stat_nofollow(dir, &name) {
                        Ok(stat) => file_type = type_of(kind(&stat)),
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(FsError::io(OP, &entry_path, e)),
                    }
                }
                Err(e) => return Err(FsError::io(OP, &entry_path, e)),
            }
        }
        let entry_bytes = entry_path.as_os_str().len();
        if walk.entries.len() == limits.max_entries
            || *path_bytes + entry_bytes > limits.max_path_bytes
        {
            walk.truncated = true;
            return Ok(());
        }
        *path_bytes += entry_bytes;
        walk.entries.push(WalkEntry {
            path: entry_path.clone(),
            depth,
            is_directory: file_type == Type::Directory,
            is_file: file_type == Type::File,
            is_symlink: file_type == Type::Symlink,
        });
        if let Some(child) = child
            && depth < limits.max_depth
        {
            walk_directory(&child, &entry_path, depth + 1, limits, walk, path_bytes)?;
            if walk.truncated {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FsErrorKind;
    use crate::test_support::make_fifo;
    use pretty_assertions::assert_eq;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// (path relative to `root`, depth, "d"/"f"/"l"/"-") of each entry.
    fn summary(root: &Path, walk: &Walk) -> Vec<(String, usize, &'static str)> {
        walk.entries
            .iter()
            .map(|e| {
                let kind = match (e.is_directory, e.is_file, e.is_symlink) {
                    (true, false, false) => "d",
                    (false, true, false) => "f",
                    (false, false, true) => "l",
                    (false, false, false) => "-",
                    _ => "?",
                };
                let relative = e.path.strip_prefix(root).unwrap();
                (relative.to_string_lossy().into_owned(), e.depth, kind)
            })
            .collect()
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("b/inner")).unwrap();
        fs::write(root.join("b/inner/deep.txt"), b"").unwrap();
        fs::write(root.join("b/a.txt"), b"").unwrap();
        fs::write(root.join("a.txt"), b"").unwrap();
        fs::create_dir(root.join("c")).unwrap();
        dir
    }

    #[test]
    fn walk_lists_depth_first_sorted_by_name_with_depth_and_kinds() {
        let dir = tree();
        make_fifo(&dir.path().join("c"), "fifo");
        let walk = walk(dir.path(), crate::MAX_TREE_DEPTH, WALK_MAX_ENTRIES).unwrap();
        assert!(!walk.truncated);
        assert_eq!(
            summary(dir.path(), &walk),
            vec![
                ("a.txt".into(), 1, "f"),
                ("b".into(), 1, "d"),
                ("b/a.txt".into(), 2, "f"),
                ("b/inner".into(), 2, "d"),
                ("b/inner/deep.txt".into(), 3, "f"),
                ("c".into(), 1, "d"),
                ("c/fifo".into(), 2, "-"),
            ]
        );
    }

    #[test]
    fn walk_lists_symlinks_below_the_root_without_entering_them() {
        let outside = tree();
        let dir = tempfile::tempdir().unwrap();
        symlink(outside.path(), dir.path().join("escape")).unwrap();
        symlink("missing", dir.path().join("dangling")).unwrap();
        let listed = walk(dir.path(), crate::MAX_TREE_DEPTH, WALK_MAX_ENTRIES).unwrap();
        assert_eq!(
            summary(dir.path(), &listed),
            vec![("dangling".into(), 1, "l"), ("escape".into(), 1, "l")]
        );
        // The root itself is followed when it is a link, as fs/readDirectory does.
        let through = walk(&dir.path().join("escape"), 1, WALK_MAX_ENTRIES).unwrap();
        assert_eq!(through.entries.len(), 3);
    }

    #[test]
    fn walk_truncates_once_the_paths_would_pass_their_byte_bound() {
        let dir = tree();
        let root = dir.path();
        let first_two = root.join("a.txt").as_os_str().len() + root.join("b").as_os_str().len();
        let open_root = open(root, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        for (bound, listed) in [(first_two, 2), (first_two - 1, 1)] {
            let limits = Limits {
                max_depth: 8,
                max_entries: 100,
                max_path_bytes: bound,
            };
            let (mut walk, mut path_bytes) = (Walk::default(), 0);
            walk_directory(&open_root, root, 1, &limits, &mut walk, &mut path_bytes).unwrap();
            assert_eq!(walk.entries.len(), listed, "bound {bound}");
            assert!(walk.truncated);
            assert!(path_bytes <= bound);
        }
    }

    #[test]
    fn walk_stops_at_max_depth_and_truncates_past_max_entries() {
        let dir = tree();
        let shallow = walk(dir.path(), 1, WALK_MAX_ENTRIES).unwrap();
        assert_eq!(
            summary(dir.path(), &shallow),
            vec![
                ("a.txt".into(), 1, "f"),
                ("b".into(), 1, "d"),
                ("c".into(), 1, "d")
            ]
        );
        assert!(!shallow.truncated, "a depth limit is not truncation");
        let cut = walk(dir.path(), crate::MAX_TREE_DEPTH, 3).unwrap();
        assert!(cut.truncated);
        assert_eq!(cut.entries.len(), 3);
        let exact = walk(dir.path(), crate::MAX_TREE_DEPTH, 6).unwrap();
        assert!(!exact.truncated, "exactly max entries is not truncated");
        assert_eq!(exact.entries.len(), 6);
    }

    #[test]
    fn walk_of_a_missing_path_or_a_file_fails_naming_it() {
        let dir = tree();
        let error = walk(&dir.path().join("missing"), 1, 1).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotFound);
        assert_eq!(error.operation(), FsOperation::Walk);
        let error = walk(&dir.path().join("a.txt"), 1, 1).unwrap_err();
        assert_eq!(error.kind(), FsErrorKind::NotADirectory);
    }
}
