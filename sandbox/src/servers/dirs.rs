//! Where the registry lives for a uid, and the checks that make a directory trusted.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::RegistryError;

pub(super) fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The registry directories of `uid`, the one written first.
pub fn registry_dirs(uid: u32) -> Vec<PathBuf> {
    if uid == 0 {
        return vec![PathBuf::from("/run/execward/servers")];
    }
    vec![
        PathBuf::from(format!("/run/user/{uid}/execward/servers")),
        PathBuf::from(format!("/dev/shm/execward-{uid}/servers")),
    ]
}

/// Most other users' registries a root reader reads.
pub const MAX_OTHER_USERS: usize = 256;

/// The registry directories of every uid but root under `run_user` (`/run/user`) and `shm`
/// (`/dev/shm`), with their uid: what a root reader reads besides its own (see
/// [`super::read`]). At most [`MAX_OTHER_USERS`], lowest uids first.
pub(super) fn other_users_dirs(run_user: &Path, shm: &Path) -> Vec<(PathBuf, u32)> {
    let mut found = Vec::new();
    let names = |parent: &Path| -> Vec<String> {
        std::fs::read_dir(parent)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|item| item.file_name().into_string().ok())
            .collect()
    };
    for name in names(run_user) {
        if let Ok(uid @ 1..) = name.parse::<u32>() {
            found.push((run_user.join(&name).join("execward/servers"), uid));
        }
    }
    for name in names(shm) {
        if let Some(Ok(uid @ 1..)) = name.strip_prefix("execward-").map(str::parse::<u32>) {
            found.push((shm.join(&name).join("servers"), uid));
        }
    }
    found.sort_by_key(|(dir, uid)| (*uid, dir.clone()));
    found.truncate(MAX_OTHER_USERS);
    found
}

/// Whether `dir` is the uid's and closed to everyone else.
pub(super) fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
    let meta = dir.symlink_metadata().map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err("not a directory".to_owned());
    }
    if meta.uid() != uid {
        return Err(format!("owned by uid {}", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!("mode {:o}", meta.mode() & 0o7777));
    }
    Ok(())
}

/// Creates `dir` (and its parent) 0700 for `uid`, or checks the existing one.
fn ensure_dir(dir: &Path, uid: u32) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        match std::fs::DirBuilder::new().mode(0o700).create(parent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("{}: {e}", parent.display())),
        }
        private_dir(parent, uid).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.to_string()),
    }
    private_dir(dir, uid)
}

/// Where `uid` writes its entry: the first candidate whose parent exists and is the uid's
/// (`/run/user/UID`), else the last one.
pub(super) fn write_dir(uid: u32) -> Result<PathBuf, RegistryError> {
    let dirs = registry_dirs(uid);
    let mut chosen = dirs.last().cloned().unwrap_or_default();
    if uid != 0 {
        let runtime = PathBuf::from(format!("/run/user/{uid}"));
        if private_dir(&runtime, uid).is_ok() {
            chosen = dirs[0].clone();
        }
    }
    ensure_dir(&chosen, uid).map_err(|reason| RegistryError::Directory {
        path: chosen.clone(),
        uid,
        reason,
    })?;
    Ok(chosen)
}
