//! The `exec-server` command line.

use std::path::PathBuf;

use clap::Parser;

/// execward exec-server: run and drive processes and files for a client over JSON-RPC.
///
/// The server prints the URL it listens on as the first line of stdout, then serves websocket
/// clients until SIGINT or SIGTERM, when it terminates every child (SIGTERM, then SIGKILL after
/// a grace period) and exits 0. Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
/// The protocol is described in docs/protocol.md.
///
/// `exec-server exec --connect URL -- PROGRAM [ARGS...]` (or `--remote REGISTRY_URL
/// --environment-id ID` through a rendezvous) is a client instead: it runs one command on a
/// server (see `exec-server exec --help`).
///
/// Exit status: 0 after a clean shutdown; 2 when the command line or a file it names is wrong
/// (bad URL, token file, helper directory, limits); 1 when the server failed while running
/// (the OS refused the bind, e.g. address in use).
#[derive(Debug, Parser)]
#[command(name = "exec-server", version, about, long_about)]
pub struct Cli {
    /// A client subcommand; without one, exec-server serves.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Where to listen: ws://IP:PORT (port 0 picks a free port), wss://IP:PORT (TLS, with
    /// --tls-cert and --tls-key) or unix:/absolute/path.sock (created with mode 0600). Default:
    /// ws://127.0.0.1:0; with --remote, no local listener unless this is given. A non-loopback
    /// address must be wss:// and requires --auth-token-file.
    ///
    /// Who may connect: a holder of the bearer token (--auth-token-file), or, without the token,
    /// the server's own user and root, as the kernel names the owner of the peer's socket
    /// (SO_PEERCRED on the unix socket, sock_diag on loopback TCP; where sock_diag is
    /// unavailable, every loopback TCP peer needs the token). Any other local user, and every
    /// peer on the network, needs the token.
    #[arg(long, value_name = "URL")]
    pub listen: Option<String>,

    /// Admit `Authorization: Bearer <token>` holders on every websocket upgrade; the token is
    /// the file's content with surrounding whitespace removed. Without the token, only the
    /// server's own user and root are admitted (the owner of a unix-socket or loopback peer's
    /// socket, as the kernel reports it); every other peer needs the token.
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// PEM certificate chain a wss:// listener serves (with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Directory holding the helper binaries (fs-helper, sandbox-run); defaults to the
    /// directory of this executable. Never searched through $PATH.
    #[arg(long, value_name = "DIR")]
    pub helper_dir: Option<PathBuf>,

    /// Start a fresh fs-helper process for every sandboxed filesystem request instead of
    /// reusing pooled helpers (slower; for comparison and for the paranoid).
    #[arg(long)]
    pub one_shot_helpers: bool,

    /// Start every sandboxed command with a sandbox-run of its own (new namespaces, mount
    /// layout, Landlock and seccomp each time) instead of through the session's pre-confined
    /// launcher for its policy (slower; for comparison, and for hosts where a long-lived
    /// launcher is unwanted). Terminal, audited and network-allowlist starts always use it.
    #[arg(long)]
    pub one_shot_sandbox: bool,

    /// Limits of every process/start that does not set its own, as comma-separated NAME=VALUE
    /// items: memoryBytes, processes, cpuSeconds, wallSeconds, fileSizeBytes, openFiles,
    /// inotifyInstances, inotifyWatches, pendingSignals, messageQueueBytes, ptys (byte sizes may
    /// end in K, M or G), and optionally bestEffort. The server refuses to start when
    /// one cannot be enforced here (unless bestEffort). Example:
    /// memoryBytes=4G,processes=1024,wallSeconds=3600
    #[arg(long, value_name = "LIST", value_parser = crate::containment::plan::parse_default_limits)]
    pub default_limits: Option<proto::methods::process::Limits>,

    /// Do not use cgroups: track process trees by process group (the server becomes a child
    /// subreaper) and enforce limits with rlimits only, as on a host without cgroup access. For
    /// comparison and for hosts where creating cgroups is unwanted.
    #[arg(long)]
    pub no_cgroups: bool,

    /// Bytes of process output all sessions retain together for `process/read` (bytes, or with
    /// K, M or G; each chunk also costs RETAINED_CHUNK_OVERHEAD_BYTES). At the cap the oldest
    /// output of the session retaining the most is dropped (readers see `outputDropped`); no
    /// process is stopped.
    #[arg(long, value_name = "BYTES", value_parser = crate::process::retention::parse_retained_output_bytes, default_value = crate::process::retention::DEFAULT_RETAINED_OUTPUT_BYTES)]
    pub retained_output_bytes: usize,

    /// Bytes of requests, their answers and unfinished websocket messages all connections may
    /// hold beyond each connection's own CONNECTION_MEMORY_ALLOWANCE (bytes, or with K, M or G).
    /// Past it, large requests are refused with a retryable limitExceeded and an unfinished
    /// message that does not fit closes its connection (1013); small requests are still served.
    #[arg(long, value_name = "BYTES", value_parser = crate::limits::parse_memory_budget, default_value = crate::limits::DEFAULT_MEMORY_BUDGET)]
    pub memory_budget: usize,

    /// Seconds a detached session (its connection lost) keeps its processes for a resume.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::limits::DETACHED_SESSION_TTL.as_secs_f64())]
    pub detached_session_ttl: f64,

    /// Remote mode: register with the registry at this URL (https://HOST:PORT, or http:// on
    /// loopback only) and serve harness streams through the rendezvous it names; a local
    /// listener only if --listen is given. The executor credential is --token-file's content
    /// or else $EXECWARD_EXECUTOR_TOKEN. See docs/remote.md.
    #[arg(long, value_name = "URL", requires_all = ["environment_id", "identity_file"])]
    pub remote: Option<String>,

    /// Remote mode: the executor's persistent Noise key, created (mode 0600) if missing. The
    /// registry binds the environment id to it; its public half is logged at start for
    /// harnesses to pin (--executor-key).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub identity_file: Option<PathBuf>,

    /// Remote mode: file holding the executor credential (surrounding whitespace removed).
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub token_file: Option<PathBuf>,

    /// Remote mode: also trust the CA certificates of this PEM file for https:// and wss://.
    #[arg(long, value_name = "PEM", requires = "remote")]
    pub ca_file: Option<PathBuf>,

    /// Remote mode: the environment id harnesses connect to (A-Z a-z 0-9 . _ -).
    #[arg(long, value_name = "ID", requires = "remote")]
    pub environment_id: Option<String>,

    /// Remote mode: display name registered with the environment (default: the id).
    #[arg(long, value_name = "NAME", requires = "remote")]
    pub name: Option<String>,

    /// Remote mode: the Noise ciphers harnesses may use: auto (ChaCha20-Poly1305, and
    /// AES-256-GCM when this CPU has AES instructions), any, chachapoly or aesgcm. See
    /// docs/remote.md.
    #[arg(
        long,
        value_name = "POLICY",
        requires = "remote",
        default_value = "auto"
    )]
    pub relay_ciphers: proto::relay::CipherPolicy,

    /// Log format on stderr: text (coloured only on a terminal) or json (one object per line).
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Client subcommands.
// Parsed once per run and moved out at once: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run a command on an exec server, stream its output, exit with its status.
    ///
    /// Run PROGRAM on the exec server at --connect (or on the remote environment --environment-id
    /// through the registry at --remote), stream its stdout and stderr to ours (or, with
    /// --tty, run it in a remote terminal driven by ours in raw mode, window size forwarded), and
    /// exit with its exit status (128+n when a signal n killed it; 255 when exec itself fails).
    ///
    /// Local stdin is forwarded to the command (end of file closes its stdin). SIGINT, SIGTERM and
    /// SIGHUP are forwarded to the remote process group; under --tty, Ctrl-C reaches the remote
    /// terminal as a keystroke. A dropped connection is resumed transparently (for up to 25 s)
    /// without losing or repeating output.
    ///
    /// Environment: by default the command gets PATH (/usr/local/bin:/usr/bin:/bin if unset), HOME,
    /// USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TERM and TZ from the local environment, and nothing
    /// else; --clear-env passes none of them; --env K=V adds or overrides one. Under --tty, TERM
    /// defaults to xterm-256color.
    ///
    /// Terminal safety: the command may be hostile, so without --tty, output written to a local
    /// terminal is filtered: OSC, DCS, APC, PM and SOS sequences (clipboard writes, window titles,
    /// hyperlinks, device control) and terminal queries (device status and attributes, window
    /// reports, whose answers the terminal would type into stdin) are removed; colours and
    /// cursor movement pass. Output to a file or pipe is never changed. --raw turns the filter
    /// off.
    #[command(long_about)]
    Exec(ExecArgs),
    /// Show what a server runs: every session's processes (state, pid, age, CPU, memory,
    /// exit) and every budget, from its GET /status.
    ///
    /// The request is admitted as a websocket connection would be: with --token-file's token,
    /// or without one from the server's own user (or root). --json prints the status as the
    /// server sent it. See docs/protocol.md, "GET /status".
    Ps(crate::ps_cmd::PsArgs),
}

/// Arguments of `exec-server exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The server: ws://HOST:PORT, wss://HOST:PORT or unix:/path.sock. A token (--token-file)
    /// is sent over ws:// only to a loopback host: to any other, exec refuses before
    /// connecting.
    #[arg(
        long,
        value_name = "URL",
        required_unless_present = "remote",
        conflicts_with = "remote"
    )]
    pub connect: Option<String>,

    /// Remote mode: the registry (https://HOST:PORT, or http:// on loopback only) of a
    /// rendezvous; the command runs on the executor registered as --environment-id, through an
    /// end-to-end encrypted relay stream. The harness credential is --token-file's content or
    /// else $EXECWARD_REGISTRY_TOKEN. An environment that is not registered yet is waited for
    /// up to 10 s. See docs/remote.md.
    #[arg(long, value_name = "REGISTRY_URL", requires = "environment_id")]
    pub remote: Option<String>,

    /// Remote mode: the environment to run on.
    #[arg(long, value_name = "ID", requires = "remote")]
    pub environment_id: Option<String>,

    /// File holding the bearer token (surrounding whitespace removed).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// Remote mode: the executor's Noise public key (base64, as its log prints it); the
    /// connection fails if the registry hands out another.
    #[arg(long, value_name = "BASE64", requires = "remote")]
    pub executor_key: Option<String>,

    /// Also trust the CA certificates of this PEM file for wss:// (--connect) or for https://
    /// and wss:// (--remote).
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,

    /// Remote mode: seconds to wait for an environment the registry does not know yet (its
    /// executor may be starting) or for a registry that refuses connections (it may be
    /// starting too); then exec fails with 255.
    #[arg(long, value_name = "SECONDS", requires = "remote", default_value_t = crate::relay::REGISTRATION_WAIT.as_secs_f64())]
    pub registration_wait: f64,

    /// Run the command under a remote pseudo-terminal; the local terminal goes to raw mode.
    #[arg(long)]
    pub tty: bool,

    /// Write the command's output to a local terminal unfiltered (by default, without --tty,
    /// OSC/DCS/APC/PM/SOS sequences and terminal queries are removed when stdout or stderr is a
    /// terminal; see the description above).
    #[arg(long)]
    pub raw: bool,

    /// Run the command under this sandbox: a built-in profile (read-only, workspace-write,
    /// danger-full-access), a profile file (`./mine.toml`, the format of policies/*.toml: read
    /// here, its paths resolved on the server), or a JSON sandbox object (`{"permissions": ...}`,
    /// see policies/README.md). The command's working directory (--cwd) is the sandbox's
    /// workspace unless the object names a cwd. The flags below widen or narrow it as
    /// sandbox-run's do.
    #[arg(long, value_name = "NAME|FILE|JSON")]
    pub sandbox: Option<String>,

    /// Also let the sandboxed command write DIR, a directory on the server (repeatable; relative
    /// to --cwd). Its .git, .agents and .codex stay read-only.
    #[arg(long = "writable-root", value_name = "DIR", requires = "sandbox")]
    pub writable_roots: Vec<String>,

    /// Widen the sandbox by a named allowance from policies/allowances/ (repeatable):
    /// `toolchain-caches` makes the caches of cargo, pip, npm and ccache writable. Resolved on
    /// the server, under the server's home (~/.cargo, ~/.cache).
    #[arg(long = "allow", value_name = "NAME", requires = "sandbox")]
    pub allowances: Vec<String>,

    /// Neither read nor write PATH on the server, even inside a writable root (repeatable;
    /// relative to --cwd).
    #[arg(long = "deny", value_name = "PATH", requires = "sandbox")]
    pub denies: Vec<String>,

    /// Turn the sandbox's network on (no allowlist).
    #[arg(long, requires = "sandbox", conflicts_with_all = ["allow_domains", "deny_domains"])]
    pub allow_network: bool,

    /// Limit the sandbox's network to an allowlist and add PATTERN to it (repeatable): `host`,
    /// `*.domain`, an IP literal, each with an optional `:PORT`, or a named set such as
    /// `@package-registries`; the command reaches them only through the server's egress proxy.
    #[arg(long = "allow-domain", value_name = "PATTERN", requires = "sandbox")]
    pub allow_domains: Vec<String>,

    /// Refuse PATTERN even when an --allow-domain pattern matches (repeatable).
    #[arg(long = "deny-domain", value_name = "PATTERN", requires = "sandbox")]
    pub deny_domains: Vec<String>,

    /// Report what the sandbox denied the command, one line on stderr per denial as it
    /// happens (`denied fs.make_reg /srv/x — allow: ...`) and a summary at the end. Needs the
    /// server's kernel audit log (a server running as root); otherwise exec says no denial
    /// could be seen. See docs/audit.md.
    #[arg(long, requires = "sandbox")]
    pub audit: bool,

    /// Leave this credential store of the built-in deny set readable (repeatable; named as in
    /// policies/credential-stores.toml, e.g. '~/.aws').
    #[arg(
        long = "allow-credential-store",
        value_name = "NAME",
        requires = "sandbox"
    )]
    pub allow_credential_stores: Vec<String>,

    /// Working directory on the server (absolute path or file: URI); defaults to the local
    /// current directory, which must then exist on the server.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,

    /// Set an environment variable for the command (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,

    /// Do not forward the default local variables (only --env ones are set).
    #[arg(long)]
    pub clear_env: bool,

    /// Limits of the command's whole process tree, in the form exec-server's
    /// --default-limits takes (e.g. memoryBytes=64M,wallSeconds=2,processes=256,cpuSeconds=60);
    /// they replace the server's defaults. When one ends the command, exec says which.
    #[arg(long, value_name = "LIST", value_parser = crate::containment::plan::parse_default_limits)]
    pub limits: Option<proto::methods::process::Limits>,

    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only when stderr is a terminal and `NO_COLOR` is unset.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields`), never coloured.
    Json,
}

/// Log to stderr (never stdout, which carries the URL line) at `RUST_LOG`, `info` by default.
/// Colours (ANSI escapes) only go to a terminal.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
            .init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// Exit status of a server (`exec-server`, `exec-rendezvous`) refused what it was given: a bad
/// flag, URL, token file, helper directory, limit or certificate. The same status clap uses for
/// a usage error: fix the command line or the files it names.
pub const CONFIGURATION_STATUS: u8 = 2;
/// Exit status of a server that failed while running, its configuration accepted: the OS refused
/// the bind (address in use, no permission), a signal handler, the guardian or the servers
/// registry failed. Retrying later, or elsewhere, may succeed.
pub const RUNTIME_FAILURE_STATUS: u8 = 1;

/// The exit status for a server's startup error: [`RUNTIME_FAILURE_STATUS`] when any cause in
/// its chain is a runtime failure, else [`CONFIGURATION_STATUS`].
pub fn server_failure_status(error: &anyhow::Error) -> u8 {
    let runtime = error.chain().any(|cause| {
        #[cfg(feature = "rendezvous")]
        if cause
            .downcast_ref::<crate::rendezvous::RendezvousError>()
            .is_some_and(crate::rendezvous::RendezvousError::is_runtime_failure)
        {
            return true;
        }
        cause
            .downcast_ref::<crate::server::ExecServerError>()
            .is_some_and(crate::server::ExecServerError::is_runtime_failure)
            || cause
                .downcast_ref::<crate::transport::BindError>()
                .is_some()
    });
    if runtime {
        RUNTIME_FAILURE_STATUS
    } else {
        CONFIGURATION_STATUS
    }
}
/// `error` and its causes on one line, each cause once: a cause whose text the message already
/// holds ("cannot bind 127.0.0.1:1: Address already in use (os error 98)") is not repeated.
pub fn describe_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The hint for a command given without `--` before it (`exec-server exec ... ls -la`): clap
/// sees `ls` as an unexpected argument. `None` for any other error.
pub fn missing_separator_hint(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(argument)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    (!argument.starts_with('-')).then(|| {
        format!(
            "hint: the command goes after `--`, e.g. `exec-server exec --connect URL -- {argument} ...`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot bind {address}: {source}")]
    struct Bind {
        address: &'static str,
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("server failed")]
    struct Outer(#[source] Bind);

    #[test]
    fn describe_error_names_each_cause_once() {
        let bind = Bind {
            address: "127.0.0.1:1",
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let described = describe_error(&Outer(bind));
        assert_eq!(
            described,
            "server failed: cannot bind 127.0.0.1:1: address in use"
        );
    }
}
