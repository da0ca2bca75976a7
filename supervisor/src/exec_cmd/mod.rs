//! `exec-server exec`: run one command on an exec server, stream its output, and exit with its
//! status. A client for people and scripts, built on [`crate::ExecServerClient`], so it survives
//! a dropped connection like any other client.
//!
//! Order of things: parse and validate everything local first (token, env, cwd), connect,
//! switch the terminal to raw mode only once the remote process exists (so errors print on a
//! sane terminal), and restore it before the exit status is returned.

mod describe;
pub(crate) mod escapes;
mod request;
pub(crate) mod terminal;

pub use describe::{describe_denial, describe_exit, exit_status};
pub use request::{
    ExecTarget, LOCAL_DETACHED_TTL, REMOTE_DETACHED_TTL, exec_target, sandbox_object, start_params,
    with_policy_flags,
};

use describe::{finish, signal_label};

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proto::methods::process::{ExitReason, OutputStream, SignalName, StartParams};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::cli::ExecArgs;
use crate::client::{ExecServerClient, ExecServerError, ProcessEvent, WebSocketTransport};
use crate::relay::REGISTRY_TOKEN_ENV;

/// Local variables passed to the remote command unless `--clear-env` is given.
pub const FORWARDED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ",
];
/// `PATH` used when the local environment has none (and `--clear-env` is not given).
pub const FALLBACK_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// `TERM` for `--tty` when none is set.
pub const FALLBACK_TERM: &str = "xterm-256color";
/// Exit status when `exec` itself fails (bad arguments, no connection, recovery failed), as
/// `ssh` does; a remote command's own status is passed through unchanged.
pub const EXEC_FAILURE_STATUS: u8 = 255;
/// Longest wait, at exit, for a relay stream to close politely (flush, then reset) so the
/// executor frees it at once: the stream's close linger plus a second.
pub const RELAY_CLOSE_WAIT: std::time::Duration =
    crate::relay::CLOSE_LINGER.saturating_add(std::time::Duration::from_secs(1));
/// Longest wait, at exit, for the websocket's close handshake (our close frame out, the
/// server's back): both steps' timeouts.
pub const WEBSOCKET_CLOSE_WAIT: std::time::Duration =
    crate::client::transport::CLOSE_HANDSHAKE_TIMEOUT.saturating_mul(2);
/// How long, once the command exited, exec still waits for output that background processes
/// hold open before it returns.
pub const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);
/// Bytes read from local stdin per `process/write`.
const STDIN_CHUNK_BYTES: usize = 64 * 1024;

/// Why `exec` could not run the command.
#[derive(Debug, thiserror::Error)]
pub enum ExecCommandError {
    /// The token file is unreadable.
    #[error("cannot read --token-file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The token file is empty.
    #[error("--token-file {path} is empty")]
    EmptyToken {
        /// The file.
        path: PathBuf,
    },
    /// `--remote` was given without a token.
    #[error(
        "--remote needs a harness credential of the registry: set ${REGISTRY_TOKEN_ENV} or pass --token-file"
    )]
    MissingRegistryToken,
    /// `--registration-wait` is not a number of seconds.
    #[error("--registration-wait {0} must be a non-negative number of seconds")]
    RegistrationWait(f64),
    /// `--executor-key` is not a base64 public key.
    #[error("--executor-key: {0}")]
    ExecutorKey(#[source] crate::relay::registry::PublicKeyError),
    /// Neither `--connect` nor `--remote` (clap normally refuses this first).
    #[error("pass --connect URL or --remote REGISTRY_URL --environment-id ID")]
    NoServer,
    /// An `--env` argument is not `KEY=VALUE`.
    #[error("--env {0:?} must be KEY=VALUE with a non-empty KEY")]
    InvalidEnv(String),
    /// `--cwd` (or the current directory) has no `file:` URI.
    #[error("--cwd {path:?} cannot be used: {reason}")]
    Cwd {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// `--sandbox` is neither a profile name nor a JSON sandbox object.
    #[error("--sandbox {value:?}: {reason}")]
    Sandbox {
        /// The value given.
        value: String,
        /// Why, and what is expected.
        reason: String,
    },
    /// The tokio runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// The terminal could not be switched to raw mode.
    #[error("cannot put the terminal in raw mode: {0}")]
    RawMode(nix::Error),
    /// The client failed (connect, start, or the connection could not be recovered).
    #[error(transparent)]
    Client(#[from] ExecServerError),
    /// The server wants a (different) bearer token.
    #[error("{error}; {hint}")]
    Unauthorized {
        /// The client's error.
        error: ExecServerError,
        /// What to do.
        hint: &'static str,
    },
    /// The event stream ended without `closed`.
    #[error("the remote process's event stream ended before it closed")]
    Incomplete,
}

/// Run `exec` to completion: the status to exit with (the remote exit status, 128+n for a
/// signal), or an error (the caller exits with [`EXEC_FAILURE_STATUS`]).
///
/// # Errors
/// See [`ExecCommandError`].
pub fn run(mut args: ExecArgs) -> Result<u8, ExecCommandError> {
    if let Some(warning) = tty_fallback(&mut args, terminal::is_terminal(std::io::stdin().as_fd()))
    {
        eprintln!("exec-server exec: {warning}");
    }
    let output = LocalOutput::new(args.tty || args.raw);
    let params = start_params(&args, std::env::vars(), &std::env::current_dir().ok())?;
    let token = read_token(args.token_file.as_deref())?;
    let target = exec_target(&args, token, std::env::var(REGISTRY_TOKEN_ENV).ok())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ExecCommandError::Runtime)?;
    let outcome = runtime.block_on(exec(target, params, output));
    // Do not wait for blocked readers of local stdin.
    runtime.shutdown_background();
    outcome.map_err(with_hint)
}

/// The status `exec` exits with when it fails: 127 when the server found no such program, 126
/// when it could not execute it (as a shell and `sandbox-run` say), else
/// [`EXEC_FAILURE_STATUS`].
pub fn failure_status(error: &ExecCommandError) -> u8 {
    use proto::error::ErrorKind;
    let ExecCommandError::Client(ExecServerError::Rpc { error, .. }) = error else {
        return EXEC_FAILURE_STATUS;
    };
    let Some(data) = error.data.as_ref() else {
        return EXEC_FAILURE_STATUS;
    };
    if data.operation.as_deref() != Some(crate::rpc::errors::EXEC_OPERATION) {
        return EXEC_FAILURE_STATUS;
    }
    match data.kind {
        ErrorKind::NotFound => 127,
        ErrorKind::PermissionDenied => 126,
        _ => EXEC_FAILURE_STATUS,
    }
}

/// `--tty` needs a terminal on stdin to drive the remote one: without it (a pipe, a file,
/// `/dev/null`) the command runs on pipes instead, as `ssh` does, and the returned warning says
/// so. Without this a remote shell waits forever for input that never comes as keystrokes.
pub fn tty_fallback(args: &mut ExecArgs, stdin_is_terminal: bool) -> Option<&'static str> {
    if !args.tty || stdin_is_terminal {
        return None;
    }
    args.tty = false;
    Some(
        "pseudo-terminal will not be allocated because stdin is not a terminal; the command \
         runs on pipes (as without --tty)",
    )
}

/// Adds what to do to errors a person can fix with a flag.
fn with_hint(error: ExecCommandError) -> ExecCommandError {
    match error {
        ExecCommandError::Client(error @ ExecServerError::Unauthorized { token_sent, .. }) => {
            ExecCommandError::Unauthorized {
                error,
                hint: if token_sent {
                    "check that --token-file holds the token of the server's --auth-token-file"
                } else {
                    "pass --token-file FILE, a file holding the token the server reads from \
                     its --auth-token-file"
                },
            }
        }
        other => other,
    }
}

fn read_token(path: Option<&Path>) -> Result<Option<String>, ExecCommandError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|source| ExecCommandError::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(ExecCommandError::EmptyToken {
            path: path.to_owned(),
        });
    }
    Ok(Some(token.to_owned()))
}

async fn exec(
    target: ExecTarget,
    params: StartParams,
    output: LocalOutput,
) -> Result<u8, ExecCommandError> {
    let (client, relay, websocket) = match target {
        ExecTarget::Local(options) => {
            let transport = Arc::new(WebSocketTransport::with_ca_file(
                &options.url,
                options.auth_token.clone(),
                options.connect_timeout,
                options.ca_file.as_deref(),
            )?);
            let client =
                ExecServerClient::connect_with_transport(transport.clone(), options).await?;
            (client, None, Some(transport))
        }
        ExecTarget::Remote(args) => {
            let (transport, options) = args.into_parts();
            let transport = Arc::new(transport);
            let client =
                ExecServerClient::connect_with_transport(transport.clone(), options).await?;
            (client, Some(transport), None)
        }
    };
    let outcome = run_command(&client, params, output).await;
    client.close();
    if let Some(relay) = relay
        && tokio::time::timeout(RELAY_CLOSE_WAIT, relay.wait_streams_closed())
            .await
            .is_err()
    {
        tracing::debug!("the relay stream did not close within {RELAY_CLOSE_WAIT:?}");
    }
    // The websocket closes with a close handshake, so the server sees a proper close, not a
    // reset; the runtime is dropped right after this returns.
    if let Some(websocket) = websocket
        && tokio::time::timeout(WEBSOCKET_CLOSE_WAIT, websocket.wait_connections_closed())
            .await
            .is_err()
    {
        tracing::debug!("the websocket did not close within {WEBSOCKET_CLOSE_WAIT:?}");
    }
    outcome
}

async fn run_command(
    client: &ExecServerClient,
    mut params: StartParams,
    mut output: LocalOutput,
) -> Result<u8, ExecCommandError> {
    let tty = params.tty;
    let args_limits = params.limits.clone();
    let stdin_is_terminal = terminal::is_terminal(std::io::stdin().as_fd());
    if tty
        && let Some((cols, rows)) = terminal::window_size(std::io::stdin())
            .or_else(|| terminal::window_size(std::io::stdout()))
    {
        params.cols = Some(cols);
        params.rows = Some(rows);
    }
    let mut interrupt = signal(SignalKind::interrupt()).map_err(ExecCommandError::Signals)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(ExecCommandError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(ExecCommandError::Signals)?;
    let mut window_change =
        signal(SignalKind::window_change()).map_err(ExecCommandError::Signals)?;

    let handle = client.start_process(params).await?;
    let _raw_mode = if tty && stdin_is_terminal {
        Some(
            terminal::RawModeGuard::enable(std::io::stdin().as_fd())
                .map_err(ExecCommandError::RawMode)?,
        )
    } else {
        None
    };
    let (process, mut events) = handle.into_parts();
    let stdin = forward_stdin();
    let writer = {
        let process = process.clone();
        tokio::spawn(async move { write_stdin(process, stdin).await })
    };

    let mut exit: Option<(i32, Option<ExitReason>)> = None;
    let mut interrupts = Interrupts::default();
    // Armed when the command exits: background processes still holding its stdout or stderr
    // get this long to finish writing, then exec returns anyway.
    let drain = tokio::time::sleep(std::time::Duration::MAX);
    tokio::pin!(drain);
    let outcome = loop {
        tokio::select! {
            event = events.next() => match event {
                Some(ProcessEvent::Output { stream, data, .. }) => output.write(stream, &data),
                Some(ProcessEvent::Exited { exit_code, reason, .. }) => {
                    exit = Some((exit_code, reason));
                    drain.as_mut().reset(tokio::time::Instant::now() + EXIT_DRAIN);
                }
                Some(ProcessEvent::Denied { record, .. }) => {
                    if let Some(line) = describe_denial(&record) {
                        output.say(&line);
                    }
                }
                Some(ProcessEvent::Closed { .. }) => break Ok(finish(exit, &args_limits)),
                Some(ProcessEvent::Failed { error }) => break Err(error.into()),
                None => break Err(ExecCommandError::Incomplete),
            },
            () = &mut drain, if exit.is_some() => {
                eprintln!(
                    "exec-server exec: the command exited; its output was still held open {} s \
                     later (a background process?), so exec stops waiting for it",
                    EXIT_DRAIN.as_secs()
                );
                break Ok(finish(exit, &args_limits));
            }
            Some(()) = interrupt.recv() => interrupts.escalate(&process, SignalName::Interrupt),
            Some(()) = terminate.recv() => interrupts.escalate(&process, SignalName::Terminate),
            Some(()) = hangup.recv() => forward_signal(&process, SignalName::Hangup),
            Some(()) = window_change.recv(), if tty => {
                if let Some((cols, rows)) = terminal::window_size(std::io::stdin()) {
                    let process = process.clone();
                    tokio::spawn(async move { let _ = process.resize(cols, rows).await; });
                }
            }
        }
    };
    writer.abort();
    outcome
}

/// Interrupts (Ctrl-C, SIGTERM) received so far: the first is forwarded to the command, the
/// second terminates its tree (SIGTERM, then SIGKILL after the server's grace period), the third
/// kills it at once. Each says so on stderr, so a command that ignores signals never traps
/// the person (or the CI job) running exec.
#[derive(Default)]
struct Interrupts {
    received: u32,
}

impl Interrupts {
    fn escalate(&mut self, process: &crate::client::RemoteProcess, signal: SignalName) {
        self.received += 1;
        match self.received {
            1 => {
                eprintln!(
                    "exec-server exec: {} forwarded to the command; interrupt again to terminate it",
                    signal_label(signal)
                );
                forward_signal(process, signal);
            }
            2 => {
                eprintln!(
                    "exec-server exec: terminating the command (SIGTERM, then SIGKILL after the \
                     server's grace period); interrupt again to kill it now"
                );
                let process = process.clone();
                tokio::spawn(async move {
                    let _ = process.terminate().await;
                });
            }
            _ => {
                eprintln!("exec-server exec: killing the command (SIGKILL)");
                let process = process.clone();
                tokio::spawn(async move {
                    let _ = process.signal(SignalName::Kill).await;
                    let _ = process.terminate().await;
                });
            }
        }
    }
}

fn forward_signal(process: &crate::client::RemoteProcess, signal: SignalName) {
    let process = process.clone();
    tokio::spawn(async move {
        let _ = process.signal(signal).await;
    });
}

/// Where the command's output goes: our stdout and stderr, each through a
/// [`escapes::TerminalFilter`] when it is a terminal (unless `--tty` or `--raw`).
struct LocalOutput {
    stdout: Option<escapes::TerminalFilter>,
    stderr: Option<escapes::TerminalFilter>,
    filtered: Vec<u8>,
    /// The command's stderr so far ends inside a line: exec's own lines start a new one.
    stderr_mid_line: bool,
}

impl LocalOutput {
    /// Filters for whichever of stdout and stderr is a terminal, none when `unfiltered`.
    fn new(unfiltered: bool) -> Self {
        let filter_if_terminal = |fd: std::os::fd::BorrowedFd<'_>| {
            (!unfiltered && terminal::is_terminal(fd)).then(escapes::TerminalFilter::new)
        };
        Self {
            stdout: filter_if_terminal(std::io::stdout().as_fd()),
            stderr: filter_if_terminal(std::io::stderr().as_fd()),
            filtered: Vec::new(),
            stderr_mid_line: false,
        }
    }

    /// One line of exec's own (`exec-server exec: {line}`) on stderr, on a line of its own even
    /// when the command's stderr is in the middle of one.
    fn say(&mut self, line: &str) {
        let newline = if self.stderr_mid_line { "\n" } else { "" };
        self.stderr_mid_line = false;
        let mut stderr = std::io::stderr().lock();
        let _ = writeln!(stderr, "{newline}exec-server exec: {line}").and_then(|()| stderr.flush());
    }

    fn write(&mut self, stream: OutputStream, data: &[u8]) {
        // Blocking writes: this command's only job is moving these bytes, and blocking here is
        // what pushes back on the remote process when the reader of our stdout is slow.
        let filter = match stream {
            OutputStream::Stderr => self.stderr.as_mut(),
            OutputStream::Stdout | OutputStream::Pty => self.stdout.as_mut(),
        };
        let data = match filter {
            Some(filter) => {
                self.filtered.clear();
                filter.filter(data, &mut self.filtered);
                &self.filtered[..]
            }
            None => data,
        };
        let _ = match stream {
            OutputStream::Stderr => {
                if let Some(last) = data.last() {
                    self.stderr_mid_line = *last != b'\n';
                }
                let mut stderr = std::io::stderr().lock();
                stderr.write_all(data).and_then(|()| stderr.flush())
            }
            OutputStream::Stdout | OutputStream::Pty => {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(data).and_then(|()| stdout.flush())
            }
        };
    }
}

/// Read local stdin on a plain thread (a blocked read must not hold up exit); `None` at EOF.
fn forward_stdin() -> mpsc::Receiver<Option<Vec<u8>>> {
    let (sender, receiver) = mpsc::channel(4);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; STDIN_CHUNK_BYTES];
        loop {
            match std::io::Read::read(&mut stdin, &mut buffer) {
                Ok(0) | Err(_) => {
                    let _ = sender.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if sender.blocking_send(Some(buffer[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    receiver
}

async fn write_stdin(
    process: crate::client::RemoteProcess,
    mut stdin: mpsc::Receiver<Option<Vec<u8>>>,
) {
    while let Some(chunk) = stdin.recv().await {
        let written = match chunk {
            Some(data) => process.write(&data).await,
            None => process.close_stdin().await,
        };
        // Stdin unavailable (the process exited or closed it): stop forwarding quietly.
        if written.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
