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
//! command. That path lives in `direct`; the outer's wait loop in `outer`.

use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;

use nix::sys::signal::{SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

use super::init::{self, InitChannels};
use super::{NamespaceMode, SandboxError, namespaces, pty};
use crate::policy::ResolvedPolicy;

mod direct;
mod outer;
use outer::{Interrupts, Outer, wall_deadline};

pub use crate::exit::code::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

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
        return direct::exec_in_place(command);
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
    direct::run_without_namespaces(policy, command, options, observer)
}

/// A shorter borrow of the observer (the trait object's lifetime shrinks with it).
fn reborrow<'b>(observer: &'b mut Option<&mut dyn Observer>) -> Option<&'b mut dyn Observer> {
    match observer {
        Some(observer) => Some(&mut **observer),
        None => None,
    }
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
