//! The namespace layer: which namespaces a sandbox gets, their uid/gid maps, and entering them.
//!
//! A command ([`super::command`]) gets a user, mount, PID and IPC namespace (plus a network
//! namespace with nothing but a down loopback when the network is off), created by `clone` so
//! that its PID 1 can mount a fresh `/proc`; the parent writes the child's maps. A helper
//! ([`super::restrict_current_process`]) unshares user, mount, IPC (and network) namespaces for
//! itself: it never forks, so it needs no PID namespace.
//!
//! Maps: an unprivileged caller maps only its own uid and gid (all it may map); root maps the
//! whole range onto itself, so files keep their owners. Either way the sandbox then drops every
//! capability (`drop_all_capabilities`), so uid 0 inside holds no power over the
//! host beyond its file ownership, and the seccomp allow-list refuses set-user-ID and
//! set-group-ID modes on the files it creates.

use std::ffi::CString;

use nix::sched::{CloneFlags, unshare};
use serde::Serialize;

use super::mounts::MountOp;
use crate::policy::{Access, ResolvedPolicy};
use crate::sys;

/// What the namespace layer set up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NamespaceReport {
    /// A user namespace was created.
    pub user: bool,
    /// A mount namespace was created and the mount plan applied.
    pub mount: bool,
    /// A network namespace was created.
    pub network: bool,
    /// A PID namespace was created (commands only).
    pub pid: bool,
    /// An IPC namespace was created.
    pub ipc: bool,
    /// Mount operations applied.
    pub mounts: Vec<MountOp>,
}

/// Why the namespace layer could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The caller turned the layer off.
    #[error("namespaces disabled by the caller")]
    Disabled,
    /// `unshare(2)`/`clone(2)` failed: user namespaces unavailable here.
    #[error("creating namespaces ({flags}) failed: {source}")]
    Unshare {
        /// The flags tried.
        flags: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing a uid/gid map failed.
    #[error("writing {file} failed: {source}")]
    IdMap {
        /// Which file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The mount layout failed after the namespace existed.
    #[error(transparent)]
    Mount(#[from] super::mounts::MountError),
}

impl NamespaceError {
    /// True when the process already entered a namespace before failing.
    pub fn is_partial(&self) -> bool {
        matches!(self, Self::IdMap { .. } | Self::Mount(_))
    }
}

/// Rules (rendered for messages) that only this layer can enforce, limited to paths that
/// exist (a missing path needs no carve-out).
pub fn rules_needing_namespace(policy: &ResolvedPolicy) -> Vec<String> {
    let mut needed: Vec<String> = policy
        .narrowing_rules()
        .into_iter()
        .filter(|rule| rule.path.symlink_metadata().is_ok())
        .map(|rule| {
            let access = match rule.access {
                Access::Read => "read-only inside a writable root",
                Access::Deny | Access::Write => "denied inside a readable root",
            };
            format!("{} ({access})", rule.path.display())
        })
        .collect();
    if !policy.restricts_filesystem() {
        for path in policy.hidden_paths() {
            if path.symlink_metadata().is_ok() {
                needed.push(format!("{} (hidden from every sandbox)", path.display()));
            }
        }
        for path in policy.read_only_paths() {
            if path.symlink_metadata().is_ok() {
                needed.push(format!("{} (read-only in every sandbox)", path.display()));
            }
        }
    }
    needed
}

/// Whether `policy` needs a mount namespace at all.
pub fn needs_mount_namespace(policy: &ResolvedPolicy) -> bool {
    policy.restricts_filesystem()
        || !policy.hidden_paths().is_empty()
        || !policy.read_only_paths().is_empty()
}

/// The namespaces a sandbox under `policy` gets (`pid`: also a PID namespace).
pub fn namespace_flags(policy: &ResolvedPolicy, pid: bool) -> CloneFlags {
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWIPC;
    if needs_mount_namespace(policy) || pid {
        flags |= CloneFlags::CLONE_NEWNS;
    }
    if policy.needs_network_namespace() {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if pid {
        flags |= CloneFlags::CLONE_NEWPID;
    }
    flags
}

/// The map lines for a new user namespace created by a process with `uid`/`gid`: root maps the
/// whole range onto itself, anyone else only their own ids.
fn id_maps(uid: u32, gid: u32) -> (String, String) {
    if uid == 0 {
        let full = "0 0 4294967295\n".to_owned();
        (full.clone(), full)
    } else {
        (format!("{uid} {uid} 1\n"), format!("{gid} {gid} 1\n"))
    }
}

/// Writes the uid/gid maps of `child`'s new user namespace, from its parent (outside it).
///
/// # Errors
/// [`NamespaceError::IdMap`] naming the file.
pub fn write_child_id_maps(child: nix::unistd::Pid) -> Result<(), NamespaceError> {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let (uid_map, gid_map) = id_maps(uid, gid);
    let write = |name: &str, content: &str| {
        let file = format!("/proc/{child}/{name}");
        std::fs::write(&file, content).map_err(|source| NamespaceError::IdMap { file, source })
    };
    if uid != 0 {
        write("setgroups", "deny\n")?;
    }
    write("uid_map", &uid_map)?;
    write("gid_map", &gid_map)
}

/// Unshares user, mount, IPC (and network) namespaces for the calling process itself (a
/// helper, which never forks).
///
/// # Errors
/// [`NamespaceError::Unshare`] when namespaces are unavailable (nothing changed yet); the
/// other variants when setup failed half-way.
pub fn unshare_for_current_process(
    policy: &ResolvedPolicy,
) -> Result<NamespaceReport, NamespaceError> {
    let flags = namespace_flags(policy, false);
    let unshare_error = |source: nix::Error| NamespaceError::Unshare {
        flags: format!("{flags:?}"),
        source: source.into(),
    };
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    if uid == 0 {
        unshare_as_root(flags)?;
    } else {
        unshare(flags).map_err(unshare_error)?;
        let (uid_map, gid_map) = id_maps(uid, gid);
        let write = |name: &str, content: &str| {
            let file = format!("/proc/self/{name}");
            std::fs::write(&file, content).map_err(|source| NamespaceError::IdMap { file, source })
        };
        write("setgroups", "deny\n")?;
        write("uid_map", &uid_map)?;
        write("gid_map", &gid_map)?;
    }
    Ok(NamespaceReport {
        user: true,
        mount: flags.contains(CloneFlags::CLONE_NEWNS),
        network: flags.contains(CloneFlags::CLONE_NEWNET),
        pid: false,
        ipc: true,
        mounts: Vec::new(),
    })
}

/// Root maps the whole id range onto itself. A process inside the new namespace lacks
/// CAP_SETUID in the parent one, so a writer that stays outside writes the maps (what
/// `newuidmap` does), after this process has unshared. The writer shares this process's memory
/// ([`sys::IdMapWriter`]) rather than being forked: a fork copies the page tables, makes every
/// page this process writes afterwards fault, and tears the copy down again.
fn unshare_as_root(flags: CloneFlags) -> Result<(), NamespaceError> {
    let parent = nix::unistd::getpid();
    let (uid_map, gid_map) = id_maps(0, 0);
    let map_err = |file: &str| {
        let file = file.to_owned();
        move |source: std::io::Error| NamespaceError::IdMap { file, source }
    };
    let files = [("uid_map", uid_map), ("gid_map", gid_map)]
        .into_iter()
        .map(|(name, content)| {
            CString::new(format!("/proc/{parent}/{name}"))
                .map(|path| (path, content.into_bytes()))
                .map_err(|err| map_err(name)(err.into()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut writer = sys::IdMapWriter::start(files).map_err(map_err("the id-map writer"))?;
    let unshared = unshare(flags);
    // Write the maps only if the unshare succeeded; otherwise the writer exits untouched.
    let written = writer
        .finish(unshared.is_ok())
        .map_err(map_err("the id-map writer"))?;
    unshared.map_err(|source| NamespaceError::Unshare {
        flags: format!("{flags:?}"),
        source: source.into(),
    })?;
    if written {
        Ok(())
    } else {
        Err(map_err("/proc/PID/{uid_map,gid_map}")(
            std::io::Error::other("the id-map writer did not write both maps"),
        ))
    }
}

/// Whether this process can create the namespaces a sandbox needs, tested in a forked child so
/// the caller itself stays untouched.
pub fn available() -> bool {
    sys::can_unshare_user_namespace()
}
