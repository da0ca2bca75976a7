//! The `exec-server` command line.

use std::path::PathBuf;

use clap::Parser;

use crate::listen::DEFAULT_LISTEN_URL;

/// execward exec-server: run and drive processes and files for a client over JSON-RPC.
///
/// The server prints the URL it listens on as the first line of stdout, then serves websocket
/// clients until SIGINT or SIGTERM, when it terminates every child (SIGTERM, then SIGKILL after
/// a grace period) and exits 0. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
/// The protocol is described in docs/protocol.md.
#[derive(Debug, Parser)]
#[command(name = "exec-server", version, about, long_about)]
pub struct Cli {
    /// Where to listen: ws://IP:PORT (port 0 picks a free port) or unix:/absolute/path.sock
    /// (created with mode 0600). A non-loopback address requires --auth-token-file.
    #[arg(long, value_name = "URL", default_value = DEFAULT_LISTEN_URL)]
    pub listen: String,

    /// Require `Authorization: Bearer <token>` on every websocket upgrade; the token is the
    /// file's content with surrounding whitespace removed.
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// Directory holding the helper binaries (fs-helper, sandbox-run); defaults to the
    /// directory of this executable. Never searched through $PATH.
    #[arg(long, value_name = "DIR")]
    pub helper_dir: Option<PathBuf>,

    /// Start a fresh fs-helper process for every sandboxed filesystem request instead of
    /// reusing pooled helpers (slower; for comparison and for the paranoid).
    #[arg(long)]
    pub one_shot_helpers: bool,

    /// Seconds a detached session (its connection lost) keeps its processes for a resume.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::limits::DETACHED_SESSION_TTL.as_secs_f64())]
    pub detached_session_ttl: f64,

    /// Remote mode: register with the registry at this URL (http://HOST:PORT) and serve harness
    /// streams through the rendezvous it names, beside the local listener. The bearer token is
    /// read from $EXECWARD_REGISTRY_TOKEN. See docs/remote.md.
    #[arg(long, value_name = "URL", requires = "environment_id")]
    pub remote: Option<String>,

    /// Remote mode: the environment id harnesses connect to (A-Z a-z 0-9 . _ -).
    #[arg(long, value_name = "ID", requires = "remote")]
    pub environment_id: Option<String>,

    /// Remote mode: display name registered with the environment (default: the id).
    #[arg(long, value_name = "NAME", requires = "remote")]
    pub name: Option<String>,
}
