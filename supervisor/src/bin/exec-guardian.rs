//! `exec-guardian`: kills the server's process groups when the server dies.
//!
//! `exec-server` starts this helper with a pipe as stdin and writes one record per process
//! group it creates (`+` or `-`, then the pgid as 4 little-endian bytes). When stdin reaches end
//! of file (the server exited, crashed or was SIGKILLed), every registered group gets SIGKILL.
//! Unlike PR_SET_PDEATHSIG, this reaches the whole group, grandchildren included. Terminal
//! signals are ignored so that Ctrl-C reaches the server, which shuts down in order first.

use std::collections::HashSet;
use std::io::Read;

use clap::Parser;
use nix::sys::signal::{SigHandler, Signal, killpg, signal};
use nix::unistd::Pid;

/// Internal helper of exec-server; not a command to run by hand.
///
/// exec-server starts it with a pipe on stdin and writes one record per process group it
/// creates. When the pipe ends (exec-server exited, crashed or was killed), exec-guardian
/// sends SIGKILL to every group still registered, so no child outlives the server. It must sit
/// next to exec-server (or in its --helper-dir, or PREFIX/libexec/execward when installed).
#[derive(Debug, Parser)]
#[command(name = "exec-guardian", version, about, long_about)]
struct Cli {}

fn main() {
    let Cli {} = Cli::parse();
    for terminal_signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        // SAFETY: SIG_IGN installs no handler code; nothing else runs in this process yet.
        let _ = unsafe { signal(terminal_signal, SigHandler::SigIgn) };
    }
    let mut groups = HashSet::new();
    let mut stdin = std::io::stdin().lock();
    let mut record = [0u8; 5];
    while stdin.read_exact(&mut record).is_ok() {
        let pgid = i32::from_le_bytes([record[1], record[2], record[3], record[4]]);
        match record[0] {
            b'+' if pgid > 1 => {
                groups.insert(pgid);
            }
            b'-' => {
                groups.remove(&pgid);
            }
            _ => {}
        }
    }
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}
