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

/// The helper binaries `exec-server` runs, by file name.
pub const HELPER_NAMES: [&str; 3] = ["fs-helper", "sandbox-run", "exec-guardian"];
/// Where an installation keeps the helpers, relative to the directory of `exec-server`
/// (`PREFIX/bin/exec-server` finds `PREFIX/libexec/execward/fs-helper`): internal programs stay
/// out of `$PATH`. See `install.sh`.
pub const INSTALLED_HELPER_DIR: &str = "../libexec/execward";

/// Why the helper paths could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum RuntimePathsError {
    /// The running executable's path is unknown.
    #[error("cannot locate the running executable to find its helpers: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// A configured path is relative.
    #[error("helper path {0:?} must be absolute")]
    Relative(PathBuf),
    /// No directory searched holds every helper.
    #[error(
        "cannot find the helper programs exec-server runs ({}): {}. Build the whole workspace (cargo build \
         --release --workspace; `cargo run --bin exec-server` builds only the server), install \
         with ./install.sh, or pass --helper-dir DIR",
        HELPER_NAMES.join(", "),
        describe_missing(.searched)
    )]
    Missing {
        /// Each directory searched, with the helpers it lacks.
        searched: Vec<(PathBuf, Vec<&'static str>)>,
    },
}

fn describe_missing(searched: &[(PathBuf, Vec<&'static str>)]) -> String {
    searched
        .iter()
        .map(|(dir, missing)| format!("{} lacks {}", dir.display(), missing.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The helpers `dir` lacks (not a regular file there).
fn missing_in(dir: &Path) -> Vec<&'static str> {
    HELPER_NAMES
        .into_iter()
        .filter(|name| !dir.join(name).is_file())
        .collect()
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

    /// Helpers for the running executable: next to it (a build tree, `cargo install`), else in
    /// `INSTALLED_HELPER_DIR` beside its directory (`install.sh`). Never through `$PATH`.
    ///
    /// # Errors
    /// [`RuntimePathsError::CurrentExe`]; [`RuntimePathsError::Missing`] naming every
    /// directory searched and the helpers it lacks.
    pub fn find_for_current_exe() -> Result<Self, RuntimePathsError> {
        let exe = std::env::current_exe().map_err(RuntimePathsError::CurrentExe)?;
        Self::find_for(&exe)
    }

    /// [`Self::find_for_current_exe`] for the executable at `exe`.
    ///
    /// # Errors
    /// As [`Self::find_for_current_exe`].
    pub fn find_for(exe: &Path) -> Result<Self, RuntimePathsError> {
        let dir = exe.parent().unwrap_or(Path::new("/"));
        let installed = std::path::absolute(dir.join(INSTALLED_HELPER_DIR))
            .map(|path| lexically_normal(&path))
            .unwrap_or_else(|_| dir.join(INSTALLED_HELPER_DIR));
        let mut searched = Vec::new();
        for candidate in [dir.to_path_buf(), installed] {
            let missing = missing_in(&candidate);
            if missing.is_empty() {
                return Ok(Self::in_dir(&candidate));
            }
            searched.push((candidate, missing));
        }
        Err(RuntimePathsError::Missing { searched })
    }

    /// Helpers in `dir`, every one of which must exist.
    ///
    /// # Errors
    /// [`RuntimePathsError::Missing`] naming the helpers `dir` lacks.
    pub fn existing_in_dir(dir: &Path) -> Result<Self, RuntimePathsError> {
        let missing = missing_in(dir);
        if missing.is_empty() {
            Ok(Self::in_dir(dir))
        } else {
            Err(RuntimePathsError::Missing {
                searched: vec![(dir.to_path_buf(), missing)],
            })
        }
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

/// `path` without `.` and `..` components (it is absolute), so messages show
/// `/usr/local/libexec/execward`, not `/usr/local/bin/../libexec/execward`.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                normal.pop();
            }
            std::path::Component::CurDir => {}
            other => normal.push(other),
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn touch(dir: &Path, names: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        for name in names {
            std::fs::write(dir.join(name), "").unwrap();
        }
    }

    #[test]
    fn helpers_are_found_next_to_the_server_else_in_libexec() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        let libexec = root.path().join("libexec/execward");
        touch(&bin, &["exec-server"]);
        touch(&libexec, &HELPER_NAMES);
        let exe = bin.join("exec-server");
        assert_eq!(
            ExecServerRuntimePaths::find_for(&exe).unwrap(),
            ExecServerRuntimePaths::in_dir(&libexec)
        );
        touch(&bin, &HELPER_NAMES);
        assert_eq!(
            ExecServerRuntimePaths::find_for(&exe).unwrap(),
            ExecServerRuntimePaths::in_dir(&bin)
        );
    }

    #[test]
    fn missing_helpers_are_named_with_every_place_searched_and_the_fix() {
        let root = tempfile::tempdir().unwrap();
        let bin = root.path().join("bin");
        touch(&bin, &["exec-server", "sandbox-run"]);
        let error = ExecServerRuntimePaths::find_for(&bin.join("exec-server"))
            .unwrap_err()
            .to_string();
        let expected = format!(
            "cannot find the helper programs exec-server runs (fs-helper, sandbox-run, exec-guardian): {} \
             lacks fs-helper, exec-guardian; {} lacks fs-helper, sandbox-run, exec-guardian. \
             Build the whole workspace (cargo build --release --workspace; `cargo run --bin \
             exec-server` builds only the server), install with ./install.sh, or pass \
             --helper-dir DIR",
            bin.display(),
            root.path().join("libexec/execward").display()
        );
        assert_eq!(error, expected);
        let error = ExecServerRuntimePaths::existing_in_dir(&bin)
            .unwrap_err()
            .to_string();
        assert!(error.contains("lacks fs-helper, exec-guardian"), "{error}");
    }
}
