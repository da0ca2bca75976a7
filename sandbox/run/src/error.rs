//! Why `sandbox-run` stopped before the program ran: one error aggregating each stage's own
//! (resolution, options, the report file, the sandbox's setup), and the exit status for each.

use crate::option_error::OptionError;
use crate::resolve::ResolveError;
use sandbox::exit::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};
#[cfg(target_os = "linux")]
use sandbox::linux::command::CommandError;

/// Why `sandbox-run` stopped before the program ran.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The command line's policy, directories or allowances could not be resolved (exit 125).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The sandbox could not be set up or the command not started (exit 125; a failed
    /// `execve` is [`RunError::Exec`]).
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Command(CommandError),
    /// A command-line option `sandbox-run` cannot honour (exit 125).
    #[error(transparent)]
    Option(#[from] OptionError),
    /// The audit report (or `--egress-log`) file could not be opened (exit 125).
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Report(#[from] sandbox::report_file::ReportFileError),
    /// `execve` failed (exit 126 or 127).
    #[error("cannot execute {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

#[cfg(target_os = "linux")]
impl From<CommandError> for RunError {
    /// A failed `execve` is [`RunError::Exec`] (exit 126/127), anything else
    /// [`RunError::Command`].
    fn from(err: CommandError) -> Self {
        match err {
            CommandError::Exec { program, source } => RunError::Exec { program, source },
            other => RunError::Command(other),
        }
    }
}

#[cfg(target_os = "linux")]
impl From<audit::supervise::AuditError> for RunError {
    fn from(err: audit::supervise::AuditError) -> Self {
        match err {
            audit::supervise::AuditError::Report(err) => Self::Report(err),
            audit::supervise::AuditError::Command(err) => Self::from(err),
        }
    }
}

impl RunError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Resolve(_) | RunError::Option(_) => EXIT_SETUP_FAILED,
            #[cfg(target_os = "linux")]
            RunError::Command(_) | RunError::Report(_) => EXIT_SETUP_FAILED,
            RunError::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            RunError::Exec { .. } => EXIT_CANNOT_EXECUTE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn each_stage_keeps_its_message_and_setup_exit_status() {
        let missing = RunError::from(ResolveError::MissingDirectory {
            flag: "--writable-root",
            path: PathBuf::from("/nonexistent/w"),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        });
        assert_eq!(missing.exit_code(), EXIT_SETUP_FAILED);
        assert!(
            missing.to_string().starts_with(
                "--writable-root /nonexistent/w does not exist (No such file or directory"
            ),
            "{missing}"
        );
        let option = RunError::from(OptionError::NoProgram);
        assert_eq!(option.exit_code(), EXIT_SETUP_FAILED);
        assert_eq!(option.to_string(), "no program given");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_exec_keeps_126_and_127_and_other_command_errors_125() {
        let exec = |errno| {
            RunError::from(CommandError::Exec {
                program: "p".to_owned(),
                source: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert_eq!(exec(libc::ENOENT).exit_code(), EXIT_NOT_FOUND);
        assert_eq!(exec(libc::EACCES).exit_code(), EXIT_CANNOT_EXECUTE);
        let plumbing = RunError::from(CommandError::Plumbing {
            what: "fork",
            source: std::io::Error::from_raw_os_error(libc::EAGAIN),
        });
        assert!(matches!(plumbing, RunError::Command(_)));
        assert_eq!(plumbing.exit_code(), EXIT_SETUP_FAILED);
        assert!(
            plumbing.to_string().starts_with("fork failed: "),
            "{plumbing}"
        );
    }
}
