//! The per-user registry of running execward servers: what each must keep from every sandbox on
//! the host, not only from its own.
//!
//! A server hides its own token, key and identity files and its unix socket from the sandboxes it
//! builds. A sandbox of another server on the same host, run by the same user, could still read
//! them (same uid, mode 0600 does not help) and drive that server unsandboxed. So:
//!
//! - **Register.** Before it listens, every server writes one entry into the registry directory
//!   ([`Registration::register`]): its pid, and the paths to hide (`hidden`) and to keep
//!   read-only (`readOnly`: its binaries). The entry is written under a temporary name and
//!   renamed, so a reader never sees half of one; it is removed when the server exits.
//! - **Read where the layout is resolved.** Every process that resolves a sandbox's policy (the
//!   server for each request, a standalone `sandbox-run` or `fs-helper`) reads every entry there,
//!   in the trusted process before anything is confined, and adds each path to the policy
//!   ([`Registered::apply`]): hidden paths are masked and denied, read-only paths bound
//!   read-only. The policy then differs from one resolved before the other server started, so a
//!   launcher or pooled helper built before is not reused for it (they are keyed by policy).
//! - **Where.** Root: `/run/execward/servers`. Another uid: `/run/user/UID/execward/servers`
//!   when `/run/user/UID` is the uid's, else `/dev/shm/execward-UID/servers`; readers read every
//!   candidate. `/run` and `/dev/shm` are private, empty tmpfs in every sandbox with the mount
//!   layer, neither is writable under the built-in profiles (Landlock), and a directory the
//!   policy would let the command write is hidden besides, so no sandbox changes the registry.
//!   (Not `/tmp`: workspace-write makes it writable, which without the mount layer is the
//!   host's.)
//! - **Trust.** A directory is used only when it belongs to the uid and nobody else may enter
//!   it (mode 0700); an entry only when it belongs to the uid. An entry only ever adds masks and
//!   read-only binds: a hostile entry can narrow what a sandbox sees, never widen it. An entry
//!   that does not parse, or more entries than [`MAX_REGISTRY_ENTRIES`], fail the resolution
//!   (ignoring them could leave a server's secret visible).
//! - **Stale entries.** A server killed before it removed its entry leaves it behind; readers
//!   still mask its paths (that can only narrow). A server starting removes the entries whose
//!   process is gone (pid and start time, in its own PID namespace).

use std::ffi::OsStr;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::ResolvedPolicy;

/// Most entries one registry directory may hold. A host runs a handful of servers; past this the
/// directory is not one servers wrote, and resolution fails rather than read part of it.
pub const MAX_REGISTRY_ENTRIES: usize = 1024;
/// Largest entry file, in bytes (a server writes a few paths).
pub const MAX_ENTRY_BYTES: u64 = 64 * 1024;
/// Most paths of each kind one entry may name.
pub const MAX_ENTRY_PATHS: usize = 64;
/// A directory changed this recently may change again within the same timestamp tick (coarse
/// kernel clocks), so [`RegistryReader`] does not trust its cached copy of it.
const RACY_WINDOW: Duration = Duration::from_secs(2);
/// Suffix of entry files; anything else in the directory (a temporary file) is ignored.
const ENTRY_SUFFIX: &str = ".json";

/// Why the registry could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The directory cannot be created or is not private to the uid.
    #[error(
        "cannot use the server registry directory {path}: {reason} (it must belong to uid {uid} \
         and have mode 0700)"
    )]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The uid that needs it.
        uid: u32,
        /// What was wrong.
        reason: String,
    },
    /// The entry could not be written.
    #[error("cannot write the server registry entry {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An entry could not be read or does not parse.
    #[error(
        "server registry entry {path} is unreadable ({reason}); a sandbox is not built without \
         it, remove the file if no execward server owns it"
    )]
    Entry {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The directory could not be listed, or holds too many entries.
    #[error("cannot read the server registry directory {path}: {reason}")]
    List {
        /// The directory.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// One server's entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The server's pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22): with the pid, tells a
    /// live server from a reused pid.
    #[serde(default)]
    pub start_time: u64,
    /// The inode of its PID namespace (pids of another namespace are not checked).
    #[serde(default)]
    pub pid_namespace: u64,
    /// Paths no sandbox may see: token, key and identity files, unix sockets.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// Paths every sandbox keeps read-only: the server's binaries.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
}

/// What every registered server asks of a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registered {
    /// The registry directories.
    pub dirs: Vec<PathBuf>,
    /// Paths to hide.
    pub hidden: Vec<PathBuf>,
    /// Paths to keep read-only.
    pub read_only: Vec<PathBuf>,
}

impl Registered {
    /// Adds the registered paths that matter to `policy` (masks and read-only binds only:
    /// narrower): every hidden path that exists (one that does not needs no mask; when it
    /// appears, the next resolution adds it), and every read-only path the policy would let
    /// the command write. What changes nothing in the layout stays out, so a launcher is not
    /// rebuilt whenever an unrelated server starts or stops.
    ///
    /// A registry directory the policy would let the command write is hidden too (a command
    /// that removed an entry would unmask that server for the next sandbox); one it can only
    /// read holds nothing secret (paths), and a private `/run` or `/tmp` hides it anyway.
    pub fn apply(&self, mut policy: ResolvedPolicy) -> ResolvedPolicy {
        for dir in &self.dirs {
            let writable = !policy.restricts_filesystem() || policy.can_write(dir);
            if writable && dir.symlink_metadata().is_ok() {
                policy = policy.with_hidden_path(dir);
            }
        }
        for path in &self.hidden {
            if path.symlink_metadata().is_ok() {
                policy = policy.with_hidden_path(path);
            }
        }
        for path in &self.read_only {
            let writable = !policy.restricts_filesystem() || policy.can_write(path);
            if writable && path.symlink_metadata().is_ok() {
                policy = policy.with_read_only_path(path);
            }
        }
        policy
    }
}

fn euid() -> u32 {
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

/// Whether `dir` is the uid's and closed to everyone else.
fn private_dir(dir: &Path, uid: u32) -> Result<(), String> {
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
fn write_dir(uid: u32) -> Result<PathBuf, RegistryError> {
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

/// Start time and PID namespace of `pid`, as `/proc` shows them.
fn process_identity(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall is the 20th after the name (fields 3.. start at index 0).
    let start = rest.split_whitespace().nth(19)?.parse().ok()?;
    let ns = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?.ino();
    Some((start, ns))
}

fn own_pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// An absolute path without `..` that is not `/`: anything else in an entry is ignored.
fn acceptable(path: &Path) -> bool {
    path.is_absolute()
        && path != Path::new("/")
        && !path.components().any(|c| matches!(c, Component::ParentDir))
}

/// A server's registration; the entry is removed when this is dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// Writes this process's entry (and removes the entries of servers that are gone).
    ///
    /// # Errors
    /// [`RegistryError`] when the directory cannot be created or is not private, or the entry
    /// cannot be written: a server that cannot register must not start, or its secrets would be
    /// open to every other server's sandboxes.
    pub fn register(hidden: &[PathBuf], read_only: &[PathBuf]) -> Result<Self, RegistryError> {
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
fn prune_dead(dir: &Path) {
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

/// Whether the server that wrote `entry` still runs. An entry of another PID namespace cannot
/// be checked from here and counts as alive (keeping it only narrows a sandbox).
fn entry_alive(entry: &Entry, own_ns: u64) -> bool {
    if entry.pid_namespace != own_ns || own_ns == 0 {
        return true;
    }
    process_identity(entry.pid)
        .is_some_and(|(start, ns)| start == entry.start_time && ns == entry.pid_namespace)
}

/// One entry file, `None` when it is not an entry (temporary or foreign name).
fn read_entry(path: &Path, uid: u32) -> Result<Option<Entry>, RegistryError> {
    let name = path.file_name().and_then(OsStr::to_str).unwrap_or("");
    if name.starts_with('.') || !name.ends_with(ENTRY_SUFFIX) {
        return Ok(None);
    }
    let error = |reason: String| RegistryError::Entry {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| error(e.to_string()))?;
    let meta = file.metadata().map_err(|e| error(e.to_string()))?;
    if !meta.is_file() || meta.uid() != uid {
        // Not one of the uid's servers wrote it (the directory is the uid's alone).
        return Ok(None);
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(error(format!("larger than {MAX_ENTRY_BYTES} bytes")));
    }
    let mut text = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(&file, MAX_ENTRY_BYTES + 1),
        &mut text,
    )
    .map_err(|e| error(e.to_string()))?;
    let entry: Entry = serde_json::from_slice(&text).map_err(|e| error(e.to_string()))?;
    if entry.hidden.len() > MAX_ENTRY_PATHS || entry.read_only.len() > MAX_ENTRY_PATHS {
        return Err(error(format!("more than {MAX_ENTRY_PATHS} paths")));
    }
    Ok(Some(entry))
}

/// Reads every entry of `dirs` (directories that are not the uid's are skipped: none of its
/// servers could have written there).
fn read_dirs(dirs: &[PathBuf], uid: u32) -> Result<Registered, RegistryError> {
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
        }
    }
    registered.hidden.sort();
    registered.hidden.dedup();
    registered.read_only.sort();
    registered.read_only.dedup();
    Ok(registered)
}

/// Reads the registry of the calling process's uid once (a standalone `sandbox-run` or
/// `fs-helper`).
///
/// # Errors
/// [`RegistryError`] when an entry is unreadable or malformed, or there are too many.
pub fn read_registered() -> Result<Registered, RegistryError> {
    let uid = euid();
    read_dirs(&registry_dirs(uid), uid)
}

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
        }
    }

    /// What every registered server asks of a sandbox, now.
    ///
    /// # Errors
    /// As [`read_registered`].
    pub fn current(&self) -> Result<Registered, RegistryError> {
        let stamps: Vec<(Stamp, bool)> = self.dirs.iter().map(|dir| stamp(dir)).collect();
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
        let registered = read_dirs(&self.dirs, self.uid)?;
        *cache = Some((stamps, registered.clone()));
        Ok(registered)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn entries_are_read_and_hostile_paths_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("servers");
        std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
        let entry = Entry {
            pid: 1,
            hidden: vec![
                PathBuf::from("/srv/a/token"),
                PathBuf::from("/"),
                PathBuf::from("relative"),
                PathBuf::from("/srv/../etc"),
            ],
            read_only: vec![PathBuf::from("/srv/a/bin")],
            ..Entry::default()
        };
        std::fs::write(reg.join("1-1.json"), serde_json::to_vec(&entry).unwrap()).unwrap();
        std::fs::write(reg.join(".2-2.tmp"), "half").unwrap();
        let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
        assert_eq!(read.hidden, vec![PathBuf::from("/srv/a/token")]);
        assert_eq!(read.dirs, vec![reg.clone()]);
        assert_eq!(read.read_only, vec![PathBuf::from("/srv/a/bin")]);
        std::fs::write(reg.join("3-3.json"), "{not json").unwrap();
        assert!(read_dirs(std::slice::from_ref(&reg), euid()).is_err());
    }

    #[test]
    fn a_dead_servers_entry_is_not_applied_and_a_live_ones_is() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("servers");
        std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
        let (start_time, pid_namespace) = process_identity(std::process::id()).unwrap();
        let live = Entry {
            pid: std::process::id(),
            start_time,
            pid_namespace,
            hidden: vec![PathBuf::from("/srv/live/token")],
            ..Entry::default()
        };
        let dead = Entry {
            start_time: start_time + 1,
            hidden: vec![PathBuf::from("/srv/dead/token")],
            ..live.clone()
        };
        for (name, entry) in [("live", &live), ("dead", &dead)] {
            let path = reg.join(format!("{name}.json"));
            std::fs::write(path, serde_json::to_vec(entry).unwrap()).unwrap();
        }
        let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
        assert_eq!(read.hidden, vec![PathBuf::from("/srv/live/token")]);
    }

    #[test]
    fn entries_of_dead_servers_are_pruned_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("servers");
        std::fs::DirBuilder::new().mode(0o700).create(&reg).unwrap();
        let (start_time, pid_namespace) = process_identity(std::process::id()).unwrap();
        let live = Entry {
            pid: std::process::id(),
            start_time,
            pid_namespace,
            ..Entry::default()
        };
        // A pid reused by another process (different start time) and a pid of another PID
        // namespace (not ours to judge).
        let reused = Entry {
            start_time: start_time + 1,
            ..live.clone()
        };
        let foreign = Entry {
            pid: 1,
            pid_namespace: pid_namespace + 1,
            ..live.clone()
        };
        for (name, entry) in [("live", &live), ("reused", &reused), ("foreign", &foreign)] {
            let path = reg.join(format!("{name}.json"));
            std::fs::write(path, serde_json::to_vec(entry).unwrap()).unwrap();
        }
        prune_dead(&reg);
        let mut left: Vec<String> = std::fs::read_dir(&reg)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["foreign.json", "live.json"]);
    }

    #[test]
    fn a_directory_open_to_others_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let reg = dir.path().join("servers");
        std::fs::create_dir(&reg).unwrap();
        std::fs::set_permissions(&reg, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(reg.join("1-1.json"), "{not json").unwrap();
        let read = read_dirs(std::slice::from_ref(&reg), euid()).unwrap();
        assert_eq!(read.hidden, Vec::<PathBuf>::new());
    }
}
