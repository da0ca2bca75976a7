//! The temporary file of an atomic write: beside its target, by descriptor, and never left
//! behind by a writer that dies.
//!
//! 1. **Anonymous first.** The data goes into an `O_TMPFILE` file of the target's directory:
//!    it has no name while it is written and synced, so a writer killed at any point before
//!    the last step leaves nothing. Only complete, it gets a name: the target's own name when
//!    that is free (`linkat`, atomic, never replacing anything), otherwise a fresh temporary
//!    name that is at once renamed over the target.
//! 2. **Named fallback.** Where the filesystem has no `O_TMPFILE`, or anonymous files cannot
//!    be linked here (no `/proc`), the data goes into `.execward-write-*` created with
//!    `O_EXCL`, then renamed over the target.
//! 3. **Locks mark live writers.** Every temporary file is `flock`ed exclusively by its writer
//!    until the rename. Before each atomic write, [`remove_stale`] removes the temporary files
//!    of the directory that nobody holds locked: their writer died (a lock dies with its
//!    process, whatever PID namespace that ran in). A named temporary file left by a killed
//!    writer is gone after the next atomic write in the same directory.
//!
//! Every call works relative to the directory descriptor and never follows a symlink; a
//! temporary name that exists already (a planted file or link) is simply skipped.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, renameat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};

use crate::dirfd::{identity, list_matching, open_below, stat_nofollow};

/// Prefix of the temporary files an atomic write may create next to its target.
pub const ATOMIC_TEMP_PREFIX: &str = ".execward-write-";

/// Attempts at finding an unused temporary name before giving up; names include the pid, a
/// counter and the clock, so a collision means something else is creating the same names.
const TEMP_NAME_ATTEMPTS: usize = 16;

/// Mode of a newly created file before the umask, as for `open(2)` in a shell redirection.
pub(crate) const NEW_FILE_MODE: u32 = 0o666;

/// Where the data is written before it becomes the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// An `O_TMPFILE` file, named only once complete.
    Anonymous,
    /// A `.execward-write-*` file from the start.
    Named,
}

/// Replaces (or creates) `name` in `dir` with a file holding `data`, atomically: readers see
/// the old file or the new one, never a mix. `mode` is the permission bits to give the new file
/// (`None`: a new file, [`NEW_FILE_MODE`] less the umask). Stale temporary files of dead writers
/// in `dir` are removed first.
///
/// # Errors
/// The OS error of the step that failed; the target is then unchanged and no temporary file of
/// this call remains.
pub(crate) fn replace(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    data: &[u8],
    mode: Option<u32>,
) -> io::Result<()> {
    remove_stale(dir);
    let result = match replace_with(dir, name, data, mode, Strategy::Anonymous, &mut || {}) {
        Err(error) if is_unsupported(&error) => {
            replace_with(dir, name, data, mode, Strategy::Named, &mut || {})
        }
        other => other,
    };
    if result.is_ok() {
        sync_directory(dir);
    }
    result
}

/// [`replace`] with a chosen strategy and a hook run after the data is synced and before it is
/// put in place (tests kill the writer there), without the stale-file sweep.
pub(crate) fn replace_with(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    data: &[u8],
    mode: Option<u32>,
    strategy: Strategy,
    before_install: &mut dyn FnMut(),
) -> io::Result<()> {
    match strategy {
        Strategy::Anonymous => {
            if !proc_fd_available() {
                return Err(unsupported());
            }
            let flags = OFlag::O_TMPFILE | OFlag::O_WRONLY;
            let file = match open_below(dir, OsStr::new("."), flags, new_file_mode()) {
                Ok(fd) => File::from(fd),
                // EOPNOTSUPP: the filesystem has no O_TMPFILE; EISDIR: the kernel does not
                // know the flag and saw O_DIRECTORY; EINVAL: either, on some filesystems.
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                    ) =>
                {
                    return Err(unsupported());
                }
                Err(error) => return Err(error),
            };
            lock(&file)?;
            fill(&file, data, mode)?;
            before_install();
            // ENOENT from linking: `/proc/self/fd` does not resolve here after all (or the
            // directory is gone, which the named strategy then reports).
            let unlinkable = |error: io::Error| match error.raw_os_error() {
                Some(libc::ENOENT) => unsupported(),
                _ => error,
            };
            if mode.is_none() {
                match link_anonymous(&file, dir, name) {
                    Ok(()) => return Ok(()),
                    // Created meanwhile: replace it like an existing target.
                    Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(error) => return Err(unlinkable(error)),
                }
            }
            let temp_name = with_fresh_name(|temp_name| link_anonymous(&file, dir, temp_name))
                .map_err(unlinkable)?;
            rename_into_place(dir, &temp_name, name)
        }
        Strategy::Named => {
            let (file, temp_name) = create_named(dir)?;
            let written = fill(&file, data, mode).map(|()| before_install());
            match written {
                Ok(()) => rename_into_place(dir, &temp_name, name),
                Err(error) => {
                    // Best effort: the write already failed, and that error is the one to report.
                    let _ = unlinkat(dir, temp_name.as_os_str(), UnlinkatFlags::NoRemoveDir);
                    Err(error)
                }
            }
        }
    }
}

/// Removes the temporary files in `dir` whose writer is gone (nobody holds their lock). Best
/// effort: an entry that cannot be examined or removed (no permission, a read-only directory
/// under a sandbox) is left alone.
pub(crate) fn remove_stale(dir: BorrowedFd<'_>) {
    let ours = |name: &[u8]| name.starts_with(ATOMIC_TEMP_PREFIX.as_bytes());
    let Ok(entries) = list_matching(dir, ours) else {
        return;
    };
    for (name, _) in entries.flatten() {
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        // A symlink or anything but a regular file with this name is not ours: left alone.
        let Ok(fd) = open_below(dir, &name, flags, Mode::empty()) else {
            continue;
        };
        let file = File::from(fd);
        if !file.metadata().is_ok_and(|m| m.is_file()) || file.try_lock().is_err() {
            continue;
        }
        if still_named(dir, &name, &file) {
            let _ = unlinkat(dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

fn unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "anonymous temporary files are not available here",
    )
}

fn is_unsupported(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::Unsupported && error.raw_os_error().is_none()
}

/// Linking an anonymous file needs `/proc/self/fd` (`linkat` with `AT_EMPTY_PATH` needs
/// `CAP_DAC_READ_SEARCH`, which sandboxed helpers never hold). Checked once per process.
fn proc_fd_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| Path::new("/proc/self/fd").is_dir())
}

fn new_file_mode() -> Mode {
    Mode::from_bits_truncate(NEW_FILE_MODE)
}

fn lock(file: &File) -> io::Result<()> {
    file.try_lock().map_err(|error| match error {
        std::fs::TryLockError::Error(error) => error,
        std::fs::TryLockError::WouldBlock => io::Error::from(io::ErrorKind::WouldBlock),
    })
}

/// Gives the file its mode, writes the data and makes it durable.
fn fill(mut file: &File, data: &[u8], mode: Option<u32>) -> io::Result<()> {
    if let Some(mode) = mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))?;
    }
    file.write_all(data)?;
    file.sync_all()
}

/// Gives the anonymous `file` the name `name` in `dir` (fails with `EEXIST` if taken).
fn link_anonymous(file: &File, dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let magic = format!("/proc/self/fd/{}", file.as_raw_fd());
    linkat(
        AT_FDCWD,
        magic.as_str(),
        dir,
        name,
        AtFlags::AT_SYMLINK_FOLLOW,
    )
    .map_err(io::Error::from)
}

/// Calls `create` with fresh temporary names until one is free.
fn with_fresh_name(mut create: impl FnMut(&OsStr) -> io::Result<()>) -> io::Result<OsString> {
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
        match create(&name) {
            Ok(()) => return Ok(name),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = error,
            Err(error) => return Err(error),
        }
    }
    Err(last_error)
}

/// Creates and locks a new named temporary file in `dir`.
fn create_named(dir: BorrowedFd<'_>) -> io::Result<(File, OsString)> {
    let mut created = None;
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
    let name = with_fresh_name(|name| {
        let file = File::from(open_below(dir, name, flags, new_file_mode())?);
        // A sweep by another writer may hold the lock for a moment, or may have removed the
        // name between the create and the lock: then this name is lost, take another.
        if lock(&file).is_err() || !still_named(dir, name, &file) {
            let _ = unlinkat(dir, name, UnlinkatFlags::NoRemoveDir);
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        created = Some(file);
        Ok(())
    })?;
    let file = created.ok_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists))?;
    Ok((file, name))
}

/// Whether `name` in `dir` is still `file` (not removed or replaced meanwhile).
fn still_named(dir: BorrowedFd<'_>, name: &OsStr, file: &File) -> bool {
    match (stat_nofollow(dir, name), file.metadata()) {
        (Ok(stat), Ok(meta)) => identity(&stat) == (meta.dev(), meta.ino()),
        _ => false,
    }
}

/// Renames `temp_name` over `name`; removes `temp_name` if that fails.
fn rename_into_place(dir: BorrowedFd<'_>, temp_name: &OsStr, name: &OsStr) -> io::Result<()> {
    renameat(dir, temp_name, dir, name).map_err(|error| {
        let _ = unlinkat(dir, temp_name, UnlinkatFlags::NoRemoveDir);
        io::Error::from(error)
    })
}

/// Makes the new name durable. The target is already replaced, so a failure (some filesystems
/// refuse `fsync` on directories, a directory may be unreadable) is not a failed write.
fn sync_directory(dir: BorrowedFd<'_>) {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if let Ok(fd) = nix::fcntl::openat(dir.as_fd(), ".", flags, Mode::empty()) {
        let _ = File::from(fd).sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dirfd::open_path_dir;
    use crate::test_support::entry_names;
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;
    use std::process::Command;

    /// Set for the child process of [`writer_killed_before_install_leaves_nothing_anonymous`]
    /// and its named twin: the directory to write in and the strategy.
    const CHILD_DIR: &str = "EXECWARD_TEMP_TEST_DIR";
    const CHILD_STRATEGY: &str = "EXECWARD_TEMP_TEST_STRATEGY";

    /// Not a test of its own: the body of the child process the two tests below start. It
    /// writes a file and dies (SIGABRT) after syncing the data, before putting it in place.
    #[test]
    #[ignore = "run by writer_killed_before_install_* in a child process"]
    fn child_writer_dies_before_install() {
        let dir = PathBuf::from(std::env::var_os(CHILD_DIR).unwrap());
        let strategy = match std::env::var(CHILD_STRATEGY).unwrap().as_str() {
            "anonymous" => Strategy::Anonymous,
            _ => Strategy::Named,
        };
        let fd = open_path_dir(&dir).unwrap();
        let _ = replace_with(
            fd.as_fd(),
            OsStr::new("target"),
            b"new content",
            Some(0o644),
            strategy,
            &mut || std::process::abort(),
        );
        panic!("the writer should have died before installing its file");
    }

    fn kill_writer_before_install(dir: &Path, strategy: &str) {
        let output = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "temp::tests::child_writer_dies_before_install",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_DIR, dir)
            .env(CHILD_STRATEGY, strategy)
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "the child writer should have been killed: {output:?}"
        );
        assert_eq!(std::fs::read(dir.join("target")).unwrap(), b"old content");
    }

    #[test]
    fn writer_killed_before_install_leaves_nothing_anonymous() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target"), b"old content").unwrap();
        kill_writer_before_install(dir.path(), "anonymous");
        assert_eq!(entry_names(dir.path()), vec![OsString::from("target")]);
    }

    #[test]
    fn temp_file_of_a_killed_named_writer_is_removed_by_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("target"), b"old content").unwrap();
        kill_writer_before_install(dir.path(), "named");
        let names = entry_names(dir.path());
        assert_eq!(
            names.len(),
            2,
            "the dead writer's file stays until a sweep: {names:?}"
        );
        let fd = open_path_dir(dir.path()).unwrap();
        replace(fd.as_fd(), OsStr::new("other"), b"x", None).unwrap();
        assert_eq!(
            entry_names(dir.path()),
            ["other", "target"].map(OsString::from).to_vec()
        );
    }

    #[test]
    fn sweep_keeps_temp_files_whose_writer_is_alive_and_files_that_are_not_ours() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join(format!("{ATOMIC_TEMP_PREFIX}live"));
        let held = File::create(&live).unwrap();
        held.try_lock().unwrap();
        let dead = dir.path().join(format!("{ATOMIC_TEMP_PREFIX}dead"));
        std::fs::write(&dead, b"").unwrap();
        let link = dir.path().join(format!("{ATOMIC_TEMP_PREFIX}link"));
        symlink(&live, &link).unwrap();
        std::fs::create_dir(dir.path().join(format!("{ATOMIC_TEMP_PREFIX}dir"))).unwrap();
        remove_stale(open_path_dir(dir.path()).unwrap().as_fd());
        let mut expected: Vec<OsString> = ["dir", "link", "live"]
            .map(|n| OsString::from(format!("{ATOMIC_TEMP_PREFIX}{n}")))
            .to_vec();
        expected.sort();
        assert_eq!(entry_names(dir.path()), expected);
    }

    #[test]
    fn both_strategies_replace_and_create_and_leave_no_temp_file() {
        for strategy in [Strategy::Anonymous, Strategy::Named] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("old"), b"old").unwrap();
            let fd = open_path_dir(dir.path()).unwrap();
            for name in ["old", "new"] {
                replace_with(
                    fd.as_fd(),
                    OsStr::new(name),
                    b"data",
                    None,
                    strategy,
                    &mut || {},
                )
                .unwrap();
                assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), b"data");
            }
            assert_eq!(
                entry_names(dir.path()),
                ["new", "old"].map(OsString::from).to_vec(),
                "{strategy:?}"
            );
        }
    }

    #[test]
    fn a_planted_temp_name_is_skipped_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let fd = open_path_dir(dir.path()).unwrap();
        let mut planted = Vec::new();
        let name = with_fresh_name(|name| {
            // Plant a link at the first name tried: it must be skipped.
            if planted.is_empty() {
                symlink(outside.path().join("victim"), dir.path().join(name)).unwrap();
                planted.push(name.to_os_string());
            }
            open_below(
                fd.as_fd(),
                name,
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                new_file_mode(),
            )
            .map(drop)
        })
        .unwrap();
        assert_ne!(name, planted[0]);
        assert!(!outside.path().join("victim").exists());
    }
}
