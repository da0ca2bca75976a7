//! What every stage of a run shares about how it ends: `sandbox-run`'s exit statuses (in
//! [`code`], a leaf the process chain in `linux` imports) and the error that stops it before the
//! program runs, which aggregates each stage's own error.

pub mod code;

pub use code::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};

#[cfg(target_os = "linux")]
use crate::linux::command::CommandError;
use crate::run::option_error::OptionError;
use crate::run::resolve::ResolveError;

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
    Report(#[from] crate::report_file::ReportFileError),
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
