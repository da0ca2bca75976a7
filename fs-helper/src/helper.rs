//! The `fs-helper` binary's two modes. Both are synchronous (no async runtime) and apply the
//! sandbox to the process itself before touching any path.
//!
//! - **One-shot**: one JSON [`HelperRequest`] on stdin (read to EOF), one JSON
//!   [`HelperResponse`] on stdout, exit 0. `fs/open` is refused here: a descriptor cannot travel
//!   through a pipe.
//! - **Serve** (`--serve --sandbox JSON`): apply that one policy once, then answer framed
//!   requests on stdin and write framed responses on stdout until EOF. A frame is a 4-byte
//!   big-endian length and that many bytes of JSON. When stdout is a unix socket, `fs/open`
//!   passes the opened descriptor with `SCM_RIGHTS`, attached to the response's length prefix.
//!   A request whose sandbox resolves to a different policy is refused. A frame longer than
//!   [`MAX_HELPER_REQUEST_BYTES`] is skipped (never buffered) and answered with `limitExceeded`.
//!
//! Exit status is non-zero (125) only when the helper cannot set itself up (bad policy, sandbox
//! cannot be applied); the reason goes to stderr.

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use proto::error::{ErrorKind, RpcError};
use sandbox::linux::{EnforceOptions, restrict_current_process};
use sandbox::{ResolvedPolicy, SandboxSpec};
use serde_json::Value;

use crate::wire::{HelperRequest, HelperResponse, MAX_HELPER_REQUEST_BYTES, Outcome, execute};

/// Exit status when the helper cannot set itself up.
pub const EXIT_SETUP_FAILED: u8 = 125;

/// Why the helper could not set itself up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The policy does not parse or resolve.
    #[error("invalid sandbox policy: {0}")]
    Policy(String),
    /// The sandbox cannot be applied.
    #[error("cannot apply the sandbox: {0}")]
    Enforce(String),
    /// stdin/stdout failed.
    #[error("helper I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Resolve a wire sandbox object (absent or null: unrestricted) and add `denies`.
fn resolve(sandbox: Option<&Value>, denies: &[PathBuf]) -> Result<ResolvedPolicy, String> {
    let Some(sandbox) = sandbox.filter(|value| !value.is_null()) else {
        return Ok(ResolvedPolicy::unrestricted());
    };
    let spec: SandboxSpec = serde_json::from_value(sandbox.clone()).map_err(|e| e.to_string())?;
    let mut policy = spec.resolve().map_err(|e| e.to_string())?;
    for path in denies {
        policy = policy.with_hidden_path(path);
    }
    Ok(policy)
}

fn restrict(policy: &ResolvedPolicy) -> Result<(), SetupError> {
    if policy.is_unrestricted() {
        return Ok(());
    }
    restrict_current_process(policy, &EnforceOptions::for_helper(&[]))
        .map(|_| ())
        .map_err(|e| SetupError::Enforce(e.to_string()))
}

fn respond_json(result: Result<Value, RpcError>) -> Vec<u8> {
    serde_json::to_vec(&HelperResponse::from(result)).unwrap_or_default()
}

/// One-shot mode.
///
/// # Errors
/// [`SetupError`] when the policy is invalid or cannot be applied, or stdio fails.
pub fn run_one_shot(denies: &[PathBuf]) -> Result<(), SetupError> {
    let mut input = Vec::new();
    std::io::stdin()
        .lock()
        .take(MAX_HELPER_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut input)?;
    let response = if input.len() > MAX_HELPER_REQUEST_BYTES {
        Err(too_large())
    } else {
        match HelperRequest::decode(&input) {
            Err(error) => Err(error),
            Ok(request) => {
                let policy =
                    resolve(request.sandbox.as_ref(), denies).map_err(SetupError::Policy)?;
                restrict(&policy)?;
                match execute(request.request, !policy.is_unrestricted()) {
                    Ok(Outcome::Value(value)) => Ok(value),
                    Ok(Outcome::Opened(..)) => Err(RpcError::invalid_request(
                        ErrorKind::Unsupported,
                        "fs/open needs the serve mode on a unix socket (the descriptor is passed with SCM_RIGHTS)",
                    )),
                    Err(error) => Err(error),
                }
            }
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&respond_json(response))?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    Ok(())
}

fn too_large() -> RpcError {
    RpcError::limit_exceeded(
        format!("helper request larger than MAX_HELPER_REQUEST_BYTES ({MAX_HELPER_REQUEST_BYTES})"),
        MAX_HELPER_REQUEST_BYTES as u64,
    )
}

/// Serve mode under `sandbox_json`, resolved here (the helper run on its own).
///
/// # Errors
/// [`SetupError`] when the policy is invalid or cannot be applied, or stdio fails.
pub fn run_serve(sandbox_json: &str, denies: &[PathBuf]) -> Result<(), SetupError> {
    let sandbox: Value =
        serde_json::from_str(sandbox_json).map_err(|e| SetupError::Policy(e.to_string()))?;
    let policy = resolve(Some(&sandbox), denies).map_err(SetupError::Policy)?;
    serve(&policy, Requests::MustMatch(denies))
}

/// Serve mode under the policy exec-server resolved, read as the first frame on stdin: this
/// helper resolves nothing, and a request carrying a `sandbox` of its own is refused.
///
/// # Errors
/// [`SetupError`] when the policy frame is missing or malformed, cannot be applied, or stdio
/// fails.
pub fn run_serve_resolved() -> Result<(), SetupError> {
    let mut stdin = std::io::stdin().lock();
    let mut header = [0u8; 4];
    stdin.read_exact(&mut header)?;
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_HELPER_REQUEST_BYTES {
        return Err(SetupError::Policy(
            "the policy frame is larger than MAX_HELPER_REQUEST_BYTES".to_owned(),
        ));
    }
    let mut body = vec![0u8; len];
    stdin.read_exact(&mut body)?;
    drop(stdin);
    let policy: ResolvedPolicy =
        serde_json::from_slice(&body).map_err(|e| SetupError::Policy(e.to_string()))?;
    serve(&policy, Requests::WithoutSandbox)
}

/// How serve mode treats a request's own `sandbox` member.
enum Requests<'a> {
    /// It must resolve (with these denies) to the policy being served.
    MustMatch(&'a [PathBuf]),
    /// It must be absent (the server resolved the policy).
    WithoutSandbox,
}

fn serve(policy: &ResolvedPolicy, requests: Requests<'_>) -> Result<(), SetupError> {
    restrict(policy)?;
    let sandboxed = !policy.is_unrestricted();
    let mut stdin = std::io::stdin().lock();
    let stdout = std::io::stdout();
    loop {
        let mut header = [0u8; 4];
        match stdin.read_exact(&mut header) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let len = u32::from_be_bytes(header) as usize;
        let (response, file) = if len > MAX_HELPER_REQUEST_BYTES {
            std::io::copy(&mut (&mut stdin).take(len as u64), &mut std::io::sink())?;
            (Err(too_large()), None)
        } else {
            let mut body = vec![0u8; len];
            stdin.read_exact(&mut body)?;
            serve_one(&body, policy, &requests, sandboxed)
        };
        let body = respond_json(response);
        write_frame(&stdout, &body, file.as_ref())?;
    }
}

fn serve_one(
    body: &[u8],
    policy: &ResolvedPolicy,
    requests: &Requests<'_>,
    sandboxed: bool,
) -> (Result<Value, RpcError>, Option<std::fs::File>) {
    let request = match HelperRequest::decode(body) {
        Ok(request) => request,
        Err(error) => return (Err(error), None),
    };
    let denies = match requests {
        Requests::MustMatch(denies) => *denies,
        Requests::WithoutSandbox if request.sandbox.as_ref().is_none_or(Value::is_null) => {
            return execute_one(request, sandboxed);
        }
        Requests::WithoutSandbox => {
            let message = "this helper serves the policy exec-server resolved; a request must not carry a sandbox of its own";
            return (
                Err(RpcError::invalid_request(
                    ErrorKind::InvalidRequest,
                    message,
                )),
                None,
            );
        }
    };
    match resolve(request.sandbox.as_ref(), denies) {
        Ok(requested) if requested == *policy => {}
        Ok(_) => {
            let message = "request sandbox differs from the policy this helper was started under; use a helper started with that policy";
            return (
                Err(RpcError::invalid_request(
                    ErrorKind::InvalidRequest,
                    message,
                )),
                None,
            );
        }
        Err(error) => {
            return (
                Err(RpcError::invalid_params(format!(
                    "invalid sandbox: {error}"
                ))),
                None,
            );
        }
    }
    execute_one(request, sandboxed)
}

fn execute_one(
    request: HelperRequest,
    sandboxed: bool,
) -> (Result<Value, RpcError>, Option<std::fs::File>) {
    match execute(request.request, sandboxed) {
        Ok(Outcome::Value(value)) => (Ok(value), None),
        Ok(Outcome::Opened(file, value)) => (Ok(value), Some(file)),
        Err(error) => (Err(error), None),
    }
}

/// Write one frame; attach `file` to its length prefix with SCM_RIGHTS.
fn write_frame(
    stdout: &std::io::Stdout,
    body: &[u8],
    file: Option<&std::fs::File>,
) -> std::io::Result<()> {
    let header = (body.len() as u32).to_be_bytes();
    let mut out = stdout.lock();
    match file {
        None => out.write_all(&header)?,
        Some(file) => {
            use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
            let fds = [file.as_raw_fd()];
            let sent = sendmsg::<()>(
                out.as_fd().as_raw_fd(),
                &[IoSlice::new(&header)],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .map_err(std::io::Error::from)?;
            out.write_all(&header[sent..])?;
        }
    }
    out.write_all(body)?;
    out.flush()
}
