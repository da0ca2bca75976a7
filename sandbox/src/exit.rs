//! What every stage of a run shares about how it ends: `sandbox-run`'s exit statuses and the
//! error that stops it before the program runs. A leaf: it imports nothing of the crate, so the
//! stages that produce these (the process chain in `linux`, the audit, `run`) import it
//! downward and never each other for them.

/// Exit status for a setup failure.
pub const EXIT_SETUP_FAILED: u8 = 125;
/// Exit status when the program exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit status when the program is not found.
pub const EXIT_NOT_FOUND: u8 = 127;

/// Why `sandbox-run` stopped before the program ran.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Policy or sandbox setup failed (exit 125).
    #[error("{0}")]
    Setup(String),
    /// `execve` failed (exit 126 or 127).
    #[error("cannot execute {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl RunError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Setup(_) => EXIT_SETUP_FAILED,
            RunError::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            RunError::Exec { .. } => EXIT_CANNOT_EXECUTE,
        }
    }
}
