//! `sandbox-run --audit`: the outer `sandbox-run` (which stays in the host's namespaces,
//! unconfined, and runs no code of the command) collects the kernel's audit records of the
//! sandbox while it runs:
//!
//! 1. the collector opens (before any process of the sandbox exists) and the outer starts a
//!    fresh audit session for itself, which the sandbox inherits;
//! 2. once PID 1 of the sandbox exists (and waits for its go), the collector installs the rules
//!    keyed on that session and the correlator learns PID 1's pid (the Landlock domain's
//!    creator); then PID 1 confines itself with audit logging on and starts the command;
//! 3. records are read while the command runs ([`sandbox::linux::command::Observer`]);
//! 4. after the command ended, the collector drains, restores the audit state, and the report is
//!    written through the descriptor opened before the command started.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use nix::unistd::Pid;

use crate::cli::{AuditArgs, EXIT_AUDIT_BLIND, EXIT_DENIED};
use crate::collect::{Collector, session_of, start_audit_session};
use crate::correlate::{Evasion, Target};
use crate::pipeline::{Findings, Pipeline, Stream};
use crate::report::{self, Format, RunAudit};
use crate::sarif::sarif;
use sandbox::denial::{Coverage, Denial};
use sandbox::exit::code::EXIT_SETUP_FAILED;
use sandbox::linux::command::{self, Command, CommandError, Ended, Observer};
use sandbox::policy::ResolvedPolicy;
use sandbox::report_file::{ReportFile, ReportFileError};

/// Why an audited run stopped before its command ran. Audit problems themselves are not
/// errors: they become coverage gaps of the report.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The report file could not be opened.
    #[error(transparent)]
    Report(#[from] ReportFileError),
    /// The sandbox could not be set up or the command not started.
    #[error(transparent)]
    Command(#[from] CommandError),
}

/// Landlock ABI that has `LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`.
const LANDLOCK_AUDIT_ABI: i32 = 7;

/// The collector and the pipeline, fed by the outer's wait loop.
struct AuditObserver {
    collector: Option<Collector>,
    session: Option<u32>,
    policy: ResolvedPolicy,
    /// `sandbox-run --deny` paths, absolute (for the advice).
    cli_denied: Vec<PathBuf>,
    pipeline: Option<Pipeline>,
    /// The streams, until the pipeline exists.
    streams: Vec<Stream>,
    /// What the outer could not observe completely (coverage gaps).
    gaps: Vec<String>,
    /// Print a live line on stderr per new group (`--audit FILE` given).
    live_lines: bool,
}

impl Observer for AuditObserver {
    fn poll_fd(&self) -> Option<BorrowedFd<'_>> {
        self.collector.as_ref().map(Collector::poll_fd)
    }

    fn readable(&mut self) {
        if let (Some(collector), Some(pipeline)) = (self.collector.as_mut(), self.pipeline.as_mut())
        {
            collector.read_available(&mut |record| pipeline.record(record));
        }
    }

    fn denial(&mut self, denial: Denial) {
        // Only the command causes denials, and it runs only after `started` made the pipeline.
        if let Some(pipeline) = self.pipeline.as_mut() {
            pipeline.denial(denial);
        }
    }

    fn gap(&mut self, gap: String) {
        self.gaps.push(gap);
    }

    fn started(&mut self, root: Pid) {
        if let Some(collector) = self.collector.as_mut() {
            collector.attach(self.session);
        }
        let root_pid = u32::try_from(root.as_raw()).unwrap_or(0);
        // The collector is in the session too; so is PID 1, which runs only sandbox-run's code
        // (without namespaces the root is the command itself).
        let mut own_pids = vec![std::process::id()];
        if in_another_pid_namespace(root_pid) {
            own_pids.push(root_pid);
        }
        self.pipeline = Some(
            Pipeline::new(
                Target {
                    root_pid,
                    session: self.session,
                    own_pids,
                },
                self.policy.clone(),
                std::mem::take(&mut self.streams),
            )
            .with_cli_denied(std::mem::take(&mut self.cli_denied)),
        );
        // A person reads `--audit FILE` runs: one line per new kind of denial as it happens.
        // exec-server (`--audit-fd` only) gets every denial as `process/denied` already.
        if self.live_lines
            && let Some(pipeline) = self.pipeline.take()
        {
            self.pipeline = Some(pipeline.with_live_lines(Box::new(std::io::stderr())));
        }
    }
}

/// `paths` as the policy holds them: relative to the current directory, symlinks resolved
/// (as far as they exist).
fn absolute_paths(paths: &[PathBuf]) -> Vec<PathBuf> {
    let current = std::env::current_dir().unwrap_or_default();
    paths
        .iter()
        .map(|path| {
            let joined = current.join(path);
            std::fs::canonicalize(&joined).unwrap_or(joined)
        })
        .collect()
}

/// The directory SARIF locations are relative to: `--audit-root`, else the command's working
/// directory; relative to the current directory and with symlinks resolved, as the kernel
/// reports denied paths.
fn audit_root(args: &AuditArgs, cwd: &std::path::Path) -> PathBuf {
    let chosen = args.audit_root.as_deref().unwrap_or(cwd);
    absolute_paths(&[chosen.to_owned()])
        .pop()
        .unwrap_or_else(|| chosen.to_owned())
}

/// Whether `pid` lives in a PID namespace other than ours (PID 1 of the sandbox does).
fn in_another_pid_namespace(pid: u32) -> bool {
    let ours = std::fs::read_link("/proc/self/ns/pid");
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/pid"));
    matches!((ours, theirs), (Ok(ours), Ok(theirs)) if ours != theirs)
}

/// Runs `command` in its sandbox under the denial audit; returns the exit status to use.
/// `cli_denied` are the `--deny` paths of the command line (the advice for a path they hide is
/// to drop the flag, not "the supervisor's own file").
///
/// # Errors
/// [`AuditError`] when the report cannot be opened or the sandbox not set up. Audit problems
/// are not errors: they become coverage gaps.
pub fn run_audited(
    policy: &ResolvedPolicy,
    command: &Command,
    options: &command::RunOptions,
    args: &AuditArgs,
    cli_denied: &[PathBuf],
) -> Result<u8, AuditError> {
    // The report's file is opened now, by descriptor, before the command can plant anything
    // at its path (sandbox::report_file).
    let output = match &args.audit {
        Some(path) => Some(ReportFile::open(path, "audit report", policy)?),
        None => None,
    };
    // JSON lines to a file are streamed as they arrive; stdout is the command's too, so the
    // report goes there (like SARIF and GitHub annotations) only once the command has ended.
    let mut streams = Vec::new();
    let (report_stream, mut final_output) = match (args.audit_format, output) {
        (Format::Jsonl, Some(ReportFile::File(file))) => {
            streams.push(Stream::new(Box::new(file)));
            (Some(0), None)
        }
        (_, output) => (None, output),
    };
    streams.extend(
        args.audit_fd
            .and_then(open_inherited_fd)
            .map(|file| Stream::new(Box::new(file))),
    );
    let (collector, blind_reason) = match Collector::open() {
        Ok(collector) => (Some(collector), None),
        Err(error) => (None, Some(error.to_string())),
    };
    let abi = sandbox::linux::landlock::running_abi();
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
        policy: policy.clone(),
        cli_denied: absolute_paths(cli_denied),
        pipeline: None,
        streams,
        gaps: Vec::new(),
        live_lines: args.audit.is_some(),
    };
    let ended = command::run(policy, command, &options, Some(&mut observer))?;
    let mut pipeline = observer.pipeline.take();
    let mut coverage = match observer.collector.take() {
        Some(mut collector) => {
            if let Some(pipeline) = pipeline.as_mut() {
                collector.drain(&mut |record| pipeline.record(record));
            }
            let mount = session.is_some();
            let mut coverage = collector.close(abi >= LANDLOCK_AUDIT_ABI, true, mount);
            if abi < LANDLOCK_AUDIT_ABI {
                coverage.gaps.push(format!(
                    "Landlock ABI {abi} cannot log denials after execve (needs ABI \
                     {LANDLOCK_AUDIT_ABI}); its refusals show as unexplained EACCES"
                ));
            }
            coverage
        }
        None => Coverage::blind(format!(
            "audit collection is not possible here: {}",
            blind_reason.unwrap_or_default()
        )),
    };
    let Findings {
        aggregate,
        evasion,
        mut streams,
    } = match pipeline {
        Some(pipeline) => pipeline.finish(),
        None => Findings {
            aggregate: Default::default(),
            evasion: Evasion::default(),
            streams: std::mem::take(&mut observer.streams),
        },
    };
    if !observer.gaps.is_empty() {
        coverage.complete = false;
        coverage.gaps.append(&mut observer.gaps);
    }
    if !evasion.is_empty() {
        coverage.complete = false;
        coverage.gaps.extend(evasion.gaps());
    }
    let audit = RunAudit {
        command: command
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        root: audit_root(args, &command.cwd),
        exit_status: ended.code(),
        aggregate,
        coverage,
    };
    eprint!("{}", report::summary(&audit));
    let closing = report::closing_lines(&audit);
    for stream in &mut streams {
        stream.write(closing.as_bytes());
    }
    let mut failed = report_stream
        .and_then(|at| streams.get(at))
        .and_then(Stream::error)
        .map(ToString::to_string);
    if let Some(output) = final_output.as_mut() {
        let text = match args.audit_format {
            Format::Jsonl => report::jsonl(&audit),
            Format::Sarif => {
                let mut text = serde_json::to_string_pretty(&sarif(&audit, args.fail_on_denial))
                    .unwrap_or_default();
                text.push('\n');
                text
            }
            Format::Github => report::github(&audit, args.fail_on_denial),
            Format::Markdown => report::markdown(&audit, args.fail_on_denial),
        };
        if let Err(err) = output.write(text.as_bytes()) {
            failed = Some(err.to_string());
        }
    }
    if let Some(err) = failed {
        eprintln!("sandbox-run: audit: writing the report failed: {err}");
        return Ok(EXIT_SETUP_FAILED);
    }
    let code = exit_code(&audit, args.fail_on_denial);
    if code == own_code(&audit)
        && let Ended::Signaled(signal) = ended
    {
        // Die of the command's signal, as without the audit.
        sandbox::sys_die_of_signal(signal);
    }
    Ok(code)
}

fn own_code(audit: &RunAudit) -> u8 {
    u8::try_from(audit.exit_status).unwrap_or(EXIT_SETUP_FAILED)
}

/// The exit status: the program's, or under `--fail-on-denial` 3 when something was denied and
/// 4 when nothing was but the audit could not see everything (blind, a layer unobserved, or
/// incomplete: records lost, or the command tried to hide its denials).
pub fn exit_code(audit: &RunAudit, fail_on_denial: bool) -> u8 {
    let own = own_code(audit);
    if !fail_on_denial {
        return own;
    }
    if audit.aggregate.total() > 0 {
        EXIT_DENIED
    } else if !audit.coverage.is_full() {
        EXIT_AUDIT_BLIND
    } else {
        own
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregate;
    use sandbox::denial::{Denial, Layer};

    #[test]
    fn the_audit_root_is_the_flag_else_the_working_directory_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("repo");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        let cwd = std::path::Path::new("/");
        let flag = AuditArgs {
            audit_root: Some(link.clone()),
            ..AuditArgs::default()
        };
        assert_eq!(audit_root(&flag, cwd), real);
        assert_eq!(audit_root(&AuditArgs::default(), &link), real);
    }

    fn audit(denials: usize, coverage: Coverage) -> RunAudit {
        let mut aggregate = Aggregate::new();
        for _ in 0..denials {
            aggregate.add(
                Denial {
                    time: String::new(),
                    pid: None,
                    exe: None,
                    layer: Layer::Seccomp,
                    operation: "socket".to_owned(),
                    path: None,
                    address: None,
                    syscall: None,
                    errno: None,
                    allow_rule: String::new(),
                },
                |_| String::new(),
            );
        }
        RunAudit {
            command: Vec::new(),
            root: PathBuf::from("/repo"),
            exit_status: 7,
            aggregate,
            coverage,
        }
    }

    fn full() -> Coverage {
        Coverage {
            audit: true,
            landlock: true,
            seccomp: true,
            mount: true,
            unexplained: true,
            complete: true,
            gaps: Vec::new(),
        }
    }

    #[test]
    fn fail_on_denial_fails_on_denials_and_on_incomplete_coverage() {
        assert_eq!(exit_code(&audit(0, full()), true), 7);
        assert_eq!(exit_code(&audit(0, full()), false), 7);
        assert_eq!(exit_code(&audit(2, full()), true), EXIT_DENIED);
        assert_eq!(exit_code(&audit(2, full()), false), 7);
        let incomplete = Coverage {
            complete: false,
            ..full()
        };
        assert_eq!(
            exit_code(&audit(0, incomplete.clone()), true),
            EXIT_AUDIT_BLIND
        );
        assert_eq!(exit_code(&audit(1, incomplete), true), EXIT_DENIED);
        let blind = Coverage::blind("no CAP_AUDIT_READ");
        assert_eq!(exit_code(&audit(0, blind), true), EXIT_AUDIT_BLIND);
    }
}
