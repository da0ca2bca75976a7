//! PID 1 of a sandbox, and the command it starts.
//!
//! PID 1 (cloned by [`super::command::run`] into the new namespaces) waits until its parent has
//! written its uid/gid maps, leaves the outer terminal's session, builds the mount layout, opens
//! the sandbox's own terminal when the outer has one, drops every capability and installs
//! Landlock and seccomp on itself, then forks the command. From then on it only forwards the
//! signals the outer passes on to the command's process group, reaps every orphan of the
//! namespace, and when the command ends, reports its status to the outer and exits: the kernel
//! then kills everything left in the PID namespace, `setsid` daemons and double forks included.
//!
//! If the outer dies first (killed with the server), PID 1 gets `SIGKILL` (`PR_SET_PDEATHSIG`)
//! and the namespace goes with it. The command's own side (its `execve` arguments and what the
//! forked child does before `execve`) is [`exec`].

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::spec::{Command, RunOptions};
use super::{EnforcementReport, SandboxError, landlock, mounts, pty};
use crate::exit::code::EXIT_SETUP_FAILED;
use crate::policy::ResolvedPolicy;

pub use super::spec::{STATUS_EXITED, STATUS_SIGNALED};
pub(super) use exec::{Exec, exec_prepared, start_command};

mod exec;

/// PID 1's ends of the channels to the outer.
pub struct InitChannels {
    /// Readable once the outer wrote the maps (one byte), or EOF if it died.
    pub go: OwnedFd,
    /// Where the command's status goes.
    pub status: OwnedFd,
    /// Where the master of the sandbox's own terminal goes (when the outer has a terminal).
    pub terminal: Option<UnixStream>,
    /// Which of stdin, stdout, stderr are terminals.
    pub relayed: [bool; 3],
    /// Where the egress proxy's listening socket goes (network allowlist only).
    pub egress: Option<UnixStream>,
    /// Where the unix-socket gate's refusals go (the denial audit runs and the gate is
    /// needed; see [`super::unix_refusals`]).
    pub unix_refusals: Option<OwnedFd>,
}

/// PID 1. Never returns.
pub fn run_init(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    channels: InitChannels,
) -> ! {
    let _ = crate::sys::set_parent_death_signal(libc::SIGKILL);
    // Nothing of the outer's (the audit's sockets and report, its signalfd) stays open in the
    // sandbox; only stdio and PID 1's own channels.
    let mut keep = vec![
        0,
        1,
        2,
        channels.go.as_raw_fd(),
        channels.status.as_raw_fd(),
    ];
    keep.extend(channels.terminal.as_ref().map(AsRawFd::as_raw_fd));
    keep.extend(channels.egress.as_ref().map(AsRawFd::as_raw_fd));
    keep.extend(channels.unix_refusals.as_ref().map(AsRawFd::as_raw_fd));
    if super::hygiene::close_inherited_fds(&keep).is_err() {
        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
    }
    let mut go = [0u8];
    if nix::unistd::read(&channels.go, &mut go) != Ok(1) {
        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
    }
    drop(channels.go);
    let prepared = match prepare(
        policy,
        command,
        options,
        channels.terminal,
        channels.relayed,
        channels.egress,
    ) {
        Ok(prepared) => prepared,
        Err(err) => {
            eprintln!("sandbox-run: {err}");
            crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
        }
    };
    for warning in &prepared.report.warnings {
        eprintln!("sandbox-run: warning: {warning}");
    }
    if options.report {
        eprintln!(
            "{}",
            serde_json::to_string(&prepared.report).unwrap_or_default()
        );
    }
    let exec = Exec::new(command, prepared.egress_port, prepared.ca_bundle.as_deref());
    // The child shares PID 1's memory and descriptors until it has installed its filters; it
    // then only sets up its session and terminal and execs (or leaves through _exit).
    let gate = prepared
        .gate
        .map(|gate| gate.report_to(channels.unix_refusals));
    let started = super::unix_sockets::start_command(prepared.seccomp, gate, &mut || {
        start_command(&exec, prepared.slave.as_ref(), channels.relayed)
    });
    let (child, notifier) = match started {
        Ok(started) => started,
        Err(err) => {
            eprintln!("sandbox-run: cannot start the command: {err}");
            crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
        }
    };
    drop(prepared.slave);
    let (kind, value) = supervise(&prepared.signals, child, notifier.as_ref());
    let mut message = [0u8; 5];
    message[0] = kind;
    message[1..].copy_from_slice(&value.to_le_bytes());
    let _ = nix::unistd::write(&channels.status, &message);
    crate::sys::exit_now(0)
}

/// What PID 1 holds once confined (but for its seccomp filter, installed once the command has
/// started).
struct Prepared {
    report: EnforcementReport,
    seccomp: super::seccomp::Prepared,
    gate: Option<super::unix_sockets::Gate>,
    signals: SignalFd,
    slave: Option<OwnedFd>,
    egress_port: Option<u16>,
    /// The trust bundle holding the inspection CA (`inspect=true`).
    ca_bundle: Option<PathBuf>,
}

/// With a network allowlist: brings `lo` up in the sandbox's (empty) network namespace, listens
/// on 127.0.0.1 there and hands the listening socket to the outer, which execs the egress proxy
/// on it. Returns the port. PID 1 keeps no copy: only the proxy accepts.
fn listen_for_egress(socket: &UnixStream) -> Result<u16, SandboxError> {
    let egress_error = |source: std::io::Error| SandboxError::Egress { source };
    crate::sys::bring_loopback_up().map_err(egress_error)?;
    let listener =
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).map_err(egress_error)?;
    let port = listener.local_addr().map_err(egress_error)?.port();
    pty::send_fd(socket, listener.as_fd()).map_err(egress_error)?;
    Ok(port)
}

fn prepare(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    terminal: Option<UnixStream>,
    relayed: [bool; 3],
    egress: Option<UnixStream>,
) -> Result<Prepared, SandboxError> {
    let mut report = EnforcementReport {
        no_new_privs: true,
        ..EnforcementReport::default()
    };
    report.namespaces.user = true;
    report.namespaces.pid = true;
    report.namespaces.ipc = true;
    report.namespaces.mount = true;
    report.namespaces.network = policy.needs_network_namespace();
    let egress_port = match &egress {
        Some(socket) if policy.egress().is_some() => Some(listen_for_egress(socket)?),
        _ => None,
    };
    let inspects = policy
        .egress()
        .is_some_and(crate::policy::EgressRules::inspects_any);
    // The host's bundle as the host has it, before the layout hides anything.
    let host_bundle = inspects.then(crate::egress::trust::host_bundle).flatten();
    // Leave the outer terminal's session: the command gets a terminal of its own, and the
    // server's signals to the outer's process group reach only the outer, which forwards them.
    let _ = nix::unistd::setsid();
    let layout = command_layout(policy, &command.cwd);
    let applied =
        mounts::apply_bounded(&mounts::mount_plan(policy, &layout), &command.limits.pools)
            .map_err(super::namespaces::NamespaceError::from)?;
    report.namespaces.mounts = applied.ops;
    report.warnings.extend(applied.warnings);
    let overlays = applied.overlays;
    let slave = match terminal {
        Some(socket) => {
            let like = crate::sys::Stdio::ALL
                .into_iter()
                .zip(relayed)
                .find_map(|(fd, relayed)| relayed.then_some(fd))
                .unwrap_or(crate::sys::Stdio::In)
                .fd();
            let terminal_error = |source: std::io::Error| SandboxError::Terminal { source };
            let (master, slave) = pty::open_inner(like).map_err(terminal_error)?;
            pty::send_fd(&socket, master.as_fd()).map_err(terminal_error)?;
            Some(slave)
        }
        None => None,
    };
    // After the terminal (the outer receives that first), before confinement.
    let ca_bundle = match egress {
        Some(socket) if inspects => install_inspection_ca(
            &socket,
            policy,
            &layout,
            host_bundle.as_deref(),
            &mut report.warnings,
        )?,
        _ => None,
    };
    super::enter_directory(&command.cwd)?;
    let _ = crate::sys::set_dumpable(false);
    // Named sockets are pinned in the sandbox's own mount namespace, before Landlock.
    let gate = super::unix_sockets::Gate::for_policy(policy, overlays, &mut report.warnings);
    let ttys = if layout.dev {
        landlock::private_ttys()
    } else {
        landlock::session_ttys()
    };
    let enforce = super::EnforceOptions {
        best_effort: options.best_effort,
        keep_fds: Vec::new(),
        env: super::EnvMode::Keep,
        namespaces: super::NamespaceMode::Auto,
        audit_log: options.audit_log,
        egress_port,
    };
    super::confine_but_seccomp(policy, &ttys, &enforce, &mut report)?;
    let seccomp = super::seccomp::Prepared::new(super::seccomp_variant(policy, &enforce))?;
    report.seccomp = seccomp.names().to_vec();
    let signals =
        SignalFd::with_flags(&forwarded_signals(), SfdFlags::SFD_CLOEXEC).map_err(|source| {
            SandboxError::Terminal {
                source: source.into(),
            }
        })?;
    Ok(Prepared {
        report,
        seccomp,
        gate,
        signals,
        slave,
        egress_port,
        ca_bundle,
    })
}

/// Waits for the inspection CA the outer relays from the proxy and writes the trust bundle
/// (the host's, then the CA) into the sandbox's private `/tmp` (an overlay's private layer),
/// else its private `$TMPDIR`. Without either (a layout that keeps the host's `/tmp`) no
/// bundle is written, with a warning: writing there would reach the host.
fn install_inspection_ca(
    socket: &UnixStream,
    policy: &ResolvedPolicy,
    layout: &mounts::Layout,
    host_bundle: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Option<PathBuf>, SandboxError> {
    let egress_error = |source: std::io::Error| SandboxError::Egress { source };
    let ca = crate::egress::trust::InspectionCa::receive(socket)
        .map_err(|err| egress_error(std::io::Error::other(err)))?;
    let tmp = Path::new(SLASH_TMP);
    let private = |dir: &Path| {
        layout.overlay_dirs.iter().any(|d| d == dir)
            || (layout.private_dirs.iter().any(|d| d == dir) && policy.can_read(dir))
    };
    let dir = std::iter::once(tmp)
        .chain(policy.tmpdir.as_deref())
        .find(|dir| private(dir));
    let Some(dir) = dir else {
        warnings.push(
            "inspect=true: the sandbox has no private /tmp or $TMPDIR for the inspection CA's \
             bundle; clients inside will not trust the inspected destinations"
                .to_owned(),
        );
        return Ok(None);
    };
    crate::egress::trust::install(dir, &ca.bundle(host_bundle))
        .map(Some)
        .map_err(egress_error)
}

/// The layout of a command's sandbox: a fresh `/proc` (its own PID namespace) and a minimal
/// `/dev` always; with a restricted filesystem also private `$TMPDIR` and `/run`, with the
/// working directory carried in when it lives there, and `/tmp` as [`TmpView`] says.
pub fn command_layout(policy: &ResolvedPolicy, cwd: &Path) -> mounts::Layout {
    let restricted = policy.restricts_filesystem();
    let mut private_dirs = Vec::new();
    let mut overlay_dirs = Vec::new();
    match TmpView::of(policy, true) {
        // The builder makes an overlay private where the host's mounts inside forbid it.
        TmpView::Overlay | TmpView::PrivateWritable => overlay_dirs.push(PathBuf::from(SLASH_TMP)),
        TmpView::Private => private_dirs.push(PathBuf::from(SLASH_TMP)),
        TmpView::HostReadOnly | TmpView::Host | TmpView::Hidden => {}
    }
    if restricted {
        // `$TMPDIR` = `/tmp` is the overlay, not a tmpfs of its own.
        private_dirs.extend(
            policy
                .tmpdir
                .iter()
                .filter(|dir| !overlay_dirs.contains(dir))
                .cloned(),
        );
        private_dirs.push(PathBuf::from("/run"));
        private_dirs.sort();
        private_dirs.dedup();
    }
    let mut carry = vec![cwd.to_owned()];
    if restricted && policy.network_fully_on() {
        carry.extend(resolver_configuration());
    }
    mounts::Layout {
        proc: true,
        dev: true,
        private_dirs,
        overlay_dirs,
        carry,
    }
}

/// `/tmp`.
const SLASH_TMP: &str = "/tmp";

/// What a command sees at `/tmp` (`--explain` prints it as [`TmpView::describe`] says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmpView {
    /// The policy writes `/tmp`: the host's `/tmp` read-only, a private writable layer on top
    /// (an overlay; what the command writes there never reaches the host).
    Overlay,
    /// The policy reads `/tmp` only: the host's `/tmp`, read-only.
    HostReadOnly,
    /// The policy cannot read `/tmp`: a private, empty tmpfs (host files there unreachable).
    Private,
    /// No mount namespace (or no sandbox): the host's `/tmp` with the policy's access; writes
    /// reach the host.
    Host,
    /// No mount namespace and the policy cannot read `/tmp`.
    Hidden,
    /// The policy writes `/tmp` but the host has filesystems mounted inside it, which the
    /// kernel will not overlay from a user namespace: a private, writable tmpfs (host files
    /// there out of sight; the working directory and named paths carried in).
    PrivateWritable,
}

impl TmpView {
    /// The view under `policy`, with or without a mount namespace.
    pub fn of(policy: &ResolvedPolicy, mount_namespace: bool) -> Self {
        let tmp = Path::new(SLASH_TMP);
        if !policy.restricts_filesystem() {
            return TmpView::Host;
        }
        let access = policy.access_for(tmp);
        match (mount_namespace, access) {
            (true, crate::policy::Access::Write) => TmpView::Overlay,
            (true, crate::policy::Access::Read) => TmpView::HostReadOnly,
            (true, crate::policy::Access::Deny) => TmpView::Private,
            (false, crate::policy::Access::Write) => TmpView::Host,
            (false, crate::policy::Access::Read) => TmpView::HostReadOnly,
            (false, crate::policy::Access::Deny) => TmpView::Hidden,
        }
    }

    /// The view as the mount builder will make it on this host: an [`TmpView::Overlay`] of a
    /// `/tmp` with host mounts inside becomes [`TmpView::PrivateWritable`] (an unreadable
    /// mountinfo, which no Linux with `/proc` has, leaves the view as it is).
    pub fn on_this_host(self) -> Self {
        let mounts_inside = || {
            mounts::mountinfo::mount_points_below(Path::new(SLASH_TMP))
                .is_ok_and(|below| !below.is_empty())
        };
        match self {
            TmpView::Overlay if mounts_inside() => TmpView::PrivateWritable,
            view => view,
        }
    }

    /// One line for `--explain`.
    pub fn describe(self) -> &'static str {
        match self {
            TmpView::Overlay => "host /tmp read-only, private writable layer on top",
            TmpView::HostReadOnly => "host /tmp read-only",
            TmpView::Private => "private, empty",
            TmpView::Host => "host /tmp, writes reach the host",
            TmpView::Hidden => "host /tmp, unreadable",
            TmpView::PrivateWritable => {
                "private, writable (the host has filesystems mounted inside /tmp, which an \
                 overlay cannot layer)"
            }
        }
    }
}

/// Where `/etc/resolv.conf` points when that is under `/run` (systemd-resolved,
/// resolvconf): carried into the private `/run` so name resolution keeps working with the
/// network on.
fn resolver_configuration() -> Option<PathBuf> {
    let target = std::fs::canonicalize("/etc/resolv.conf").ok()?;
    target
        .starts_with("/run")
        .then(|| target.parent().map(Path::to_owned))
        .flatten()
}

/// The signals the outer forwards and PID 1 passes on to the command's process group, plus
/// `SIGCHLD`, all blocked and read from a signalfd.
pub fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for signal in FORWARDED_SIGNALS {
        set.add(signal);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Signals passed on to the command.
pub const FORWARDED_SIGNALS: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGCONT,
];

/// Forwards signals, reaps, and answers the command's notifications (`notifier`) until the
/// command ends; returns its status message.
pub(super) fn supervise(
    signals: &SignalFd,
    command: Pid,
    notifier: Option<&super::unix_sockets::Notifier>,
) -> (u8, i32) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut listening = notifier.is_some();
    loop {
        if let Some(notifier) = notifier.filter(|_| listening) {
            let mut fds = [
                PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(notifier.fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return end_unsupervised(command),
            }
            let ready = fds[1].revents().unwrap_or(PollFlags::empty());
            if ready.contains(PollFlags::POLLIN) {
                notifier.handle_one();
            } else if ready.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
                // No process is left under the filter; only signals from now on.
                listening = false;
            }
            if !fds[0]
                .revents()
                .unwrap_or(PollFlags::empty())
                .contains(PollFlags::POLLIN)
            {
                continue;
            }
        }
        let info = match signals.read_signal() {
            Ok(Some(info)) => info,
            Ok(None) | Err(nix::errno::Errno::EINTR) => continue,
            // The signalfd is unusable: no signal can be passed on, and looping would spin.
            // End the command and report how it ended.
            Err(_) => return end_unsupervised(command),
        };
        let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
        if signo != libc::SIGCHLD {
            if let Ok(signal) = Signal::try_from(signo)
                && nix::sys::signal::killpg(command, signal).is_err()
            {
                // The command has not made its own session yet.
                let _ = nix::sys::signal::kill(command, signal);
            }
            continue;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                    return (STATUS_EXITED, code);
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                    return (STATUS_SIGNALED, signal as i32);
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

/// Kills the command's group and waits for the command (without the signalfd).
fn end_unsupervised(command: Pid) -> (u8, i32) {
    let _ = nix::sys::signal::killpg(command, Signal::SIGKILL);
    let _ = nix::sys::signal::kill(command, Signal::SIGKILL);
    loop {
        match waitpid(command, None) {
            Ok(WaitStatus::Exited(_, code)) => return (STATUS_EXITED, code),
            Ok(WaitStatus::Signaled(_, signal, _)) => return (STATUS_SIGNALED, signal as i32),
            Err(nix::errno::Errno::EINTR) | Ok(_) => {}
            Err(_) => return (STATUS_SIGNALED, libc::SIGKILL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Access, FilesystemPolicy, PathRule};

    fn policy(tmp: Access) -> ResolvedPolicy {
        let rule = |path: &str, access| PathRule {
            path: PathBuf::from(path),
            access,
        };
        ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: vec![rule("/", Access::Read), rule("/tmp", tmp)],
            },
            false,
        )
    }

    #[test]
    fn tmp_is_an_overlay_when_written_the_hosts_when_read_and_private_when_denied() {
        let cases = [
            (Access::Write, TmpView::Overlay, true, false),
            (Access::Read, TmpView::HostReadOnly, false, false),
            (Access::Deny, TmpView::Private, false, true),
        ];
        for (access, view, overlaid, private) in cases {
            let policy = policy(access);
            assert_eq!(TmpView::of(&policy, true), view, "{access:?}");
            let layout = command_layout(&policy, Path::new("/"));
            let tmp = PathBuf::from("/tmp");
            assert_eq!(layout.overlay_dirs.contains(&tmp), overlaid, "{access:?}");
            assert_eq!(layout.private_dirs.contains(&tmp), private, "{access:?}");
        }
        assert_eq!(TmpView::of(&policy(Access::Write), false), TmpView::Host);
    }

    #[test]
    fn a_tmpdir_that_is_tmp_is_the_overlay_not_a_tmpfs_of_its_own() {
        let mut policy = policy(Access::Write);
        policy.tmpdir = Some(PathBuf::from("/tmp"));
        let layout = command_layout(&policy, Path::new("/"));
        assert_eq!(layout.overlay_dirs, vec![PathBuf::from("/tmp")]);
        assert!(!layout.private_dirs.contains(&PathBuf::from("/tmp")));
    }
}
