//! `exec-server`: parse arguments, run the server, map the result to an exit code.

#![deny(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use supervisor::cli::{Cli, Command};
use supervisor::{ExecServerRuntimePaths, ServerOptions, run_main_with_options};

fn main() -> ExitCode {
    supervisor::tune_allocator();
    let mut cli = Cli::try_parse().unwrap_or_else(|error| {
        if let Some(hint) = supervisor::cli::missing_separator_hint(&error) {
            eprint!("{}", error.render());
            eprintln!("{hint}");
            std::process::exit(2);
        }
        error.exit()
    });
    match cli.command.take() {
        Some(Command::Exec(args)) => {
            return match supervisor::exec_cmd::run(args) {
                Ok(status) => ExitCode::from(status),
                Err(error) => {
                    eprintln!("exec-server exec: {error}");
                    ExitCode::from(supervisor::exec_cmd::failure_status(&error))
                }
            };
        }
        Some(Command::Ps(args)) => {
            return match supervisor::ps_cmd::run(&args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("exec-server ps: {error}");
                    ExitCode::FAILURE
                }
            };
        }
        None => {}
    }
    supervisor::cli::init_logging(cli.log_format);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!(
                "exec-server: {}",
                supervisor::cli::describe_error(error.as_ref())
            );
            ExitCode::from(supervisor::cli::server_failure_status(&error))
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime_paths = match &cli.helper_dir {
        Some(dir) => ExecServerRuntimePaths::existing_in_dir(&std::path::absolute(dir)?)?,
        None => ExecServerRuntimePaths::find_for_current_exe()?,
    };
    if !(cli.detached_session_ttl.is_finite() && cli.detached_session_ttl >= 0.0) {
        anyhow::bail!("--detached-session-ttl must be a non-negative number of seconds");
    }
    // Remote mode serves relay streams; a local listener only when asked for.
    let mut options = match (cli.listen, &cli.remote) {
        (Some(url), _) => ServerOptions::new(url, runtime_paths),
        (None, None) => ServerOptions::new(supervisor::DEFAULT_LISTEN_URL, runtime_paths),
        (None, Some(_)) => ServerOptions::without_listener(runtime_paths),
    };
    options.auth_token_file = cli.auth_token_file;
    options.tls = cli.tls_cert.zip(cli.tls_key);
    options.one_shot_helpers = cli.one_shot_helpers;
    options.one_shot_sandbox = cli.one_shot_sandbox;
    options.detached_session_ttl = Duration::from_secs_f64(cli.detached_session_ttl);
    options.use_cgroups = !cli.no_cgroups;
    options.retained_output_bytes = cli.retained_output_bytes;
    options.memory_budget_bytes = cli.memory_budget;
    options.default_limits = cli.default_limits.unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match (cli.remote, cli.environment_id) {
        (Some(registry_url), Some(environment_id)) => {
            let mut config = supervisor::relay::RemoteEnvironmentConfig::from_token_source(
                registry_url,
                environment_id,
                cli.name,
                cli.token_file.as_deref(),
            )?;
            // Sandboxed commands must never read the executor's key or credential.
            options.protected_files.extend(
                cli.identity_file
                    .iter()
                    .chain(cli.token_file.iter())
                    .cloned(),
            );
            config.identity_file = cli.identity_file;
            config.ca_file = cli.ca_file;
            config.ciphers = cli.relay_ciphers;
            runtime.block_on(supervisor::relay::run_main_remote(options, config))?;
        }
        _ => runtime.block_on(run_main_with_options(options))?,
    }
    Ok(())
}
