//! `fs-helper`: run filesystem operations under a sandbox policy. See the crate README and
//! `fs_helper::helper` for the contract.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Sandboxed filesystem operations for execward (an internal helper of exec-server, which runs
/// it; usable by hand for testing a policy).
///
/// One-shot (default): read one JSON request `{"operation": "fs/readFile", "params": {...},
/// "sandbox": {...}}` on stdin, apply the sandbox to this process, perform the operation, write
/// `{"status": "ok", "payload": ...}` or `{"status": "error", "payload": {code, message, data}}`
/// on stdout, exit 0. Exits 125 with the reason on stderr only when it cannot set itself up.
///
/// Serve (--serve --sandbox JSON): apply one policy once, then answer length-prefixed requests
/// (4-byte big-endian length + JSON) on stdin/stdout until EOF.
///
/// Internal (exec-server): --serve --policy-frame reads the policy exec-server already resolved
/// as the first frame instead, and resolves nothing itself.
#[derive(Debug, Parser)]
#[command(name = "fs-helper", version, about, long_about)]
struct Cli {
    /// Serve framed requests under one policy until EOF.
    #[arg(long)]
    serve: bool,
    /// The wire sandbox object (JSON) to serve under.
    #[arg(long, value_name = "JSON", conflicts_with = "policy_frame")]
    sandbox: Option<String>,
    /// Internal: the first frame is the resolved policy to serve under.
    #[arg(long, hide = true, requires = "serve")]
    policy_frame: bool,
    /// Extra path to deny (masked) in addition to the policy; repeatable.
    #[arg(long = "deny", value_name = "PATH")]
    denies: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match (cli.serve, &cli.sandbox, cli.policy_frame) {
        (true, _, true) => fs_helper::helper::run_serve_resolved(),
        (true, Some(sandbox), false) => fs_helper::helper::run_serve(sandbox, &cli.denies),
        (true, None, false) => Err(fs_helper::helper::SetupError::ServeWithoutSandbox),
        (false, ..) => fs_helper::helper::run_one_shot(&cli.denies),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fs-helper: {error}");
            ExitCode::from(fs_helper::helper::EXIT_SETUP_FAILED)
        }
    }
}
