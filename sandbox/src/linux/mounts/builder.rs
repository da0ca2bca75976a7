//! Building a [`mount_plan`](super::mount_plan) in a fresh mount namespace from descriptors:
//! sources opened and identified before anything changes, targets opened relative to the mounts
//! already attached, the private `/dev` and `/proc` assembled.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::layers::{build_overlay, fresh_tmpfs, make_writable};
use super::{DEV_NODES, MountError, MountOp, depth, mountinfo};
use crate::limits::PoolLimits;
use crate::sys::{
    self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// A file of the private `/dev` with mode 0000: what denied files are covered with. Opening it
/// fails with `EACCES` for every uid (the sandbox holds no `CAP_DAC_OVERRIDE`), so a denied file
/// is refused rather than silently read as empty. (A detached tmpfs cannot be the source: the
/// kernel clones only mounts attached in the caller's namespace.)
const DENIED_FILE: &str = ".execward-denied";
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
    /// Each overlaid directory and its upper layer (a descriptor, the only way to it once the
    /// overlay covers it): where the objects the command made there live
    /// ([`crate::linux::unix_sockets::Gate`]).
    pub overlays: Vec<(PathBuf, OwnedFd)>,
}

/// Builds `plan` in the caller's (fresh, private) mount namespace, its devpts instance and user
/// namespace bounded to their shares of the host's pools.
///
/// # Errors
/// [`MountError`] naming the step; the namespace is then half-built.
pub fn apply(plan: &[MountOp]) -> Result<Applied, MountError> {
    apply_bounded(plan, &PoolLimits::default())
}

/// [`apply`], with the devpts instance's `max=` and the user namespace's inotify maxima at the
/// smaller bounds `pools` asks for (never above the shares).
///
/// # Errors
/// As [`apply`].
pub fn apply_bounded(plan: &[MountOp], pools: &PoolLimits) -> Result<Applied, MountError> {
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
                    pools,
                )
            }
        };
        // A masked file or directory removed since it was opened (another server's socket or
        // token, gone as that server exited): nothing is left there to hide.
        if matches!(op, MountOp::MaskFile(_) | MountOp::MaskDir(_))
            && matches!(&result, Err(err) if err.raw_os_error() == Some(libc::ENOENT))
        {
            continue;
        }
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
        // A masked path removed since it was opened (another server's socket, gone as that
        // server exited): nothing is left there to hide.
        Err(err)
            if err.raw_os_error() == Some(libc::ENOENT)
                && matches!(op, MountOp::MaskFile(_) | MountOp::MaskDir(_)) =>
        {
            return Ok(None);
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
    pools: &PoolLimits,
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
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            // Attached first: the kernel changes a mount inside a tree one by one only once
            // the tree is in our namespace.
            make_writable(tree.as_fd(), path, &mut applied.warnings)?;
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
            sys::attach_mount(tree.as_fd(), target.as_fd())?;
            // Attached first: the kernel changes a mount inside a tree one by one only once
            // the tree is in our namespace.
            make_writable(tree.as_fd(), path, &mut applied.warnings)?;
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
        MountOp::OverlayDir(path) => match build_overlay(target, source(path)?.fd.as_fd()) {
            Ok((overlay, upper)) => {
                applied.overlays.push((path.clone(), upper));
                Ok(Some((overlay, true)))
            }
            // The kernel layers no directory with mounts of the host beneath it (they are
            // locked in our user namespace and an overlay would uncover what they cover). The
            // command gets a private directory there instead: narrower (host files there are
            // out of sight, what the policy names is carried in), never wider.
            Err(err)
                if err.raw_os_error() == Some(libc::EINVAL)
                    && !mountinfo::mount_points_below(path)?.is_empty() =>
            {
                applied.warnings.push(format!(
                    "{} is private to the command, not the host's with a private layer: the \
                     host has filesystems mounted inside it, which an overlay cannot layer",
                    path.display()
                ));
                let tmp = fresh_tmpfs("1777", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
                sys::attach_mount(tmp.as_fd(), target.as_fd())?;
                Ok(Some((tmp, true)))
            }
            Err(err) => Err(err),
        },
        MountOp::PrivateDev => build_dev(target, devices, pools).map(|dev| Some((dev, false))),
        MountOp::Proc => build_proc(target, applied, pools).map(|proc| Some((proc, false))),
    }
}

/// A tmpfs on `/dev` holding [`DEV_NODES`] bound from the host, a private devpts instance, the
/// mount point of `/dev/shm` (a [`MountOp::PrivateDir`] of its own) and the usual symlinks;
/// read-only once populated.
fn build_dev(
    target: &OwnedFd,
    devices: &[(&str, Source)],
    pools: &PoolLimits,
) -> io::Result<OwnedFd> {
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
        .set("mode", "0620")?
        // The host's devpts instances share one pool (kernel.pty.max): bounded per sandbox.
        .set("max", &pools.ptys().to_string())?;
    let pts = sys::fsmount(&pts, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)?;
    let place = sys::open_no_symlinks(Some(dev.as_fd()), Path::new("pts"))?;
    sys::attach_mount(pts.as_fd(), place.as_fd())?;
    sys::mount_setattr_fd(dev.as_fd(), false, MOUNT_ATTR_RDONLY, 0)?;
    Ok(dev)
}

/// The per-uid inotify counters this user namespace may charge: [`POOL_SHARE_DIVISOR`] of the
/// host's (`fs/inotify/max_user_*` shows the initial namespace's), written as this namespace's
/// own maxima (`sys/user/max_inotify_*`), which the kernel checks at every level of the
/// user-namespace hierarchy. Not setting them leaves the sandbox the host uid's whole pool, so
/// it fails the build. `pools` may ask for less ([`PoolLimits::inotify`]).
///
/// [`POOL_SHARE_DIVISOR`]: crate::limits::POOL_SHARE_DIVISOR
fn bound_inotify(proc: &OwnedFd, pools: &PoolLimits) -> io::Result<()> {
    for (host, ours, watches) in INOTIFY_POOLS {
        let read = nix::fcntl::openat(
            proc.as_fd(),
            *host,
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        let mut text = String::new();
        io::Read::read_to_string(&mut std::fs::File::from(read), &mut text)?;
        let host_max: u64 = text
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("{host}: not a number: {text:?}")))?;
        let share = pools.inotify(host_max, *watches);
        let fd = nix::fcntl::openat(
            proc.as_fd(),
            *ours,
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|err| io::Error::other(format!("{ours}: {err}")))?;
        nix::unistd::write(&fd, share.to_string().as_bytes())
            .map_err(|err| io::Error::other(format!("{ours}: {err}")))?;
    }
    Ok(())
}

/// The host's per-uid inotify maxima and this user namespace's own, relative to `/proc`, and
/// whether they count watches (else instances).
const INOTIFY_POOLS: &[(&str, &str, bool)] = &[
    (
        "sys/fs/inotify/max_user_instances",
        "sys/user/max_inotify_instances",
        false,
    ),
    (
        "sys/fs/inotify/max_user_watches",
        "sys/user/max_inotify_watches",
        true,
    ),
];

/// A fresh proc instance (of the caller's PID namespace) on `/proc`, with [`PROC_READ_ONLY`]
/// re-bound read-only, after forbidding new user namespaces in ours
/// (`/proc/sys/user/max_user_namespaces` = 0: a nested user namespace would hand a process a
/// full capability set again; seccomp refuses creating one too).
fn build_proc(target: &OwnedFd, applied: &mut Applied, pools: &PoolLimits) -> io::Result<OwnedFd> {
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
    bound_inotify(&proc, pools)?;
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
