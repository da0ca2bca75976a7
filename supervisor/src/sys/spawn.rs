//! The child spawn: a `CLONE_VM | CLONE_VFORK` clone, born in its cgroup v2 leaf by `clone3`
//! where it can be, that joins its other cgroups, sets its rlimits and resets its signal
//! dispositions before `execve`; a failed step is reported to the parent as [`SpawnFailure`].

use std::ffi::{CStr, CString};
use std::os::fd::RawFd;

/// Signals reset to their default action in every child: the server ignores SIGPIPE (Rust's
/// runtime does), and a child must not inherit that or any other ignored disposition.
const SIGNALS_RESET_IN_CHILD: [libc::c_int; 14] = [
    libc::SIGPIPE,
    libc::SIGXFSZ,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGTERM,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGCHLD,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGWINCH,
];

/// What the child does to its descriptors before exec, in order.
pub enum FileAction<'a> {
    /// `dup2(fd, target)` (the new descriptor is not close-on-exec).
    Dup(RawFd, RawFd),
    /// `open(path, O_RDWR)` onto `target`.
    OpenReadWrite(RawFd, &'a CStr),
}

/// One resource limit the child sets before exec (a `RLIMIT_*` number, soft and hard value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildRlimit {
    /// `RLIMIT_CPU`, `RLIMIT_FSIZE`, ...
    pub resource: libc::c_int,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// Which step of the child's setup failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStep {
    /// Writing to a `cgroup.procs` (joining a cgroup).
    JoinCgroup,
    /// Setting an rlimit.
    Rlimit,
    /// `setsid`, the descriptor actions, `chdir` or `execve`.
    Exec,
}

/// A failed spawn: the step and its OS error.
#[derive(Debug)]
pub struct SpawnFailure {
    /// The step.
    pub step: ChildStep,
    /// Its OS error.
    pub error: std::io::Error,
}

/// Stack of the short-lived child between `clone` and `execve` (it runs only the few system
/// calls of [`child_main`]); one guard page below it.
const CHILD_STACK_BYTES: usize = 64 * 1024;
/// The guard page below the child's stack.
const GUARD_BYTES: usize = 4096;
/// Highest signal number reset in the child.
const LAST_SIGNAL: libc::c_int = 64;

/// Step codes the child leaves in [`ChildPlan`] when it fails (0: none).
const STEP_NONE: u8 = 0;
const STEP_JOIN: u8 = 1;
const STEP_RLIMIT: u8 = 2;
const STEP_EXEC: u8 = 3;

/// `clone3(2)` flag: the child is born in the cgroup v2 directory `clone_args.cgroup` names
/// (Linux 5.7), with no migration. A migration (a write to `cgroup.procs`) takes the kernel's
/// cgroup mutex and, after the host has been idle, waits out an RCU grace period while holding
/// it: 7 to 30 ms measured here, against nothing for a child born in place.
#[cfg(target_arch = "x86_64")]
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` of `clone3(2)`, as far as `cgroup` (`CLONE_ARGS_SIZE_VER2`, 88 bytes).
#[cfg(target_arch = "x86_64")]
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Set once `clone3` with `CLONE_INTO_CGROUP` turned out to be missing (`ENOSYS`: before Linux
/// 5.3; `E2BIG`: before 5.7): from then on every child joins its leaf by writing `cgroup.procs`.
#[cfg(target_arch = "x86_64")]
static CLONE_INTO_CGROUP_MISSING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// The cgroups a child starts in.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildCgroups<'a> {
    /// A cgroup v2 directory the child is born in (`clone3(CLONE_INTO_CGROUP)`), with its
    /// `cgroup.procs`, which the child writes instead where the kernel cannot place it at birth.
    pub born_in: Option<(RawFd, RawFd)>,
    /// `cgroup.procs` of further cgroups the child joins before it execs (v1 hierarchies:
    /// `CLONE_INTO_CGROUP` places a child in the v2 hierarchy only).
    pub join: &'a [RawFd],
}

/// Everything the child reads, prepared before the clone: the child shares our memory and must
/// not allocate or take a lock.
struct ChildPlan<'a> {
    program: &'a CStr,
    argv: &'a [*mut libc::c_char],
    envp: &'a [*mut libc::c_char],
    cwd: &'a CStr,
    actions: &'a [FileAction<'a>],
    join: &'a [RawFd],
    rlimits: &'a [ChildRlimit],
    failed_step: std::sync::atomic::AtomicU8,
    failed_errno: std::sync::atomic::AtomicI32,
}

/// Spawn `program` with `argv`/`envp`: the child is born in `cgroups.born_in` and first joins
/// the cgroups of `cgroups.join` (so it, and everything it ever starts, is in them before the
/// program's first instruction), sets `rlimits`, starts a new session (`setsid`), resets every
/// signal to its default action (keeping ignored ones ignored, except [`SIGNALS_RESET_IN_CHILD`])
/// with an empty mask, applies `actions`, changes to `cwd` and execs.
///
/// Like `posix_spawn`, the child is created with `CLONE_VM | CLONE_VFORK`: no copy of the
/// server's address space, and this thread waits until the child has exec'd (or failed), so the
/// failure is reported here, never as a process that "started" and exited 127. With a cgroup to
/// be born in, the clone is a `clone3` with `CLONE_INTO_CGROUP` (x86-64; elsewhere, and on
/// kernels without it, the child joins that cgroup like the others).
///
/// # Errors
/// The failed step and its errno.
pub fn spawn_in_new_session(
    program: &CStr,
    argv: &[CString],
    envp: &[CString],
    cwd: &CStr,
    actions: &[FileAction<'_>],
    cgroups: ChildCgroups<'_>,
    rlimits: &[ChildRlimit],
) -> Result<libc::pid_t, SpawnFailure> {
    use std::sync::atomic::Ordering;
    let failure = |step, error| SpawnFailure { step, error };
    let argv_ptrs = null_terminated(argv);
    let envp_ptrs = null_terminated(envp);
    // Joined by the child when it was not born in `born_in`: its `cgroup.procs` first.
    let join_all: Vec<RawFd> = cgroups
        .born_in
        .map(|(_, procs)| procs)
        .into_iter()
        .chain(cgroups.join.iter().copied())
        .collect();
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut plan = ChildPlan {
        program,
        argv: &argv_ptrs,
        envp: &envp_ptrs,
        cwd,
        actions,
        join: &join_all,
        rlimits,
        failed_step: std::sync::atomic::AtomicU8::new(STEP_NONE),
        failed_errno: std::sync::atomic::AtomicI32::new(0),
    };
    let stack = ChildStack::new().map_err(|e| failure(ChildStep::Exec, e))?;
    // SAFETY: sigset_t values are plain data initialised by sigfillset/pthread_sigmask before
    // use. Every signal is blocked around the clone so no handler of ours runs in the child
    // (which shares our memory) before it has reset them; the old mask is restored right after.
    let mut previous: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
    }
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut pid = -1;
    #[cfg(target_arch = "x86_64")]
    if let Some((directory, _)) = cgroups.born_in
        && !CLONE_INTO_CGROUP_MISSING.load(Ordering::Relaxed)
    {
        plan.join = cgroups.join;
        // SAFETY: as for the clone below; the directory descriptor is the caller's, open.
        pid = unsafe { clone3_into_cgroup(&plan, &stack, directory) };
        if pid < 0 {
            let error = std::io::Error::last_os_error();
            if matches!(error.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG)) {
                CLONE_INTO_CGROUP_MISSING.store(true, Ordering::Relaxed);
            }
            // Whatever the kernel refused, the child joins by `cgroup.procs` instead, which
            // reports a cgroup's own error as a failed join.
            plan.join = &join_all;
        }
    }
    if pid < 0 {
        // SAFETY: `child_main` only reads `plan` (alive until the clone returns: with
        // CLONE_VFORK this thread is suspended until the child has exec'd or exited) and makes
        // async-signal-safe system calls; the stack is ours, writable, and unused by anyone
        // else.
        pid = unsafe {
            libc::clone(
                child_main,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::from_ref(&plan).cast_mut().cast(),
            )
        };
    }
    let clone_error = std::io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(failure(ChildStep::Exec, clone_error));
    }
    let step = match plan.failed_step.load(Ordering::Acquire) {
        STEP_NONE => return Ok(pid),
        STEP_JOIN => ChildStep::JoinCgroup,
        STEP_RLIMIT => ChildStep::Rlimit,
        _ => ChildStep::Exec,
    };
    let errno = plan.failed_errno.load(Ordering::Acquire);
    // The child has left through _exit: reap it.
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    Err(failure(step, std::io::Error::from_raw_os_error(errno)))
}

/// `clone3(CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP)`: the child is born in the cgroup v2
/// directory `directory`, runs [`child_main`] on `stack` and never returns here; this thread
/// waits until it has exec'd or exited. The child's pid, or -1 with `errno` set.
///
/// libc has no `clone3` wrapper that takes a function, and a child that shares our memory
/// cannot return from a raw system call into Rust code on the parent's stack, so the system
/// call is made here: the kernel starts the child right after the `syscall` instruction with
/// `rax` 0 and its stack pointer at the top of `stack` (16-byte aligned), and the child calls
/// `child_main(plan)` from there.
///
/// # Safety
/// Every signal blocked; `plan` and `stack` alive until this returns (they are: the parent is
/// suspended until the child is done with them).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_into_cgroup(plan: &ChildPlan<'_>, stack: &ChildStack, directory: RawFd) -> i32 {
    let args = CloneArgs {
        flags: libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack.bottom() as u64,
        stack_size: stack.usable() as u64,
        cgroup: u64::try_from(directory).unwrap_or(u64::MAX),
        ..CloneArgs::default()
    };
    let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = child_main;
    let result: i64;
    // SAFETY: a `clone3` system call. In this thread it clobbers only rax (the result), rcx and
    // r11. The child runs the instructions after `test`: on its own stack it calls
    // `child_main(plan)`, which execs or `_exit`s; should it return, the child exits with its
    // value and never reaches the parent's code.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r13",
            "call r12",
            "mov edi, eax",
            "mov eax, {exit}",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") libc::SYS_clone3 => result,
            in("rdi") &raw const args,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") std::ptr::from_ref(plan),
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if result < 0 {
        // SAFETY: this thread's errno slot.
        unsafe { *libc::__errno_location() = i32::try_from(-result).unwrap_or(libc::EINVAL) };
        return -1;
    }
    i32::try_from(result).unwrap_or(-1)
}

/// The child's stack: an anonymous mapping with a guard page at its low end.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

impl ChildStack {
    fn new() -> std::io::Result<Self> {
        let page = GUARD_BYTES;
        let len = CHILD_STACK_BYTES + page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Self { base, len };
        // SAFETY: the first page of the mapping just made; an overflow then faults instead of
        // writing below the mapping.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The initial stack pointer (stacks grow down; 16-byte aligned).
    fn top(&self) -> *mut libc::c_void {
        self.base.cast::<u8>().wrapping_add(self.len).cast()
    }

    /// The lowest usable address (above the guard page), as `clone3` takes it.
    #[cfg(target_arch = "x86_64")]
    fn bottom(&self) -> *mut libc::c_void {
        self.base.cast::<u8>().wrapping_add(GUARD_BYTES).cast()
    }

    /// Usable bytes between [`Self::bottom`] and [`Self::top`].
    #[cfg(target_arch = "x86_64")]
    fn usable(&self) -> usize {
        self.len - GUARD_BYTES
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; the child that used it has exec'd or
        // exited (CLONE_VFORK), so nothing runs on it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Records the failed step and errno for the parent and leaves.
///
/// # Safety
/// Only from the child of [`spawn_in_new_session`].
unsafe fn child_fail(plan: &ChildPlan<'_>, step: u8) -> ! {
    use std::sync::atomic::Ordering;
    // SAFETY: __errno_location returns this thread's errno slot (shared with the suspended
    // parent thread, which reads nothing of it).
    let errno = unsafe { *libc::__errno_location() };
    plan.failed_errno.store(errno, Ordering::Release);
    plan.failed_step.store(step, Ordering::Release);
    // SAFETY: _exit ends the child without running any of the parent's exit handlers.
    unsafe { libc::_exit(127) }
}

/// The child between `clone` and `execve`: raw, async-signal-safe system calls only.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` the parent passed, alive while the parent is suspended.
    let plan = unsafe { &*arg.cast_const().cast::<ChildPlan<'_>>() };
    // SAFETY: every call below is a plain system call wrapper on data prepared by the parent;
    // nothing allocates, locks, or unwinds.
    unsafe {
        for &procs in plan.join {
            if libc::write(procs, b"0".as_ptr().cast(), 1) != 1 {
                child_fail(plan, STEP_JOIN);
            }
        }
        for limit in plan.rlimits {
            let value = libc::rlimit64 {
                rlim_cur: limit.soft,
                rlim_max: limit.hard,
            };
            if libc::syscall(
                libc::SYS_prlimit64,
                0,
                libc::c_long::from(limit.resource),
                &value,
                std::ptr::null_mut::<libc::rlimit64>(),
            ) != 0
            {
                child_fail(plan, STEP_RLIMIT);
            }
        }
        if libc::setsid() < 0 {
            child_fail(plan, STEP_EXEC);
        }
        reset_signal_dispositions();
        for action in plan.actions {
            let ok = match action {
                FileAction::Dup(from, to) if from == to => libc::fcntl(*to, libc::F_SETFD, 0) == 0,
                FileAction::Dup(from, to) => libc::dup2(*from, *to) == *to,
                FileAction::OpenReadWrite(to, path) => {
                    let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                    fd == *to || (fd >= 0 && libc::dup2(fd, *to) == *to && libc::close(fd) == 0)
                }
            };
            if !ok {
                child_fail(plan, STEP_EXEC);
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            child_fail(plan, STEP_EXEC);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(
            plan.program.as_ptr(),
            plan.argv.as_ptr().cast(),
            plan.envp.as_ptr().cast(),
        );
        child_fail(plan, STEP_EXEC)
    }
}

/// Every signal with a handler (ours must never run in the child) and every one of
/// [`SIGNALS_RESET_IN_CHILD`] goes back to its default action; other ignored ones stay ignored.
///
/// # Safety
/// Only from the child of [`spawn_in_new_session`], with every signal blocked.
unsafe fn reset_signal_dispositions() {
    for signal in 1..=LAST_SIGNAL {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sigaction reads/writes only the local structs passed.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            let ignored = current.sa_sigaction == libc::SIG_IGN;
            let default = current.sa_sigaction == libc::SIG_DFL;
            if default || (ignored && !SIGNALS_RESET_IN_CHILD.contains(&signal)) {
                continue;
            }
            let mut reset: libc::sigaction = std::mem::zeroed();
            reset.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &reset, std::ptr::null_mut());
        }
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*mut libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect()
}

#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    /// A fresh cgroup v2 leaf below this test's own cgroup, removed on drop.
    struct Leaf {
        path: std::path::PathBuf,
    }

    impl Leaf {
        fn new(name: &str) -> Self {
            let read = |path: &str| std::fs::read_to_string(path).expect(path);
            let own = crate::containment::detect::locate(
                &read("/proc/self/mountinfo"),
                &read("/proc/self/cgroup"),
            );
            let base = own.v2.expect("this host has a cgroup v2 hierarchy");
            let path = base.join(format!("execward-{name}-{}", std::process::id()));
            std::fs::create_dir(&path).expect("a cgroup v2 directory can be made here (root)");
            Self { path }
        }
    }

    impl Drop for Leaf {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.path);
        }
    }

    /// Spawn `sleep 30` with `cgroups`, read its v2 cgroup line, kill and reap it.
    fn v2_cgroup_of_a_child(cgroups: ChildCgroups<'_>) -> String {
        let sleep = CString::new("/bin/sleep").expect("no NUL");
        let argv = [sleep.clone(), CString::new("30").expect("no NUL")];
        let pid = spawn_in_new_session(&sleep, &argv, &[], c"/", &[], cgroups, &[])
            .map_err(|failure| failure.error)
            .expect("spawn");
        let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
        let child = nix::unistd::Pid::from_raw(pid);
        let kill = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(child, None);
        kill.expect("kill the child");
        let membership = membership.expect("the child's /proc/PID/cgroup");
        let line = membership.lines().find(|line| line.starts_with("0::"));
        line.expect("a v2 line").to_owned()
    }

    /// A child given a cgroup v2 leaf to be born in starts in it without joining it: the
    /// descriptor passed as the leaf's `cgroup.procs` is a pipe, so a child that joined by
    /// writing it would stay in the test's own cgroup and leave a "0" in the pipe.
    #[test]
    fn a_child_is_born_in_its_cgroup_v2_leaf_without_migrating() {
        let leaf = Leaf::new("born-in");
        let directory = std::fs::File::open(&leaf.path).expect("open the leaf");
        let (mut procs_read, procs_write) = std::io::pipe().expect("pipe");
        let v2_line = v2_cgroup_of_a_child(ChildCgroups {
            born_in: Some((directory.as_raw_fd(), procs_write.as_raw_fd())),
            join: &[],
        });
        drop(procs_write);
        let mut written = String::new();
        procs_read
            .read_to_string(&mut written)
            .expect("read the pipe");
        let name = leaf.path.file_name().expect("a name").to_string_lossy();
        assert!(
            v2_line.ends_with(&format!("/{name}")),
            "the child is in {v2_line}, not in {}",
            leaf.path.display()
        );
        assert_eq!(written, "", "the child joined by writing cgroup.procs");
    }

    /// When the kernel refuses to place the child (here: the "directory" is not a cgroup), the
    /// child joins the leaf through its `cgroup.procs` instead.
    #[test]
    fn a_child_the_kernel_cannot_place_joins_its_leaf_instead() {
        let leaf = Leaf::new("joins");
        let not_a_cgroup = std::fs::File::open("/").expect("open /");
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(leaf.path.join("cgroup.procs"))
            .expect("open cgroup.procs");
        let v2_line = v2_cgroup_of_a_child(ChildCgroups {
            born_in: Some((not_a_cgroup.as_raw_fd(), procs.as_raw_fd())),
            join: &[],
        });
        let name = leaf.path.file_name().expect("a name").to_string_lossy();
        assert!(
            v2_line.ends_with(&format!("/{name}")),
            "the child is in {v2_line}, not in {}",
            leaf.path.display()
        );
    }
}
