//! The `fs-helper` binary's two modes. Both are synchronous (no async runtime) and apply the
//! sandbox to the process itself before touching any path.
//!
//! - **One-shot**: one JSON [`HelperRequest`] on stdin (read to EOF), one JSON
//!   [`HelperResponse`] on stdout, exit 0. `fs/open` is refused here: a descriptor cannot travel
//!   through a pipe.
//! - **Serve** (`--serve --sandbox JSON`): apply that one policy once, then answer framed
//!   requests on stdin and write framed responses on stdout until EOF ([`crate::frame`]: a
//!   4-byte big-endian length and that many bytes of JSON). When stdout is a unix socket,
//!   `fs/open` passes the opened descriptor with `SCM_RIGHTS`, attached to the response's
//!   length prefix.
//!   A request whose sandbox resolves to a different policy is refused. A frame longer than
//!   [`MAX_HELPER_REQUEST_BYTES`] is skipped (never buffered) and answered with `limitExceeded`.
//!
//! Exit status is non-zero (125) only when the helper cannot set itself up (bad policy, sandbox
//! cannot be applied); the reason goes to stderr.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

use proto::error::{ErrorKind, RpcError};
use sandbox::linux::SandboxError;
use sandbox::linux::{EnforceOptions, restrict_current_process};
use sandbox::{ResolvedPolicy, SandboxSpec};
use serde_json::Value;

use crate::frame::{FrameError, read_frame, skip_body, write_frame};
use crate::wire::{
    HelperOutcome, HelperRequest, HelperResponse, MAX_HELPER_REQUEST_BYTES, Outcome,
    execute_helper_request,
};

/// Exit status when the helper cannot set itself up.
pub const EXIT_SETUP_FAILED: u8 = 125;

/// Why a wire sandbox object does not give a policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// It is not JSON.
    #[error("the sandbox is not JSON: {source}")]
    Json {
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// It is not a sandbox object.
    #[error("{source}")]
    Spec {
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// It does not resolve (unknown profile, a path that cannot be resolved, ...).
    #[error("{source}")]
    Resolve {
        /// Why.
        #[source]
        source: sandbox::PolicyError,
    },
    /// The registry of running servers (whose secrets every sandbox hides) cannot be read.
    #[cfg(target_os = "linux")]
    #[error("{source}")]
    Registry {
        /// Why.
        #[source]
        source: sandbox::servers::RegistryError,
    },
}

/// Why the helper could not set itself up (or lost its server).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `--serve` without a policy to serve.
    #[error("--serve needs --sandbox JSON (or, from exec-server, --policy-frame)")]
    ServeWithoutSandbox,
    /// The `--sandbox` or request sandbox does not give a policy.
    #[error("invalid sandbox policy: {0}")]
    Policy(#[from] PolicyError),
    /// The policy frame exec-server sent could not be read.
    #[error("cannot read the policy frame: {0}")]
    ReadPolicyFrame(#[source] FrameError),
    /// stdin ended before the policy frame.
    #[error("stdin ended before the policy frame")]
    NoPolicyFrame,
    /// The policy frame is not a resolved policy.
    #[error("the policy frame is not a resolved policy: {source}")]
    DecodePolicyFrame {
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
    /// The sandbox cannot be applied.
    #[error("cannot apply the sandbox: {0}")]
    Enforce(#[source] SandboxError),
    /// A request frame could not be read or a response frame written.
    #[error("serving requests failed: {0}")]
    Frame(#[from] FrameError),
    /// stdin/stdout failed.
    #[error("helper I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Resolve a wire sandbox object (absent or null: unrestricted) and add `denies`.
fn resolve(sandbox: Option<&Value>, denies: &[PathBuf]) -> Result<ResolvedPolicy, PolicyError> {
    let Some(sandbox) = sandbox.filter(|value| !value.is_null()) else {
        return Ok(ResolvedPolicy::unrestricted());
    };
    let spec: SandboxSpec =
        serde_json::from_value(sandbox.clone()).map_err(|source| PolicyError::Spec { source })?;
    let mut policy = spec
        .resolve()
        .map_err(|source| PolicyError::Resolve { source })?;
    for path in denies {
        policy = policy.with_hidden_path(path);
    }
    // Every running server's secrets, read here, before anything is confined.
    #[cfg(target_os = "linux")]
    {
        policy = sandbox::servers::read_registered()
            .map_err(|source| PolicyError::Registry { source })?
            .apply(policy);
    }
    Ok(policy)
}

fn restrict(policy: &ResolvedPolicy) -> Result<(), SetupError> {
    if policy.is_unrestricted() {
        return Ok(());
    }
    restrict_current_process(policy, &EnforceOptions::for_helper(&[]))
        .map(|_| ())
        .map_err(SetupError::Enforce)
}

fn respond_json(response: &HelperResponse) -> Vec<u8> {
    serde_json::to_vec(response).unwrap_or_default()
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
                let policy = resolve(request.sandbox.as_ref(), denies)?;
                restrict(&policy)?;
                match execute_helper_request(request, !policy.is_unrestricted()) {
                    Ok(HelperOutcome::Done(Outcome::Opened(..))) => Err(RpcError::invalid_request(
                        ErrorKind::Unsupported,
                        "fs/open needs the serve mode on a unix socket (the descriptor is passed with SCM_RIGHTS)",
                    )),
                    other => other,
                }
            }
        }
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&respond_json(&HelperResponse::from(response)))?;
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
        serde_json::from_str(sandbox_json).map_err(|source| PolicyError::Json { source })?;
    let policy = resolve(Some(&sandbox), denies)?;
    serve(&policy, Requests::MustMatch(denies))
}

/// Serve mode under the policy exec-server resolved, read as the first frame on stdin: this
/// helper resolves nothing, and a request carrying a `sandbox` of its own is refused.
///
/// # Errors
/// [`SetupError`] when the policy frame is missing or malformed, cannot be applied, or stdio
/// fails.
pub fn run_serve_resolved() -> Result<(), SetupError> {
    let stdin = std::io::stdin();
    let mut stdin = Stdio(stdin.as_fd());
    let frame =
        read_frame(&mut stdin, MAX_HELPER_REQUEST_BYTES).map_err(SetupError::ReadPolicyFrame)?;
    let frame = frame.ok_or(SetupError::NoPolicyFrame)?;
    let policy: ResolvedPolicy = serde_json::from_slice(&frame.body)
        .map_err(|source| SetupError::DecodePolicyFrame { source })?;
    serve(&policy, Requests::WithoutSandbox)
}

/// Unbuffered reads and writes straight on a stdio descriptor (the frame codec needs the
/// descriptor itself for `SCM_RIGHTS`; std's stdio buffers). Borrowed, not duplicated: the
/// helper holds only its socket (0, 1) and stderr (2).
struct Stdio<'a>(BorrowedFd<'a>);

impl Read for Stdio<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        nix::unistd::read(self.0, buf).map_err(std::io::Error::from)
    }
}

impl Write for Stdio<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        nix::unistd::write(self.0, buf).map_err(std::io::Error::from)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stdio<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0
    }
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
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let mut input = Stdio(stdin.as_fd());
    let mut output = Stdio(stdout.as_fd());
    loop {
        let outcome = match read_frame(&mut input, MAX_HELPER_REQUEST_BYTES) {
            Ok(None) => return Ok(()),
            // A request never carries a descriptor; one sent anyway is closed with the frame.
            Ok(Some(frame)) => serve_one(&frame.body, policy, &requests, sandboxed),
            Err(FrameError::TooLarge { len, .. }) => {
                skip_body(&mut input, len)?;
                Err(too_large())
            }
            Err(error) => return Err(error.into()),
        };
        let (response, file) = match outcome {
            Ok(HelperOutcome::Done(Outcome::Opened(file, value))) => {
                (HelperResponse::Ok(value), Some(file))
            }
            other => (HelperResponse::from(other), None),
        };
        let body = respond_json(&response);
        write_frame(&mut output, &body, file.as_ref().map(AsFd::as_fd))?;
    }
}

fn serve_one(
    body: &[u8],
    policy: &ResolvedPolicy,
    requests: &Requests<'_>,
    sandboxed: bool,
) -> Result<HelperOutcome, RpcError> {
    let request = HelperRequest::decode(body)?;
    let denies = match requests {
        Requests::MustMatch(denies) => *denies,
        Requests::WithoutSandbox if request.sandbox.as_ref().is_none_or(Value::is_null) => {
            return execute_helper_request(request, sandboxed);
        }
        Requests::WithoutSandbox => {
            let message = "this helper serves the policy exec-server resolved; a request must not carry a sandbox of its own";
            return Err(RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                message,
            ));
        }
    };
    match resolve(request.sandbox.as_ref(), denies) {
        Ok(requested) if requested == *policy => {}
        Ok(_) => {
            let message = "request sandbox differs from the policy this helper was started under; use a helper started with that policy";
            return Err(RpcError::invalid_request(
                ErrorKind::InvalidRequest,
                message,
            ));
        }
        Err(error) => {
            return Err(RpcError::invalid_params(format!(
                "invalid sandbox: {error}"
            )));
        }
    }
    execute_helper_request(request, sandboxed)
}
