//! Turning kernel auditing on for the length of a run, and back off afterwards, safely when
//! several audited runs overlap.
//!
//! State lives in [`STATE_DIR`] (root only): an exclusive `flock` on `lock` serialises changes;
//! each running collector owns `holder.PID`; `enabled-by-execward` records that auditing was
//! off before the first holder turned it on. The last holder to leave turns it off again. A
//! holder whose process died is pruned, so a crash cannot keep auditing on forever (the next
//! run that leaves turns it off).

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::netlink::{Control, NetlinkError};

/// Where the shared state lives.
pub const STATE_DIR: &str = "/run/execward/audit";
/// The marker: auditing was off and an execward collector turned it on.
const MARKER: &str = "enabled-by-execward";

/// Why auditing could not be turned on.
#[derive(Debug, thiserror::Error)]
pub enum EnableError {
    /// The state directory or its lock could not be used.
    #[error("audit state {path}: {source}")]
    State {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The kernel refused.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// One collector's claim on "auditing is on". Call [`EnableGuard::release`] when done.
#[derive(Debug)]
pub struct EnableGuard {
    holder: PathBuf,
    /// Whether this run found auditing off (for the report).
    pub turned_on: bool,
}

/// Makes sure auditing is on, turning it on when it is off, and registers this process.
///
/// # Errors
/// [`EnableError`] when the state cannot be kept or the kernel refuses `AUDIT_SET`.
pub fn acquire(control: &mut Control) -> Result<EnableGuard, EnableError> {
    let dir = Path::new(STATE_DIR);
    let state_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EnableError::State { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(state_err(dir))?;
    let _lock = lock(dir)?;
    prune_dead_holders(dir);
    let status = control.status()?;
    let mut turned_on = false;
    if status.enabled == 0 {
        control.set_enabled(true)?;
        let marker = dir.join(MARKER);
        fs::write(&marker, b"").map_err(state_err(&marker))?;
        turned_on = true;
    }
    let holder = dir.join(format!("holder.{}", std::process::id()));
    fs::write(&holder, b"").map_err(state_err(&holder))?;
    Ok(EnableGuard { holder, turned_on })
}

impl EnableGuard {
    /// Unregisters; the last holder turns auditing off again if an execward collector turned
    /// it on. Returns a message when restoring failed.
    pub fn release(self, control: &mut Control) -> Option<String> {
        let dir = Path::new(STATE_DIR);
        let _lock = match lock(dir) {
            Ok(lock) => lock,
            Err(err) => return Some(err.to_string()),
        };
        let _ = fs::remove_file(&self.holder);
        prune_dead_holders(dir);
        let others = holders(dir).next().is_some();
        let marker = dir.join(MARKER);
        if others || !marker.exists() {
            return None;
        }
        let result = control.set_enabled(false);
        let _ = fs::remove_file(&marker);
        result
            .err()
            .map(|err| format!("turning auditing back off failed: {err}"))
    }
}

fn lock(dir: &Path) -> Result<Flock<File>, EnableError> {
    let path = dir.join("lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| EnableError::State {
            path: path.clone(),
            source,
        })?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| EnableError::State {
        path,
        source: errno.into(),
    })
}

fn holders(dir: &Path) -> impl Iterator<Item = (PathBuf, u32)> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name.to_str()?.strip_prefix("holder.")?.parse().ok()?;
            Some((entry.path(), pid))
        })
}

fn prune_dead_holders(dir: &Path) {
    for (path, pid) in holders(dir).collect::<Vec<_>>() {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_file(path);
        }
    }
}
