//! Layers the builder makes writable or fresh: a cloned writable root made writable mount by
//! mount where the host locked one read-only, an overlay with its private tmpfs, a fresh tmpfs.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::mountinfo;
use crate::sys::{self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// The directories of an overlay's tmpfs: its upper layer and the overlay's work directory.
const OVERLAY_UPPER: &str = "upper";
const OVERLAY_WORK: &str = "work";

/// Clears the read-only attribute the root step set on every mount of `tree` (the clone of the
/// writable root or pin at `path`). All at once when it can; when one mount refuses (one the
/// host made read-only: it is locked so in our user namespace), each mount on its own, so that
/// one read-only mount leaves the mounts beside and above it writable. What stays read-only is
/// reported in `warnings` (narrower, never wider).
pub(super) fn make_writable(
    tree: BorrowedFd<'_>,
    path: &Path,
    warnings: &mut Vec<String>,
) -> io::Result<()> {
    let refused = |err: &io::Error| err.raw_os_error() == Some(libc::EPERM);
    match sys::mount_setattr_fd(tree, true, 0, MOUNT_ATTR_RDONLY) {
        Err(err) if refused(&err) => {}
        result => return result,
    }
    let below = mountinfo::mount_points_below(path)?;
    for relative in std::iter::once(PathBuf::new()).chain(below) {
        let result = if relative.as_os_str().is_empty() {
            sys::mount_setattr_fd(tree, false, 0, MOUNT_ATTR_RDONLY)
        } else {
            sys::open_no_symlinks(Some(tree), &relative)
                .and_then(|mount| sys::mount_setattr_fd(mount.as_fd(), false, 0, MOUNT_ATTR_RDONLY))
        };
        let shown = path.join(&relative);
        match result {
            Ok(()) => {}
            Err(err) if refused(&err) => warnings.push(format!(
                "{} stays read-only: the host mounted it read-only",
                shown.display()
            )),
            // Not in this tree (mounted since the source was opened, or hidden beneath
            // another mount): nothing of it is reachable here.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
            Err(err) => warnings.push(format!("{} stays read-only: {err}", shown.display())),
        }
    }
    Ok(())
}

/// An overlay on `target` (the host directory `lower`, opened before anything changed): a
/// fresh tmpfs is attached there first and holds the upper and work directories, then the
/// overlay (`lower` read-only below, the tmpfs's upper directory above) is attached on top of
/// it. Layers are named by `/proc/self/fd` (the private `/proc` is mounted before any private
/// directory), so nothing is looked up by path twice. `userxattr`: the overlay's own
/// attributes live in the `user.` namespace, the one a user namespace may write.
/// Returns the overlay and its upper directory.
pub(super) fn build_overlay(
    target: &OwnedFd,
    lower: BorrowedFd<'_>,
) -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
    let stat = nix::sys::stat::fstat(lower)?;
    let layer = fresh_tmpfs("0755", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    sys::attach_mount(layer.as_fd(), target.as_fd())?;
    nix::sys::stat::mkdirat(
        layer.as_fd(),
        OVERLAY_UPPER,
        Mode::from_bits_truncate(0o700),
    )?;
    nix::sys::stat::mkdirat(layer.as_fd(), OVERLAY_WORK, Mode::from_bits_truncate(0o700))?;
    // The merged root shows the upper directory's owner and mode: the host directory's (a
    // user namespace without the host owner mapped keeps its own uid).
    let _ = nix::unistd::fchownat(
        layer.as_fd(),
        OVERLAY_UPPER,
        Some(nix::unistd::Uid::from_raw(stat.st_uid)),
        Some(nix::unistd::Gid::from_raw(stat.st_gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    fchmodat(
        layer.as_fd(),
        OVERLAY_UPPER,
        Mode::from_bits_truncate(stat.st_mode & 0o7777),
        // Just made in our fresh tmpfs: nothing there can be a symlink.
        FchmodatFlags::FollowSymlink,
    )?;
    let upper = sys::open_no_symlinks(Some(layer.as_fd()), Path::new(OVERLAY_UPPER))?;
    let work = sys::open_no_symlinks(Some(layer.as_fd()), Path::new(OVERLAY_WORK))?;
    let by_fd = |fd: &OwnedFd| format!("/proc/self/fd/{}", fd.as_raw_fd());
    let context = FsContext::open("overlay")?;
    context
        .set("lowerdir", &format!("/proc/self/fd/{}", lower.as_raw_fd()))?
        .set("upperdir", &by_fd(&upper))?
        .set("workdir", &by_fd(&work))?
        .flag("userxattr")?;
    let overlay = sys::fsmount(&context, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    sys::attach_mount(overlay.as_fd(), layer.as_fd())?;
    Ok((overlay, upper))
}

pub(super) fn fresh_tmpfs(mode: &str, attrs: u64) -> io::Result<OwnedFd> {
    let context = FsContext::open("tmpfs")?;
    context.set("mode", mode)?;
    sys::fsmount(&context, attrs)
}
