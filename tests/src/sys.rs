//! The only unsafe code of the test library: raw calls, each behind a safe wrapper.

use std::io;

/// Sets the calling thread's file-system uid (`setfsuid(2)`) and returns the previous one.
/// `setfsuid` reports no error: the previous uid comes back whether or not it changed.
pub fn set_fsuid(uid: libc::uid_t) -> libc::uid_t {
    // SAFETY: setfsuid changes only this thread's file-system uid; no memory is involved.
    let previous = unsafe { libc::setfsuid(uid) };
    // A uid is never negative: setfsuid returns it as an int.
    libc::uid_t::try_from(previous).unwrap_or(uid)
}

/// Sets the calling thread's nice value (`setpriority(PRIO_PROCESS, 0, nice)`).
///
/// # Errors
/// The OS error (EACCES/EPERM when not permitted).
pub fn set_nice(nice: i32) -> io::Result<()> {
    // SAFETY: setpriority on the calling thread (who 0 means the caller) touches no memory.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `command`'s child set its nice value to `nice` between fork and exec (a failure, e.g.
/// not root, is ignored: the child keeps its priority).
pub fn set_nice_in_child(command: &mut std::process::Command, nice: i32) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs in the child between fork and exec and makes one
    // async-signal-safe system call (setpriority), allocating nothing.
    unsafe {
        command.pre_exec(move || {
            let _ = set_nice(nice);
            Ok(())
        });
    }
}
