//! A command's PID 1 on the launcher's side: preparing the next one ahead ([`Warm`]), handing it
//! its command ([`start`]), and what PID 1 itself does (its setup before the command arrives,
//! the hand-over of stdio and cgroups, supervising the command, reporting its status).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::sys::signal::{SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::wire::{MAX_MESSAGE_FDS, MOUNT_NAMESPACE, StartCommand, encode_status, receive, send};
use super::{LaunchFailure, Pid1SetupError, Setup, take_mount_namespace};
use crate::exit::code::EXIT_SETUP_FAILED;
use crate::launch::read_json;
use crate::linux::init::{self, Exec};
use crate::linux::mounts;
use crate::linux::spec::{Command, Ended};
use crate::linux::{EnforceOptions, EnforcementReport, EnvMode, NamespaceMode, landlock};

/// A PID 1 that is ready: in its own PID, mount and IPC namespaces, with its mounts, working
/// directory, Landlock domain and seccomp filter in place, waiting on its channel for the one
/// command it will run. Preparing the next one while the current command runs takes the
/// sandbox's setup off the start's path.
pub(super) struct Warm {
    pub(super) pid: Pid,
    pub(super) pidfd: OwnedFd,
    pub(super) status: OwnedFd,
    pub(super) channel: OwnedFd,
    /// Its mount namespace, once it has sent it ([`MOUNT_NAMESPACE`]).
    pub(super) mount_namespace: Option<OwnedFd>,
}

impl Warm {
    /// Clones the next PID 1, which joins the cgroups `ahead` (their `cgroup.procs`) and
    /// confines itself without waiting for a command.
    pub(super) fn prepare(setup: &Setup, ahead: &[OwnedFd]) -> Result<Self, LaunchFailure> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (channel, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(LaunchFailure::pid1("PID 1's channel"))?;
        let (status_read, status_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(LaunchFailure::pid1("PID 1's status pipe"))?;
        let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
        match crate::sys::clone_into_namespaces(flags).map_err(|source| LaunchFailure::Pid1 {
            what: "creating the command's PID, mount and IPC namespaces",
            source,
        })? {
            None => {
                drop(channel);
                command_init(setup, &theirs, &status_write, ahead)
            }
            Some(pid) => {
                drop((theirs, status_write));
                let pidfd = crate::sys::pidfd_open(pid).map_err(|source| LaunchFailure::Pid1 {
                    what: "pidfd_open",
                    source,
                })?;
                Ok(Self {
                    pid,
                    pidfd,
                    status: status_read,
                    channel,
                    mount_namespace: None,
                })
            }
        }
    }
}

/// Hands one command to a ready PID 1 (making one now if none is ready, or if the ready one
/// died meanwhile).
pub(super) fn start(
    setup: &Setup,
    warm: &mut Option<Warm>,
    ahead: &[OwnedFd],
    fds: Vec<OwnedFd>,
) -> Result<Warm, LaunchFailure> {
    if fds.len() < 4 || fds.len() > MAX_MESSAGE_FDS {
        return Err(LaunchFailure::StartDescriptors {
            max: MAX_MESSAGE_FDS,
            count: fds.len(),
        });
    }
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut ready = match warm.take() {
            Some(ready) => ready,
            None => Warm::prepare(setup, ahead)?,
        };
        ready.mount_namespace = take_mount_namespace(ready.channel.as_fd());
        match send(ready.channel.as_fd(), b"start", &borrowed) {
            Ok(()) => return Ok(ready),
            // The ready PID 1 may have died meanwhile: one fresh one is tried.
            Err(source) if attempt == 2 => return Err(LaunchFailure::Handover { source }),
            Err(_) => {}
        }
    }
}

/// PID 1 of one command. Never returns.
///
/// Sets up first (a failure is kept and reported to the command's stderr once it arrives),
/// then waits for its command on `channel`: the memfd with the [`StartCommand`], stdio and the
/// cgroups to join.
fn command_init(setup: &Setup, channel: &OwnedFd, status: &OwnedFd, ahead: &[OwnedFd]) -> ! {
    let _ = crate::sys::set_parent_death_signal(libc::SIGKILL);
    // Nothing of the launcher's: its socket to the server is its stdin.
    if let Ok(null) = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        let _ = crate::sys::replace_stdio(null.as_fd(), crate::sys::Stdio::In);
        let _ = crate::sys::replace_stdio(null.as_fd(), crate::sys::Stdio::Out);
    }
    let keep = [0, 1, 2, channel.as_raw_fd(), status.as_raw_fd()];
    // The launcher holds the namespace from now on, so that PID 1's exit does not tear it
    // down: unmounting waits for an expedited RCU grace period (about 0.1 ms), which would
    // come before the command's stdio closes for the server. Sent even without it: the
    // launcher reads this message before it hands over the command.
    let namespace = crate::sys::own_mount_namespace().ok();
    let _ = send(
        channel.as_fd(),
        MOUNT_NAMESPACE,
        &namespace
            .as_ref()
            .map(AsFd::as_fd)
            .into_iter()
            .collect::<Vec<_>>(),
    );
    drop(namespace);
    // The command's cgroups, joined now: a migration can wait for an RCU grace period
    // (milliseconds on an idle host), which the start then does not pay. The command is born
    // inside them. Joined before the launcher's descriptors are closed, so that closing them
    // closes this process's copies of the cgroups too (`ahead` is never dropped here: this
    // function does not return).
    let joined = join_cgroups(ahead.iter().map(AsFd::as_fd));
    let warm_up = match crate::linux::hygiene::close_inherited_fds(&keep) {
        Err(source) => Err(Pid1SetupError::CloseInherited {
            what: "launcher's descriptors",
            source,
        }),
        Ok(()) => joined.and_then(|()| warm_up(setup)),
    };
    let Ok(Some((body, fds))) = receive(channel.as_fd()) else {
        // The launcher is gone (or retired this PID 1 unused).
        crate::sys::exit_now(0)
    };
    if body != b"start" || fds.len() < 4 {
        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
    }
    let mut fds = fds.into_iter();
    let memfd = fds.next();
    let stdio: Vec<OwnedFd> = fds.by_ref().take(3).collect();
    for (target, fd) in crate::sys::Stdio::ALL.into_iter().zip(&stdio) {
        if let Err(source) = crate::sys::replace_stdio(fd.as_fd(), target) {
            setup_failed(status, &Pid1SetupError::Stdio(source));
        }
    }
    drop(stdio);
    let joining: Vec<OwnedFd> = fds.collect();
    if let Err(err) = join_cgroups(joining.iter().map(AsFd::as_fd)) {
        setup_failed(status, &err);
    }
    drop(joining);
    let WarmedUp {
        signals,
        warnings,
        gate,
    } = match warm_up {
        Ok(ready) => ready,
        Err(err) => setup_failed(status, &err),
    };
    let command: StartCommand = match memfd.map(read_json) {
        Some(Ok(command)) => command,
        Some(Err(err)) => setup_failed(status, &err.into()),
        None => setup_failed(status, &Pid1SetupError::NoCommand),
    };
    if command.cwd != setup.cwd || command.argv.is_empty() {
        setup_failed(
            status,
            &Pid1SetupError::WrongCommand {
                launcher: setup.cwd.clone(),
                cwd: command.cwd.clone(),
                argv: command.argv.clone(),
            },
        );
    }
    // The channel and anything else left from the launcher; the signalfd and the gate's own
    // descriptors (its overlays' upper layers) stay.
    let mut keep = vec![0, 1, 2, status.as_raw_fd(), signals.as_raw_fd()];
    keep.extend(
        gate.iter()
            .flat_map(crate::linux::unix_sockets::Gate::descriptors),
    );
    if let Err(source) = crate::linux::hygiene::close_inherited_fds(&keep) {
        setup_failed(
            status,
            &Pid1SetupError::CloseInherited {
                what: "channel",
                source,
            },
        );
    }
    for warning in setup.warnings.iter().chain(&warnings) {
        eprintln!("sandbox-run: warning: {warning}");
    }
    let exec = Exec::new(
        &Command {
            argv: command.argv.iter().map(Into::into).collect(),
            env: command
                .env
                .iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            cwd: command.cwd.clone(),
            limits: command.limits.clone(),
        },
        None,
        None,
    );
    // Sharing PID 1's memory until its execve: PID 1 is single-threaded, and the child only
    // installs its own filter (handing its listener to PID 1), resets its own signals, session
    // and rlimits before it execs (its signalfd and the status pipe are close-on-exec) or leaves
    // through _exit. It inherits the sandbox's main filter, which PID 1 installed while it
    // prepared.
    // The gate's refusals go to the command's stderr (PID 1's own is released below), on a
    // copy PID 1 closes as soon as the command has ended.
    let gate = gate.map(|gate| match nix::unistd::dup(std::io::stderr()) {
        Ok(stderr) => {
            let _ = nix::fcntl::fcntl(
                &stderr,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
            gate.report_on(stderr)
        }
        Err(_) => gate,
    });
    let started =
        crate::linux::unix_sockets::start_command_under_installed_filter(gate, &mut || {
            init::start_command(&exec, None, [false; 3]);
        });
    let (child, notifier) = match started {
        Ok(started) => started,
        Err(err) => setup_failed(status, &Pid1SetupError::Start(err)),
    };
    // PID 1 keeps none of the command's stdio: it closes for the server when the command and
    // what it started close it, not when PID 1 is gone.
    release_stdio();
    let (kind, value) = init::supervise(&signals, child, notifier.as_ref());
    // Its copy of the command's stderr closes now, not when PID 1 is gone.
    drop(notifier);
    // What the command left behind dies before its status goes out: the server reports the
    // exit on the status, and nothing of the command outlives that report.
    end_the_rest();
    let ended = if kind == init::STATUS_SIGNALED {
        Ended::Signaled(value)
    } else {
        Ended::Exited(value)
    };
    let cpu = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map(|usage| {
            let time = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            time(usage.user_time()) + time(usage.system_time())
        })
        .unwrap_or_default();
    let _ = nix::unistd::write(status, &encode_status(ended, cpu));
    crate::sys::exit_now(0)
}

/// Points PID 1's descriptors 0-2 at `/dev/null` (its copies of the command's stdio).
fn release_stdio() {
    if let Ok(null) = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        for target in crate::sys::Stdio::ALL {
            let _ = crate::sys::replace_stdio(null.as_fd(), target);
        }
    }
}

/// Kills every other process of PID 1's namespace (`kill(-1)` from a namespace's init reaches
/// all of them but itself) and reaps them all, killing again after each reap in case one was
/// being forked while the first kill went round.
fn end_the_rest() {
    loop {
        match nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL) {
            // ESRCH: nobody else is left.
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            // Not allowed (the command's processes are in this PID 1's Landlock domain and
            // seccomp lets it signal them, so this should not happen): waiting could then
            // never end, and PID 1's own exit ends them instead.
            Err(_) => return,
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}

/// Moves this process into each cgroup (a `cgroup.procs` descriptor).
fn join_cgroups<'a>(cgroups: impl Iterator<Item = BorrowedFd<'a>>) -> Result<(), Pid1SetupError> {
    for cgroup in cgroups {
        nix::unistd::write(cgroup, b"0").map_err(Pid1SetupError::JoinCgroup)?;
    }
    Ok(())
}

/// What a PID 1 prepared before its command arrived.
struct WarmedUp {
    signals: SignalFd,
    warnings: Vec<String>,
    /// What it lets the command connect to (when it holds the command's listener).
    gate: Option<crate::linux::unix_sockets::Gate>,
}

/// PID 1's own setup, before its command arrives: a session of its own, the per-command
/// mounts, the working directory, the named unix sockets pinned, every capability dropped,
/// Landlock, the seccomp program built, and the signalfd it forwards signals from.
fn warm_up(setup: &Setup) -> Result<WarmedUp, Pid1SetupError> {
    let _ = nix::unistd::setsid();
    let applied = mounts::apply(&setup.per_command)?;
    crate::linux::enter_directory(&setup.cwd)?;
    let _ = crate::sys::set_dumpable(false);
    let mut report = EnforcementReport::default();
    let gate = crate::linux::unix_sockets::Gate::for_policy(
        &setup.policy,
        applied.overlays,
        &mut report.warnings,
    );
    let enforce = EnforceOptions {
        best_effort: false,
        keep_fds: Vec::new(),
        env: EnvMode::Keep,
        namespaces: NamespaceMode::Auto,
        audit_log: false,
        egress_port: None,
    };
    report.namespaces.user = true;
    crate::linux::confine_but_seccomp(
        &setup.policy,
        &landlock::private_ttys(),
        &enforce,
        &mut report,
    )?;
    let seccomp = crate::linux::seccomp::Prepared::new(crate::linux::seccomp_variant(
        &setup.policy,
        &enforce,
    ))?;
    let forwarded = init::forwarded_signals();
    let signals = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&forwarded), None)
        .and_then(|()| SignalFd::with_flags(&forwarded, SfdFlags::SFD_CLOEXEC))
        .map_err(Pid1SetupError::Signals)?;
    // Last: PID 1 and the command it starts (which inherits it) run under it from here on.
    // Installing a program of this size takes the kernel a third of a millisecond, which no
    // start waits for when it is done here.
    seccomp.install_on_current_thread().map_err(|source| {
        Pid1SetupError::Sandbox(crate::linux::SandboxError::HolderSeccomp { source })
    })?;
    Ok(WarmedUp {
        signals,
        warnings: report.warnings,
        gate,
    })
}

/// Says why on the command's stderr, reports exit status 125, and exits.
fn setup_failed(status: &OwnedFd, error: &Pid1SetupError) -> ! {
    eprintln!("sandbox-run: {error}");
    let _ = nix::unistd::write(
        status,
        &encode_status(Ended::Exited(i32::from(EXIT_SETUP_FAILED)), Duration::ZERO),
    );
    crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED))
}
