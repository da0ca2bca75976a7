//! One cgroup directory and its interface files: create, configure, join, kill, read counters,
//! remove. Works the same for v2 and v1 directories; which files exist is the caller's business.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::ContainmentError;

/// A cgroup directory this server created (or will create).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDir {
    path: PathBuf,
}

impl CgroupDir {
    /// The directory at `path`, not touched yet.
    pub fn at(path: PathBuf) -> Self {
        Self { path }
    }

    /// Create the directory (the kernel fills it with its interface files).
    ///
    /// # Errors
    /// [`ContainmentError::Create`] (`EEXIST` included).
    pub fn create(path: PathBuf) -> Result<Self, ContainmentError> {
        match std::fs::create_dir(&path) {
            Ok(()) => Ok(Self { path }),
            Err(source) => Err(ContainmentError::Create { path, source }),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A directory below this one.
    pub fn child(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Whether an interface file exists (controllers and kernel versions differ).
    pub fn has(&self, file: &str) -> bool {
        self.path.join(file).exists()
    }

    /// Write `value` to interface file `file` in one `write`, as the kernel expects.
    ///
    /// # Errors
    /// [`ContainmentError::Write`].
    pub fn write(&self, file: &str, value: &str) -> Result<(), ContainmentError> {
        let path = self.path.join(file);
        let result = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut opened| opened.write_all(value.as_bytes()));
        result.map_err(|source| ContainmentError::Write {
            path,
            value: value.to_owned(),
            source,
        })
    }

    /// The content of interface file `file`.
    ///
    /// # Errors
    /// [`ContainmentError::Read`].
    pub fn read(&self, file: &str) -> Result<String, ContainmentError> {
        let path = self.path.join(file);
        std::fs::read_to_string(&path).map_err(|source| ContainmentError::Read { path, source })
    }

    /// The value of `key` in a flat-keyed file (`memory.events`, `cgroup.events`, `cpu.stat`,
    /// `memory.oom_control`: one `key value` per line); `None` when the file or key is missing.
    pub fn keyed(&self, file: &str, key: &str) -> Option<u64> {
        keyed_value(&self.read(file).ok()?, key)
    }

    /// `cgroup.procs` opened for writing, for the child to join with (close-on-exec).
    ///
    /// # Errors
    /// [`ContainmentError::Join`].
    pub fn open_procs(&self) -> Result<OwnedFd, ContainmentError> {
        let path = self.path.join("cgroup.procs");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map(OwnedFd::from)
            .map_err(|source| ContainmentError::Join { path, source })
    }

    /// The directory itself, opened read-only (close-on-exec), for a child to be born in
    /// (`clone3(CLONE_INTO_CGROUP)` takes a directory descriptor).
    ///
    /// # Errors
    /// [`ContainmentError::Join`].
    pub fn open_directory(&self) -> Result<OwnedFd, ContainmentError> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&self.path)
            .map(OwnedFd::from)
            .map_err(|source| ContainmentError::Join {
                path: self.path.clone(),
                source,
            })
    }

    /// v2: some process is in this cgroup or below (`cgroup.events` `populated`). A directory
    /// that is gone or unreadable counts as empty.
    pub fn populated(&self) -> bool {
        self.keyed("cgroup.events", "populated")
            .is_some_and(|populated| populated != 0)
    }

    /// v1: some process is in this very cgroup (v1 has no `cgroup.events`).
    pub fn has_processes(&self) -> bool {
        self.read("cgroup.procs")
            .is_ok_and(|procs| !procs.trim().is_empty())
    }

    /// v2: SIGKILL every process in this cgroup and below, at once (`cgroup.kill`, Linux 5.14);
    /// a process forking meanwhile cannot escape it.
    ///
    /// # Errors
    /// [`ContainmentError::Write`].
    pub fn kill(&self) -> Result<(), ContainmentError> {
        self.write("cgroup.kill", "1")
    }

    /// Remove the directory and any child directories (each must be empty of processes).
    /// Missing directories are fine.
    ///
    /// # Errors
    /// [`ContainmentError::Remove`] for the first directory that could not be removed.
    pub fn remove_tree(&self) -> Result<(), ContainmentError> {
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    CgroupDir::at(entry.path()).remove_tree()?;
                }
            }
        }
        match std::fs::remove_dir(&self.path) {
            Err(source) if source.kind() != std::io::ErrorKind::NotFound => {
                Err(ContainmentError::Remove {
                    path: self.path.clone(),
                    source,
                })
            }
            _ => Ok(()),
        }
    }
}

/// The value of `key` in `key value` lines.
pub fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_are_read_by_key() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(events, "oom_kill"), Some(2));
        assert_eq!(keyed_value(events, "oom"), Some(1));
        assert_eq!(keyed_value(events, "missing"), None);
        let control = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        assert_eq!(keyed_value(control, "oom_kill"), Some(1));
    }
}
