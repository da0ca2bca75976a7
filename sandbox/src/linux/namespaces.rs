//! The namespace layer: a user + mount namespace in which `/` is read-only, writable roots are
//! re-bound writable, narrower rules inside them are re-bound read-only and deny entries are
//! masked; plus a network namespace (no interfaces but a down loopback) when the network is off.
//!
//! This is the layer that stops `chmod`, `chown`, `utime`, xattr changes and writes into `.git`:
//! Landlock only ever adds rights beneath a path, so it cannot carve a read-only `.git` out of a
//! writable workspace. The plan ([`mount_plan`]) is a pure function so tests can check it.
//!
//! Ordering: the uid/gid maps are written before `/` becomes read-only (they live in `/proc`);
//! mounts are applied shallowest first so deeper rules override; the caller re-enters its cwd
//! afterwards, because the old cwd still points at the mount that is now covered.

use std::ffi::CString;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use serde::Serialize;

use crate::policy::{Access, ResolvedPolicy};
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// What the namespace layer set up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NamespaceReport {
    /// A user namespace was created.
    pub user: bool,
    /// A mount namespace was created and the mount plan applied.
    pub mount: bool,
    /// A network namespace was created.
    pub network: bool,
    /// Mount operations applied.
    pub mounts: Vec<MountOp>,
}

/// One step of the mount plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", content = "path", rename_all = "kebab-case")]
pub enum MountOp {
    /// Make the mount tree at the path read-only, recursively.
    ReadOnlyTree(PathBuf),
    /// Bind the path onto itself and make it writable.
    WritableBind(PathBuf),
    /// Bind the path onto itself, read-only.
    ReadOnlyBind(PathBuf),
    /// Cover a directory with an empty read-only tmpfs.
    MaskDir(PathBuf),
    /// Cover a file with a read-only bind of `/dev/null`.
    MaskFile(PathBuf),
}

/// Why the namespace layer could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The caller turned the layer off.
    #[error("namespaces disabled by the caller")]
    Disabled,
    /// `unshare(2)` failed: user namespaces unavailable here.
    #[error("unshare({flags}) failed: {source}")]
    Unshare {
        /// The flags tried.
        flags: String,
        /// The OS error.
        source: nix::Error,
    },
    /// Writing a uid/gid map failed.
    #[error("writing {file} failed: {source}")]
    IdMap {
        /// Which file.
        file: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A mount operation failed after the namespace existed.
    #[error("mount step {op:?} failed: {source}")]
    Mount {
        /// The step.
        op: MountOp,
        /// The OS error.
        source: std::io::Error,
    },
}

impl NamespaceError {
    /// True when the process already entered a namespace before failing.
    pub fn is_partial(&self) -> bool {
        matches!(self, Self::IdMap { .. } | Self::Mount { .. })
    }
}

/// Rules (rendered for messages) that only this layer can enforce, limited to paths that
/// exist (a missing path needs no carve-out).
pub fn rules_needing_namespace(policy: &ResolvedPolicy) -> Vec<String> {
    policy
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
        .collect()
}

/// The mount steps for `policy`, shallowest first. Paths that do not exist are skipped.
pub fn mount_plan(policy: &ResolvedPolicy) -> Vec<MountOp> {
    if !policy.restricts_filesystem() {
        return Vec::new();
    }
    let mut plan = Vec::new();
    if policy.access_for(Path::new("/")) != Access::Write {
        plan.push(MountOp::ReadOnlyTree(PathBuf::from("/")));
    }
    let mut rules: Vec<_> = policy
        .rules()
        .iter()
        .filter(|r| r.path != Path::new("/"))
        .collect();
    rules.sort_by_key(|r| (r.path.components().count(), r.path.clone()));
    for rule in rules {
        let Ok(meta) = rule.path.symlink_metadata() else {
            continue;
        };
        let parent = rule
            .path
            .parent()
            .map_or(Access::Deny, |p| policy.access_for(p));
        let is_device = meta.file_type().is_char_device() || meta.file_type().is_block_device();
        let path = rule.path.clone();
        match rule.access {
            Access::Write if parent != Access::Write && !is_device => {
                plan.push(MountOp::WritableBind(path));
            }
            Access::Read if parent == Access::Write => plan.push(MountOp::ReadOnlyBind(path)),
            Access::Deny if parent.can_read() && meta.is_dir() => plan.push(MountOp::MaskDir(path)),
            Access::Deny if parent.can_read() => plan.push(MountOp::MaskFile(path)),
            _ => {}
        }
    }
    plan
}

/// Enters new namespaces and applies the mount plan.
///
/// # Errors
/// [`NamespaceError::Unshare`] when namespaces are unavailable (nothing changed yet);
/// the other variants when setup failed half-way.
pub fn enter(policy: &ResolvedPolicy) -> Result<NamespaceReport, NamespaceError> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let root = nix::unistd::geteuid().is_root();
    let mut flags = CloneFlags::CLONE_NEWUSER;
    if policy.restricts_filesystem() {
        flags |= CloneFlags::CLONE_NEWNS;
    }
    if !policy.network_allowed() {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    let mut report = NamespaceReport::default();
    let unshare_error = |source| NamespaceError::Unshare {
        flags: format!("{flags:?}"),
        source,
    };
    if root {
        match unshare_as_root(flags) {
            Ok(()) => report.user = true,
            Err(RootUnshare::Unshare(first)) => {
                // No user namespaces (sysctl or LSM), but real root may still unshare the rest;
                // seccomp and Landlock then keep it from undoing the mounts.
                unshare(flags - CloneFlags::CLONE_NEWUSER).map_err(|_| unshare_error(first))?;
            }
            Err(RootUnshare::Map(source)) => {
                return Err(NamespaceError::IdMap {
                    file: "/proc/PID/{uid_map,gid_map} (written from outside the namespace)",
                    source,
                });
            }
        }
    } else {
        unshare(flags).map_err(unshare_error)?;
        write_own_id_maps(uid.as_raw(), gid.as_raw()).map_err(|source| NamespaceError::IdMap {
            file: "/proc/self/{setgroups,uid_map,gid_map}",
            source,
        })?;
        report.user = true;
    }
    report.network = flags.contains(CloneFlags::CLONE_NEWNET);
    if flags.contains(CloneFlags::CLONE_NEWNS) {
        let plan = mount_plan(policy);
        apply_plan(&plan)?;
        report.mount = true;
        report.mounts = plan;
    }
    Ok(report)
}

/// Maps only the caller's own ids into the new user namespace (all an unprivileged process
/// may map).
fn write_own_id_maps(uid: u32, gid: u32) -> std::io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny\n")?;
    std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

/// Root maps the whole id range onto itself, so files of every owner keep their owner and
/// root's capabilities count only inside the namespace. A process inside the new namespace
/// lacks CAP_SETUID in the parent one, so a writer that stays outside writes the maps (what
/// `newuidmap` does), after this process has unshared. The writer shares this process's memory
/// ([`sys::IdMapWriter`]) rather than being forked: a fork copies the page tables, makes every
/// page this process writes afterwards fault, and tears the copy down again.
fn unshare_as_root(flags: CloneFlags) -> Result<(), RootUnshare> {
    const FULL_RANGE: &[u8] = b"0 0 4294967295\n";
    let parent = nix::unistd::getpid();
    let map_file = |name: &str| {
        CString::new(format!("/proc/{parent}/{name}"))
            .map(|path| (path, FULL_RANGE.to_vec()))
            .map_err(|err| RootUnshare::Map(err.into()))
    };
    let files = vec![map_file("uid_map")?, map_file("gid_map")?];
    let mut writer = sys::IdMapWriter::start(files).map_err(RootUnshare::Map)?;
    let unshared = unshare(flags);
    // Write the maps only if the unshare succeeded; otherwise the writer exits untouched.
    let written = writer.finish(unshared.is_ok()).map_err(RootUnshare::Map)?;
    unshared.map_err(RootUnshare::Unshare)?;
    if written {
        Ok(())
    } else {
        Err(RootUnshare::Map(std::io::Error::other(
            "the id-map writer did not write both maps",
        )))
    }
}

/// How [`unshare_as_root`] failed: before entering (nothing changed) or after.
enum RootUnshare {
    Unshare(nix::Error),
    Map(std::io::Error),
}

fn apply_plan(plan: &[MountOp]) -> Result<(), NamespaceError> {
    let step = |op: &MountOp, result: std::io::Result<()>| {
        result.map_err(|source| NamespaceError::Mount {
            op: op.clone(),
            source,
        })
    };
    let none: Option<&str> = None;
    let root_op = MountOp::ReadOnlyTree(PathBuf::from("/"));
    step(
        &root_op,
        mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_SLAVE, none).map_err(Into::into),
    )?;
    for op in plan {
        let result = match op {
            MountOp::ReadOnlyTree(path) => sys::mount_setattr(path, true, MOUNT_ATTR_RDONLY, 0),
            MountOp::WritableBind(path) => bind(path, path).and_then(|()| {
                // No device nodes or set-user-ID programs from a writable root.
                let hardening = MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID;
                sys::mount_setattr(path, true, hardening, MOUNT_ATTR_RDONLY)
                    .or_else(|_| sys::mount_setattr(path, false, hardening, MOUNT_ATTR_RDONLY))
                    // A mount the host made read-only stays read-only: narrower, not wider.
                    .or_else(ignore_eperm)
            }),
            MountOp::ReadOnlyBind(path) => {
                bind(path, path).and_then(|()| sys::mount_setattr(path, true, MOUNT_ATTR_RDONLY, 0))
            }
            MountOp::MaskDir(path) => mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=000"),
            )
            .map_err(Into::into),
            MountOp::MaskFile(path) => bind(Path::new("/dev/null"), path)
                .and_then(|()| sys::mount_setattr(path, false, MOUNT_ATTR_RDONLY, 0)),
        };
        step(op, result)?;
    }
    Ok(())
}

fn bind(source: &Path, target: &Path) -> std::io::Result<()> {
    let none: Option<&str> = None;
    mount(
        Some(source),
        target,
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )
    .map_err(Into::into)
}

fn ignore_eperm(err: std::io::Error) -> std::io::Result<()> {
    if err.raw_os_error() == Some(libc::EPERM) {
        Ok(())
    } else {
        Err(err)
    }
}
