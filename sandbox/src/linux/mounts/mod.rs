//! The mount layout of a sandbox, built from descriptors.
//!
//! [`mount_plan`] is a pure function of the policy and the [`Layout`] (tests check it without the
//! kernel). [`apply`] builds it inside a fresh mount namespace:
//!
//! 1. every host path a step needs is opened once, with `openat2(RESOLVE_NO_SYMLINKS)`, and its
//!    identity (device, inode) recorded, before anything changes: a path that became a symlink
//!    since the policy was resolved fails the start instead of redirecting a mount;
//! 2. `/` becomes read-only and `nosuid`, recursively;
//! 3. the steps run shallowest first. Each target is opened relative to the deepest mount this
//!    layout already attached above it, again without following symlinks, and a target that is
//!    the original host location must be the very inode opened in step 1. Copies of mounts are
//!    made with `open_tree(OPEN_TREE_CLONE)`, get their attributes while detached and are attached
//!    with `move_mount` onto the target descriptor, so nothing is looked up by path twice.
//!
//! Steps: writable roots re-bound writable (`nosuid`, `nodev`; each mount inside as writable
//! as the host has it), narrower paths inside them
//! re-bound read-only (`.git`, `.agents`, `.codex`, the server's binaries), denied paths masked,
//! ancestors of denied paths inside writable roots pinned (bound onto themselves, so they cannot
//! be renamed from inside: a deny entry cannot be moved from under the next command), private
//! `$TMPDIR` and `/run` (fresh tmpfs: host daemons' sockets and files there are out of reach;
//! paths the policy names inside them are carried in), `/tmp` as an overlay when the policy
//! writes it (the host's `/tmp` the read-only lower layer, a fresh tmpfs the private upper
//! layer: host files there stay readable, what the command writes stays its own, and a host
//! socket seen through the lower layer is another inode than the one its server bound, so
//! `connect` finds no listener; named sockets are bound in from the host; a `/tmp` with host
//! mounts inside, which the kernel will not layer, becomes a private directory), a minimal `/dev`
//! with its own
//! devpts instance (no host terminal, disk or console is reachable), and a fresh `/proc` for the
//! PID namespace with `/proc/sys` and friends read-only.
//!
//! The plan lives here; `builder` builds it (`layers` makes its writable and fresh layers).

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::policy::{Access, ResolvedPolicy};

mod builder;
mod layers;
pub mod mountinfo;
pub use builder::{Applied, apply, apply_bounded};

/// Device nodes the private `/dev` holds, bound from the host's.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// The private `/dev`'s shared-memory directory: a fresh tmpfs like `/tmp`.
const DEV_SHM: &str = "/dev/shm";

/// What the sandbox builds besides the policy's rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// A fresh `/proc` (the builder is PID 1 of a new PID namespace).
    pub proc: bool,
    /// A minimal `/dev` with a private devpts instance.
    pub dev: bool,
    /// Directories that get a fresh tmpfs (`$TMPDIR`, `/run`, `/tmp` when not overlaid).
    pub private_dirs: Vec<PathBuf>,
    /// Directories that get an overlay: the host directory as the read-only lower layer, a
    /// fresh tmpfs as the private upper layer (`/tmp` under a policy that writes it).
    pub overlay_dirs: Vec<PathBuf>,
    /// Paths to carry into a private directory besides the policy's own rules (the working
    /// directory), with the access the policy gives them.
    pub carry: Vec<PathBuf>,
}

/// One step of the layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "op", content = "path", rename_all = "kebab-case")]
pub enum MountOp {
    /// Make the whole tree read-only and `nosuid`.
    ReadOnlyRoot,
    /// Bind the path onto itself, writable, `nosuid`, `nodev`.
    WritableBind(PathBuf),
    /// Bind the path onto itself, read-only.
    ReadOnlyBind(PathBuf),
    /// Bind a directory of a writable root onto itself, writable: it becomes a mount point,
    /// which cannot be renamed or removed from inside.
    Pin(PathBuf),
    /// Cover a directory with an empty, read-only tmpfs.
    MaskDir(PathBuf),
    /// Cover a file with an unreadable (mode 0000), read-only empty file.
    MaskFile(PathBuf),
    /// A fresh tmpfs on the directory.
    PrivateDir(PathBuf),
    /// An overlay on the directory: the host directory read-only below, a fresh tmpfs (the
    /// command's own, gone when its mount namespace ends) as the writable layer above.
    OverlayDir(PathBuf),
    /// A minimal `/dev`.
    PrivateDev,
    /// A fresh `/proc`.
    Proc,
}

impl MountOp {
    /// The path the step mounts on.
    pub fn path(&self) -> &Path {
        match self {
            MountOp::ReadOnlyRoot => Path::new("/"),
            MountOp::PrivateDev => Path::new("/dev"),
            MountOp::Proc => Path::new("/proc"),
            MountOp::WritableBind(path)
            | MountOp::ReadOnlyBind(path)
            | MountOp::Pin(path)
            | MountOp::MaskDir(path)
            | MountOp::MaskFile(path)
            | MountOp::PrivateDir(path)
            | MountOp::OverlayDir(path) => path,
        }
    }

    /// Whether the step re-mounts the host object at its own place (and so must find the same
    /// inode there). An overlay's lower layer is the host directory at its own place.
    fn binds_in_place(&self) -> bool {
        matches!(
            self,
            MountOp::WritableBind(_)
                | MountOp::ReadOnlyBind(_)
                | MountOp::Pin(_)
                | MountOp::MaskDir(_)
                | MountOp::MaskFile(_)
                | MountOp::OverlayDir(_)
        )
    }

    /// Whether the step gives the command a fresh layer of its own (redone per command).
    pub fn is_fresh(&self) -> bool {
        matches!(
            self,
            MountOp::PrivateDir(_) | MountOp::OverlayDir(_) | MountOp::PrivateDev | MountOp::Proc
        )
    }
}

/// Why the layout could not be built. The process is then half-configured and must not go on.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A path changed between the resolution of the policy and the start of the sandbox.
    #[error(
        "{path} changed while the sandbox was set up ({what}); refusing to start (a symlink or \
         a swapped directory must not redirect a mount)"
    )]
    Changed {
        /// The path.
        path: PathBuf,
        /// What was found.
        what: String,
    },
    /// A step failed.
    #[error("mount step {op:?} failed: {source}")]
    Step {
        /// The step.
        op: MountOp,
        /// The OS error.
        source: io::Error,
    },
}

/// The steps for `policy`, shallowest first. Paths that do not exist are skipped.
pub fn mount_plan(policy: &ResolvedPolicy, layout: &Layout) -> Vec<MountOp> {
    let mut plan = Vec::new();
    let restricted = policy.restricts_filesystem();
    if restricted && policy.access_for(Path::new("/")) != Access::Write {
        plan.push(MountOp::ReadOnlyRoot);
    }
    let shm = Path::new(DEV_SHM);
    let replaced = |path: &Path| {
        (layout.dev && path.starts_with("/dev") && !path.starts_with(shm))
            || (layout.proc && path.starts_with("/proc"))
    };
    let mut private_dirs: Vec<PathBuf> = layout
        .private_dirs
        .iter()
        .filter(|dir| is_dir(dir) && !replaced(dir))
        .cloned()
        .collect();
    if layout.dev {
        private_dirs.push(shm.to_owned());
    }
    let private = |path: &Path| private_dirs.iter().any(|dir| path.starts_with(dir));
    let overlay_dirs: Vec<PathBuf> = layout
        .overlay_dirs
        .iter()
        .filter(|dir| is_dir(dir) && !replaced(dir) && !private(dir))
        .cloned()
        .collect();
    let overlaid = |path: &Path| {
        overlay_dirs
            .iter()
            .any(|dir| path.starts_with(dir) && path != dir.as_path())
    };
    let mut ops: Vec<MountOp> = private_dirs
        .iter()
        .map(|dir| MountOp::PrivateDir(dir.clone()))
        .collect();
    ops.extend(
        overlay_dirs
            .iter()
            .map(|dir| MountOp::OverlayDir(dir.clone())),
    );
    if layout.dev {
        ops.push(MountOp::PrivateDev);
    }
    if layout.proc {
        ops.push(MountOp::Proc);
    }
    let mut carried: Vec<(PathBuf, Access)> = Vec::new();
    for rule in policy.rules() {
        if rule.path != Path::new("/") {
            carried.push((rule.path.clone(), rule.access));
        }
    }
    for path in &layout.carry {
        if (private(path) || overlaid(path)) && !carried.iter().any(|(p, _)| p == path) {
            carried.push((path.clone(), policy.access_for(path)));
        }
    }
    // A named socket inside a private or overlaid directory is bound in from the host: a
    // fresh tmpfs does not hold it, and through an overlay's lower layer it is another inode
    // than the one its server listens on.
    for path in &policy.unix_sockets {
        let hidden = policy.hidden_paths().iter().any(|h| path.starts_with(h));
        if (private(path) || overlaid(path)) && !hidden && policy.access_for(path).can_read() {
            carried.push((path.clone(), Access::Read));
        }
    }
    for path in policy.hidden_paths() {
        carried.push((path.clone(), Access::Deny));
    }
    for path in policy.read_only_paths() {
        if policy.access_for(path).can_write() || !restricted {
            carried.push((path.clone(), Access::Read));
        }
    }
    carried.sort();
    carried.dedup_by(|later, earlier| later.0 == earlier.0);
    // Inside a fresh private directory a host object is visible only if it, or an ancestor
    // below the private directory, is carried in (bound); `carried` is sorted, so ancestors
    // come first.
    let mut bound: Vec<PathBuf> = Vec::new();
    for (path, access) in &carried {
        // A private directory is a fresh tmpfs of its own (PrivateDir), whatever its rule.
        if replaced(path) || private_dirs.contains(path) || overlay_dirs.contains(path) {
            continue;
        }
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        let in_private = private(path);
        let visible_parent = !in_private
            || bound
                .iter()
                .any(|b| path.starts_with(b) && b.as_path() != path.as_path());
        let parent = if visible_parent {
            path.parent().map_or(Access::Deny, |p| effective(policy, p))
        } else {
            Access::Deny
        };
        // Inside an overlay (and no bind of ours between), a write lands in the command's
        // private layer: the host object there is read-only until bound writable.
        let below_bind = bound
            .iter()
            .any(|b| path.starts_with(b) && b.as_path() != path.as_path());
        let host_parent = if overlaid(path) && !below_bind && parent == Access::Write {
            Access::Read
        } else {
            parent
        };
        let is_device = meta.file_type().is_char_device() || meta.file_type().is_block_device();
        let op = match access {
            Access::Write if host_parent != Access::Write && !is_device => {
                Some(MountOp::WritableBind(path.clone()))
            }
            Access::Read if parent == Access::Write || !visible_parent => {
                Some(MountOp::ReadOnlyBind(path.clone()))
            }
            Access::Deny if parent.can_read() && meta.is_dir() => {
                Some(MountOp::MaskDir(path.clone()))
            }
            Access::Deny if parent.can_read() => Some(MountOp::MaskFile(path.clone())),
            _ => None,
        };
        if matches!(
            op,
            Some(MountOp::WritableBind(_) | MountOp::ReadOnlyBind(_))
        ) {
            bound.push(path.clone());
        }
        ops.extend(op);
    }
    for pin in pinned_ancestors(policy, &ops, &overlay_dirs) {
        ops.push(MountOp::Pin(pin));
    }
    // The private /dev and /proc come first (masks use the private /dev's unreadable file),
    // then shallowest first so deeper steps land on top.
    let ordinary = |op: &MountOp| !matches!(op, MountOp::PrivateDev | MountOp::Proc);
    ops.sort_by(|a, b| {
        ordinary(a)
            .cmp(&ordinary(b))
            .then(depth(a.path()).cmp(&depth(b.path())))
            .then(a.path().cmp(b.path()))
    });
    ops.dedup_by(|later, earlier| later.path() == earlier.path());
    drop_beneath_masks(&mut ops);
    plan.extend(ops);
    plan
}

/// The access for `path`, treating an unrestricted filesystem as writable.
fn effective(policy: &ResolvedPolicy, path: &Path) -> Access {
    if policy.restricts_filesystem() {
        policy.access_for(path)
    } else {
        Access::Write
    }
}

/// Directories strictly between a writable root and a masked or read-only-bound path below
/// it: pinned so the protection cannot be moved away from its path by renaming one of them. A
/// mount follows its dentry through `rename(2)`, so renaming an unpinned ancestor (`vendor/lib`
/// above a protected `vendor/lib/.git`, `services` above a read entry `services/api` with a
/// denied `.env`) would leave the protected *path* an ordinary directory the command could
/// recreate; a mount point cannot be renamed or removed (`EBUSY`). The walk stops at a directory
/// that is already a step: that step's own walk pins what is above it. It stops too at a
/// directory an overlay shows and no writable bind carries: the command does not write the
/// host object there (and overlayfs refuses to rename a directory of its lower layer).
fn pinned_ancestors(
    policy: &ResolvedPolicy,
    ops: &[MountOp],
    overlays: &[PathBuf],
) -> Vec<PathBuf> {
    let host_writable = |dir: &Path| {
        effective(policy, dir).can_write()
            && (!overlays.iter().any(|o| dir.starts_with(o))
                || ops
                    .iter()
                    .any(|op| matches!(op, MountOp::WritableBind(b) if dir.starts_with(b))))
    };
    let mut pins = Vec::new();
    for op in ops {
        let (MountOp::MaskDir(path) | MountOp::MaskFile(path) | MountOp::ReadOnlyBind(path)) = op
        else {
            continue;
        };
        let mut ancestor = path.parent();
        while let Some(dir) = ancestor {
            if dir == Path::new("/") || !host_writable(dir) {
                break;
            }
            let is_root =
                policy.rules().iter().any(|r| r.path == dir) || !policy.restricts_filesystem();
            if ops.iter().any(|o| o.path() == dir) || (is_root && policy.restricts_filesystem()) {
                break;
            }
            pins.push(dir.to_path_buf());
            ancestor = dir.parent();
        }
    }
    pins
}

/// Steps beneath a masked directory would mount inside an empty read-only tmpfs: dropped (a
/// denied directory hides everything beneath it).
fn drop_beneath_masks(ops: &mut Vec<MountOp>) {
    let masks: Vec<PathBuf> = ops
        .iter()
        .filter_map(|op| match op {
            MountOp::MaskDir(path) => Some(path.clone()),
            _ => None,
        })
        .collect();
    ops.retain(|op| {
        !masks
            .iter()
            .any(|mask| op.path() != mask && op.path().starts_with(mask))
    });
}

fn depth(path: &Path) -> usize {
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count()
}

fn is_dir(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{FilesystemPolicy, PathRule};

    fn policy(rules: &[(&str, Access)]) -> ResolvedPolicy {
        ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: rules
                    .iter()
                    .map(|(path, access)| PathRule {
                        path: PathBuf::from(path),
                        access: *access,
                    })
                    .collect(),
            },
            false,
        )
    }

    #[test]
    fn private_directories_replace_host_paths_and_carry_named_ones_in() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(ws.join(".git")).unwrap();
        let policy = policy(&[
            ("/", Access::Read),
            ("/dev/null", Access::Write),
            (ws.to_str().unwrap(), Access::Write),
            (ws.join(".git").to_str().unwrap(), Access::Read),
        ]);
        let layout = Layout {
            proc: true,
            dev: true,
            private_dirs: vec![PathBuf::from("/tmp")],
            overlay_dirs: Vec::new(),
            carry: Vec::new(),
        };
        let plan = mount_plan(&policy, &layout);
        assert_eq!(
            plan,
            vec![
                MountOp::ReadOnlyRoot,
                MountOp::PrivateDev,
                MountOp::Proc,
                MountOp::PrivateDir(PathBuf::from("/tmp")),
                MountOp::PrivateDir(PathBuf::from("/dev/shm")),
                MountOp::WritableBind(ws.clone()),
                MountOp::ReadOnlyBind(ws.join(".git")),
            ]
        );
    }

    #[test]
    fn a_cwd_in_tmp_that_only_the_tmp_rule_covers_is_carried_with_its_denies() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let cwd = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::write(cwd.join("secret"), "k").unwrap();
        let policy = policy(&[
            ("/", Access::Read),
            ("/tmp", Access::Write),
            (cwd.join("secret").to_str().unwrap(), Access::Deny),
        ]);
        let layout = Layout {
            proc: true,
            dev: true,
            private_dirs: vec![PathBuf::from("/tmp")],
            overlay_dirs: Vec::new(),
            carry: vec![cwd.clone()],
        };
        let plan = mount_plan(&policy, &layout);
        assert!(
            plan.contains(&MountOp::WritableBind(cwd.clone())),
            "{plan:?}"
        );
        assert!(
            plan.contains(&MountOp::MaskFile(cwd.join("secret"))),
            "{plan:?}"
        );
        assert!(
            !plan.contains(&MountOp::WritableBind(PathBuf::from("/tmp"))),
            "{plan:?}"
        );
    }

    #[test]
    fn an_overlaid_tmp_binds_its_writable_roots_and_masks_denied_paths_without_pins() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(ws.join(".git")).unwrap();
        let other = tempfile::tempdir_in("/tmp").unwrap();
        let other = std::fs::canonicalize(other.path()).unwrap();
        std::fs::create_dir(other.join("sub")).unwrap();
        std::fs::write(other.join("sub/token"), "k").unwrap();
        let policy = policy(&[
            ("/", Access::Read),
            ("/tmp", Access::Write),
            (ws.to_str().unwrap(), Access::Write),
            (ws.join(".git").to_str().unwrap(), Access::Read),
            (other.join("sub/token").to_str().unwrap(), Access::Deny),
        ]);
        let layout = Layout {
            proc: true,
            dev: true,
            private_dirs: Vec::new(),
            overlay_dirs: vec![PathBuf::from("/tmp")],
            carry: vec![ws.clone()],
        };
        let plan = mount_plan(&policy, &layout);
        for expected in [
            MountOp::OverlayDir(PathBuf::from("/tmp")),
            MountOp::WritableBind(ws.clone()),
            MountOp::ReadOnlyBind(ws.join(".git")),
            MountOp::MaskFile(other.join("sub/token")),
        ] {
            assert!(plan.contains(&expected), "{expected:?}: {plan:?}");
        }
        // A pin is a writable bind of the host directory: inside the overlay it would hand
        // the command the host's own directory.
        assert!(
            !plan.iter().any(|op| matches!(op, MountOp::Pin(_))),
            "{plan:?}"
        );
        assert!(
            !plan
                .iter()
                .any(|op| matches!(op, MountOp::PrivateDir(p) if p == Path::new("/tmp"))),
            "{plan:?}"
        );
    }

    #[test]
    fn ancestors_of_a_denied_path_inside_a_writable_root_are_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/secret.pem"), "k").unwrap();
        let secret = ws.join("a/b/secret.pem");
        let policy = policy(&[
            ("/", Access::Read),
            (ws.to_str().unwrap(), Access::Write),
            (secret.to_str().unwrap(), Access::Deny),
        ]);
        let plan = mount_plan(&policy, &Layout::default());
        assert!(plan.contains(&MountOp::Pin(ws.join("a"))), "{plan:?}");
        assert!(plan.contains(&MountOp::Pin(ws.join("a/b"))), "{plan:?}");
        assert!(plan.contains(&MountOp::MaskFile(secret)), "{plan:?}");
        assert!(!plan.contains(&MountOp::Pin(ws.clone())), "{plan:?}");
    }

    #[test]
    fn ancestors_of_a_read_only_bind_inside_a_writable_root_are_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(ws.join("vendor/lib/.git")).unwrap();
        std::fs::create_dir_all(ws.join("services/api")).unwrap();
        std::fs::write(ws.join("services/api/.env"), "k").unwrap();
        let policy = policy(&[
            ("/", Access::Read),
            (ws.to_str().unwrap(), Access::Write),
            (ws.join("vendor/lib/.git").to_str().unwrap(), Access::Read),
            (ws.join("services/api").to_str().unwrap(), Access::Read),
            (ws.join("services/api/.env").to_str().unwrap(), Access::Deny),
        ]);
        let plan = mount_plan(&policy, &Layout::default());
        for pinned in ["vendor", "vendor/lib", "services"] {
            assert!(
                plan.contains(&MountOp::Pin(ws.join(pinned))),
                "{pinned}: {plan:?}"
            );
        }
        assert!(plan.contains(&MountOp::ReadOnlyBind(ws.join("vendor/lib/.git"))));
        assert!(plan.contains(&MountOp::ReadOnlyBind(ws.join("services/api"))));
        assert!(!plan.contains(&MountOp::Pin(ws.clone())), "{plan:?}");
    }

    #[test]
    fn nothing_is_mounted_beneath_a_masked_directory() {
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(ws.join("secret/pub")).unwrap();
        let policy = policy(&[
            ("/", Access::Read),
            (ws.to_str().unwrap(), Access::Write),
            (ws.join("secret").to_str().unwrap(), Access::Deny),
            (ws.join("secret/pub").to_str().unwrap(), Access::Write),
        ]);
        let plan = mount_plan(&policy, &Layout::default());
        assert!(
            plan.contains(&MountOp::MaskDir(ws.join("secret"))),
            "{plan:?}"
        );
        assert!(
            !plan.iter().any(|op| op.path() == ws.join("secret/pub")),
            "{plan:?}"
        );
    }
}
