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
//!   candidate. A root reader also reads every other uid's (their servers admit root without a
//!   token): their ports, and only the paths that belong to that uid, an unreadable entry of
//!   theirs skipped (`read::read_other_users`). `/run` and `/dev/shm` are private, empty tmpfs
//!   in every sandbox with the mount
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

mod dirs;
mod entries;
mod read;
mod register;
#[cfg(test)]
mod tests;

use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ResolvedPolicy;

pub use dirs::registry_dirs;
pub use read::{RegistryReader, read_registered};
pub use register::Registration;

/// Most entries one registry directory may hold. A host runs a handful of servers; past this the
/// directory is not one servers wrote, and resolution fails rather than read part of it.
pub const MAX_REGISTRY_ENTRIES: usize = 1024;
/// Largest entry file, in bytes (a server writes a few paths).
pub const MAX_ENTRY_BYTES: u64 = 64 * 1024;
/// Most paths of each kind one entry may name.
pub const MAX_ENTRY_PATHS: usize = 64;
/// Most TCP ports one entry may name (a server listens on one).
pub const MAX_ENTRY_PORTS: usize = 16;
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
    /// The TCP ports it listens on: a sandbox with the network on may not connect to them (a
    /// loopback listener without a token admits every process of its user, a sandboxed command
    /// of another server included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_ports: Vec<u16>,
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
    /// TCP ports to refuse with the network on.
    pub tcp_ports: Vec<u16>,
}

impl Registered {
    /// Sorted, each path and port once.
    fn normalize(&mut self) {
        self.hidden.sort();
        self.hidden.dedup();
        self.read_only.sort();
        self.read_only.dedup();
        self.tcp_ports.sort_unstable();
        self.tcp_ports.dedup();
    }

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
        // Hidden all at once: a directory under another hidden one adds a rule that changes
        // nothing, as it would one by one.
        let writable = |policy: &ResolvedPolicy, path: &Path| {
            !policy.restricts_filesystem() || policy.can_write(path)
        };
        let hidden: Vec<&Path> = (self.dirs.iter())
            .filter(|dir| writable(&policy, dir))
            .chain(&self.hidden)
            .map(PathBuf::as_path)
            .filter(|path| path.symlink_metadata().is_ok())
            .collect();
        policy = policy.with_hidden_paths(hidden);
        let read_only: Vec<&Path> = (self.read_only.iter())
            .map(PathBuf::as_path)
            .filter(|path| writable(&policy, path) && path.symlink_metadata().is_ok())
            .collect();
        policy = policy.with_read_only_paths(read_only);
        // Only where something of the sandbox reaches the host's network: the command (network
        // on), or the egress proxy connecting for it (an allowlist; the proxy refuses a policy's
        // denied ports, and a pattern may name a loopback address). With the network off no
        // server's port is reachable.
        if policy.network_allowed() {
            for port in &self.tcp_ports {
                policy = policy.with_denied_tcp_port(*port);
            }
        }
        policy
    }
}

/// An absolute path without `..` that is not `/`: anything else in an entry is ignored.
fn acceptable(path: &Path) -> bool {
    path.is_absolute()
        && path != Path::new("/")
        && !path.components().any(|c| matches!(c, Component::ParentDir))
}
