//! The one place internal errors become JSON-RPC errors (code, message, `data`).

use fs_helper::{FsError, FsErrorKind};
use proto::FileUri;
use proto::error::{self as codes, ErrorKind, RpcError};

use crate::fs::FsRequestError;
use crate::process::ProcessError;
use crate::process::spawn::SpawnError;
use crate::session::SessionError;

impl From<ProcessError> for RpcError {
    fn from(error: ProcessError) -> Self {
        let message = error.to_string();
        let (code, kind) = match &error {
            ProcessError::InvalidParams(_) => (codes::INVALID_PARAMS, ErrorKind::InvalidParams),
            ProcessError::InvalidBase64(_) => (codes::INVALID_PARAMS, ErrorKind::InvalidBase64),
            ProcessError::NotFound { .. } | ProcessError::CwdMissing { .. } => {
                (codes::NOT_FOUND, ErrorKind::NotFound)
            }
            ProcessError::DuplicateId { .. } => (codes::INVALID_REQUEST, ErrorKind::AlreadyExists),
            ProcessError::TooMany { limit } => {
                return RpcError::limit_exceeded(message, *limit as u64);
            }
            ProcessError::CwdNotDirectory { .. } => {
                (codes::INVALID_REQUEST, ErrorKind::NotADirectory)
            }
            ProcessError::StdinUnavailable { .. } => {
                (codes::INVALID_REQUEST, ErrorKind::StdinUnavailable)
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
            ProcessError::Spawn(SpawnError::Setup { .. }) => (codes::INTERNAL_ERROR, ErrorKind::Io),
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
            SessionError::StillAttached(_) => RpcError::new(
                codes::SESSION_ATTACHED,
                ErrorKind::SessionAttached,
                error.to_string(),
            )
            .retryable(),
        }
    }
}

/// Map a filesystem error. `sandboxed` turns permission errors into `sandboxDenied`.
pub fn fs_error(error: &FsError, sandboxed: bool) -> RpcError {
    let (code, kind) = match error.kind() {
        FsErrorKind::NotFound => (codes::NOT_FOUND, ErrorKind::NotFound),
        FsErrorKind::PermissionDenied if sandboxed => {
            (codes::INVALID_REQUEST, ErrorKind::SandboxDenied)
        }
        FsErrorKind::PermissionDenied => (codes::INVALID_REQUEST, ErrorKind::PermissionDenied),
        FsErrorKind::AlreadyExists => (codes::INVALID_REQUEST, ErrorKind::AlreadyExists),
        FsErrorKind::NotADirectory => (codes::INVALID_REQUEST, ErrorKind::NotADirectory),
        FsErrorKind::IsADirectory => (codes::INVALID_REQUEST, ErrorKind::IsADirectory),
        FsErrorKind::DirectoryNotEmpty => (codes::INVALID_REQUEST, ErrorKind::DirectoryNotEmpty),
        FsErrorKind::NotRegularFile => (codes::INVALID_REQUEST, ErrorKind::NotAFile),
        FsErrorKind::TooLarge => (codes::INVALID_REQUEST, ErrorKind::LimitExceeded),
        FsErrorKind::InvalidInput => (codes::INVALID_PARAMS, ErrorKind::InvalidParams),
        FsErrorKind::Other => (codes::INTERNAL_ERROR, ErrorKind::Io),
    };
    let mut rpc =
        RpcError::new(code, kind, error.to_string()).with_operation(error.operation().as_str());
    if let FsError::TooLarge { limit, .. } = error {
        if let Some(data) = rpc.data.as_mut() {
            data.limit = Some(*limit);
        }
    }
    if let Some(uri) = error.path().and_then(|path| FileUri::from_path(path).ok()) {
        rpc = rpc.with_path(uri.to_uri_string());
    }
    rpc
}

impl From<FsRequestError> for RpcError {
    fn from(error: FsRequestError) -> Self {
        let message = error.to_string();
        match error {
            FsRequestError::Fs(error) => fs_error(&error, false),
            FsRequestError::InvalidBase64(_) => {
                RpcError::new(codes::INVALID_PARAMS, ErrorKind::InvalidBase64, message)
            }
            FsRequestError::InvalidParams(_) => RpcError::invalid_params(message),
            FsRequestError::UnknownHandle(_) => RpcError::not_found(message),
            FsRequestError::DuplicateHandle(_) => {
                RpcError::invalid_request(ErrorKind::AlreadyExists, message)
            }
            FsRequestError::TooManyHandles(limit) => {
                RpcError::limit_exceeded(message, limit as u64)
            }
            FsRequestError::SandboxUnsupported(_) => {
                RpcError::invalid_request(ErrorKind::Unsupported, message)
            }
            FsRequestError::Join(_) => RpcError::internal(message),
        }
    }
}
