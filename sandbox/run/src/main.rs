//! `sandbox-run`: run a command in a sandbox of its own. All logic lives in this crate's
//! library, `sandbox::linux::command` (and the `audit` crate for the denial audit flags); this
//! parses the command line and turns the outcome into an exit status (or the command's fatal
//! signal).
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::FromArgMatches;
use sandbox_run::Cli;

fn main() -> ExitCode {
    let matches = sandbox_run::command()
        .try_get_matches()
        .unwrap_or_else(|error| {
            use clap::error::{ContextKind, ContextValue, ErrorKind};
            if error.kind() == ErrorKind::UnknownArgument
                && let Some(ContextValue::String(argument)) = error.get(ContextKind::InvalidArg)
                && !argument.starts_with('-')
            {
                eprint!("{}", error.render());
                eprintln!(
                    "hint: the command goes after `--`, e.g. `sandbox-run --policy read-only -- {argument} ...`"
                );
                std::process::exit(2);
            }
            error.exit()
        });
    let parsed = Cli::from_arg_matches(&matches)
        .and_then(|cli| Ok((cli, audit_flags::AuditArgs::from_arg_matches(&matches)?)));
    let (cli, audit) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => err.exit(),
    };
    if cli.list_profiles {
        print!("{}", sandbox_run::list_profiles());
        return ExitCode::SUCCESS;
    }
    run(&cli, &audit)
}

#[cfg(target_os = "linux")]
fn run(cli: &Cli, audit: &audit_flags::AuditArgs) -> ExitCode {
    use sandbox::linux::command::Ended;
    let fail = |err: sandbox_run::RunError| {
        eprintln!("sandbox-run: {err}");
        ExitCode::from(err.exit_code())
    };
    // First of all: nothing inherited reaches the sandbox but stdio and the descriptors
    // handed over on purpose.
    let mut keep = vec![0, 1, 2];
    keep.extend(cli.launch_fd);
    keep.extend(audit.audit_fd);
    keep.extend(cli.ask_fd);
    if let Err(source) = sandbox::linux::hygiene::close_inherited_fds(&keep) {
        eprintln!("sandbox-run: closing inherited file descriptors failed: {source}");
        return ExitCode::from(sandbox_run::EXIT_SETUP_FAILED);
    }
    if cli.launcher {
        // The server hands the launcher its socket as stdin.
        use std::os::fd::AsFd;
        let stdin = std::io::stdin();
        return match sandbox::linux::launcher::serve(stdin.as_fd()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("sandbox-run: {err}");
                ExitCode::from(sandbox_run::EXIT_SETUP_FAILED)
            }
        };
    }
    if audit.requested() && !cli.explain {
        let prepared = match sandbox_run::prepare(cli) {
            Ok(prepared) => prepared,
            Err(err) => return fail(err),
        };
        let options = match sandbox_run::run_options(cli, &prepared, true, Vec::new()) {
            Ok(options) => options,
            Err(err) => return fail(err),
        };
        let audited = audit::supervise::run_audited(
            &prepared.policy,
            &sandbox_run::command_of(&prepared),
            &options,
            audit,
            &cli.denies,
        );
        return match audited {
            Ok(code) => ExitCode::from(code),
            Err(err) => fail(err.into()),
        };
    }
    match sandbox_run::run(cli) {
        Ok(Ended::Exited(code)) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
        Ok(Ended::Signaled(signal)) => {
            // Die of the same signal, so whoever waits for us sees what killed the command.
            sandbox::sys_die_of_signal(signal);
            ExitCode::from(u8::try_from(128 + signal).unwrap_or(255))
        }
        Err(err) => fail(err),
    }
}

#[cfg(not(target_os = "linux"))]
fn run(cli: &Cli, _audit: &audit_flags::AuditArgs) -> ExitCode {
    match sandbox_run::run(cli) {
        Ok(never) => match never {},
        Err(err) => {
            eprintln!("sandbox-run: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

#[cfg(target_os = "linux")]
mod audit_flags {
    pub use audit::cli::AuditArgs;
}

#[cfg(not(target_os = "linux"))]
mod audit_flags {
    /// No denial audit outside Linux.
    #[derive(Debug, clap::Args)]
    pub struct AuditArgs {}
}
