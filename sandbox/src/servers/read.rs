//! Reading every entry where a sandbox's policy is resolved: once (a standalone run) or
//! cached and re-read whenever a directory changed (a long-lived server).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::dirs::{euid, other_users_dirs, private_dir, registry_dirs};
use super::entries::{entry_alive, own_pid_namespace, read_entry};
use super::{MAX_REGISTRY_ENTRIES, RACY_WINDOW, Registered, RegistryError, acceptable};

/// Reads every entry of `dirs` (directories that are not the uid's are skipped: none of its
/// servers could have written there).
pub(super) fn read_dirs(dirs: &[PathBuf], uid: u32) -> Result<Registered, RegistryError> {
    let mut registered = Registered::default();
    let own_ns = own_pid_namespace();
    for dir in dirs {
        registered.dirs.push(dir.clone());
        if private_dir(dir, uid).is_err() {
            continue;
        }
        let list_error = |reason: String| RegistryError::List {
            path: dir.clone(),
            reason,
        };
        let listing = std::fs::read_dir(dir).map_err(|e| list_error(e.to_string()))?;
        let mut count = 0;
        for item in listing {
            let item = item.map_err(|e| list_error(e.to_string()))?;
            count += 1;
            if count > MAX_REGISTRY_ENTRIES {
                return Err(list_error(format!(
                    "more than {MAX_REGISTRY_ENTRIES} entries (MAX_REGISTRY_ENTRIES)"
                )));
            }
            let Some(entry) = read_entry(&item.path(), uid)? else {
                continue;
            };
            // A server killed before it could remove its entry (SIGKILL) protects nothing any
            // more: its entry would only make sandboxes fail closed without namespaces.
            if !entry_alive(&entry, own_ns) {
                continue;
            }
            registered
                .hidden
                .extend(entry.hidden.into_iter().filter(|p| acceptable(p)));
            registered
                .read_only
                .extend(entry.read_only.into_iter().filter(|p| acceptable(p)));
            registered.tcp_ports.extend(entry.tcp_ports);
        }
    }
    registered.normalize();
    Ok(registered)
}

/// Where other users' servers register, as a root reader finds them.
const RUN_USER: &str = "/run/user";
/// The other place (when `/run/user/UID` is not the uid's).
const SHM: &str = "/dev/shm";

/// Adds what other uids' servers registered in `dirs` (each with its uid), as root takes it.
///
/// Such a server admits root without a token, and a sandboxed command running as root could
/// otherwise connect to it or read its token, then drive it outside the sandbox. So a root
/// reader refuses their ports and hides (or keeps read-only) their paths, but only the paths
/// that belong to that uid: a user narrows root's sandboxes over nothing but their own files.
/// An entry of another uid that cannot be read is skipped (it could only leave that uid's own
/// server unprotected), so no user can make root's sandboxes fail to build.
pub(super) fn read_other_users(registered: &mut Registered, dirs: &[(PathBuf, u32)]) {
    let own_ns = own_pid_namespace();
    let theirs = |uid: u32| {
        move |path: &PathBuf| {
            acceptable(path) && path.symlink_metadata().is_ok_and(|meta| meta.uid() == uid)
        }
    };
    for (dir, uid) in dirs {
        if private_dir(dir, *uid).is_err() {
            continue;
        }
        registered.dirs.push(dir.clone());
        let Ok(listing) = std::fs::read_dir(dir) else {
            continue;
        };
        for item in listing.flatten().take(MAX_REGISTRY_ENTRIES) {
            let Ok(Some(entry)) = read_entry(&item.path(), *uid) else {
                continue;
            };
            if !entry_alive(&entry, own_ns) {
                continue;
            }
            registered
                .hidden
                .extend(entry.hidden.into_iter().filter(theirs(*uid)));
            registered
                .read_only
                .extend(entry.read_only.into_iter().filter(theirs(*uid)));
            registered.tcp_ports.extend(entry.tcp_ports);
        }
    }
    registered.normalize();
}

/// The other uids' registry directories a reader of `uid` reads: every one for root, none
/// otherwise.
fn other_dirs(uid: u32) -> Vec<(PathBuf, u32)> {
    if uid == 0 {
        other_users_dirs(Path::new(RUN_USER), Path::new(SHM))
    } else {
        Vec::new()
    }
}

/// Reads the registry of the calling process's uid once (a standalone `sandbox-run` or
/// `fs-helper`).
///
/// # Errors
/// [`RegistryError`] when an entry is unreadable or malformed, or there are too many.
pub fn read_registered() -> Result<Registered, RegistryError> {
    let uid = euid();
    let mut registered = read_dirs(&registry_dirs(uid), uid)?;
    read_other_users(&mut registered, &other_dirs(uid));
    Ok(registered)
}

/// Other users' registry directories, each with its uid.
type OtherDirs = Vec<(PathBuf, u32)>;

/// What identifies a directory's state: device, inode, size, change and modification times.
type Stamp = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn stamp(dir: &Path) -> (Stamp, bool) {
    match dir.symlink_metadata() {
        Ok(meta) => {
            let ctime = SystemTime::UNIX_EPOCH.checked_add(Duration::new(
                u64::try_from(meta.ctime()).unwrap_or(0),
                u32::try_from(meta.ctime_nsec()).unwrap_or(0),
            ));
            let changed = meta.modified().ok().into_iter().chain(ctime);
            let racy = changed
                .into_iter()
                .any(|t| t.elapsed().map_or(true, |age| age < RACY_WINDOW));
            (
                Some((
                    meta.dev(),
                    meta.ino(),
                    meta.size(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                    meta.ctime(),
                    meta.ctime_nsec(),
                )),
                racy,
            )
        }
        Err(_) => (None, false),
    }
}

/// The registry as a long-lived server reads it for every sandbox it resolves: re-read whenever
/// a directory changed (or changed too recently to tell), else the copy read last.
#[derive(Debug)]
pub struct RegistryReader {
    uid: u32,
    dirs: Vec<PathBuf>,
    cache: Mutex<Option<(Vec<Stamp>, Registered)>>,
    /// Root's listing of the other users' registry directories, with the stamps of the two
    /// directories it lists (`/dev/shm` may hold thousands of entries of other programs).
    others: Mutex<Option<([Stamp; 2], OtherDirs)>>,
}

impl Default for RegistryReader {
    fn default() -> Self {
        Self::new()
    }
}

impl RegistryReader {
    /// The reader of the calling process's uid.
    pub fn new() -> Self {
        let uid = euid();
        Self {
            uid,
            dirs: registry_dirs(uid),
            cache: Mutex::new(None),
            others: Mutex::new(None),
        }
    }

    /// [`other_dirs`], listed again only when `/run/user` or `/dev/shm` changed (or changed
    /// too recently to tell).
    fn other_dirs(&self) -> OtherDirs {
        if self.uid != 0 {
            return Vec::new();
        }
        let (run_user, racy_run_user) = stamp(Path::new(RUN_USER));
        let (shm, racy_shm) = stamp(Path::new(SHM));
        let stamps = [run_user, shm];
        let mut others = self
            .others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !racy_run_user
            && !racy_shm
            && let Some((cached, dirs)) = others.as_ref()
            && *cached == stamps
        {
            return dirs.clone();
        }
        let dirs = other_dirs(self.uid);
        *others = Some((stamps, dirs.clone()));
        dirs
    }

    /// What every registered server asks of a sandbox, now.
    ///
    /// # Errors
    /// As [`read_registered`].
    pub fn current(&self) -> Result<Registered, RegistryError> {
        let others = self.other_dirs();
        let stamps: Vec<(Stamp, bool)> = self
            .dirs
            .iter()
            .chain(others.iter().map(|(dir, _)| dir))
            .map(|dir| stamp(dir))
            .collect();
        let racy = stamps.iter().any(|(_, racy)| *racy);
        let stamps: Vec<Stamp> = stamps.into_iter().map(|(s, _)| s).collect();
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !racy
            && let Some((cached, registered)) = cache.as_ref()
            && *cached == stamps
        {
            return Ok(registered.clone());
        }
        let mut registered = read_dirs(&self.dirs, self.uid)?;
        read_other_users(&mut registered, &others);
        *cache = Some((stamps, registered.clone()));
        Ok(registered)
    }
}
