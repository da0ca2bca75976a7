//! The only unsafe code of the supervisor: raw system calls, each behind a typed safe wrapper —
//! the child spawn (a `CLONE_VM | CLONE_VFORK` clone, born in its cgroup v2 leaf by `clone3`
//! where it can be, that joins its other cgroups and sets its rlimits before `execve`),
//! `pidfd_open`, `pidfd_send_signal`, `waitid` on a pidfd with the child's
//! CPU time, the PTY window-size ioctls (set for a child's terminal, read for `exec`'s own),
//! ignoring a signal (`exec-guardian`),
//! taking ownership of descriptors received with `SCM_RIGHTS`, and the one-time descriptor
//! hygiene at server start. [`sock_diag`] asks the kernel's socket table who owns a local TCP
//! peer's socket (safe code on `nix`'s netlink calls).

pub mod sock_diag;

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `close_range(2)` flag: mark the range close-on-exec instead of closing it.
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

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

/// Once at server start: raise the soft descriptor limit to the hard one, make sure descriptors
/// 0-2 exist (so no pipe we create later lands on
/// them) and mark every descriptor above 2 close-on-exec, so nothing the server inherited from
/// its parent can leak into a child.
pub fn prepare_server_descriptors() {
    // Each process holds 3-4 descriptors (pipes or PTY, pidfd) and each connection a socket:
    // raise the soft limit to the hard one so MAX_PROCESSES_PER_SESSION is reachable.
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    for fd in 0..=2 {
        if nix::fcntl::fcntl(borrow(fd), nix::fcntl::FcntlArg::F_GETFD).is_err() {
            // Opened without O_CLOEXEC on purpose: it takes the lowest free number, `fd`, and
            // stays open for the life of the server.
            let _ = nix::fcntl::open(
                "/dev/null",
                nix::fcntl::OFlag::O_RDWR,
                nix::sys::stat::Mode::empty(),
            )
            .map(std::mem::forget::<OwnedFd>);
        }
    }
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // nothing and touches no memory.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
}

fn borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: only used for fcntl(F_GETFD) probes of 0..=2, which are harmless on a closed number.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

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

/// A pidfd for our child `pid` (readable once it exits).
///
/// # Errors
/// The `pidfd_open` errno.
pub fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal` flag (Linux 6.9): signal the process group of the pidfd's process.
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// Send `signal` through `pidfd`: to the process's whole group when `group` is set (where the
/// kernel supports it: Linux 6.9; older kernels signal the process alone). A pidfd names one
/// process for its whole life, so a recycled pid can never be hit; once the process is reaped
/// this fails with `ESRCH`.
///
/// # Errors
/// The `pidfd_send_signal` errno.
pub fn pidfd_send_signal(
    pidfd: &impl AsRawFd,
    signal: libc::c_int,
    group: bool,
) -> std::io::Result<()> {
    let send = |flags: libc::c_uint| {
        // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null siginfo and
        // flags; it touches no memory of ours.
        let result = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                flags,
            )
        };
        if result < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    if !group {
        return send(0);
    }
    match send(PIDFD_SIGNAL_PROCESS_GROUP) {
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => send(0),
        other => other,
    }
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildExit {
    /// Its exit status, or 128 + the signal that killed it.
    pub code: i32,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// CPU time (user + system) of the child and every descendant it reaped.
    pub cpu: std::time::Duration,
    /// Peak resident memory of the largest single process among the child and the
    /// descendants it reaped (`ru_maxrss`), where the kernel reported it.
    pub max_rss_bytes: Option<u64>,
}

/// Reap our child through its pidfd if it has exited (`waitid(P_PIDFD, WEXITED | WNOHANG)`
/// with its resource usage); `None` while it runs.
///
/// # Errors
/// The `waitid` errno (`ECHILD` once reaped).
pub fn reap_pidfd(pidfd: &impl AsRawFd) -> std::io::Result<Option<ChildExit>> {
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: siginfo_t and rusage are plain data the kernel fills; waitid writes only into
    // the two locals passed.
    let (info, usage) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let mut usage: libc::rusage = std::mem::zeroed();
        let result = libc::syscall(
            libc::SYS_waitid,
            P_PIDFD,
            pidfd.as_raw_fd(),
            &mut info,
            libc::WEXITED | libc::WNOHANG,
            &mut usage,
        );
        if result < 0 {
            return Err(std::io::Error::last_os_error());
        }
        (info, usage)
    };
    // SAFETY: si_pid and si_status are valid for a SIGCHLD siginfo, which waitid fills (si_pid
    // stays 0 when no child has changed state).
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    let time = |t: libc::timeval| {
        std::time::Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + std::time::Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    let cpu = time(usage.ru_utime) + time(usage.ru_stime);
    // ru_maxrss is in KiB on Linux.
    let max_rss_bytes = u64::try_from(usage.ru_maxrss)
        .ok()
        .filter(|kib| *kib > 0)
        .map(|kib| kib.saturating_mul(1024));
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => ChildExit {
            code: status,
            signal: None,
            cpu,
            max_rss_bytes,
        },
        _ => ChildExit {
            code: 128 + status,
            signal: Some(status),
            cpu,
            max_rss_bytes,
        },
    }))
}

/// Reap `pid` if it is a zombie (`waitpid(pid, WNOHANG)`); true when it was reaped.
pub fn reap_if_exited(pid: libc::pid_t) -> bool {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    matches!(
        waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// Set a terminal's window size (`TIOCSWINSZ`).
///
/// # Errors
/// The ioctl errno.
pub fn set_window_size(terminal: &impl AsRawFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which points at a live local.
    if unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Register an owned descriptor with the tokio reactor.
///
/// # Errors
/// The reactor's registration error.
pub fn register_async_fd(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor that stays open, and always reports the same
    // number, for as long as it is owned — here, for the whole life of the AsyncFd.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|error| error.into_parts().1)
}

/// Take ownership of a descriptor the kernel installed for us with `SCM_RIGHTS`.
pub fn owned_fd_from_scm_rights(fd: RawFd) -> OwnedFd {
    // SAFETY: recvmsg just installed `fd` in our descriptor table for this message; nothing else
    // knows the number, so this is its only owner.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Lower the scheduling priority of the calling thread (only: on Linux every thread has its own
/// nice value) to `nice`. Irreversible without privilege: call it only on threads that keep
/// this priority for good, and never on a thread that starts children (they inherit it).
pub fn lower_current_thread_priority(nice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: gettid has no preconditions and touches no memory.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid).map_err(|_| std::io::Error::other("bad thread id"))?;
    if lower_thread_priority(tid, nice) {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Set the nice value of thread (or single-threaded process) `tid` to `nice`; whether it
/// worked. Lowering the priority of one's own children needs no privilege.
pub fn lower_thread_priority(tid: libc::id_t, nice: libc::c_int) -> bool {
    // SAFETY: setpriority only changes the scheduling priority of the named thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0 }
}

/// Set the allocator's thresholds ([`ALLOCATOR_MMAP_THRESHOLD_BYTES`],
/// [`ALLOCATOR_TRIM_THRESHOLD_BYTES`]) so that messages of a few hundred KiB reuse arena
/// memory instead of being mapped, faulted in and unmapped one by one. Call it first in `main`,
/// before any thread exists. Whether both were set (always false off glibc).
///
/// [`ALLOCATOR_MMAP_THRESHOLD_BYTES`]: crate::limits::ALLOCATOR_MMAP_THRESHOLD_BYTES
/// [`ALLOCATOR_TRIM_THRESHOLD_BYTES`]: crate::limits::ALLOCATOR_TRIM_THRESHOLD_BYTES
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use crate::limits::{ALLOCATOR_MMAP_THRESHOLD_BYTES, ALLOCATOR_TRIM_THRESHOLD_BYTES};
        let set = |parameter: libc::c_int, bytes: usize| {
            let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt only changes glibc's allocation parameters.
            unsafe { libc::mallopt(parameter, bytes) == 1 }
        };
        set(libc::M_MMAP_THRESHOLD, ALLOCATOR_MMAP_THRESHOLD_BYTES)
            && set(libc::M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD_BYTES)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Give the allocator's free memory back to the system, now: after a large buffer was freed,
/// glibc keeps it in the freeing thread's arena (above its mmap threshold, which it raises
/// after the first large free), so a burst of large requests would leave the server's RSS at
/// the sum of the arenas' peaks and the memory budget would stop describing the process.
/// `malloc_trim` returns free pages with `madvise`, under the address space's read lock (unlike
/// `munmap`, which would make every thread's page faults wait). Blocking: call it on the
/// blocking pool. Whether memory was released (always false off glibc).
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Read;

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

/// The window size of terminal `fd` as `(cols, rows)` (`TIOCGWINSZ`); `None` when it is not a
/// terminal or reports a zero size.
pub fn terminal_window_size(fd: std::os::fd::BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points at a live,
    // properly aligned local; the descriptor is borrowed for the duration of the call.
    let status = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCGWINSZ,
            &mut size as *mut libc::winsize,
        )
    };
    (status == 0 && size.ws_col > 0 && size.ws_row > 0).then_some((size.ws_col, size.ws_row))
}

/// Ignore `signal` in this process from now on (`SIG_IGN`).
///
/// # Errors
/// The kernel refused the disposition (an invalid signal such as `SIGKILL`).
pub fn ignore_signal(signal: nix::sys::signal::Signal) -> nix::Result<()> {
    // SAFETY: SIG_IGN installs no handler code, so nothing can run in signal context.
    unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigIgn) }.map(|_| ())
}
