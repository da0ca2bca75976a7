//! `sandbox-run`: apply an execward sandbox policy to this process, then exec a command.
//! All logic lives in `sandbox::run` (and `sandbox::audit` for the denial audit flags); this
//! parses the command line and maps the result to an exit status.

use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches};
use sandbox::run::{Cli, run};

fn main() -> ExitCode {
    let matches = audit_flags::AuditArgs::augment_args(Cli::command()).get_matches();
    let parsed = Cli::from_arg_matches(&matches)
        .and_then(|cli| Ok((cli, audit_flags::AuditArgs::from_arg_matches(&matches)?)));
    let (cli, audit) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => err.exit(),
    };
    #[cfg(target_os = "linux")]
    if audit.requested() && !cli.explain {
        return match sandbox::audit::supervise::run_cli_audited(&cli, &audit) {
            Ok(code) => ExitCode::from(code),
            Err(err) => {
                eprintln!("sandbox-run: {err}");
                ExitCode::from(err.exit_code())
            }
        };
    }
    let _ = &audit;
    match run(&cli) {
        Ok(never) => match never {},
        Err(err) => {
            eprintln!("sandbox-run: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

#[cfg(target_os = "linux")]
mod audit_flags {
    pub use sandbox::audit::cli::AuditArgs;
}

#[cfg(not(target_os = "linux"))]
mod audit_flags {
    /// No denial audit outside Linux.
    #[derive(Debug, clap::Args)]
    pub struct AuditArgs {}
}
