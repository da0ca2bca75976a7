//! `sandbox-run --audit`: the outer `sandbox-run` (which stays in the host's namespaces,
//! unconfined, and runs no code of the command) collects the kernel's audit records of the
//! sandbox while it runs:
//!
//! 1. the collector opens (before any process of the sandbox exists) and the outer starts a
//!    fresh audit session for itself, which the sandbox inherits;
//! 2. once PID 1 of the sandbox exists (and waits for its go), the collector installs the rules
//!    keyed on that session and the correlator learns PID 1's pid (the Landlock domain's
//!    creator); then PID 1 confines itself with audit logging on and starts the command;
//! 3. records are read while the command runs ([`crate::linux::command::Observer`]);
//! 4. after the command ended, the collector drains, restores the audit state, and the report is
//!    written through the descriptor opened before the command started.

use std::fs::File;
use std::io::Write;
use std::os::fd::BorrowedFd;

use nix::unistd::Pid;

use crate::audit::cli::{AuditArgs, EXIT_AUDIT_BLIND, EXIT_DENIED};
use crate::audit::collect::{Collector, session_of, start_audit_session};
use crate::audit::correlate::{Correlator, Target};
use crate::audit::denial::{Coverage, Denial};
use crate::audit::records::Record;
use crate::audit::report::{self, Format, RunAudit};
use crate::audit::sarif::sarif;
use crate::linux::command::{self, Ended, Observer};
use crate::policy::ResolvedPolicy;
use crate::run::{EXIT_SETUP_FAILED, Prepared, RunError};

/// Landlock ABI that has `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`.
const LANDLOCK_AUDIT_ABI: i32 = 7;

/// The collector and the correlator, fed by the outer's wait loop.
struct AuditObserver {
    collector: Option<Collector>,
    session: Option<u32>,
    policy: ResolvedPolicy,
    sink: Option<Sink>,
    live: Option<File>,
}

impl Observer for AuditObserver {
    fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        self.collector.as_ref().map(Collector::poll_fd)
    }

    fn readable(&mut self) {
        if let (Some(collector), Some(sink)) = (self.collector.as_mut(), self.sink.as_mut()) {
            collector.read_available(&mut |record| sink.record(record));
        }
    }

    fn denial(&mut self, denial: Denial) {
        if let Some(sink) = self.sink.as_mut() {
            sink.emit(vec![denial]);
        }
    }

    fn started(&mut self, root: Pid) {
        if let Some(collector) = self.collector.as_mut() {
            collector.attach(self.session);
        }
        self.sink = Some(Sink {
            correlator: Correlator::new(
                Target {
                    root_pid: u32::try_from(root.as_raw()).unwrap_or(0),
                    session: self.session,
                },
                self.policy.clone(),
            ),
            denials: Vec::new(),
            live: self.live.take(),
        });
    }
}

/// Runs the prepared command under the denial audit; returns the exit status to use.
///
/// # Errors
/// [`RunError::Setup`] when the report cannot be opened or the sandbox not set up. Audit
/// problems are not errors: they become coverage gaps.
pub fn run_audited(
    prepared: &Prepared,
    options: &command::RunOptions,
    print_report: bool,
    args: &AuditArgs,
) -> Result<u8, RunError> {
    let _ = print_report;
    // The report's file is opened now, by descriptor, before the command can plant anything
    // at its path (crate::audit::output).
    let mut output = match &args.audit {
        Some(path) => Some(crate::audit::output::ReportFile::open(
            path,
            &prepared.policy,
        )?),
        None => None,
    };
    let (collector, blind_reason) = match Collector::open() {
        Ok(collector) => (Some(collector), None),
        Err(reason) => (None, Some(reason)),
    };
    let abi = crate::sys::landlock_abi();
    let mut session = None;
    if collector.is_some() {
        let before = session_of(std::process::id());
        if start_audit_session() {
            session = session_of(std::process::id()).filter(|s| Some(*s) != before);
        }
    }
    let mut options = options.clone();
    options.audit_log = collector.is_some();
    let mut observer = AuditObserver {
        collector,
        session,
        policy: prepared.policy.clone(),
        sink: None,
        live: args.audit_fd.and_then(open_inherited_fd),
    };
    let command = crate::run::command_of(prepared);
    let ended = command::run(&prepared.policy, &command, &options, Some(&mut observer))
        .map_err(crate::run::from_command_error)?;
    let mut sink = observer.sink.take();
    let coverage = match observer.collector.take() {
        Some(mut collector) => {
            if let Some(sink) = sink.as_mut() {
                collector.drain(&mut |record| sink.record(record));
            }
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
    let denials = sink.map(Sink::finish).unwrap_or_default();
    let audit = RunAudit {
        command: prepared
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        exit_status: ended.code(),
        denials,
        coverage,
    };
    eprint!("{}", report::summary(&audit));
    if let Some(output) = output.as_mut() {
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
        if let Err(err) = output.write(text.as_bytes()) {
            eprintln!("sandbox-run: audit: writing the report failed: {err}");
            return Ok(EXIT_SETUP_FAILED);
        }
    }
    let code = exit_code(&audit, args.fail_on_denial);
    if code == own_code(&audit)
        && let Ended::Signaled(signal) = ended
    {
        // Die of the command's signal, as without the audit.
        crate::sys::die_of_signal(signal);
    }
    Ok(code)
}

fn own_code(audit: &RunAudit) -> u8 {
    u8::try_from(audit.exit_status).unwrap_or(EXIT_SETUP_FAILED)
}

/// The exit status: the program's, or 3 (denied) / 4 (blind) under `--fail-on-denial`.
pub fn exit_code(audit: &RunAudit, fail_on_denial: bool) -> u8 {
    let own = own_code(audit);
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
        Ok(file) => {
            // The new descriptor is close-on-exec; the inherited one must not reach the
            // command, which could write forged records into it.
            let _ = nix::unistd::close(fd);
            Some(file)
        }
        Err(err) => {
            eprintln!("sandbox-run: audit: --audit-fd {fd} is not usable: {err}");
            None
        }
    }
}
