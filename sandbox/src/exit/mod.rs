//! How a sandboxed run ends before its program does: `sandbox-run`'s exit statuses (in
//! [`code`], a leaf the process chain in `linux` imports). The error that aggregates each
//! stage's own error is `sandbox-run`'s (`sandbox_run::RunError`).

pub mod code;

pub use code::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED};
