//! `exec-guardian`: kills the server's process trees when the server dies.
//!
//! `exec-server` starts this helper with a socket as stdin and tells it the cgroups it creates
//! (and, without cgroups, the pidfds of the process groups it starts). When the socket reaches
//! end of file (the server exited, crashed or was SIGKILLed), every tree gets SIGKILL through
//! its cgroup or pidfd and the server's cgroups are removed; the protocol is described in
//! `supervisor::guardian`. Terminal signals are ignored so that Ctrl-C reaches the
//! server, which shuts down in order first.

#![deny(unsafe_code)]

use clap::Parser;

/// Internal helper of exec-server; not a command to run by hand.
///
/// exec-server starts it with a socket on stdin and tells it the cgroups (or process groups) it
/// creates. When the socket ends (exec-server exited, crashed or was killed), exec-guardian
/// sends SIGKILL to every tree still registered, so no child outlives the server. It must sit
/// next to exec-server (or in its --helper-dir, or PREFIX/libexec/execward when installed).
#[derive(Debug, Parser)]
#[command(name = "exec-guardian", version, about, long_about)]
struct Cli {}

fn main() {
    let Cli {} = Cli::parse();
    supervisor::guardian::ignore_terminal_signals();
    supervisor::guardian::serve(&std::io::stdin());
}
