//! `sandbox-run --audit`: the one place where `sandbox-run` does not simply confine itself and
//! `execve`. The collector must outlive the command, so:
//!
//! 1. the parent opens the collector (before any child exists), blocks the signals it forwards
//!    and forks;
//! 2. the child starts a fresh audit session, tells the parent and waits for the go (the rules
//!    keyed on the session must exist before anything is denied); then it confines itself
//!    exactly as plain `sandbox-run` does, with audit logging on, and `execve`s the command;
//! 3. the parent collects while the command runs, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to it,
//!    and after it exited drains, restores the audit state, writes the report and exits with
//!    the command's status (or 3/4 under `--fail-on-denial`).
//!
//! The parent stays unconfined (it needs the audit socket) and runs no code of the command.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2, read, write};

use crate::audit::cli::{AuditArgs, EXIT_AUDIT_BLIND, EXIT_DENIED};
use crate::audit::collect::{Collector, session_of, start_audit_session};
use crate::audit::correlate::{Correlator, Target};
use crate::audit::denial::{Coverage, Denial};
use crate::audit::records::Record;
use crate::audit::report::{self, Format, RunAudit};
use crate::audit::sarif::sarif;
use crate::linux::{EnforceOptions, restrict_current_process};
use crate::policy::ResolvedPolicy;
use crate::run::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED, RunError};

/// Landlock ABI that has `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`.
const LANDLOCK_AUDIT_ABI: i32 = 7;

/// Runs `command` under `policy` with the denial audit; returns the exit status to use.
///
/// # Errors
/// [`RunError::Setup`] when the process plumbing (signals, pipes, fork) fails before the
/// command started. Audit problems are not errors: they become coverage gaps.
pub fn run_audited(
    policy: &ResolvedPolicy,
    options: &EnforceOptions,
    command: &[OsString],
    print_report: bool,
    args: &AuditArgs,
) -> Result<u8, RunError> {
    let setup = |what: &str| {
        let what = what.to_owned();
        move |err: nix::Error| RunError::Setup(format!("audit: {what} failed: {err}"))
    };
    let (program, program_args) = command
        .split_first()
        .ok_or_else(|| RunError::Setup("no program given".to_owned()))?;
    let (mut collector, blind_reason) = match Collector::open() {
        Ok(collector) => (Some(collector), None),
        Err(reason) => (None, Some(reason)),
    };
    let abi = crate::sys::landlock_abi();
    let mut options = options.clone();
    options.audit_log = collector.is_some();

    let mut forwarded = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        forwarded.add(signal);
    }
    let mut old_mask = SigSet::empty();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), Some(&mut old_mask))
        .map_err(setup("blocking signals"))?;
    let signals = SignalFd::with_flags(&forwarded, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(setup("signalfd"))?;
    let (ready_r, ready_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(setup("pipe"))?;
    let (go_r, go_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(setup("pipe"))?;
    let collecting = collector.is_some();

    let child = crate::audit::sys::fork_child(|| {
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old_mask), None);
        child_main(
            policy,
            &options,
            program,
            program_args,
            print_report,
            collecting.then_some((&ready_w, &go_r)),
        )
    })
    .map_err(|err| RunError::Setup(format!("audit: fork failed: {err}")))?;
    drop((ready_w, go_r));

    let mut session = None;
    if let Some(collector) = collector.as_mut() {
        let mut ok = [0u8];
        if read(&ready_r, &mut ok) == Ok(1) && ok[0] == 1 {
            let own = session_of(std::process::id());
            session = session_of(child_pid(child)).filter(|s| Some(*s) != own);
        }
        collector.attach(session);
    }
    let _ = write(&go_w, &[1]);
    drop((ready_r, go_w));

    let mut sink = Sink {
        correlator: Correlator::new(
            Target {
                root_pid: child_pid(child),
                session,
            },
            policy.clone(),
        ),
        denials: Vec::new(),
        live: args.audit_fd.and_then(open_inherited_fd),
    };
    let exit_status = wait_collecting(child, &signals, collector.as_mut(), &mut sink);
    let coverage = match collector {
        Some(mut collector) => {
            collector.drain(&mut |record| sink.record(record));
            let mount = session.is_some();
            let mut coverage = collector.close(abi >= LANDLOCK_AUDIT_ABI, true, mount);
            if abi < LANDLOCK_AUDIT_ABI {
                coverage.gaps.push(format!(
                    "Landlock ABI {abi} cannot log denials after execve (needs ABI {LANDLOCK_AUDIT_ABI})"
                ));
            }
            coverage
        }
        None => Coverage::blind(format!(
            "audit collection is not possible here: {}",
            blind_reason.unwrap_or_default()
        )),
    };
    let denials = sink.finish();
    let audit = RunAudit {
        command: command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        exit_status,
        denials,
        coverage,
    };
    eprint!("{}", report::summary(&audit));
    if let Some(path) = &args.audit {
        let text = match args.audit_format {
            Format::Jsonl => report::jsonl(&audit),
            Format::Sarif => {
                let mut text = serde_json::to_string_pretty(&sarif(&audit, args.fail_on_denial))
                    .unwrap_or_default();
                text.push('\n');
                text
            }
            Format::Github => report::github(&audit, args.fail_on_denial),
        };
        let written = if path.as_os_str() == "-" {
            std::io::stdout().write_all(text.as_bytes())
        } else {
            std::fs::write(path, text)
        };
        if let Err(err) = written {
            eprintln!(
                "sandbox-run: audit: writing the report to {} failed: {err}",
                path.display()
            );
            return Ok(EXIT_SETUP_FAILED);
        }
    }
    Ok(exit_code(&audit, args.fail_on_denial))
}

/// The exit status: the program's, or 3 (denied) / 4 (blind) under `--fail-on-denial`.
pub fn exit_code(audit: &RunAudit, fail_on_denial: bool) -> u8 {
    let own = u8::try_from(audit.exit_status).unwrap_or(EXIT_SETUP_FAILED);
    if !fail_on_denial {
        return own;
    }
    if !audit.denials.is_empty() {
        EXIT_DENIED
    } else if !audit.coverage.is_full() {
        EXIT_AUDIT_BLIND
    } else {
        own
    }
}

/// The child: join a fresh audit session, wait for the go, confine, exec.
fn child_main(
    policy: &ResolvedPolicy,
    options: &EnforceOptions,
    program: &OsString,
    args: &[OsString],
    print_report: bool,
    sync: Option<(&OwnedFd, &OwnedFd)>,
) -> i32 {
    if let Some((ready, go)) = sync {
        let ok = start_audit_session();
        let _ = write(ready, &[u8::from(ok)]);
        let mut byte = [0u8];
        if read(go, &mut byte) != Ok(1) {
            return i32::from(EXIT_SETUP_FAILED);
        }
    }
    let report = match restrict_current_process(policy, options) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("sandbox-run: {err}");
            return i32::from(EXIT_SETUP_FAILED);
        }
    };
    for warning in &report.warnings {
        eprintln!("sandbox-run: warning: {warning}");
    }
    if print_report {
        eprintln!("{}", serde_json::to_string(&report).unwrap_or_default());
    }
    let err = std::process::Command::new(program).args(args).exec();
    eprintln!(
        "sandbox-run: cannot execute {}: {err}",
        program.to_string_lossy()
    );
    if err.kind() == std::io::ErrorKind::NotFound {
        i32::from(EXIT_NOT_FOUND)
    } else {
        i32::from(EXIT_CANNOT_EXECUTE)
    }
}

/// Reads records and forwards signals until the child exits; returns its status.
fn wait_collecting(
    child: Pid,
    signals: &SignalFd,
    mut collector: Option<&mut Collector>,
    sink: &mut Sink,
) -> i32 {
    loop {
        {
            let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
            if let Some(collector) = collector.as_deref() {
                fds.push(PollFd::new(collector.poll_fd(), PollFlags::POLLIN));
            }
            let _ = poll(&mut fds, PollTimeout::NONE);
        }
        if let Some(collector) = collector.as_deref_mut() {
            collector.read_available(&mut |record| sink.record(record));
        }
        while let Ok(Some(info)) = signals.read_signal() {
            let signo = i32::try_from(info.ssi_signo).unwrap_or(0);
            if signo != libc::SIGCHLD
                && let Ok(signal) = Signal::try_from(signo)
            {
                let _ = kill(child, signal);
            }
        }
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(_) => return i32::from(EXIT_SETUP_FAILED),
        }
    }
}

/// Where records go: the correlator, the list, and the live descriptor.
struct Sink {
    correlator: Correlator,
    denials: Vec<Denial>,
    live: Option<File>,
}

impl Sink {
    fn record(&mut self, record: Record) {
        let found = self.correlator.push(record);
        self.emit(found);
    }

    fn finish(mut self) -> Vec<Denial> {
        let found = self.correlator.finish();
        self.emit(found);
        self.denials
    }

    fn emit(&mut self, found: Vec<Denial>) {
        for denial in found {
            if let Some(live) = self.live.as_mut()
                && live
                    .write_all(report::denial_line(&denial).as_bytes())
                    .is_err()
            {
                self.live = None;
            }
            self.denials.push(denial);
        }
    }
}

/// Opens inherited descriptor `fd` for writing through `/proc/self/fd` (no raw-fd ownership
/// games; works for pipes and files).
fn open_inherited_fd(fd: i32) -> Option<File> {
    match File::options()
        .append(true)
        .open(format!("/proc/self/fd/{fd}"))
    {
        Ok(file) => Some(file),
        Err(err) => {
            eprintln!("sandbox-run: audit: --audit-fd {fd} is not usable: {err}");
            None
        }
    }
}

fn child_pid(pid: Pid) -> u32 {
    u32::try_from(pid.as_raw()).unwrap_or(0)
}

/// `sandbox-run` with audit flags: resolves the policy and options as plain `sandbox-run`
/// does, then [`run_audited`].
///
/// # Errors
/// As [`run_audited`], plus policy errors.
pub fn run_cli_audited(cli: &crate::run::Cli, args: &AuditArgs) -> Result<u8, RunError> {
    use crate::linux::NamespaceMode;
    let policy = crate::run::resolve_cli_policy(cli)?;
    let mut options = EnforceOptions::for_command();
    options.best_effort = cli.best_effort;
    if cli.no_namespaces {
        options.namespaces = NamespaceMode::Off;
    }
    run_audited(&policy, &options, &cli.command, cli.report, args)
}
