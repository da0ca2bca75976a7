//! The one place internal errors become JSON-RPC errors (code, message, `data`).

use crate::sandboxing::SandboxRequestError;
use proto::error::{self as codes, ErrorKind, RpcError};

/// `data.operation` of a `process/start` error whose program could not be found or executed.
pub const EXEC_OPERATION: &str = "exec";

use crate::budget::BudgetError;
use crate::containment::plan::PlanError;
use crate::fs::FsRequestError;
use crate::fs::helpers::HelperFailure;
use crate::http::HttpError;
use crate::process::ProcessError;
use crate::process::launcher::LauncherError;
use crate::process::spawn::SpawnError;
use crate::rpc::shared::ConnectionError;
use crate::session::SessionError;
use sandbox::linux::launcher::FailureKind;

impl From<ProcessError> for RpcError {
    fn from(error: ProcessError) -> Self {
        let error = match error {
            ProcessError::Budget(budget) => return budget.into(),
            other => other,
        };
        let message = error.to_string();
        let error_source_for_exec = match &error {
            ProcessError::Spawn(spawn) => Some(spawn),
            _ => None,
        };
        let (code, kind) = match &error {
            ProcessError::Sandbox(SandboxRequestError::Registry(_)) => {
                (codes::INTERNAL_ERROR, ErrorKind::HelperFailed)
            }
            ProcessError::EmptyArgv
            | ProcessError::ProcessIdLength { .. }
            | ProcessError::AuditWithoutSandbox
            | ProcessError::Arg0WithSandbox { .. }
            | ProcessError::ZeroTerminalSize { .. }
            | ProcessError::Sandbox(_)
            | ProcessError::CwdRefused { .. }
            | ProcessError::CwdNotUtf8 { .. } => (codes::INVALID_PARAMS, ErrorKind::InvalidParams),
            ProcessError::InvalidBase64(_) => (codes::INVALID_PARAMS, ErrorKind::InvalidBase64),
            ProcessError::NotFound { .. } | ProcessError::CwdMissing { .. } => {
                (codes::NOT_FOUND, ErrorKind::NotFound)
            }
            ProcessError::DuplicateId { .. } => (codes::INVALID_REQUEST, ErrorKind::AlreadyExists),
            ProcessError::TooMany { limit } | ProcessError::TooLong { limit, .. } => {
                return RpcError::limit_exceeded(message, *limit as u64);
            }
            // Returned above.
            ProcessError::Budget(_) => (codes::INTERNAL_ERROR, ErrorKind::Internal),
            ProcessError::CwdNotDirectory { .. } => {
                (codes::INVALID_REQUEST, ErrorKind::NotADirectory)
            }
            ProcessError::CwdDenied { .. } => (codes::INVALID_REQUEST, ErrorKind::SandboxDenied),
            ProcessError::NotPty { .. } | ProcessError::Unsupported { .. } => {
                (codes::INVALID_REQUEST, ErrorKind::Unsupported)
            }
            ProcessError::Resize { .. } | ProcessError::TerminalClosed { .. } => {
                (codes::INTERNAL_ERROR, ErrorKind::Io)
            }
            ProcessError::Spawn(SpawnError::Exec { source, .. }) => match source.kind() {
                std::io::ErrorKind::NotFound => (codes::NOT_FOUND, ErrorKind::NotFound),
                std::io::ErrorKind::PermissionDenied => {
                    (codes::INVALID_REQUEST, ErrorKind::PermissionDenied)
                }
                _ => (codes::INTERNAL_ERROR, ErrorKind::Io),
            },
            ProcessError::Spawn(SpawnError::NotFound { .. }) => {
                (codes::NOT_FOUND, ErrorKind::NotFound)
            }
            ProcessError::Spawn(SpawnError::Nul(_) | SpawnError::EnvName { .. }) => {
                (codes::INVALID_PARAMS, ErrorKind::InvalidParams)
            }
            ProcessError::Spawn(SpawnError::Setup { .. } | SpawnError::JoinCgroup { .. })
            | ProcessError::Containment(_) => (codes::INTERNAL_ERROR, ErrorKind::Io),
            ProcessError::Launcher(failure) => launcher_kind(&failure.error),
            ProcessError::Spawn(SpawnError::Rlimit { .. })
            | ProcessError::Limits(PlanError::Unenforceable { .. }) => {
                (codes::INVALID_REQUEST, ErrorKind::Unsupported)
            }
            ProcessError::Limits(PlanError::Zero { .. } | PlanError::WallTooLong { .. }) => {
                (codes::INVALID_PARAMS, ErrorKind::InvalidParams)
            }
        };
        let error = RpcError::new(code, kind, message);
        // The program itself could not be found or executed (not its cwd, not a limit):
        // `operation: "exec"` lets a client tell it apart, as a shell's 127/126 do.
        if matches!(
            &error_source_for_exec,
            Some(SpawnError::NotFound { .. } | SpawnError::Exec { .. })
        ) {
            return error.with_operation(EXEC_OPERATION);
        }
        error
    }
}

/// The code and `data.kind` of a launcher's failure, by the stage its `Reply::Failed` named: a
/// policy it does not serve is `unsupported`, a message it did not understand is the server's
/// bug (`internal`), its own confinement, making the command's PID 1 and the hand-over are a
/// sandbox helper that failed to set up (`helperFailed`). The stage's name is in the message.
fn launcher_kind(error: &LauncherError) -> (i64, ErrorKind) {
    match error {
        LauncherError::Refused { kind, .. } => match kind {
            FailureKind::Unsupported => (codes::INVALID_REQUEST, ErrorKind::Unsupported),
            FailureKind::Protocol => (codes::INTERNAL_ERROR, ErrorKind::Internal),
            FailureKind::Confinement | FailureKind::Pid1 | FailureKind::Handover => {
                (codes::INTERNAL_ERROR, ErrorKind::HelperFailed)
            }
        },
        _ => (codes::INTERNAL_ERROR, ErrorKind::HelperFailed),
    }
}

impl From<HelperFailure> for RpcError {
    fn from(failure: HelperFailure) -> Self {
        let HelperFailure { error, stderr } = failure;
        let message = if stderr.is_empty() {
            format!("fs-helper failed: {error}")
        } else {
            format!("fs-helper failed: {error}; its stderr: {stderr}")
        };
        RpcError::new(codes::INTERNAL_ERROR, ErrorKind::HelperFailed, message)
    }
}

impl From<ConnectionError> for RpcError {
    fn from(error: ConnectionError) -> Self {
        let message = error.to_string();
        match error {
            ConnectionError::NotInitialized { .. } => {
                RpcError::invalid_request(ErrorKind::NotInitialized, message)
            }
            ConnectionError::UnexpectedNotification { .. } => {
                RpcError::invalid_request(ErrorKind::UnexpectedNotification, message)
            }
            ConnectionError::UnexpectedResponse | ConnectionError::ClosedWhileReading => {
                RpcError::invalid_request(ErrorKind::InvalidRequest, message)
            }
            ConnectionError::AlreadyInitialized => {
                RpcError::invalid_request(ErrorKind::AlreadyInitialized, message)
            }
            ConnectionError::ClientNameTooLong { limit, .. } => {
                RpcError::limit_exceeded(message, limit as u64)
            }
            ConnectionError::TooManyConnections { limit, .. } => {
                RpcError::limit_exceeded(message, limit as u64).retryable()
            }
        }
    }
}

impl From<BudgetError> for RpcError {
    fn from(error: BudgetError) -> Self {
        let message = error.to_string();
        match error {
            BudgetError::Memory { limit, .. }
            | BudgetError::Descriptors { limit, .. }
            | BudgetError::Processes { limit } => {
                RpcError::limit_exceeded(message, limit as u64).retryable()
            }
            BudgetError::Closed | BudgetError::TaskFailed(_) | BudgetError::CpuJobFailed(_) => {
                RpcError::internal(message)
            }
        }
    }
}

impl From<SessionError> for RpcError {
    fn from(error: SessionError) -> Self {
        match error {
            SessionError::Unknown(_) => {
                RpcError::invalid_request(ErrorKind::UnknownSession, error.to_string())
            }
            SessionError::TooMany { limit } => {
                RpcError::limit_exceeded(error.to_string(), limit as u64).retryable()
            }
            SessionError::StillAttached(_) => RpcError::new(
                codes::SESSION_ATTACHED,
                ErrorKind::SessionAttached,
                error.to_string(),
            )
            .retryable(),
        }
    }
}

impl From<FsRequestError> for RpcError {
    fn from(error: FsRequestError) -> Self {
        let message = error.to_string();
        match error {
            // The server could not read what it hides (out of descriptors, say): its failure,
            // not the client's params, and worth a retry.
            FsRequestError::Sandbox(SandboxRequestError::Registry(_)) => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::HelperFailed, message).retryable()
            }
            FsRequestError::BlockLength { .. } | FsRequestError::Sandbox(_) => {
                RpcError::invalid_params(message)
            }
            FsRequestError::OpenWithoutDescriptor => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::HelperFailed, message)
            }
            FsRequestError::UnexpectedDescriptor => RpcError::internal(message),
            FsRequestError::HandleIdLength { limit, .. } => {
                RpcError::limit_exceeded(message, limit as u64)
            }
            FsRequestError::UnknownHandle(_) => RpcError::not_found(message),
            FsRequestError::DuplicateHandle(_) => {
                RpcError::invalid_request(ErrorKind::AlreadyExists, message)
            }
            // The reference's text (its tests compare it); ours names the constant, in
            // `data.detail`.
            FsRequestError::TooManyHandles(limit) => {
                RpcError::limit_exceeded(message, limit as u64).with_reference_message(format!(
                    "at most {limit} file reads may be open per connection"
                ))
            }
            FsRequestError::Budget(budget) => budget.into(),
        }
    }
}

impl From<HttpError> for RpcError {
    fn from(error: HttpError) -> Self {
        let message = error.to_string();
        let rpc = match &error {
            HttpError::RequestIdLength { .. }
            | HttpError::InvalidMethod { .. }
            | HttpError::ConnectMethod
            | HttpError::InvalidUrl { .. }
            | HttpError::UnsupportedScheme { .. }
            | HttpError::UrlWithoutHost { .. }
            | HttpError::UrlWithoutPort { .. }
            | HttpError::InvalidHeaderName { .. }
            | HttpError::InvalidHeaderValue { .. }
            | HttpError::DuplicateStream { .. }
            | HttpError::SandboxShape(_)
            | HttpError::SandboxPolicy(_) => RpcError::invalid_params(message),
            HttpError::InvalidBase64(_) => {
                RpcError::new(codes::INVALID_PARAMS, ErrorKind::InvalidBase64, message)
            }
            HttpError::TooLarge { limit, .. } | HttpError::TooMany { limit, .. } => {
                RpcError::limit_exceeded(message, *limit as u64)
            }
            HttpError::NetworkOff { .. }
            | HttpError::TargetRefused { .. }
            | HttpError::NotInAllowlist { .. }
            | HttpError::HostHeaderMismatch { .. } => {
                RpcError::invalid_request(ErrorKind::SandboxDenied, message)
            }
            HttpError::TimedOut { .. } => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::TimedOut, message)
            }
            HttpError::Resolve { .. }
            | HttpError::NoAddress { .. }
            | HttpError::Upstream { .. }
            | HttpError::TooManyRedirects { .. } => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::Io, message)
            }
            HttpError::Tls(_) | HttpError::Client(_) => RpcError::internal(message),
            HttpError::ValueEnvVar { .. } => {
                RpcError::invalid_request(ErrorKind::Unsupported, message)
            }
        };
        rpc.with_operation(proto::methods::HTTP_REQUEST)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::error::Error as _;

    use base64::Engine as _;

    use super::*;
    use crate::process::UnsupportedFeature;

    fn invalid_base64() -> base64::DecodeError {
        base64::engine::general_purpose::STANDARD
            .decode("!!")
            .unwrap_err()
    }

    #[test]
    fn each_invalid_process_input_is_invalid_params_naming_the_input() {
        let cases = [
            (ProcessError::EmptyArgv, "argv must not be empty"),
            (
                ProcessError::ProcessIdLength {
                    length: 129,
                    limit: 128,
                },
                "processId must be 1 to 128 bytes (got 129)",
            ),
            (
                ProcessError::Arg0WithSandbox {
                    arg0: "login-shell\n".into(),
                },
                "arg0 \"login-shell\\n\" cannot be combined with a sandbox",
            ),
            (
                ProcessError::ZeroTerminalSize { cols: 0, rows: 24 },
                "cols and rows must be at least 1 (got cols 0, rows 24)",
            ),
            (
                ProcessError::AuditWithoutSandbox,
                "auditDenials needs a restricting sandbox",
            ),
            (
                ProcessError::Spawn(SpawnError::EnvName { name: "A=B".into() }),
                "environment variable name \"A=B\" is empty or contains '='",
            ),
        ];
        for (error, expected) in cases {
            let rpc = RpcError::from(error);
            assert_eq!(rpc.code, codes::INVALID_PARAMS, "{rpc:?}");
            assert_eq!(rpc.kind(), Some(ErrorKind::InvalidParams), "{rpc:?}");
            assert!(rpc.message.contains(expected), "{rpc:?}");
        }
    }

    #[test]
    fn invalid_base64_chunk_keeps_the_decoder_error_as_its_source() {
        let error = ProcessError::InvalidBase64(invalid_base64());
        assert!(error.source().is_some());
        let rpc = RpcError::from(error);
        assert_eq!(rpc.code, codes::INVALID_PARAMS);
        assert_eq!(rpc.kind(), Some(ErrorKind::InvalidBase64));
        assert!(
            rpc.message.starts_with("chunk is not valid base64: "),
            "{rpc:?}"
        );
    }

    #[test]
    fn resize_failure_names_the_process_and_keeps_the_os_error() {
        let error = ProcessError::Resize {
            process_id: "p1".into(),
            cols: 80,
            rows: 24,
            source: std::io::Error::from_raw_os_error(libc::ENOTTY),
        };
        let os = error
            .source()
            .and_then(|source| source.downcast_ref::<std::io::Error>())
            .and_then(std::io::Error::raw_os_error);
        assert_eq!(os, Some(libc::ENOTTY));
        let rpc = RpcError::from(error);
        assert_eq!(rpc.code, codes::INTERNAL_ERROR);
        assert!(rpc.message.contains("\"p1\""), "{rpc:?}");
        assert!(rpc.message.contains("80x24"), "{rpc:?}");
    }

    #[test]
    fn an_unsupported_feature_is_refused_as_unsupported_naming_the_field() {
        let rpc = RpcError::from(ProcessError::Unsupported {
            feature: UnsupportedFeature::EnforceManagedNetworkWithOpenNetwork,
        });
        assert_eq!(rpc.code, codes::INVALID_REQUEST);
        assert_eq!(rpc.kind(), Some(ErrorKind::Unsupported));
        assert!(
            rpc.message.starts_with("enforceManagedNetwork: "),
            "{rpc:?}"
        );
    }

    #[test]
    fn a_malformed_sandbox_is_invalid_params_for_processes_and_http_alike() {
        let shape = || serde_json::from_str::<sandbox::SandboxSpec>("42").unwrap_err();
        let process = RpcError::from(ProcessError::Sandbox(
            crate::sandboxing::SandboxRequestError::Shape(shape()),
        ));
        let http = RpcError::from(HttpError::SandboxShape(shape()));
        for rpc in [process, http] {
            assert_eq!(rpc.code, codes::INVALID_PARAMS, "{rpc:?}");
            assert!(rpc.message.starts_with("invalid sandbox: "), "{rpc:?}");
            assert!(rpc.message.contains("policies/README.md"), "{rpc:?}");
        }
    }

    #[test]
    fn http_body_base64_error_is_invalid_base64() {
        let rpc = RpcError::from(HttpError::InvalidBase64(invalid_base64()));
        assert_eq!(rpc.code, codes::INVALID_PARAMS);
        assert_eq!(rpc.kind(), Some(ErrorKind::InvalidBase64));
    }

    #[test]
    fn a_launcher_failure_carries_its_stage_into_the_kind_and_message() {
        let refused = |kind| {
            RpcError::from(ProcessError::Launcher(
                crate::process::launcher::LauncherFailure {
                    error: LauncherError::Refused {
                        error: "cloning PID 1: EAGAIN".to_owned(),
                        kind,
                    },
                    stderr: String::new(),
                },
            ))
        };
        let cases = [
            (
                FailureKind::Unsupported,
                codes::INVALID_REQUEST,
                ErrorKind::Unsupported,
            ),
            (
                FailureKind::Protocol,
                codes::INTERNAL_ERROR,
                ErrorKind::Internal,
            ),
            (
                FailureKind::Confinement,
                codes::INTERNAL_ERROR,
                ErrorKind::HelperFailed,
            ),
            (
                FailureKind::Pid1,
                codes::INTERNAL_ERROR,
                ErrorKind::HelperFailed,
            ),
            (
                FailureKind::Handover,
                codes::INTERNAL_ERROR,
                ErrorKind::HelperFailed,
            ),
        ];
        for (stage, code, kind) in cases {
            let rpc = refused(stage);
            assert_eq!(rpc.code, code, "{rpc:?}");
            assert_eq!(rpc.data.as_ref().map(|d| d.kind), Some(kind), "{rpc:?}");
            assert!(
                rpc.message
                    .contains(&format!("(stage {}): cloning PID 1: EAGAIN", stage.name())),
                "{rpc:?}"
            );
        }
    }
}
