//! `exec-server exec`: run one command on an exec server, stream its output, and exit with its
//! status. A client for people and scripts, built on [`crate::ExecServerClient`], so it survives
//! a dropped connection like any other client.
//!
//! Order of things: parse and validate everything local first (token, env, cwd), connect,
//! switch the terminal to raw mode only once the remote process exists (so errors print on a
//! sane terminal), and restore it before the exit status is returned.

pub(crate) mod escapes;
pub(crate) mod terminal;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proto::FileUri;
use proto::methods::process::{ExitReason, Limits, OutputStream, SignalName, StartParams};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::cli::ExecArgs;
use crate::client::{
    ExecServerClient, ExecServerClientConnectOptions, ExecServerError, ProcessEvent,
    RemoteExecServerConnectArgs, WebSocketTransport,
};
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

/// Where `exec` connects.
#[derive(Debug, Clone)]
pub enum ExecTarget {
    /// A local server over `ws://` or `unix:` (`--connect`).
    Local(ExecServerClientConnectOptions),
    /// A remote environment through a registry and rendezvous (`--remote`).
    Remote(RemoteExecServerConnectArgs),
}

/// How long a server keeps exec's session after its connection is gone: enough for exec to
/// reconnect and resume after a dropped connection, short enough that a killed exec (SIGKILL,
/// which it cannot catch) does not leave its command running for the server's whole TTL.
pub const LOCAL_DETACHED_TTL: std::time::Duration = std::time::Duration::from_secs(3);
/// How long an executor keeps exec's session after its relay stream is gone: enough to resume
/// over a new stream when the rendezvous socket drops, short enough that a killed exec does not
/// leave its command running for the executor's whole TTL.
pub const REMOTE_DETACHED_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// Client name `exec` gives in `initialize`.
const CLIENT_NAME: &str = "exec-server exec";

/// Choose the server from the arguments: `--connect` with the `--token-file` token, or
/// `--remote`/`--environment-id` with the `--token-file` token or else `registry_env_token`
/// (the value of `$EXECWARD_REGISTRY_TOKEN`). Pure: unit-tested.
///
/// # Errors
/// [`ExecCommandError::MissingRegistryToken`] for `--remote` without a token,
/// [`ExecCommandError::NoServer`] when neither is given.
pub fn exec_target(
    args: &ExecArgs,
    file_token: Option<String>,
    registry_env_token: Option<String>,
) -> Result<ExecTarget, ExecCommandError> {
    match (&args.connect, &args.remote, &args.environment_id) {
        (Some(url), _, _) => Ok(ExecTarget::Local(
            ExecServerClientConnectOptions::new(url.clone())
                .with_auth_token(file_token)
                .with_ca_file(args.ca_file.clone())
                .with_client_name(CLIENT_NAME)
                // When exec goes (killed, even by SIGKILL), its command follows shortly.
                .with_detached_session_ttl(LOCAL_DETACHED_TTL),
        )),
        (None, Some(registry_url), Some(environment_id)) => {
            let token = file_token
                .or_else(|| {
                    registry_env_token
                        .map(|token| token.trim().to_owned())
                        .filter(|token| !token.is_empty())
                })
                .ok_or(ExecCommandError::MissingRegistryToken)?;
            let registration_wait = std::time::Duration::try_from_secs_f64(args.registration_wait)
                .map_err(|_| ExecCommandError::RegistrationWait(args.registration_wait))?;
            let executor_key = args
                .executor_key
                .as_deref()
                .map(crate::relay::registry::decode_public_key)
                .transpose()
                .map_err(ExecCommandError::ExecutorKey)?;
            Ok(ExecTarget::Remote(
                RemoteExecServerConnectArgs::new(
                    registry_url.clone(),
                    environment_id.clone(),
                    token,
                )
                .with_client_name(CLIENT_NAME)
                .with_ca_file(args.ca_file.clone())
                .with_executor_key(executor_key)
                .with_registration_wait(registration_wait)
                .with_detached_session_ttl(REMOTE_DETACHED_TTL),
            ))
        }
        _ => Err(ExecCommandError::NoServer),
    }
}

/// Build `process/start` params from the arguments, the local environment and the local
/// current directory (pure: unit-tested).
///
/// # Errors
/// [`ExecCommandError::InvalidEnv`], [`ExecCommandError::Cwd`].
pub fn start_params(
    args: &ExecArgs,
    local_env: impl IntoIterator<Item = (String, String)>,
    local_cwd: &Option<PathBuf>,
) -> Result<StartParams, ExecCommandError> {
    let mut env = BTreeMap::new();
    if !args.clear_env {
        env.extend(
            local_env
                .into_iter()
                .filter(|(key, _)| FORWARDED_ENV.contains(&key.as_str())),
        );
        env.entry("PATH".to_owned())
            .or_insert_with(|| FALLBACK_PATH.to_owned());
    }
    for pair in &args.env {
        match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                env.insert(key.to_owned(), value.to_owned());
            }
            _ => return Err(ExecCommandError::InvalidEnv(pair.clone())),
        }
    }
    if args.tty {
        env.entry("TERM".to_owned())
            .or_insert_with(|| FALLBACK_TERM.to_owned());
    }
    let cwd = cwd_uri(args.cwd.as_deref(), local_cwd)?;
    // The command's working directory is the sandbox's workspace: profiles such as
    // workspace-write need one, and the server never guesses it.
    let sandbox = args
        .sandbox
        .as_deref()
        .map(|text| {
            let object = sandbox_object(text, &cwd, local_cwd)?;
            with_policy_flags(object, args, &cwd).map_err(|reason| ExecCommandError::Sandbox {
                value: text.to_owned(),
                reason,
            })
        })
        .transpose()?;
    let mut params = StartParams::new(
        format!("exec-{}", uuid::Uuid::new_v4()),
        args.command.clone(),
        cwd,
    )
    .with_env(env)
    .with_tty(args.tty)
    .with_pipe_stdin(!args.tty);
    if let Some(sandbox) = sandbox {
        params = params.with_sandbox(sandbox);
    }
    if let Some(limits) = &args.limits {
        params = params.with_limits(limits.clone());
    }
    if args.audit {
        params = params.with_audit_denials(true);
    }
    Ok(params)
}

/// The wire `sandbox` object for `--sandbox`: a built-in profile name, a profile file (read
/// here, sent as `profileToml`, its paths resolved where the command runs), or a JSON sandbox
/// object (as `sandbox-run --policy` takes), each with the command's cwd as its workspace unless
/// the object names one.
///
/// # Errors
/// [`ExecCommandError::Sandbox`] for invalid JSON, a JSON value that is not an object, or a
/// profile file that cannot be read or does not parse.
pub fn sandbox_object(
    text: &str,
    cwd: &FileUri,
    local_cwd: &Option<PathBuf>,
) -> Result<serde_json::Value, ExecCommandError> {
    let error = |reason: String| ExecCommandError::Sandbox {
        value: text.to_owned(),
        reason,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let mut object = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(_) => return Err(error("a JSON sandbox object must be an object".into())),
            Err(err) => return Err(error(format!("not valid JSON: {err}"))),
        };
        object
            .entry("cwd")
            .or_insert_with(|| serde_json::Value::String(cwd.to_uri_string()));
        return Ok(serde_json::Value::Object(object));
    }
    if text.contains('/') || text.ends_with(".toml") {
        let path = match local_cwd {
            Some(base) => base.join(text),
            None => PathBuf::from(text),
        };
        let toml = std::fs::read_to_string(&path)
            .map_err(|err| error(format!("cannot read the profile file: {err}")))?;
        // Parsed here too, so a mistake is reported before anything is sent.
        sandbox::policy::ProfileFile::parse(&toml, &path.display().to_string())
            .map_err(|err| error(err.to_string()))?;
        return Ok(serde_json::json!({ "profileToml": toml, "cwd": cwd.to_uri_string() }));
    }
    Ok(serde_json::json!({ "profile": text, "cwd": cwd.to_uri_string() }))
}

/// `object` with exec's policy flags applied as the wire keys `sandbox-run`'s flags map to:
/// `--writable-root` (`writableRoots`, inside a `profile` object or beside `permissions` and
/// `profileToml`), `--allow` (`allowances`), `--deny` (`denyPaths`), `--allow-network`,
/// `--allow-domain`/`--deny-domain` (`network`), `--allow-credential-store`
/// (`readableCredentialStores`). Relative paths are taken relative to the command's cwd on the
/// server.
///
/// # Errors
/// What is wrong, for a flag the object's shape cannot take.
pub fn with_policy_flags(
    mut object: serde_json::Value,
    args: &ExecArgs,
    cwd: &FileUri,
) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let serde_json::Value::Object(map) = &mut object else {
        return Err("a sandbox object must be a JSON object".into());
    };
    let remote = |path: &str| {
        let path = Path::new(path);
        let absolute = if path.is_absolute() {
            path.to_owned()
        } else {
            cwd.as_path().join(path)
        };
        Value::String(absolute.display().to_string())
    };
    let append = |map: &mut serde_json::Map<String, Value>, key: &str, items: Vec<Value>| {
        if items.is_empty() {
            return Ok(());
        }
        match map
            .entry(key.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(existing) => {
                existing.extend(items);
                Ok(())
            }
            other => Err(format!(
                "the object's {key:?} must be an array (got {other})"
            )),
        }
    };
    if !args.writable_roots.is_empty() {
        let takes_roots = ["profile", "permissions", "profileToml"]
            .iter()
            .any(|key| map.contains_key(*key));
        if !takes_roots {
            return Err(
                "--writable-root needs a profile name, a profile file or a `permissions` object \
                 (a legacy `type` object names its own writableRoots)"
                    .into(),
            );
        }
        append(
            map,
            "writableRoots",
            args.writable_roots.iter().map(|p| remote(p)).collect(),
        )?;
    }
    append(
        map,
        "allowances",
        args.allowances.iter().cloned().map(Value::String).collect(),
    )?;
    append(
        map,
        "denyPaths",
        args.denies.iter().map(|p| remote(p)).collect(),
    )?;
    append(
        map,
        "readableCredentialStores",
        args.allow_credential_stores
            .iter()
            .cloned()
            .map(Value::String)
            .collect(),
    )?;
    if args.allow_network {
        map.insert("network".into(), Value::String("on".into()));
    }
    if !args.allow_domains.is_empty() || !args.deny_domains.is_empty() {
        let network = map
            .entry("network".to_owned())
            .or_insert_with(|| serde_json::json!({}));
        if !network.is_object() {
            // "off" or "on" beside domains: the allowlist is what was asked for.
            *network = serde_json::json!({});
        }
        if let Value::Object(network) = network {
            let strings = |items: &[String]| items.iter().cloned().map(Value::String).collect();
            append(network, "allow", strings(&args.allow_domains))?;
            append(network, "deny", strings(&args.deny_domains))?;
        }
    }
    Ok(object)
}

fn cwd_uri(cwd: Option<&str>, local_cwd: &Option<PathBuf>) -> Result<FileUri, ExecCommandError> {
    let error = |path: &str, reason: String| ExecCommandError::Cwd {
        path: path.to_owned(),
        reason,
    };
    match cwd {
        Some(text) if text.starts_with("file:") => {
            serde_json::from_value(serde_json::Value::String(text.to_owned()))
                .map_err(|e| error(text, e.to_string()))
        }
        Some(text) => {
            let path = Path::new(text);
            let path = match (path.is_absolute(), local_cwd) {
                (true, _) => path.to_owned(),
                (false, Some(base)) => base.join(path),
                (false, None) => {
                    return Err(error(
                        text,
                        "a relative directory needs a current directory".into(),
                    ));
                }
            };
            FileUri::from_path(&path).map_err(|e| error(text, e.to_string()))
        }
        None => {
            let Some(base) = local_cwd else {
                return Err(error(
                    ".",
                    "the current directory is unknown; pass --cwd".into(),
                ));
            };
            FileUri::from_path(base).map_err(|e| error(&base.display().to_string(), e.to_string()))
        }
    }
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

/// The stderr line for one record of the denial audit (docs/audit.md): a denial with what
/// would allow it, or the coverage summary at the end; `None` for the per-group summaries.
/// Every value is the server's: control characters are escaped so none reaches the terminal.
pub fn describe_denial(record: &serde_json::Value) -> Option<String> {
    let text = |key: &str| {
        record
            .get(key)
            .and_then(serde_json::Value::as_str)
            .map(|value| {
                value
                    .chars()
                    .map(|c| match c.is_control() {
                        true => c.escape_unicode().to_string(),
                        false => c.to_string(),
                    })
                    .collect::<String>()
            })
    };
    match record.get("kind").and_then(serde_json::Value::as_str)? {
        "denial" => {
            let operation = text("operation").unwrap_or_else(|| "?".into());
            let target = text("path")
                .or_else(|| text("address"))
                .unwrap_or_else(|| "?".into());
            let mut line = format!("denied {operation} {target}");
            if let Some(exe) = text("exe") {
                line.push_str(&format!(" by {exe}"));
            }
            if let Some(rule) = text("allow_rule") {
                line.push_str(&format!(" — allow: {rule}"));
            }
            Some(line)
        }
        "coverage" => {
            if record.get("audit").and_then(serde_json::Value::as_bool) == Some(false) {
                return Some(
                    "audit: the server cannot read the kernel audit log (it must run as root), so \
                     no denial could be seen; this is not a clean report"
                        .into(),
                );
            }
            let denials = record
                .get("denials")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let complete = record.get("complete").and_then(serde_json::Value::as_bool);
            Some(format!(
                "audit: {denials} denial(s){}",
                if complete == Some(false) {
                    " (incomplete: some layers could not be observed; see docs/audit.md)"
                } else {
                    ""
                }
            ))
        }
        _ => None,
    }
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

fn signal_label(signal: SignalName) -> &'static str {
    match signal {
        SignalName::Interrupt => "SIGINT",
        SignalName::Terminate => "SIGTERM",
        SignalName::Kill => "SIGKILL",
        SignalName::Hangup => "SIGHUP",
    }
}

/// The status to exit with once the command ended, after saying why on stderr when it was not
/// an exit of its own.
fn finish(exit: Option<(i32, Option<ExitReason>)>, limits: &Option<Limits>) -> u8 {
    let (code, reason) = exit.unwrap_or((0, None));
    if let Some(why) = reason.and_then(|reason| describe_exit(reason, code, limits.as_ref())) {
        eprintln!("exec-server exec: {why}");
    }
    exit_status(code)
}

/// Why a command ended, in words, when it was not a normal exit (pure: unit-tested).
pub fn describe_exit(reason: ExitReason, code: i32, limits: Option<&Limits>) -> Option<String> {
    let limit = |value: Option<u64>, unit: fn(u64) -> String| {
        value.map_or_else(String::new, |value| format!(" (limit {})", unit(value)))
    };
    let limits = limits.cloned().unwrap_or_default();
    let signal = code - 128;
    Some(match reason {
        ExitReason::Exit => return None,
        ExitReason::Oom => format!(
            "killed: out of memory{}",
            limit(limits.memory_bytes, human_bytes)
        ),
        ExitReason::WallTimeout => format!(
            "killed: wall-clock limit reached{}",
            limit(limits.wall_seconds, |s| format!("{s} s"))
        ),
        ExitReason::CpuLimit => format!(
            "killed: CPU time limit reached{}",
            limit(limits.cpu_seconds, |s| format!("{s} CPU-seconds"))
        ),
        ExitReason::Terminated => {
            "terminated (process/terminate, the session's end or the server's shutdown)".to_owned()
        }
        ExitReason::Signal if signal > 0 => format!("killed by signal {signal}"),
        ExitReason::Signal => "killed by a signal".to_owned(),
    })
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| bytes >= *size && bytes.is_multiple_of(*size))
        .map_or_else(
            || format!("{bytes} bytes"),
            |(size, unit)| format!("{} {unit}", bytes / size),
        )
}

/// The exit status for a remote exit code (already 128+n for signal n).
pub fn exit_status(code: i32) -> u8 {
    u8::try_from(code.clamp(0, 255)).unwrap_or(EXEC_FAILURE_STATUS)
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
mod tests {
    use super::*;
    use clap::Parser;
    use pretty_assertions::assert_eq;

    fn args(argv: &[&str]) -> ExecArgs {
        match crate::cli::Cli::try_parse_from(argv).map(|cli| cli.command) {
            Ok(Some(crate::cli::Command::Exec(args))) => args,
            other => panic!("not an exec command line: {other:?}"),
        }
    }

    #[test]
    fn a_denial_line_names_the_operation_path_and_rule_and_escapes_control_characters() {
        let record = serde_json::json!({"kind": "denial", "operation": "fs.make_reg",
            "path": "/srv/x\u{1b}[2J", "exe": "/usr/bin/dash",
            "allow_rule": "\"/srv\" = \"write\""});
        assert_eq!(
            describe_denial(&record).unwrap(),
            "denied fs.make_reg /srv/x\\u{1b}[2J by /usr/bin/dash — allow: \"/srv\" = \"write\""
        );
        let blind = serde_json::json!({"kind": "coverage", "audit": false});
        assert!(
            describe_denial(&blind)
                .unwrap()
                .contains("not a clean report")
        );
        let clean =
            serde_json::json!({"kind": "coverage", "audit": true, "denials": 0, "complete": true});
        assert_eq!(describe_denial(&clean).unwrap(), "audit: 0 denial(s)");
        assert_eq!(describe_denial(&serde_json::json!({"kind": "group"})), None);
    }

    fn local_env() -> Vec<(String, String)> {
        [
            ("PATH", "/p"),
            ("HOME", "/h"),
            ("SECRET", "s"),
            ("TERM", "vt100"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn default_env_forwards_only_the_listed_variables_and_env_flags_override() {
        let args = args(&[
            "exec-server",
            "exec",
            "--connect",
            "ws://127.0.0.1:1",
            "--env",
            "HOME=/x",
            "--env",
            "A=b=c",
            "--",
            "prog",
            "arg",
        ]);
        let params = start_params(&args, local_env(), &Some(PathBuf::from("/work"))).unwrap();
        let env: Vec<(&str, &str)> = params
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            env,
            vec![
                ("A", "b=c"),
                ("HOME", "/x"),
                ("PATH", "/p"),
                ("TERM", "vt100")
            ]
        );
        assert_eq!(params.argv, vec!["prog", "arg"]);
        assert_eq!(params.cwd.to_uri_string(), "file:///work");
        assert!(params.pipe_stdin && !params.tty);
        assert_eq!(params.sandbox, None);
    }

    #[test]
    fn clear_env_starts_empty_and_tty_gets_a_term() {
        let args = args(&[
            "exec-server",
            "exec",
            "--connect",
            "unix:/s",
            "--clear-env",
            "--tty",
            "--sandbox",
            "read-only",
            "--cwd",
            "/tmp",
            "--",
            "cat",
        ]);
        let params = start_params(&args, local_env(), &None).unwrap();
        assert_eq!(
            params.env,
            BTreeMap::from([("TERM".to_owned(), FALLBACK_TERM.to_owned())])
        );
        assert_eq!(
            params.sandbox,
            Some(serde_json::json!({"profile": "read-only", "cwd": "file:///tmp"}))
        );
        assert!(params.tty && !params.pipe_stdin);
        assert_eq!(params.cwd.to_uri_string(), "file:///tmp");
    }

    #[test]
    fn malformed_env_is_refused() {
        let args = args(&[
            "exec-server",
            "exec",
            "--connect",
            "unix:/s",
            "--env",
            "NOEQUALS",
            "--",
            "true",
        ]);
        assert!(matches!(
            start_params(&args, local_env(), &None),
            Err(ExecCommandError::InvalidEnv(_))
        ));
    }

    #[test]
    fn remote_takes_the_token_from_the_file_or_else_the_environment() {
        let remote = [
            "exec-server",
            "exec",
            "--remote",
            "http://127.0.0.1:7700",
            "--environment-id",
            "laptop",
            "--",
            "uname",
        ];
        let target = |file: Option<&str>, env: Option<&str>| {
            exec_target(
                &args(&remote),
                file.map(str::to_owned),
                env.map(str::to_owned),
            )
        };
        let token_of = |target: Result<ExecTarget, ExecCommandError>| match target {
            Ok(ExecTarget::Remote(args)) => {
                assert_eq!(args.relay.registry_url, "http://127.0.0.1:7700");
                assert_eq!(args.relay.environment_id, "laptop");
                args.relay.bearer_token
            }
            other => panic!("not a remote target: {other:?}"),
        };
        assert_eq!(token_of(target(None, Some(" from-env\n"))), "from-env");
        assert_eq!(
            token_of(target(Some("from-file"), Some("env"))),
            "from-file"
        );
        assert!(matches!(
            target(None, Some("  ")),
            Err(ExecCommandError::MissingRegistryToken)
        ));
        assert!(matches!(
            target(None, None),
            Err(ExecCommandError::MissingRegistryToken)
        ));
    }

    #[test]
    fn connect_and_remote_are_mutually_exclusive_and_one_is_required() {
        let parse = |argv: &[&str]| crate::cli::Cli::try_parse_from(argv).map(|_| ());
        assert!(
            parse(&[
                "exec-server",
                "exec",
                "--connect",
                "ws://127.0.0.1:1",
                "--remote",
                "http://127.0.0.1:2",
                "--environment-id",
                "e",
                "--",
                "true",
            ])
            .is_err()
        );
        assert!(parse(&["exec-server", "exec", "--", "true"]).is_err());
        assert!(
            parse(&[
                "exec-server",
                "exec",
                "--remote",
                "http://127.0.0.1:2",
                "--",
                "true"
            ])
            .is_err(),
            "--remote needs --environment-id"
        );
        let local = exec_target(
            &args(&["exec-server", "exec", "--connect", "unix:/s", "--", "true"]),
            Some("t".into()),
            Some("ignored".into()),
        );
        match local {
            Ok(ExecTarget::Local(options)) => {
                assert_eq!(
                    (options.url.as_str(), options.auth_token.as_deref()),
                    ("unix:/s", Some("t"))
                );
            }
            other => panic!("not a local target: {other:?}"),
        }
    }

    #[test]
    fn tty_without_a_terminal_on_stdin_falls_back_to_pipes_with_a_warning() {
        let argv = [
            "exec-server",
            "exec",
            "--connect",
            "unix:/s",
            "--tty",
            "--",
            "bash",
        ];
        let mut on_terminal = args(&argv);
        assert_eq!(tty_fallback(&mut on_terminal, true), None);
        assert!(on_terminal.tty);
        let mut piped = args(&argv);
        let warning = tty_fallback(&mut piped, false).unwrap();
        assert!(warning.contains("stdin is not a terminal"), "{warning}");
        assert!(!piped.tty);
        let params = start_params(&piped, local_env(), &Some(PathBuf::from("/"))).unwrap();
        assert!(params.pipe_stdin && !params.tty);
        let mut plain = args(
            &argv[..4]
                .iter()
                .chain(&argv[5..])
                .copied()
                .collect::<Vec<_>>(),
        );
        assert_eq!(tty_fallback(&mut plain, false), None);
    }

    #[test]
    fn a_401_says_which_flag_fixes_it() {
        let unauthorized = |token_sent| {
            with_hint(ExecCommandError::Client(ExecServerError::Unauthorized {
                endpoint: "ws://127.0.0.1:1".into(),
                token_sent,
                reason: String::new(),
            }))
            .to_string()
        };
        let without = unauthorized(false);
        assert!(
            without.contains("401 Unauthorized") && without.contains("pass --token-file FILE"),
            "{without}"
        );
        let wrong = unauthorized(true);
        assert!(wrong.contains("check that --token-file holds"), "{wrong}");
    }

    #[test]
    fn exit_status_passes_codes_through() {
        assert_eq!(exit_status(3), 3);
        assert_eq!(exit_status(130), 130);
        assert_eq!(exit_status(-1), 0);
        assert_eq!(exit_status(300), 255);
    }
}
