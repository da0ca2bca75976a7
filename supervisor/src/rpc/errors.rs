//! The one place internal errors become JSON-RPC errors (code, message, `data`).

use proto::error::{self as codes, ErrorKind, RpcError};

use crate::containment::plan::PlanError;
use crate::fs::FsRequestError;
use crate::http::HttpError;
use crate::process::ProcessError;
use crate::process::spawn::SpawnError;
use crate::session::SessionError;

impl From<ProcessError> for RpcError {
    fn from(error: ProcessError) -> Self {
        let error = match error {
            ProcessError::Budget(budget) => return budget.into(),
            other => other,
        };
        let message = error.to_string();
        let (code, kind) = match &error {
            ProcessError::InvalidParams(_) => (codes::INVALID_PARAMS, ErrorKind::InvalidParams),
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
            ProcessError::NotPty { .. } | ProcessError::Unsupported(_) => {
                (codes::INVALID_REQUEST, ErrorKind::Unsupported)
            }
            ProcessError::Resize(_) => (codes::INTERNAL_ERROR, ErrorKind::Io),
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
            ProcessError::Spawn(SpawnError::Nul(_)) => {
                (codes::INVALID_PARAMS, ErrorKind::InvalidParams)
            }
            ProcessError::Spawn(SpawnError::Setup { .. } | SpawnError::JoinCgroup { .. })
            | ProcessError::Containment(_) => (codes::INTERNAL_ERROR, ErrorKind::Io),
            ProcessError::Spawn(SpawnError::Rlimit { .. })
            | ProcessError::Limits(PlanError::Unenforceable { .. }) => {
                (codes::INVALID_REQUEST, ErrorKind::Unsupported)
            }
            ProcessError::Limits(PlanError::Zero { .. } | PlanError::WallTooLong { .. }) => {
                (codes::INVALID_PARAMS, ErrorKind::InvalidParams)
            }
        };
        RpcError::new(code, kind, message)
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
            FsRequestError::InvalidParams(_) => RpcError::invalid_params(message),
            FsRequestError::HandleIdLength { limit, .. } => {
                RpcError::limit_exceeded(message, limit as u64)
            }
            FsRequestError::UnknownHandle(_) => RpcError::not_found(message),
            FsRequestError::DuplicateHandle(_) => {
                RpcError::invalid_request(ErrorKind::AlreadyExists, message)
            }
            FsRequestError::TooManyHandles(limit) => {
                RpcError::limit_exceeded(message, limit as u64)
            }
            FsRequestError::Budget(budget) => budget.into(),
        }
    }
}

impl From<HttpError> for RpcError {
    fn from(error: HttpError) -> Self {
        let message = error.to_string();
        let rpc = match &error {
            HttpError::InvalidParams(_)
            | HttpError::DuplicateStream { .. }
            | HttpError::InvalidSandbox(_) => RpcError::invalid_params(message),
            HttpError::InvalidBase64(_) => {
                RpcError::new(codes::INVALID_PARAMS, ErrorKind::InvalidBase64, message)
            }
            HttpError::TooLarge { limit, .. } | HttpError::TooMany { limit, .. } => {
                RpcError::limit_exceeded(message, *limit as u64)
            }
            HttpError::NetworkOff { .. }
            | HttpError::TargetRefused { .. }
            | HttpError::NotInAllowlist { .. } => {
                RpcError::invalid_request(ErrorKind::SandboxDenied, message)
            }
            HttpError::TimedOut { .. } => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::TimedOut, message)
            }
            HttpError::Resolve { .. }
            | HttpError::Upstream { .. }
            | HttpError::TooManyRedirects { .. } => {
                RpcError::new(codes::INTERNAL_ERROR, ErrorKind::Io, message)
            }
            HttpError::Tls(_) => RpcError::internal(message),
            HttpError::ValueEnvVar { .. } => {
                RpcError::invalid_request(ErrorKind::Unsupported, message)
            }
        };
        rpc.with_operation(proto::methods::HTTP_REQUEST)
    }
}
