//! Running a command in a sandbox of its own: `sandbox-run`'s process model.
//!
//! ```text
//! sandbox-run (outer: the host's namespaces; exec-server's child; unconfined, runs no code of
//!  │           the command; collects the denial audit when asked)
//!  └─ PID 1    (new user, mount, PID, IPC [, network] namespaces; builds the mount layout,
//!      │        drops every capability, Landlock, seccomp; forwards signals, reaps orphans)
//!      └─ the command (its own session; the sandbox's own terminal when the outer has one)
//! ```
//!
//! The outer writes PID 1's uid/gid maps, forwards `SIGINT`, `SIGTERM`, `SIGHUP`, `SIGQUIT`,
//! `SIGUSR1`, `SIGUSR2` and `SIGCONT` to it, relays the terminal when there is one, and when the
//! command has ended (PID 1 reports its status, then exits and the kernel ends everything left
//! in the PID namespace) it returns the command's status; `sandbox-run` then exits with it or
//! dies of the same signal. If the outer is killed, PID 1 gets `SIGKILL` and the sandbox ends.
//!
//! Without the namespace layer (`--no-namespaces`, or best effort where user namespaces are
//! unavailable) the outer confines itself and `execve`s the command in place, as before; with
//! the denial audit it forks one child for that instead, because the collector must outlive the
//! command.

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;

use nix::sys::signal::{SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::init::{self, InitChannels};
use super::{EnforceOptions, EnvMode, NamespaceMode, SandboxError, namespaces, pty};
use crate::policy::ResolvedPolicy;

mod outer;
use outer::{Interrupts, Outer, wall_deadline};

pub use crate::exit::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

pub use super::spec::{AskOptions, Command, Ended, INTERRUPT_GRACE, RunOptions};

/// Watches the sandbox from the outer process (the denial audit).
pub trait Observer {
    /// A descriptor to poll beside the outer's own.
    fn poll_fd(&self) -> Option<BorrowedFd<'_>>;
    /// The descriptor is readable.
    fn readable(&mut self);
    /// The process that confines itself (and creates the Landlock domain) exists and waits;
    /// called before it is let go.
    fn started(&mut self, root: Pid);
    /// A denial the outer saw directly (the egress proxy's and the unix-socket gate's
    /// refusals).
    fn denial(&mut self, denial: crate::denial::Denial) {
        let _ = denial;
    }
    /// Something the outer could not observe completely (the report says so).
    fn gap(&mut self, gap: String) {
        let _ = gap;
    }
}

/// Why the command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Confinement failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The outer's own plumbing failed.
    #[error("{what} failed: {source}")]
    Plumbing {
        /// The step.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// `execve` failed (only without the namespace layer; with it, the command's process
    /// reports this itself and exits 126/127).
    #[error("cannot execute {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

fn plumbing(what: &'static str) -> impl Fn(nix::Error) -> CommandError {
    move |source| CommandError::Plumbing {
        what,
        source: source.into(),
    }
}

/// Runs `command` under `policy` and returns how it ended.
///
/// The caller has closed the descriptors it inherited and does not need
/// ([`super::hygiene::close_inherited_fds`], first thing in `sandbox-run`); whatever else it opened
/// must be close-on-exec. PID 1 closes everything but its own channels.
///
/// # Errors
/// [`CommandError`] when the sandbox could not be set up or the command never started.
pub fn run(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    mut observer: Option<&mut dyn Observer>,
) -> Result<Ended, CommandError> {
    if policy.is_unrestricted() {
        return exec_in_place(command);
    }
    nix::sys::prctl::set_no_new_privs().map_err(|source| SandboxError::NoNewPrivs { source })?;
    if options.namespaces == NamespaceMode::Off && policy.egress().is_some() {
        return Err(SandboxError::EgressNeedsNamespace {
            cause: "--no-namespaces".to_owned(),
        }
        .into());
    }
    if options.namespaces == NamespaceMode::Auto {
        match run_in_namespaces(policy, command, options, reborrow(&mut observer)) {
            Err(CommandError::Sandbox(SandboxError::Namespace(
                err @ namespaces::NamespaceError::Unshare { .. },
            ))) if policy.egress().is_some() => {
                // Without its own network namespace the command would reach everything.
                return Err(SandboxError::EgressNeedsNamespace {
                    cause: err.to_string(),
                }
                .into());
            }
            Err(CommandError::Sandbox(SandboxError::Namespace(
                err @ namespaces::NamespaceError::Unshare { .. },
            ))) => {
                // Nothing changed yet: fall back only where no rule needs the layer.
                let narrowing = namespaces::rules_needing_namespace(policy);
                if let Some(rule) = narrowing.first().filter(|_| !options.best_effort) {
                    return Err(SandboxError::NamespaceRequired {
                        rule: rule.clone(),
                        cause: err.to_string(),
                    }
                    .into());
                }
                if !options.best_effort {
                    return Err(SandboxError::Namespace(err).into());
                }
                eprintln!("sandbox-run: warning: namespace layer not applied: {err}");
            }
            other => return other,
        }
    }
    run_without_namespaces(policy, command, options, observer)
}

/// A shorter borrow of the observer (the trait object's lifetime shrinks with it).
fn reborrow<'b>(observer: &'b mut Option<&mut dyn Observer>) -> Option<&'b mut dyn Observer> {
    match observer {
        Some(observer) => Some(&mut **observer),
        None => None,
    }
}

/// No sandbox at all: `execve` in place with the command's environment and limits (the wall
/// clock through `alarm(2)`, as no process of ours outlives the exec to watch it).
fn exec_in_place(command: &Command) -> Result<Ended, CommandError> {
    use std::os::unix::process::CommandExt;
    let (program, args) = command.argv.split_first().ok_or(CommandError::Exec {
        program: String::new(),
        source: std::io::Error::from_raw_os_error(libc::ENOENT),
    })?;
    command
        .limits
        .apply_rlimits_to_current_process()
        .map_err(|err| CommandError::Plumbing {
            what: "setting the command's limits",
            source: std::io::Error::other(err.to_string()),
        })?;
    if let Some(seconds) = command.limits.wall_seconds {
        nix::unistd::alarm::set(u32::try_from(seconds).unwrap_or(u32::MAX));
    }
    let source = std::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&command.cwd)
        .exec();
    Err(CommandError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    })
}

/// Landlock and seccomp only: confine this process and exec the command in place, or (with an
/// observer) in a forked child the outer waits for.
fn run_without_namespaces(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    observer: Option<&mut dyn Observer>,
) -> Result<Ended, CommandError> {
    let enforce = EnforceOptions {
        best_effort: options.best_effort,
        keep_fds: {
            let mut keep = vec![0, 1, 2];
            keep.extend_from_slice(&options.keep_fds);
            keep
        },
        env: EnvMode::Keep,
        namespaces: NamespaceMode::Off,
        audit_log: options.audit_log,
        egress_port: None,
    };
    let holds = super::unix_sockets::needs_notifier(policy);
    let Some(observer) = observer else {
        if holds {
            return hold_here(policy, command, options, &enforce, None);
        }
        confine_here(policy, command, options, &enforce)?;
        return exec_in_place(command);
    };
    let refusals = refusal_channel(policy, true)?;
    let signals = block_forwarded_signals()?;
    // sandbox-run is single-threaded; the child confines itself and execs or leaves through
    // _exit.
    let child =
        match crate::sys::fork_single_threaded().map_err(|source| CommandError::Plumbing {
            what: "fork",
            source,
        })? {
            None if holds => {
                crate::sys::reset_signals_for_exec();
                let mut enforce = enforce.clone();
                let channel = refusals.map(|(read, write)| {
                    drop(read);
                    enforce
                        .keep_fds
                        .push(std::os::fd::AsRawFd::as_raw_fd(&write));
                    write
                });
                match hold_here(policy, command, options, &enforce, channel) {
                    Ok(ended) => exit_as(ended),
                    Err(err) => {
                        eprintln!("sandbox-run: {err}");
                        crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
                    }
                }
            }
            None => {
                crate::sys::reset_signals_for_exec();
                if let Err(err) = confine_here(policy, command, options, &enforce) {
                    eprintln!("sandbox-run: {err}");
                    crate::sys::exit_now(i32::from(EXIT_SETUP_FAILED));
                }
                let err = exec_in_place(command);
                eprintln!(
                    "sandbox-run: {}",
                    err.err().map(|e| e.to_string()).unwrap_or_default()
                );
                crate::sys::exit_now(i32::from(EXIT_CANNOT_EXECUTE))
            }
            Some(child) => child,
        };
    observer.started(child);
    let mut outer = Outer {
        signals,
        status: None,
        relay: None,
        root: child,
        reported: None,
        root_status: None,
        deadline: wall_deadline(&command.limits),
        proxy: None,
        egress_log: None,
        interrupts: Interrupts::new(options.escalate_interrupts),
        refusals: refusals.map(|(read, write)| {
            drop(write);
            super::unix_refusals::Reader::new(read)
        }),
    };
    Ok(outer.wait(Some(observer)))
}

/// The refusal channel of the unix-socket gate ([`super::unix_refusals`]): a pipe, when the
/// denial audit runs (`audited`) and the policy needs the gate on this host.
fn refusal_channel(
    policy: &ResolvedPolicy,
    audited: bool,
) -> Result<Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>, CommandError> {
    if !audited || !super::unix_sockets::needs_notifier(policy) {
        return Ok(None);
    }
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map(Some)
        .map_err(plumbing("the unix-socket refusal channel"))
}

/// Ends this process as the command ended: its exit status, or death by its signal.
fn exit_as(ended: Ended) -> ! {
    if let Ended::Signaled(signal) = ended {
        crate::sys::die_of_signal(signal);
    }
    crate::sys::exit_now(ended.code())
}

/// Without namespaces, when the command's unix-socket connections need a holder
/// ([`super::unix_sockets`]): this process confines itself, starts the command as its child
/// (which installs its own filter, whose listener this process keeps), installs its own
/// seccomp filter, and then forwards signals, answers the command's connections and waits
/// until the command ends. The command gets `SIGKILL` if this process dies: its connections
/// would fail from then on.
fn hold_here(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    enforce: &EnforceOptions,
    refusals: Option<std::os::fd::OwnedFd>,
) -> Result<Ended, CommandError> {
    nix::unistd::chdir(&command.cwd).map_err(|source| SandboxError::Chdir {
        path: command.cwd.clone(),
        source: source.into(),
    })?;
    let mut pinned = Vec::new();
    // No mount namespace, no overlay.
    let gate = super::unix_sockets::Gate::for_policy(policy, Vec::new(), &mut pinned)
        .map(|gate| gate.report_to(refusals));
    let mut report = super::restrict_current_process_but_seccomp(policy, enforce)?;
    report.warnings.extend(pinned);
    let main = super::seccomp::Prepared::new(super::seccomp_variant(policy, enforce))
        .map_err(SandboxError::from)?;
    report.seccomp = main.names().to_vec();
    for warning in &report.warnings {
        eprintln!("sandbox-run: warning: {warning}");
    }
    if options.report {
        eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    let _ = crate::sys::set_dumpable(false);
    let forwarded = init::forwarded_signals();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), None)
        .map_err(plumbing("blocking signals"))?;
    let signals =
        SignalFd::with_flags(&forwarded, SfdFlags::SFD_CLOEXEC).map_err(plumbing("signalfd"))?;
    let exec = init::Exec::new(command, None, None);
    let (child, notifier) = super::unix_sockets::start_command(main, gate, &mut || {
        crate::sys::reset_signals_for_exec();
        let _ = crate::sys::set_parent_death_signal(libc::SIGKILL);
        if let Some(seconds) = command.limits.wall_seconds {
            // As in exec_in_place: no process of ours watches the wall clock here.
            nix::unistd::alarm::set(u32::try_from(seconds).unwrap_or(u32::MAX));
        }
        // Its rlimits and its shares of the host's pools (without a user namespace of its own
        // it charges the host uid's counters directly), then execve.
        init::exec_prepared(&exec);
    })?;
    let (kind, value) = init::supervise(&signals, child, notifier.as_ref());
    Ok(if kind == init::STATUS_SIGNALED {
        Ended::Signaled(value)
    } else {
        Ended::Exited(value)
    })
}

fn confine_here(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    enforce: &EnforceOptions,
) -> Result<(), CommandError> {
    nix::unistd::chdir(&command.cwd).map_err(|source| SandboxError::Chdir {
        path: command.cwd.clone(),
        source: source.into(),
    })?;
    let report = super::restrict_current_process(policy, enforce)?;
    for warning in &report.warnings {
        eprintln!("sandbox-run: warning: {warning}");
    }
    if options.report {
        eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    // Without a user namespace of its own the command charges the host uid's counters
    // directly: its rlimit shares still bound what it can add to them.
    crate::limits::apply_pool_rlimits_to_current_process(&command.limits).map_err(|err| {
        CommandError::Plumbing {
            what: "setting the command's shares of the host's pools",
            source: std::io::Error::other(err.to_string()),
        }
    })?;
    Ok(())
}

/// Blocks the forwarded signals and `SIGCHLD` and reads them from a signalfd instead.
fn block_forwarded_signals() -> Result<SignalFd, CommandError> {
    let set = init::forwarded_signals();
    let mut with_winch = set;
    with_winch.add(Signal::SIGWINCH);
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&with_winch), None)
        .map_err(plumbing("blocking signals"))?;
    SignalFd::with_flags(&with_winch, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(plumbing("signalfd"))
}

fn run_in_namespaces(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &RunOptions,
    observer: Option<&mut dyn Observer>,
) -> Result<Ended, CommandError> {
    let relayed = pty::terminal_fds();
    let (go_read, go_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(plumbing("pipe"))?;
    let (status_read, status_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(plumbing("pipe"))?;
    let terminal = if relayed.iter().any(|r| *r) {
        Some(UnixStream::pair().map_err(|source| CommandError::Plumbing {
            what: "socketpair",
            source,
        })?)
    } else {
        None
    };
    let egress = if policy.egress().is_some() {
        Some(UnixStream::pair().map_err(|source| CommandError::Plumbing {
            what: "socketpair",
            source,
        })?)
    } else {
        None
    };
    // With the denial audit, the gate's refusals become denial records (unix_refusals).
    let refusals = refusal_channel(policy, observer.is_some())?;
    let signals = block_forwarded_signals()?;
    let flags = namespaces::namespace_flags(policy, true);
    let cloned = crate::sys::clone_into_namespaces(flags.bits()).map_err(|source| {
        SandboxError::Namespace(namespaces::NamespaceError::Unshare {
            flags: format!("{flags:?}"),
            source,
        })
    })?;
    let Some(root) = cloned else {
        drop((go_write, status_read, signals));
        let (refusals_read, unix_refusals) = refusals.unzip();
        drop(refusals_read);
        let terminal = terminal.map(|(ours, theirs)| {
            drop(ours);
            theirs
        });
        let egress = egress.map(|(ours, theirs)| {
            drop(ours);
            theirs
        });
        init::run_init(
            policy,
            command,
            options,
            InitChannels {
                go: go_read,
                status: status_write,
                terminal,
                relayed,
                egress,
                unix_refusals,
            },
        )
    };
    drop((go_read, status_write));
    let refusals = refusals.map(|(read, write)| {
        drop(write);
        super::unix_refusals::Reader::new(read)
    });
    nix::fcntl::fcntl(
        &status_read,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(plumbing("the status channel"))?;
    let terminal = terminal.map(|(ours, theirs)| {
        drop(theirs);
        ours
    });
    let egress = egress.map(|(ours, theirs)| {
        drop(theirs);
        ours
    });
    if let Err(err) = namespaces::write_child_id_maps(root) {
        let _ = nix::sys::signal::kill(root, Signal::SIGKILL);
        let _ = waitpid(root, None);
        return Err(SandboxError::Namespace(err).into());
    }
    let mut observer = observer;
    if let Some(observer) = reborrow(&mut observer) {
        observer.started(root);
    }
    nix::unistd::write(&go_write, &[1]).map_err(plumbing("starting the sandbox"))?;
    drop(go_write);
    let relay =
        match terminal {
            Some(socket) => match pty::receive_fd(&socket) {
                Ok(Some(master)) => Some(pty::Relay::new(master, relayed).map_err(|source| {
                    CommandError::Plumbing {
                        what: "the terminal relay",
                        source,
                    }
                })?),
                // PID 1 failed before opening the terminal; its status says why.
                _ => None,
            },
            None => None,
        };
    let proxy = match (egress, policy.egress()) {
        (Some(socket), Some(rules)) => start_proxy(&socket, policy, rules, options, root)?,
        _ => None,
    };
    let mut outer = Outer {
        signals,
        status: Some(status_read),
        relay,
        root,
        reported: None,
        root_status: None,
        deadline: wall_deadline(&command.limits),
        proxy,
        egress_log: options.egress_log.clone(),
        interrupts: Interrupts::new(options.escalate_interrupts),
        refusals,
    };
    Ok(outer.wait(observer))
}

/// The question socket pair: the outer's end served by a thread asking `ask`'s responder,
/// the proxy's end returned.
fn ask_channel(ask: &AskOptions) -> Result<std::os::fd::OwnedFd, CommandError> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    let failed = |source: std::io::Error| CommandError::Plumbing {
        what: "the egress question socket",
        source,
    };
    let (outer_end, proxy_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|err| failed(err.into()))?;
    let responder = match &ask.peer {
        Some(peer) => crate::egress::ask::Responder::Peer(peer.try_clone().map_err(failed)?),
        None => crate::egress::ask::Responder::Terminal {
            timeout: ask.timeout,
        },
    };
    crate::egress::ask::serve_questions(outer_end, responder).map_err(failed)?;
    Ok(proxy_end)
}

/// The roots an inspected destination is verified against, when this process's environment
/// names a bundle (`SSL_CERT_FILE`, as the host's TLS libraries read it); `None`: the proxy
/// reads the host's trust store itself. Only when a pattern asks for `inspect=true`.
fn inspection_roots(rules: &crate::policy::EgressRules) -> Option<Vec<String>> {
    if !rules.inspects_any() {
        return None;
    }
    let path = std::env::var_os("SSL_CERT_FILE")?;
    std::fs::read_to_string(path).ok().map(|pem| vec![pem])
}

/// Relays the proxy's inspection CA certificate (`inspect=true`) to PID 1, which waits for it
/// before it starts the command ([`crate::egress::trust`]), and closes the channel.
fn relay_inspection_ca(
    socket: &UnixStream,
    proxy: &crate::egress::launch::ProxyProcess,
) -> Result<(), crate::egress::trust::TrustError> {
    if let Some(ca) = proxy.inspection_ca() {
        ca.send(socket)?;
    }
    socket.shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

/// Receives the listening socket PID 1 made in the sandbox's network namespace and execs the
/// egress proxy on it. `None` when PID 1 failed before sending it (its status says why). A
/// proxy that cannot start ends the sandbox: its command would have no network at all, and
/// could not be told why.
fn start_proxy(
    socket: &UnixStream,
    policy: &ResolvedPolicy,
    rules: &crate::policy::EgressRules,
    options: &RunOptions,
    root: Pid,
) -> Result<Option<crate::egress::launch::ProxyProcess>, CommandError> {
    let Ok(Some(listener)) = pty::receive_fd(socket) else {
        return Ok(None);
    };
    let config = crate::egress::ProxyConfig {
        rules: rules.clone(),
        denied_ports: policy.denied_tcp_ports.clone(),
        hosts: options.egress_hosts.clone(),
        upstream_authorization: options.upstream_authorization.clone(),
        ask: None,
        upstream_roots: inspection_roots(rules),
    };
    let (config, ask) = match (&options.ask, rules.ask) {
        (Some(ask), true) => match ask_channel(ask) {
            Ok(proxy_end) => (
                crate::egress::ProxyConfig {
                    ask: Some(crate::egress::ask::AskConfig {
                        timeout_ms: u64::try_from(ask.timeout.as_millis()).unwrap_or(u64::MAX),
                    }),
                    ..config
                },
                Some(proxy_end),
            ),
            Err(err) => {
                let _ = nix::sys::signal::kill(root, Signal::SIGKILL);
                let _ = waitpid(root, None);
                return Err(err);
            }
        },
        _ => (config, None),
    };
    let relayed =
        crate::egress::launch::ProxyProcess::spawn(listener, &config, ask).and_then(|proxy| {
            match relay_inspection_ca(socket, &proxy) {
                Ok(()) => Ok(proxy),
                Err(err) => {
                    let _ = proxy.stop();
                    Err(err.into())
                }
            }
        });
    match relayed {
        Ok(proxy) => Ok(Some(proxy)),
        Err(err) => {
            let _ = nix::sys::signal::kill(root, Signal::SIGKILL);
            let _ = waitpid(root, None);
            Err(CommandError::Plumbing {
                what: "the egress proxy",
                source: std::io::Error::other(err.to_string()),
            })
        }
    }
}
