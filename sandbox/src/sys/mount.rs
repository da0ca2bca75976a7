//! The descriptor-based mount API (`open_tree`, `move_mount`, `fsopen`/`fsconfig`/`fsmount`,
//! `mount_setattr` on a descriptor) and `openat2`, each behind a typed safe wrapper. Working from
//! descriptors is what makes the sandbox's mount layout immune to a path being swapped for a
//! symlink while it is built: every source is opened once, without following symlinks, and
//! every target is a descriptor checked to be the same inode.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// `mount_setattr(2)` attribute: no execution of programs from the mount.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;

/// `open_tree(2)`: make a detached copy of the tree instead of opening it.
const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `open_tree(2)` / `mount_setattr(2)`: the whole subtree.
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `move_mount(2)`: the source is the descriptor itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
/// `move_mount(2)`: the target is the descriptor itself.
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x0000_0040;
/// `fsopen(2)` flag.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
/// `fsmount(2)` flag.
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
/// `fsconfig(2)` commands.
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

/// `struct mount_attr` from `<linux/mount.h>`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn owned(rc: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(check(rc)?).map_err(|_| io::Error::from(io::ErrorKind::Other))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstring(text: &[u8]) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens `path` (absolute) as an `O_PATH` descriptor without following any symlink on the way
/// (`openat2` with `RESOLVE_NO_SYMLINKS`), so a component swapped for a symlink fails with
/// `ELOOP` instead of redirecting the open.
///
/// # Errors
/// The OS error of `openat2(2)`.
pub fn open_no_symlinks(dir: Option<BorrowedFd<'_>>, path: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = match dir {
        Some(dir) => nix::fcntl::openat2(dir, path, how),
        None => nix::fcntl::openat2(nix::fcntl::AT_FDCWD, path, how),
    };
    fd.map_err(io::Error::from)
}

/// A detached copy of the mount tree at `source` (recursive), ready to get attributes and be
/// attached elsewhere.
///
/// # Errors
/// The OS error of `open_tree(2)`.
pub fn clone_mount_tree(source: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let empty = cstring(b"")?;
    // SAFETY: `empty` is a valid NUL-terminated string that outlives the call; the flags ask
    // for a new descriptor and touch no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            source.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    owned(rc)
}

/// Sets and clears attributes of the mount `mount` refers to (and its children when
/// `recursive`).
///
/// # Errors
/// The OS error of `mount_setattr(2)` (`EPERM` when clearing a flag the host locked).
pub fn mount_setattr_fd(
    mount: BorrowedFd<'_>,
    recursive: bool,
    set: u64,
    clear: u64,
) -> io::Result<()> {
    let empty = cstring(b"")?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: `empty` and `attr` are valid for the duration of the call and the size passed is
    // the size of `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            empty.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc).map(drop)
}

/// Attaches the detached mount `tree` on top of the location `target` refers to.
///
/// # Errors
/// The OS error of `move_mount(2)`.
pub fn attach_mount(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    let empty = cstring(b"")?;
    // SAFETY: both path arguments are the same valid empty string; the call only uses the two
    // descriptors.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    check(rc).map(drop)
}

/// A filesystem context (`fsopen`) being configured for a new, detached mount.
pub struct FsContext {
    fd: OwnedFd,
}

impl FsContext {
    /// Opens a context for a filesystem type (`tmpfs`, `proc`, `devpts`).
    ///
    /// # Errors
    /// The OS error of `fsopen(2)`.
    pub fn open(fstype: &str) -> io::Result<Self> {
        let name = cstring(fstype.as_bytes())?;
        // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
        let rc = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) };
        Ok(Self { fd: owned(rc)? })
    }

    /// Sets a string option (`mode`, `size`, ...).
    ///
    /// # Errors
    /// The OS error of `fsconfig(2)`.
    pub fn set(&self, key: &str, value: &str) -> io::Result<&Self> {
        let key = cstring(key.as_bytes())?;
        let value = cstring(value.as_bytes())?;
        // SAFETY: both strings are valid and NUL-terminated for the duration of the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        check(rc).map(|_| self)
    }

    /// Sets a flag option (`newinstance`).
    ///
    /// # Errors
    /// The OS error of `fsconfig(2)`.
    pub fn flag(&self, key: &str) -> io::Result<&Self> {
        let key = cstring(key.as_bytes())?;
        // SAFETY: `key` is valid and NUL-terminated for the duration of the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.fd.as_raw_fd(),
                FSCONFIG_SET_FLAG,
                key.as_ptr(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        };
        check(rc).map(|_| self)
    }
}

/// Creates the filesystem of `context` and returns it as a detached mount with `attrs`.
///
/// # Errors
/// The OS error of `fsconfig(FSCONFIG_CMD_CREATE)` or `fsmount(2)`.
pub fn fsmount(context: &FsContext, attrs: u64) -> io::Result<OwnedFd> {
    // SAFETY: FSCONFIG_CMD_CREATE takes no pointers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.fd.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    };
    check(rc)?;
    // SAFETY: fsmount takes a descriptor and two integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.fd.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs as libc::c_uint,
        )
    };
    owned(rc)
}
