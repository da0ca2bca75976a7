//! Every raw system call of the crate, each behind a typed safe wrapper.
//!
//! Everything else in the crate uses `nix`, `landlock` and `seccompiler`; what they do not
//! cover lives here, with a `// SAFETY:` note per block.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `mount_setattr(2)` attribute: read-only mount.
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `mount_setattr(2)` attribute: ignore set-user-ID bits.
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// `mount_setattr(2)` attribute: no device access.
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// `mount_setattr(2)` flag: apply to the whole subtree.
const AT_RECURSIVE: libc::c_uint = 0x8000;
/// `landlock_create_ruleset(2)` flag: return the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// `struct mount_attr` from `<linux/mount.h>` (not in libc yet).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// The running kernel's Landlock ABI version (0 when Landlock is missing or disabled).
pub fn landlock_abi() -> i32 {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the call only returns
    // a number; no memory is read or written.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// Sets and clears mount attributes on the mount at `path` (and below it when `recursive`).
pub fn mount_setattr(path: &Path, recursive: bool, set: u64, clear: u64) -> io::Result<()> {
    let c_path = cstring(path.as_os_str())?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `c_path` is a valid NUL-terminated string and `attr` a valid `struct mount_attr`
    // whose size is passed alongside; both outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes every descriptor in `first..=last`.
pub fn close_range(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; the caller owns the process's descriptor
    // table at this point (single-threaded, before any runtime exists).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes `key` from the environment.
///
/// Must only be called while the process is single-threaded (the confinement contract).
pub fn remove_env(key: &OsStr) {
    // SAFETY: restrict_current_process runs in a freshly exec'd, single-threaded process
    // before any thread or runtime exists, so no other thread reads the environment.
    unsafe { std::env::remove_var(key) };
}

/// Every environment variable name, for clearing.
pub fn env_keys() -> Vec<OsString> {
    std::env::vars_os().map(|(key, _)| key).collect()
}

/// Runs `child` in a forked child process, which exits with the returned status without
/// returning into the caller's code. Returns the child's pid to the parent.
///
/// Must only be called while the process is single-threaded (the confinement contract).
pub fn fork_child(child: impl FnOnce() -> i32) -> io::Result<nix::unistd::Pid> {
    use nix::unistd::ForkResult;
    // SAFETY: the caller is single-threaded, so no lock can be held by another thread across
    // the fork; the child runs `child` and leaves through `_exit` without unwinding back.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            let status = child();
            // SAFETY: _exit ends the forked child immediately without running destructors.
            unsafe { libc::_exit(status) }
        }
        Ok(ForkResult::Parent { child }) => Ok(child),
        Err(errno) => Err(errno.into()),
    }
}

/// Whether this process can create a user + mount namespace, tested in a forked child so
/// the caller itself stays untouched.
pub fn can_unshare_user_namespace() -> bool {
    use nix::sched::{CloneFlags, unshare};
    use nix::sys::wait::{WaitStatus, waitpid};
    use nix::unistd::ForkResult;
    // SAFETY: the child only calls async-signal-safe functions (unshare, _exit) and never
    // returns into Rust code that could touch locks held by other threads.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            let ok = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).is_ok();
            // SAFETY: _exit ends the forked child immediately without running destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(ForkResult::Parent { child }) => {
            matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0)))
        }
        Err(_) => false,
    }
}

fn cstring(value: &OsStr) -> io::Result<CString> {
    CString::new(value.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}
