//! `sandbox-run`: apply an execward sandbox policy to this process, then exec a command.
//! All logic lives in `sandbox::run`; this maps its result to an exit status.

use std::process::ExitCode;

use clap::Parser;
use sandbox::run::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(never) => match never {},
        Err(err) => {
            eprintln!("sandbox-run: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
