//! `sandbox-run`'s exit statuses for a run that ended before its program did. A leaf: it imports
//! nothing, so the process chain in `linux` takes them from here while `sandbox_run::RunError`
//! aggregates that chain's errors.

/// Exit status for a setup failure.
pub const EXIT_SETUP_FAILED: u8 = 125;
/// Exit status when the program exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit status when the program is not found.
pub const EXIT_NOT_FOUND: u8 = 127;
