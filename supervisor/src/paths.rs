//! Absolute paths of the helper binaries the server execs.

use std::path::{Path, PathBuf};

/// Absolute paths of the helpers. Found next to the running executable by default, never
/// through `$PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecServerRuntimePaths {
    /// The `fs-helper` binary (sandboxed filesystem operations).
    pub fs_helper: PathBuf,
    /// The `sandbox-run` binary (sandboxed spawns).
    pub sandbox_run: PathBuf,
    /// The `exec-guardian` binary (kills the server's process groups if the server dies).
    pub guardian: PathBuf,
}

/// Why the helper paths could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum RuntimePathsError {
    /// The running executable's path is unknown.
    #[error("cannot locate the running executable to find its helpers: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// A configured path is relative.
    #[error("helper path {0:?} must be absolute")]
    Relative(PathBuf),
}

impl ExecServerRuntimePaths {
    /// Helpers in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            fs_helper: dir.join("fs-helper"),
            sandbox_run: dir.join("sandbox-run"),
            guardian: dir.join("exec-guardian"),
        }
    }

    /// Helpers next to the running executable.
    ///
    /// # Errors
    /// [`RuntimePathsError::CurrentExe`] when the executable's path cannot be read.
    pub fn next_to_current_exe() -> Result<Self, RuntimePathsError> {
        let exe = std::env::current_exe().map_err(RuntimePathsError::CurrentExe)?;
        let dir = exe.parent().unwrap_or(Path::new("/"));
        Ok(Self::in_dir(dir))
    }

    /// Explicit paths; both must be absolute.
    ///
    /// # Errors
    /// [`RuntimePathsError::Relative`] for a relative path.
    pub fn new(
        fs_helper: PathBuf,
        sandbox_run: PathBuf,
        guardian: PathBuf,
    ) -> Result<Self, RuntimePathsError> {
        for path in [&fs_helper, &sandbox_run, &guardian] {
            if !path.is_absolute() {
                return Err(RuntimePathsError::Relative(path.clone()));
            }
        }
        Ok(Self {
            fs_helper,
            sandbox_run,
            guardian,
        })
    }
}
