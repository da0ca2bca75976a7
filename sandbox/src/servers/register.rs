//! A server's own entry: written before it listens, removed when it exits, and the dead
//! servers' entries pruned on the way.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::dirs::{euid, write_dir};
use super::entries::{entry_alive, own_pid_namespace, process_identity, read_entry};
use super::{ENTRY_SUFFIX, Entry, MAX_REGISTRY_ENTRIES, RegistryError};

/// A server's registration; the entry is removed when this is dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// Writes this process's entry (and removes the entries of servers that are gone): the
    /// paths to hide and to keep read-only, and the TCP ports it listens on.
    ///
    /// # Errors
    /// [`RegistryError`] when the directory cannot be created or is not private, or the entry
    /// cannot be written: a server that cannot register must not start, or its secrets would be
    /// open to every other server's sandboxes.
    pub fn register(
        hidden: &[PathBuf],
        read_only: &[PathBuf],
        tcp_ports: &[u16],
    ) -> Result<Self, RegistryError> {
        let uid = euid();
        let dir = write_dir(uid)?;
        prune_dead(&dir);
        let pid = std::process::id();
        let (start_time, pid_namespace) = process_identity(pid).unwrap_or_default();
        let absolute = |paths: &[PathBuf]| -> Vec<PathBuf> {
            paths
                .iter()
                .filter_map(|p| std::path::absolute(p).ok())
                .collect()
        };
        let entry = Entry {
            pid,
            start_time,
            pid_namespace,
            hidden: absolute(hidden),
            read_only: absolute(read_only),
            tcp_ports: tcp_ports.to_vec(),
        };
        let text = serde_json::to_vec_pretty(&entry).unwrap_or_default();
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!("{pid}-{nonce}");
        let temporary = dir.join(format!(".{name}.tmp"));
        let path = dir.join(format!("{name}{ENTRY_SUFFIX}"));
        let write_error = |source| RegistryError::Write {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)
            .map_err(write_error)?;
        std::io::Write::write_all(&mut file, &text).map_err(write_error)?;
        drop(file);
        std::fs::rename(&temporary, &path).map_err(|source| {
            let _ = std::fs::remove_file(&temporary);
            write_error(source)
        })?;
        Ok(Self { path })
    }

    /// The entry file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes the entries of processes of this PID namespace that are gone.
pub(super) fn prune_dead(dir: &Path) {
    let own_ns = own_pid_namespace();
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten().take(MAX_REGISTRY_ENTRIES) {
        let path = item.path();
        let Ok(entry) = read_entry(&path, euid()) else {
            continue;
        };
        let Some(entry) = entry else { continue };
        if entry.pid_namespace == own_ns && own_ns != 0 && !entry_alive(&entry, own_ns) {
            let _ = std::fs::remove_file(&path);
        }
    }
}
