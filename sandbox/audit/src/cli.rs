//! The `sandbox-run` audit flags (added to the command line by `src/bin/sandbox-run.rs`).

use std::path::PathBuf;

use crate::report::Format;

/// Exit status of `--fail-on-denial` when something was denied.
pub const EXIT_DENIED: u8 = 3;
/// Exit status of `--fail-on-denial` when the collector could not observe every layer and saw
/// no denial: "no denials" cannot be confirmed, so the run does not pass.
pub const EXIT_AUDIT_BLIND: u8 = 4;

/// Denial audit options.
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "Denial audit")]
pub struct AuditArgs {
    /// Collect every denial of the sandboxed command tree (kernel audit: Landlock, seccomp,
    /// read-only mounts, and EACCES/EPERM no layer logged) and write the report to FILE
    /// (JSON lines are streamed as denials arrive; '-' for stdout, written at exit). A summary
    /// goes to stderr. Needs root (CAP_AUDIT_READ/CONTROL); otherwise says it is blind.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Report format of --audit FILE.
    #[arg(long, value_enum, default_value_t, value_name = "FORMAT")]
    pub audit_format: Format,
    /// The repository root SARIF locations are relative to (default: the command's working
    /// directory, --cwd). A denied path under it is reported as that file; anything else
    /// points at the documented runtime artifact `.execward/sandbox-run`.
    #[arg(long, value_name = "DIR")]
    pub audit_root: Option<PathBuf>,
    /// Also stream each denial as one JSON line to inherited descriptor N while the command
    /// runs (used by exec-server); the descriptor is not passed on to the command.
    #[arg(long, value_name = "N")]
    pub audit_fd: Option<i32>,
    /// Exit 3 when anything was denied (the program's own status otherwise); exit 4 when
    /// nothing was but the report is not complete (a layer unobserved, records lost, or the
    /// command tried to stack its own Landlock domain or seccomp filter, which is itself a
    /// denial and so exits 3), since "no denials" cannot be confirmed then.
    #[arg(long)]
    pub fail_on_denial: bool,
}

impl AuditArgs {
    /// Whether any audit option was given.
    pub fn requested(&self) -> bool {
        self.audit.is_some() || self.audit_fd.is_some() || self.fail_on_denial
    }
}
