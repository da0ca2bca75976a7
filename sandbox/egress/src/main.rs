//! `egress-proxy`: the egress proxy of one sandbox whose network is an allowlist. Started by
//! `sandbox-run` (never by hand): it serves the listening socket `sandbox-run`'s PID 1 made
//! inside the sandbox's network namespace and connects out from the host's. All logic lives in
//! this crate's library.
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

/// Command line (descriptors inherited from `sandbox-run`).
#[derive(Debug, Parser)]
#[command(
    name = "egress-proxy",
    version,
    about = "The egress proxy of one sandbox (started by sandbox-run)"
)]
struct Cli {
    /// The listening socket.
    #[arg(long, value_name = "N")]
    listen_fd: i32,
    /// Where decisions go, one JSON line each.
    #[arg(long, value_name = "N")]
    events_fd: i32,
    /// The configuration (JSON).
    #[arg(long, value_name = "N")]
    config_fd: i32,
    /// The question socket (asking before a refusal is final).
    #[arg(long, value_name = "N")]
    ask_fd: Option<i32>,
    /// Where the inspection CA's certificate goes (`inspect=true`).
    #[arg(long, value_name = "N")]
    ca_fd: Option<i32>,
    /// The pid of the `sandbox-run` that started it.
    #[arg(long, value_name = "PID")]
    parent_pid: u32,
}

#[cfg(target_os = "linux")]
fn main() -> ExitCode {
    let cli = Cli::parse();
    let fds = egress::helper::HelperFds {
        listen: cli.listen_fd,
        events: cli.events_fd,
        config: cli.config_fd,
        ask: cli.ask_fd,
        ca: cli.ca_fd,
        parent: cli.parent_pid,
    };
    match egress::helper::run(fds) {
        Ok(never) => match never {},
        Err(err) => {
            eprintln!("egress-proxy: {err}");
            ExitCode::from(1)
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn main() -> ExitCode {
    let _ = Cli::parse();
    eprintln!("egress-proxy: only Linux sandboxes use the egress proxy");
    ExitCode::from(1)
}
