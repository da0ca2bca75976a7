//! The `process/*` methods: params in, results out; errors are [`ProcessError`]s mapped to
//! JSON-RPC in one place (`rpc::errors`).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use nix::sys::signal::Signal;
use proto::methods::process::{
    OutputChunk, ReadParams, ReadResult, ResizeParams, RunningResult, SignalName, SignalParams,
    StartParams, StartResult, TerminateParams, WriteParams, WriteResult, WriteStatus,
};

use super::managed::{ManagedProcess, Stdin};
use super::pump::{self, PumpIo};
use super::spawn::{ChildIo, SpawnSpec, spawn};
use super::{Lookup, ProcessError, env_policy};
use crate::limits::{DEFAULT_PTY_COLS, DEFAULT_PTY_ROWS, MAX_READ_BYTES, MAX_WAIT_MS};
use crate::server::ServerState;
use crate::session::Session;

/// `process/start`.
///
/// # Errors
/// See [`ProcessError`].
pub async fn start(
    session: &Session,
    server: &ServerState,
    params: StartParams,
) -> Result<StartResult, ProcessError> {
    if params.argv.is_empty() {
        return Err(ProcessError::InvalidParams(
            "argv must not be empty; pass at least the program".into(),
        ));
    }
    let cwd = params.cwd.as_path().to_path_buf();
    // A stat of a local directory is quick enough to do inline (no blocking-pool hop).
    match std::fs::metadata(&cwd) {
        Err(_) => return Err(ProcessError::CwdMissing { path: cwd }),
        Ok(metadata) if !metadata.is_dir() => {
            return Err(ProcessError::CwdNotDirectory { path: cwd });
        }
        Ok(_) => {}
    }
    let reservation = session.processes.reserve(&params.process_id)?;
    let pty = params.tty.then(|| {
        (
            params.cols.unwrap_or(DEFAULT_PTY_COLS),
            params.rows.unwrap_or(DEFAULT_PTY_ROWS),
        )
    });
    let audit = params.audit_denials;
    if params.enforce_managed_network {
        refuse_unmanaged_network(params.sandbox.as_ref())?;
    }
    let env = env_policy::child_env(
        params.env_policy.as_ref(),
        env_policy::server_env(),
        params.env,
    );
    let argv = sandboxed_argv(
        server,
        params.sandbox.as_ref(),
        &cwd,
        params.argv,
        params.arg0.is_some(),
        audit,
    )?;
    let spec = SpawnSpec {
        argv,
        arg0: params.arg0,
        cwd,
        env,
        pty,
        pipe_stdin: params.pipe_stdin,
        audit_pipe: audit,
    };
    let spawned = spawn(&spec)?;
    server.guardian.register(spawned.pid);
    let (stdin, pty_master, pump_io) = match spawned.io {
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let stdin = match stdin {
                Some(pipe) => Stdin::Pipe(pipe),
                None => Stdin::Unavailable("the process was started without pipeStdin (or tty)"),
            };
            (stdin, None, PumpIo::Pipes(stdout, stderr))
        }
        ChildIo::Pty(master) => {
            let master = Arc::new(master);
            (
                Stdin::Pty(master.clone()),
                Some(master.clone()),
                PumpIo::Pty(master),
            )
        }
    };
    let process = Arc::new(ManagedProcess::new(
        params.process_id.clone(),
        spawned.pid,
        stdin,
        pty_master,
    ));
    reservation.fill(process.clone());
    tokio::spawn(pump::run(
        process,
        spawned.exit,
        pump_io,
        spawned.audit,
        session.attachment.clone(),
        Arc::downgrade(&session.processes),
        server.guardian.clone(),
    ));
    Ok(StartResult {
        process_id: params.process_id,
    })
}

/// `process/read`.
///
/// # Errors
/// [`ProcessError::NotFound`].
pub async fn read(session: &Session, params: ReadParams) -> Result<ReadResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let max_bytes = params
        .max_bytes
        .unwrap_or(MAX_READ_BYTES)
        .min(MAX_READ_BYTES);
    let wait = Duration::from_millis(params.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let read = process
        .read(params.after_seq.unwrap_or(0), max_bytes, wait)
        .await;
    Ok(ReadResult {
        chunks: read
            .chunks
            .into_iter()
            .map(|chunk| OutputChunk {
                seq: chunk.seq,
                stream: chunk.stream,
                chunk: base64_simd::STANDARD.encode_to_string(&chunk.data),
            })
            .collect(),
        next_seq: read.next_seq,
        exited: read.exit.is_some(),
        exit_code: read.exit.map(|exit| exit.code),
        signal: read.exit.and_then(|exit| exit.signal),
        exit_seq: read.exit.map(|exit| exit.seq),
        closed: read.closed_seq.is_some(),
        closed_seq: read.closed_seq,
        failure: None,
        output_dropped: read.dropped.is_some(),
        first_retained_seq: read.dropped,
        denials: process.denials(),
        denials_dropped: process.denials_dropped(),
    })
}

/// `process/write`: the state of the process is a status (`unknownProcess`, `starting`,
/// `stdinClosed`, `accepted`), never an error.
///
/// # Errors
/// Invalid base64 only.
pub async fn write(session: &Session, params: WriteParams) -> Result<WriteResult, ProcessError> {
    let data = base64::engine::general_purpose::STANDARD
        .decode(params.chunk.as_bytes())
        .map_err(|error| ProcessError::InvalidBase64(error.to_string()))?;
    let status = match session.processes.lookup(&params.process_id) {
        Lookup::Missing => WriteStatus::UnknownProcess,
        Lookup::Starting => WriteStatus::Starting,
        Lookup::Ready(process) => {
            process
                .write(&data, params.write_id.as_deref(), params.close)
                .await
        }
    };
    Ok(WriteResult { status })
}

/// `process/signal`.
///
/// # Errors
/// [`ProcessError::NotFound`].
pub fn signal(session: &Session, params: SignalParams) -> Result<RunningResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let signal = match params.signal {
        SignalName::Interrupt => Signal::SIGINT,
        SignalName::Terminate => Signal::SIGTERM,
        SignalName::Kill => Signal::SIGKILL,
        SignalName::Hangup => Signal::SIGHUP,
    };
    Ok(RunningResult {
        running: process.signal(signal),
    })
}

/// `process/resize`.
///
/// # Errors
/// Unknown process, not a PTY, resize failure.
pub fn resize(session: &Session, params: ResizeParams) -> Result<(), ProcessError> {
    if params.cols == 0 || params.rows == 0 {
        return Err(ProcessError::InvalidParams(
            "cols and rows must be at least 1".into(),
        ));
    }
    session
        .processes
        .get(&params.process_id)?
        .resize(params.cols, params.rows)
}

/// `process/terminate`: `{running: false}` for unknown or exited processes.
pub fn terminate(session: &Session, params: TerminateParams) -> RunningResult {
    let running = session
        .processes
        .get(&params.process_id)
        .is_ok_and(|process| process.terminate());
    RunningResult { running }
}

/// Terminate every process of a session and wait (bounded) for them to exit.
pub async fn terminate_all(processes: Vec<Arc<ManagedProcess>>) {
    for process in &processes {
        process.terminate();
    }
    for process in &processes {
        if !process
            .wait_exit(crate::limits::TERMINATE_GRACE + Duration::from_secs(1))
            .await
        {
            process.signal(Signal::SIGKILL);
        }
    }
}

/// `enforceManagedNetwork` asks that the command reach the network only through a managed
/// proxy, which this server cannot enforce: refuse unless the sandbox turns the network off
/// altogether (stricter than asked), rather than run the command with the network open.
fn refuse_unmanaged_network(sandbox: Option<&serde_json::Value>) -> Result<(), ProcessError> {
    let network_off = match sandbox.filter(|value| !value.is_null()) {
        None => false,
        Some(sandbox) => {
            let spec: sandbox::SandboxSpec =
                serde_json::from_value(sandbox.clone()).map_err(|e| {
                    ProcessError::InvalidParams(format!(
                        "invalid sandbox: {e}; see policies/README.md"
                    ))
                })?;
            let policy = spec
                .resolve()
                .map_err(|e| ProcessError::InvalidParams(format!("invalid sandbox: {e}")))?;
            !policy.network_allowed()
        }
    };
    if network_off {
        return Ok(());
    }
    Err(ProcessError::Unsupported(
        "enforceManagedNetwork: this server cannot confine a command's network to a managed \
         proxy; send a sandbox whose network is off, or leave enforceManagedNetwork out to run \
         with the network the sandbox allows"
            .into(),
    ))
}

/// The argv to spawn: `argv` itself, or `sandbox-run` (found next to the server) applying the
/// request's sandbox and then exec'ing `argv` in place, so pid, exit status and signals are the
/// program's.
fn sandboxed_argv(
    server: &ServerState,
    sandbox: Option<&serde_json::Value>,
    cwd: &std::path::Path,
    argv: Vec<String>,
    has_arg0: bool,
    audit: bool,
) -> Result<Vec<String>, ProcessError> {
    let needs_sandbox =
        || ProcessError::InvalidParams("auditDenials needs a restricting sandbox".into());
    let Some(sandbox) = sandbox.filter(|value| !value.is_null()) else {
        return if audit {
            Err(needs_sandbox())
        } else {
            Ok(argv)
        };
    };
    let spec: sandbox::SandboxSpec = serde_json::from_value(sandbox.clone()).map_err(|e| {
        ProcessError::InvalidParams(format!("invalid sandbox: {e}; see policies/README.md"))
    })?;
    let policy = spec
        .resolve()
        .map_err(|e| ProcessError::InvalidParams(format!("invalid sandbox: {e}")))?;
    if policy.is_unrestricted() {
        return if audit {
            Err(needs_sandbox())
        } else {
            Ok(argv)
        };
    }
    if has_arg0 {
        return Err(ProcessError::InvalidParams(
            "arg0 cannot be combined with a sandbox (sandbox-run execs argv[0])".into(),
        ));
    }
    let text = |path: &std::path::Path| path.to_str().map(str::to_owned);
    let runner = text(&server.runtime_paths.sandbox_run)
        .ok_or_else(|| ProcessError::Unsupported("the sandbox-run path is not UTF-8".into()))?;
    let mut wrapped = vec![runner, "--policy-json".to_owned(), sandbox.to_string()];
    if spec.cwd.is_none() {
        let cwd = text(cwd).ok_or_else(|| {
            ProcessError::InvalidParams("cwd must be UTF-8 for a sandboxed start".into())
        })?;
        wrapped.extend(["--cwd".to_owned(), cwd]);
    }
    for path in &server.sandbox_denies {
        if let Some(path) = text(path) {
            wrapped.extend(["--deny".to_owned(), path]);
        }
    }
    if audit {
        wrapped.extend(["--audit-fd".to_owned(), super::spawn::AUDIT_FD.to_string()]);
    }
    wrapped.push("--".to_owned());
    wrapped.extend(argv);
    Ok(wrapped)
}
