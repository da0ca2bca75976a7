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
//! Steps: writable roots re-bound writable (`nosuid`, `nodev`), narrower paths inside them
//! re-bound read-only (`.git`, `.agents`, `.codex`, the server's binaries), denied paths masked,
//! ancestors of denied paths inside writable roots pinned (bound onto themselves, so they cannot
//! be renamed from inside: a deny entry cannot be moved from under the next command), private
//! `/tmp`, `$TMPDIR` and `/run` (fresh tmpfs: host daemons' sockets and files there are out of
//! reach; paths the policy names inside them are carried in), a minimal `/dev` with its own
//! devpts instance (no host terminal, disk or console is reachable), and a fresh `/proc` for the
//! PID namespace with `/proc/sys` and friends read-only.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use crate::policy::{Access, ResolvedPolicy};
use crate::sys::{
    self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// Device nodes the private `/dev` holds, bound from the host's.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// A file of the private `/dev` with mode 0000: what denied files are covered with. Opening it
/// fails with `EACCES` for every uid (the sandbox holds no `CAP_DAC_OVERRIDE`), so a denied file
/// is refused rather than silently read as empty. (A detached tmpfs cannot be the source: the
/// kernel clones only mounts attached in the caller's namespace.)
const DENIED_FILE: &str = ".execward-denied";
/// The private `/dev`'s shared-memory directory: a fresh tmpfs like `/tmp`.
const DEV_SHM: &str = "/dev/shm";
/// Symlinks of the private `/dev`.
const DEV_LINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];
/// Entries of a fresh `/proc` that stay read-only (as container runtimes keep them): kernel
/// tunables and triggers that are only guarded by their owner's uid.
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Size of the tmpfs that masks a denied directory.
const MASK_TMPFS_OPTIONS: [(&str, &str); 2] = [("size", "4k"), ("mode", "000")];

/// What the sandbox builds besides the policy's rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// A fresh `/proc` (the builder is PID 1 of a new PID namespace).
    pub proc: bool,
    /// A minimal `/dev` with a private devpts instance.
    pub dev: bool,
    /// Directories that get a fresh tmpfs (`/tmp`, `$TMPDIR`, `/run`).
    pub private_dirs: Vec<PathBuf>,
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
            | MountOp::PrivateDir(path) => path,
        }
    }

    /// Whether the step re-mounts the host object at its own place (and so must find the same
    /// inode there).
    fn binds_in_place(&self) -> bool {
        matches!(
            self,
            MountOp::WritableBind(_)
                | MountOp::ReadOnlyBind(_)
                | MountOp::Pin(_)
                | MountOp::MaskDir(_)
                | MountOp::MaskFile(_)
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
    let mut ops: Vec<MountOp> = private_dirs
        .iter()
        .map(|dir| MountOp::PrivateDir(dir.clone()))
        .collect();
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
        if private(path) && !carried.iter().any(|(p, _)| p == path) {
            carried.push((path.clone(), policy.access_for(path)));
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
        if replaced(path) || private_dirs.contains(path) {
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
        let is_device = meta.file_type().is_char_device() || meta.file_type().is_block_device();
        let op = match access {
            Access::Write if parent != Access::Write && !is_device => {
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
    for pin in pinned_ancestors(policy, &ops) {
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

/// Directories strictly between a writable root and a masked path below it: pinned so the mask
/// cannot be moved away from its path by renaming one of them.
fn pinned_ancestors(policy: &ResolvedPolicy, ops: &[MountOp]) -> Vec<PathBuf> {
    let mut pins = Vec::new();
    for op in ops {
        let (MountOp::MaskDir(path) | MountOp::MaskFile(path)) = op else {
            continue;
        };
        let mut ancestor = path.parent();
        while let Some(dir) = ancestor {
            if dir == Path::new("/") || !effective(policy, dir).can_write() {
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

/// A host object opened before the layout changed, with its identity.
struct Source {
    fd: OwnedFd,
    dev: u64,
    ino: u64,
    is_dir: bool,
}

impl Source {
    fn open(path: &Path) -> Result<Option<Self>, MountError> {
        match sys::open_no_symlinks(None, path) {
            Ok(fd) => {
                let meta =
                    std::fs::File::from(fd.try_clone().map_err(|source| MountError::Step {
                        op: MountOp::ReadOnlyRoot,
                        source,
                    })?)
                    .metadata()
                    .map_err(|source| MountError::Step {
                        op: MountOp::ReadOnlyRoot,
                        source,
                    })?;
                Ok(Some(Self {
                    fd,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    is_dir: meta.is_dir(),
                }))
            }
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(err) if err.raw_os_error() == Some(libc::ELOOP) => Err(MountError::Changed {
                path: path.to_owned(),
                what: "a symlink is on its way".to_owned(),
            }),
            Err(source) => Err(MountError::Step {
                op: MountOp::ReadOnlyRoot,
                source,
            }),
        }
    }
}

fn identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let stat = nix::sys::stat::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// A mount this layout attached: later targets beneath it are opened relative to it.
struct Attached {
    path: PathBuf,
    root: OwnedFd,
    /// A fresh tmpfs of ours: missing mount points may be created in it.
    fresh: bool,
}

/// What [`apply`] did that the caller reports.
#[derive(Debug, Default)]
pub struct Applied {
    /// Steps applied.
    pub ops: Vec<MountOp>,
    /// Narrower outcomes (a writable root the host mounted read-only stays read-only).
    pub warnings: Vec<String>,
}

/// Builds `plan` in the caller's (fresh, private) mount namespace.
///
/// # Errors
/// [`MountError`] naming the step; the namespace is then half-built.
pub fn apply(plan: &[MountOp]) -> Result<Applied, MountError> {
    let step = |op: &MountOp| {
        let op = op.clone();
        move |source: io::Error| MountError::Step { op, source }
    };
    let none: Option<&str> = None;
    nix::mount::mount(
        none,
        "/",
        none,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_SLAVE,
        none,
    )
    .map_err(|e| step(&MountOp::ReadOnlyRoot)(e.into()))?;
    // 1. Sources, before anything changes.
    let mut sources: BTreeMap<PathBuf, Source> = BTreeMap::new();
    for op in plan {
        if op.binds_in_place()
            && let Some(source) = Source::open(op.path())?
        {
            sources.insert(op.path().to_owned(), source);
        }
    }
    let mut devices = Vec::new();
    if plan.contains(&MountOp::PrivateDev) {
        for name in DEV_NODES {
            let path = Path::new("/dev").join(name);
            if let Some(source) = Source::open(&path)? {
                devices.push((*name, source));
            }
        }
    }
    // What denied files are covered with: the private /dev's unreadable file (set below).
    let mut mask_file: Option<OwnedFd> = None;
    let root = sys::open_no_symlinks(None, Path::new("/")).map_err(step(&MountOp::ReadOnlyRoot))?;
    let mut attached: Vec<Attached> = Vec::new();
    let mut applied = Applied::default();
    for op in plan {
        let result = match op {
            MountOp::ReadOnlyRoot => {
                sys::mount_setattr_fd(root.as_fd(), true, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
                    .map(|()| None)
            }
            _ => {
                let Some(target) = open_target(op, &root, &attached, &sources)? else {
                    continue;
                };
                build(
                    op,
                    &target,
                    &sources,
                    &devices,
                    mask_file.as_ref(),
                    &mut applied,
                )
            }
        };
        let result = result.map_err(step(op))?;
        if *op == MountOp::PrivateDev
            && let Some((dev, _)) = &result
        {
            mask_file = Some(
                sys::open_no_symlinks(Some(dev.as_fd()), Path::new(DENIED_FILE))
                    .map_err(step(op))?,
            );
        }
        if let Some((mount_root, fresh)) = result {
            attached.push(Attached {
                path: op.path().to_owned(),
                root: mount_root,
                fresh,
            });
        }
        applied.ops.push(op.clone());
    }
    Ok(applied)
}

/// Opens the place `op` mounts on, relative to the deepest mount already attached above it.
/// `None` when there is nothing to do (the host object is gone).
fn open_target(
    op: &MountOp,
    root: &OwnedFd,
    attached: &[Attached],
    sources: &BTreeMap<PathBuf, Source>,
) -> Result<Option<OwnedFd>, MountError> {
    let path = op.path();
    let source = sources.get(path);
    if op.binds_in_place() && source.is_none() {
        return Ok(None);
    }
    let base = attached
        .iter()
        .filter(|a| path.starts_with(&a.path) && a.path != path)
        .max_by_key(|a| depth(&a.path));
    let (base_fd, base_path, fresh) = match base {
        Some(a) => (a.root.as_fd(), a.path.as_path(), a.fresh),
        None => (root.as_fd(), Path::new("/"), false),
    };
    let relative = path.strip_prefix(base_path).unwrap_or(path);
    let changed = |what: String| MountError::Changed {
        path: path.to_owned(),
        what,
    };
    let step_err = |source: io::Error| MountError::Step {
        op: op.clone(),
        source,
    };
    let target = match sys::open_no_symlinks(Some(base_fd), relative) {
        Ok(fd) => fd,
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) && fresh => {
            let as_dir = source.is_none_or(|s| s.is_dir);
            create_mount_point(base_fd, relative, as_dir).map_err(step_err)?;
            sys::open_no_symlinks(Some(base_fd), relative).map_err(step_err)?
        }
        Err(err) if err.raw_os_error() == Some(libc::ELOOP) => {
            return Err(changed("a symlink is on its way".to_owned()));
        }
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {
            return Err(changed("it disappeared".to_owned()));
        }
        Err(err) => return Err(step_err(err)),
    };
    if op.binds_in_place()
        && !fresh
        && let Some(source) = source
    {
        let found = identity(target.as_fd()).map_err(step_err)?;
        if found != (source.dev, source.ino) {
            return Err(changed("another file is there now".to_owned()));
        }
    }
    Ok(Some(target))
}

/// Creates the directories of `relative` below `base` (a fresh tmpfs of ours), and the last
/// component as a directory or an empty file.
fn create_mount_point(base: BorrowedFd<'_>, relative: &Path, as_dir: bool) -> io::Result<()> {
    use nix::sys::stat::Mode;
    let mut current: Option<OwnedFd> = None;
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    for (index, part) in parts.iter().enumerate() {
        let dir = current.as_ref().map_or(base, AsFd::as_fd);
        let last = index + 1 == parts.len();
        if last && !as_dir {
            let file = nix::fcntl::openat(
                dir,
                *part,
                nix::fcntl::OFlag::O_CREAT
                    | nix::fcntl::OFlag::O_EXCL
                    | nix::fcntl::OFlag::O_WRONLY
                    | nix::fcntl::OFlag::O_CLOEXEC
                    | nix::fcntl::OFlag::O_NOFOLLOW,
                Mode::from_bits_truncate(0o644),
            );
            match file {
                Ok(_) | Err(nix::errno::Errno::EEXIST) => {}
                Err(err) => return Err(err.into()),
            }
            return Ok(());
        }
        match nix::sys::stat::mkdirat(dir, *part, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(err) => return Err(err.into()),
        }
        let next = sys::open_no_symlinks(Some(dir), Path::new(part))?;
        current = Some(next);
    }
    Ok(())
}

/// Performs one step onto `target`; returns the root of the new mount (to open deeper targets
/// in) and whether it is a fresh tmpfs of ours.
fn build(
    op: &MountOp,
    target: &OwnedFd,
    sources: &BTreeMap<PathBuf, Source>,
    devices: &[(&str, Source)],
    mask_file: Option<&OwnedFd>,
    applied: &mut Applied,
) -> io::Result<Option<(OwnedFd, bool)>> {
    let source = |path: &Path| {
        sources
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    };
    match op {
        MountOp::ReadOnlyRoot => Ok(None),
        MountOp::WritableBind(path) => {
            let tree = sys::clone_mount_tree(source(path)?.fd.as_fd())?;
            // No device nodes or set-user-ID programs from a writable root; this only adds
            // restrictions, so it must succeed.
            sys::mount_setattr_fd(tree.as_fd(), true, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID, 0)?;
            let writable = sys::mount_setattr_fd(tree.as_fd(), true, 0, MOUNT_ATTR_RDONLY)
                .or_else(|_| sys::mount_setattr_fd(tree.as_fd(), false, 0, MOUNT_ATTR_RDONLY));
            if let Err(err) = writable {
                if err.raw_os_error() != Some(libc::EPERM) {
                    return Err(err);
                }
                // A mount the host made read-only stays read-only: narrower, not wider.
                applied.warnings.push(format!(
                    "{} stays read-only: the host mounted it read-only",
                    path.display()
                ));
            }
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            Ok(Some((tree, false)))
        }
        MountOp::ReadOnlyBind(path) => {
            let tree = sys::clone_mount_tree(source(path)?.fd.as_fd())?;
            sys::mount_setattr_fd(
                tree.as_fd(),
                true,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
                0,
            )?;
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            Ok(Some((tree, false)))
        }
        MountOp::Pin(path) => {
            // Pins only sit inside writable roots: a writable bind of the directory onto itself.
            let tree = sys::clone_mount_tree(source(path)?.fd.as_fd())?;
            sys::mount_setattr_fd(tree.as_fd(), true, MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID, 0)?;
            let _ = sys::mount_setattr_fd(tree.as_fd(), false, 0, MOUNT_ATTR_RDONLY);
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            Ok(Some((tree, false)))
        }
        MountOp::MaskDir(_) => {
            let context = FsContext::open("tmpfs")?;
            for (key, value) in MASK_TMPFS_OPTIONS {
                context.set(key, value)?;
            }
            let mask = sys::fsmount(
                &context,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )?;
            sys::attach_mount(mask.as_fd(), target.as_fd())?;
            Ok(None)
        }
        MountOp::MaskFile(_) => {
            let mask = mask_file.ok_or_else(|| {
                io::Error::other("a denied file needs the private /dev (its unreadable file)")
            })?;
            let tree = sys::clone_mount_tree(mask.as_fd())?;
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            Ok(None)
        }
        MountOp::PrivateDir(_) => {
            let tmp = fresh_tmpfs("1777", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
            sys::attach_mount(tmp.as_fd(), target.as_fd())?;
            Ok(Some((tmp, true)))
        }
        MountOp::PrivateDev => build_dev(target, devices).map(|dev| Some((dev, false))),
        MountOp::Proc => build_proc(target, applied).map(|proc| Some((proc, false))),
    }
}

fn fresh_tmpfs(mode: &str, attrs: u64) -> io::Result<OwnedFd> {
    let context = FsContext::open("tmpfs")?;
    context.set("mode", mode)?;
    sys::fsmount(&context, attrs)
}

/// A tmpfs on `/dev` holding [`DEV_NODES`] bound from the host, a private devpts instance, the
/// mount point of `/dev/shm` (a [`MountOp::PrivateDir`] of its own) and the usual symlinks;
/// read-only once populated.
fn build_dev(target: &OwnedFd, devices: &[(&str, Source)]) -> io::Result<OwnedFd> {
    use nix::sys::stat::Mode;
    let dev = fresh_tmpfs("0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
    sys::attach_mount(dev.as_fd(), target.as_fd())?;
    for (name, source) in devices {
        let node = nix::fcntl::openat(
            dev.as_fd(),
            *name,
            nix::fcntl::OFlag::O_CREAT
                | nix::fcntl::OFlag::O_EXCL
                | nix::fcntl::OFlag::O_WRONLY
                | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o666),
        )?;
        drop(node);
        let place = sys::open_no_symlinks(Some(dev.as_fd()), Path::new(name))?;
        let tree = sys::clone_mount_tree(source.fd.as_fd())?;
        sys::attach_mount(tree.as_fd(), place.as_fd())?;
    }
    for dir in ["pts", "shm"] {
        nix::sys::stat::mkdirat(dev.as_fd(), dir, Mode::from_bits_truncate(0o755))?;
    }
    let denied = nix::fcntl::openat(
        dev.as_fd(),
        DENIED_FILE,
        nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_EXCL
            | nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    drop(denied);
    for (name, to) in DEV_LINKS {
        nix::unistd::symlinkat(*to, dev.as_fd(), *name)?;
    }
    let pts = FsContext::open("devpts")?;
    pts.flag("newinstance")?
        .set("ptmxmode", "0666")?
        .set("mode", "0620")?;
    let pts = sys::fsmount(&pts, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
    let place = sys::open_no_symlinks(Some(dev.as_fd()), Path::new("pts"))?;
    sys::attach_mount(pts.as_fd(), place.as_fd())?;
    sys::mount_setattr_fd(dev.as_fd(), false, MOUNT_ATTR_RDONLY, 0)?;
    Ok(dev)
}

/// A fresh proc instance (of the caller's PID namespace) on `/proc`, with [`PROC_READ_ONLY`]
/// re-bound read-only, after forbidding new user namespaces in ours
/// (`/proc/sys/user/max_user_namespaces` = 0: a nested user namespace would hand a process a
/// full capability set again; seccomp refuses creating one too).
fn build_proc(target: &OwnedFd, applied: &mut Applied) -> io::Result<OwnedFd> {
    let context = FsContext::open("proc")?;
    let proc = sys::fsmount(
        &context,
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
    )?;
    sys::attach_mount(proc.as_fd(), target.as_fd())?;
    let limit = nix::fcntl::openat(
        proc.as_fd(),
        "sys/user/max_user_namespaces",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .and_then(|fd| nix::unistd::write(&fd, b"0").map(drop));
    if let Err(err) = limit {
        applied.warnings.push(format!(
            "cannot set max_user_namespaces to 0 ({err}); seccomp still refuses new namespaces"
        ));
    }
    for entry in PROC_READ_ONLY {
        let Ok(place) = sys::open_no_symlinks(Some(proc.as_fd()), Path::new(entry)) else {
            continue;
        };
        let tree = sys::clone_mount_tree(place.as_fd())?;
        sys::mount_setattr_fd(tree.as_fd(), true, MOUNT_ATTR_RDONLY, 0)?;
        sys::attach_mount(tree.as_fd(), place.as_fd())?;
    }
    Ok(proc)
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
