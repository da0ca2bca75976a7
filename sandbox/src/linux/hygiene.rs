//! Process hygiene before confinement: inherited descriptors and the environment.

use std::ffi::OsStr;
use std::os::fd::RawFd;

use super::EnvMode;
use crate::sys;

/// Variables a helper keeps; everything else (notably `HOME` and any token) is dropped.
pub const HELPER_ENV_ALLOWLIST: &[&str] = &["PATH", "TMPDIR", "TMP", "TEMP"];

/// Takes ownership of descriptor `fd`, handed to this process at `exec` on purpose (an
/// `--ask-fd` peer; the egress proxy's listener, event pipe and configuration), after checking
/// that it is open; sets close-on-exec on it.
///
/// # Errors
/// `EBADF` when it is not open.
pub fn take_inherited_fd(fd: RawFd) -> std::io::Result<std::os::fd::OwnedFd> {
    sys::take_inherited_fd(fd)
}

/// Closes every descriptor not in `keep`.
///
/// # Errors
/// The OS error of `close_range(2)`.
pub fn close_inherited_fds(keep: &[RawFd]) -> std::io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|fd| u32::try_from(*fd).ok())
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut next = 0u32;
    for fd in keep {
        if fd > next {
            sys::close_range(next, fd - 1)?;
        }
        next = fd.saturating_add(1);
    }
    sys::close_range(next, u32::MAX)
}

/// Applies `mode` to the environment of the current process.
pub fn rebuild_env(mode: EnvMode) {
    if mode == EnvMode::Keep {
        return;
    }
    for key in sys::env_keys() {
        let keep = HELPER_ENV_ALLOWLIST
            .iter()
            .any(|allowed| OsStr::new(allowed) == key);
        if !keep {
            sys::remove_env(&key);
        }
    }
}
