//! Every raw system call of the crate, each behind a typed safe wrapper.
//!
//! Everything else in the crate uses `nix`, `landlock` and `seccompiler`; what they do not
//! cover lives here, with a `// SAFETY:` note per block.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// `mount_setattr(2)` attribute: read-only mount.
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `mount_setattr(2)` attribute: ignore set-user-ID bits.
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// `mount_setattr(2)` attribute: no device access.
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// `landlock_create_ruleset(2)` flag: return the ABI version.
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

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

/// Stack of an [`IdMapWriter`]: it makes a handful of raw system calls through libc wrappers
/// (well under 1 KiB of stack); 64 KiB leaves a wide margin.
const ID_MAP_WRITER_STACK_BYTES: usize = 64 * 1024;

/// What an [`IdMapWriter`] reads: its end of the go pipe and the files to write, all prepared
/// before it starts so that it only makes system calls (no allocation, no locks).
struct IdMapJob {
    go_read: RawFd,
    go_write: RawFd,
    files: Vec<(CString, Vec<u8>)>,
}

/// A process that shares this one's memory (`CLONE_VM`: no copy of the address space, no
/// copy-on-write faults afterwards and no teardown on exit, unlike `fork`) but keeps its own
/// credentials and namespaces. It waits until [`IdMapWriter::finish`] says go, writes each file,
/// and exits. Used to write the id maps of a user namespace this process has just entered,
/// which only a process outside it may do for more than one id.
pub struct IdMapWriter {
    pid: Option<nix::unistd::Pid>,
    go: Option<OwnedFd>,
    // Both must outlive the child, which reads the job and runs on the stack: the child is
    // always reaped (in `finish` or `Drop`) before they are freed.
    job: Box<IdMapJob>,
    stack: Vec<u8>,
}

/// The writer's entry point; see [`IdMapWriter`]. Exit status 0: every file written in full.
extern "C" fn id_map_writer_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `IdMapJob` boxed in the `IdMapWriter`, which reaps this process
    // before freeing it; the job is only read.
    let job = unsafe { &*arg.cast::<IdMapJob>() };
    let mut go = 0u8;
    // SAFETY: raw system calls on descriptors and buffers that are valid for the duration of
    // each call. This process shares the parent's memory and thread-local storage, so it calls
    // only async-signal-safe libc wrappers that neither allocate nor take locks.
    unsafe {
        // Close the copy of the write end, so a parent that goes away reads as "no".
        libc::close(job.go_write);
        if libc::read(job.go_read, (&raw mut go).cast(), 1) != 1 || go != 1 {
            return 2;
        }
        for (path, content) in &job.files {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return 1;
            }
            let written = libc::write(fd, content.as_ptr().cast(), content.len());
            libc::close(fd);
            if usize::try_from(written).ok() != Some(content.len()) {
                return 1;
            }
        }
    }
    0
}

impl IdMapWriter {
    /// Starts the writer for `files` (`(path, content)`); it waits for [`Self::finish`].
    ///
    /// Must only be called while the process is single-threaded (the confinement contract).
    ///
    /// # Errors
    /// The OS error of `pipe2(2)` or `clone(2)`.
    pub fn start(files: Vec<(CString, Vec<u8>)>) -> io::Result<Self> {
        let (go_read, go_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let mut writer = Self {
            pid: None,
            go: None,
            job: Box::new(IdMapJob {
                go_read: go_read.as_raw_fd(),
                go_write: go_write.as_raw_fd(),
                files,
            }),
            stack: vec![0u8; ID_MAP_WRITER_STACK_BYTES],
        };
        // The stack grows down from the (16-byte aligned) end of the buffer.
        let top = writer.stack.as_mut_ptr_range().end;
        let top = top.wrapping_sub(top as usize % 16);
        let job: *const IdMapJob = &*writer.job;
        // SAFETY: the child runs `id_map_writer_main` on `stack`, which is ours alone and is
        // kept alive, like `job`, until the child has been reaped (`finish`/`Drop`). Without
        // CLONE_THREAD/CLONE_FILES/CLONE_FS it is a separate process with its own descriptor
        // table and credentials; SIGCHLD makes it reapable with waitpid. glibc gives a CLONE_VM
        // child no rseq or robust-list registration of its own, so it cannot disturb ours.
        let pid = unsafe {
            libc::clone(
                id_map_writer_main,
                top.cast(),
                libc::CLONE_VM | libc::SIGCHLD,
                job.cast_mut().cast(),
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(go_read);
        writer.pid = Some(nix::unistd::Pid::from_raw(pid));
        writer.go = Some(go_write);
        Ok(writer)
    }

    /// Tells the writer to write the files (`write`) or to exit without touching them, and
    /// waits for it. Returns whether every file was written in full.
    ///
    /// # Errors
    /// The OS error of `waitpid(2)`.
    pub fn finish(&mut self, write: bool) -> io::Result<bool> {
        use nix::sys::wait::{WaitStatus, waitpid};
        if let Some(go) = self.go.take() {
            let _ = nix::unistd::write(&go, &[u8::from(write)]);
        }
        let Some(pid) = self.pid.take() else {
            return Ok(false);
        };
        loop {
            match waitpid(pid, None) {
                Ok(status) => return Ok(write && matches!(status, WaitStatus::Exited(_, 0))),
                Err(nix::errno::Errno::EINTR) => {}
                // Only ECHILD is possible for our own child: SIGCHLD is ignored, so the kernel
                // reaped it when it exited. Either way it no longer runs on `stack`.
                Err(errno) => return Err(errno.into()),
            }
        }
    }
}

impl Drop for IdMapWriter {
    fn drop(&mut self) {
        let _ = self.finish(false);
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

mod fd;
mod mount;
mod notify;
mod process;
mod seccomp;

pub use fd::{
    Stdio, fork_single_threaded, replace_stdio, set_window_size, unlock_pty, window_size,
};
pub use mount::{
    FsContext, MOUNT_ATTR_NOEXEC, attach_mount, clone_mount_tree, fsmount, mount_setattr_fd,
    open_no_symlinks,
};
pub use notify::{
    Notification, SECCOMP_FILTER_FLAG_LOG, SECCOMP_FILTER_FLAG_NEW_LISTENER,
    answer as answer_notification, connect_raw, install_filter_on_current_thread, pidfd_getfd,
    pidfd_open_with_flags, read_memory, receive as receive_notification, receive_descriptor,
    send_descriptor, socket_domain, still_valid as notification_valid, unshare_descriptor_table,
};
pub use process::{
    bring_loopback_up, clone_into_namespaces, die_of_signal, drop_all_capabilities, execve,
    exit_now, open_pty_peer, own_mount_namespace, owned_fd, pidfd_open, require_no_capabilities,
    reset_signals_for_exec, set_controlling_terminal, set_dumpable, set_parent_death_signal,
    spawn_sharing_memory, spawn_sharing_memory_and_descriptors, take_inherited_fd,
};
pub use seccomp::install_seccomp_filter_logged_on_current_thread;
