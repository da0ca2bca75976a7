//! Test fixtures that hold wherever the checkout and its target directory live, and whoever runs
//! them (root, or the unprivileged uid the sandbox tests drop to).
//!
//! Two things used to depend on the checkout's location:
//! - "outside" directories were created under `CARGO_TARGET_TMPDIR` (`<repo>/target/tmp`), which
//!   is inside a writable root when the clone lives under `/tmp` (workspace-write makes `/tmp`
//!   writable), so "the write outside was denied" failed;
//! - the unprivileged uid could not traverse a 0700 home (`/root/...`) to reach the fixtures or
//!   execute the test binaries, so every uid-65534 case failed with `EACCES`.
//!
//! [`scratch_base`] picks a directory outside every writable root the tests' policies grant and
//! traversable by everyone; [`traversable`] gives a copy of an executable that everyone can run.
//! This file is shared by the `tests` crate and, through `#[path]`, by the sandbox and fs-helper
//! integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where fixture directories may live, in order of preference. Each must be outside `/tmp` (a
/// writable root of workspace-write) and is rejected when `$TMPDIR` (another writable root)
/// contains it.
const SCRATCH_CANDIDATES: &[&str] = &["/var/tmp", "/srv", "/var/lib", "/opt"];
/// Name of the shared directory created under the chosen candidate.
const SCRATCH_DIR_NAME: &str = "execward-tests";

/// The directory fixtures are created in: outside `/tmp` and `$TMPDIR`, and every ancestor (and
/// the directory itself, mode 1777) traversable by any uid. Panics, naming what it tried, when
/// this machine has no such place.
pub fn scratch_base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut tried = Vec::new();
        for candidate in SCRATCH_CANDIDATES {
            let candidate = Path::new(candidate);
            match usable_scratch(candidate) {
                Ok(base) => return base,
                Err(reason) => tried.push(format!("{}: {reason}", candidate.display())),
            }
        }
        panic!(
            "no directory for sandbox test fixtures outside every writable root (/tmp, $TMPDIR) \
             and traversable by an unprivileged uid; tried {}",
            tried.join("; ")
        )
    })
}

fn usable_scratch(candidate: &Path) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(candidate).map_err(|e| e.to_string())?;
    for writable in writable_roots_of_test_policies() {
        if canonical.starts_with(&writable) {
            return Err(format!("inside writable root {}", writable.display()));
        }
    }
    if let Some(blocked) = first_untraversable(&canonical) {
        return Err(format!(
            "{} is not traversable by others",
            blocked.display()
        ));
    }
    let base = canonical.join(SCRATCH_DIR_NAME);
    match std::fs::create_dir(&base) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", base.display())),
    }
    let meta = std::fs::symlink_metadata(&base).map_err(|e| e.to_string())?;
    if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!(
            "{} exists but is not a directory owned by us",
            base.display()
        ));
    }
    // Sticky and world-writable like /tmp: every fixture below is created by its own test.
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| e.to_string())?;
    Ok(base)
}

/// `/tmp` and `$TMPDIR` (canonical), which workspace-write makes writable.
fn writable_roots_of_test_policies() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/tmp")];
    roots.extend(
        std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute()),
    );
    roots
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect()
}

/// The first directory on the way to `path` (inclusive) that others cannot traverse.
fn first_untraversable(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .filter(|dir| std::fs::metadata(dir).map_or(true, |m| m.is_dir() && m.mode() & 0o001 == 0))
        .last()
        .map(Path::to_owned)
}

/// A fresh directory under [`scratch_base`], mode 0755 (the unprivileged uid can traverse it),
/// removed when dropped.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(scratch_base())
        .expect("fixture directory under the scratch base");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod fixture directory");
    dir
}

/// `path` itself when any uid can execute it (every ancestor traversable, the file o+rx) and a
/// sandbox sees it where it is; otherwise a copy in a 0755 directory under [`scratch_base`], made
/// once per process. Two kinds of checkout need the copy: one under a 0700 home keeps its binaries
/// where the unprivileged uid cannot reach them, and one under `/tmp`, `/run` or `$TMPDIR` keeps
/// them where every sandbox mounts a private, empty directory (a clone in `/tmp/x` with 0755
/// parents passes the first test and fails the second).
pub fn traversable(path: &Path) -> PathBuf {
    static COPIES: OnceLock<Mutex<HashMap<PathBuf, PathBuf>>> = OnceLock::new();
    let runnable = std::fs::metadata(path).is_ok_and(|m| m.mode() & 0o005 == 0o005)
        && path
            .parent()
            .is_none_or(|dir| first_untraversable(dir).is_none())
        && !hidden_by_sandboxes(path);
    if runnable {
        return path.to_owned();
    }
    let mut copies = COPIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    copies
        .entry(path.to_owned())
        .or_insert_with(|| {
            let dir = tempfile::Builder::new()
                .prefix("bin-")
                .tempdir_in(scratch_base())
                .expect("directory for a traversable binary")
                .keep();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            let copy = dir.join(path.file_name().expect("a file name"));
            copy_executable(path, &copy);
            CopiedBinaries::register(dir);
            copy
        })
        .clone()
}

/// [`traversable`] for a binary that starts `siblings` from its own directory (`sandbox-run`
/// starts `egress-proxy` next to it): where `path` is copied, each sibling is copied beside it.
pub fn traversable_with(path: &Path, siblings: &[&Path]) -> PathBuf {
    static SIBLINGS: Mutex<()> = Mutex::new(());
    let copy = traversable(path);
    if copy != path {
        let _copying = SIBLINGS.lock().unwrap_or_else(|p| p.into_inner());
        let dir = copy.parent().expect("a copy lives in a directory");
        for sibling in siblings {
            let to = dir.join(sibling.file_name().expect("a file name"));
            if !to.exists() {
                copy_executable(sibling, &to);
            }
        }
    }
    copy
}

/// Copy the executable `from` to `to`, mode 0755, in a `cp` process of its own. Copied here, the
/// copy's writable descriptor would be inherited by any child another test thread forks
/// meanwhile, and executing the copy would fail with `ETXTBSY` until that child execs.
pub fn copy_executable(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        status.success(),
        "cp {} {}: {status}",
        from.display(),
        to.display()
    );
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether `path` lies where a sandbox sees a private directory of its own instead of the host's:
/// `/tmp`, `/run` and `$TMPDIR` (canonical, so `/var/run` counts as `/run`).
pub fn hidden_by_sandboxes(path: &Path) -> bool {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let run = std::fs::canonicalize("/run").unwrap_or_else(|_| PathBuf::from("/run"));
    writable_roots_of_test_policies()
        .into_iter()
        .chain([run])
        .any(|dir| canonical.starts_with(dir))
}

/// Removes the copied binaries' directories when the test process exits normally.
struct CopiedBinaries;

impl CopiedBinaries {
    fn register(dir: PathBuf) {
        static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
        extern "C" fn cleanup() {
            for dir in DIRS.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        let mut dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
        if dirs.is_empty() {
            // Without the hook the copies stay behind: nothing else depends on it.
            let _ = sys::at_exit(cleanup);
        }
        dirs.push(dir);
    }
}

/// Panics unless `path` is outside `/tmp` and `$TMPDIR`: a fixture that must be unwritable under
/// workspace-write.
pub fn assert_outside_writable_roots(path: &Path) {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    for root in writable_roots_of_test_policies() {
        assert!(
            !canonical.starts_with(&root),
            "fixture {} is inside the writable root {}; the test would prove nothing",
            canonical.display(),
            root.display()
        );
    }
}

// This file is also compiled into other crates' tests (`#[path]`), so its one raw call has a
// `sys` module of its own rather than the test library's.
#[allow(unsafe_code)]
mod sys {
    use std::io;

    /// Registers `cleanup` to run at process exit (`atexit(3)`).
    ///
    /// # Errors
    /// When the C library refuses (out of memory).
    pub fn at_exit(cleanup: extern "C" fn()) -> io::Result<()> {
        // SAFETY: registers a plain extern "C" function with no captured state.
        if unsafe { libc::atexit(cleanup) } != 0 {
            return Err(io::Error::other("atexit failed"));
        }
        Ok(())
    }
}
