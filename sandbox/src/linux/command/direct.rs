//! Without the namespace layer (`--no-namespaces`, or best effort where user namespaces are
//! unavailable): the outer confines itself with Landlock and seccomp and `execve`s the command
//! in place, or (with the denial audit, or when the command's unix-socket connections need a
//! holder) forks one child for it and waits; and no sandbox at all for an unrestricted policy.

use nix::sys::signal::{SigmaskHow, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::outer::{Interrupts, Outer, wall_deadline};
use super::{
    Command, CommandError, EXIT_CANNOT_EXECUTE, EXIT_SETUP_FAILED, Ended, Observer, RunOptions,
    block_forwarded_signals, plumbing, refusal_channel,
};
use crate::linux::init;
use crate::linux::{EnforceOptions, EnvMode, NamespaceMode, SandboxError};
use crate::policy::ResolvedPolicy;

/// No sandbox at all: `execve` in place with the command's environment and limits (the wall
/// clock through `alarm(2)`, as no process of ours outlives the exec to watch it).
pub(super) fn exec_in_place(command: &Command) -> Result<Ended, CommandError> {
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
pub(super) fn run_without_namespaces(
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
    let holds = crate::linux::unix_sockets::needs_notifier(policy);
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
            crate::linux::unix_refusals::Reader::new(read)
        }),
    };
    Ok(outer.wait(Some(observer)))
}

/// Ends this process as the command ended: its exit status, or death by its signal.
fn exit_as(ended: Ended) -> ! {
    if let Ended::Signaled(signal) = ended {
        crate::sys::die_of_signal(signal);
    }
    crate::sys::exit_now(ended.code())
}

/// Without namespaces, when the command's unix-socket connections need a holder
/// ([`crate::linux::unix_sockets`]): this process confines itself, starts the command as its child
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
    let gate = crate::linux::unix_sockets::Gate::for_policy(policy, Vec::new(), &mut pinned)
        .map(|gate| gate.report_to(refusals));
    let mut report = crate::linux::restrict_current_process_but_seccomp(policy, enforce)?;
    report.warnings.extend(pinned);
    let main = crate::linux::seccomp::Prepared::new(crate::linux::seccomp_variant(policy, enforce))
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
    let (child, notifier) = crate::linux::unix_sockets::start_command(main, gate, &mut || {
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
    let report = crate::linux::restrict_current_process(policy, enforce)?;
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
