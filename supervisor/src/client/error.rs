//! The client's one error type. Variants name what failed and carry its inputs; the server's
//! own errors arrive as [`ExecServerError::Rpc`] with their code and `data.kind` intact.

use std::time::Duration;

use proto::RpcError;
use proto::error::{ErrorKind, NOT_FOUND, SESSION_ATTACHED};
use proto::methods::process::WriteStatus;

fn describe_write_status(status: WriteStatus) -> &'static str {
    match status {
        WriteStatus::Accepted => "accepted",
        WriteStatus::UnknownProcess => "the server knows no such process (unknownProcess)",
        WriteStatus::StdinClosed => "its stdin is closed (stdinClosed)",
        WriteStatus::Starting => "the process is still starting (starting)",
    }
}

/// The server's explanation of a refusal, in parentheses; nothing when it gave none.
fn server_says(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" (the server says: {reason})")
    }
}

/// Why a client call failed.
///
/// The type is `Clone` because one failure (the end of recovery) is handed to every waiting
/// call and every open process handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecServerError {
    /// The URL is not `ws://HOST:PORT[/PATH]`, `wss://HOST:PORT[/PATH]` or
    /// `unix:/absolute/path`.
    #[error(
        "invalid exec-server URL {url:?}: {reason} (expected ws://HOST:PORT, wss://HOST:PORT or \
         unix:/path.sock)"
    )]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bearer token would cross the network in clear: a `ws://` URL whose host is not
    /// loopback. Refused before connecting.
    #[error(
        "refusing to send a bearer token over plain ws:// to {host:?}, which is not loopback: \
         use wss:// (exec-server --listen wss://... --tls-cert PEM --tls-key PEM)"
    )]
    PlainTextToken {
        /// The URL as given.
        url: String,
        /// Its host.
        host: String,
    },
    /// The TLS settings for a `wss://` URL are unusable (the CA file, no trust roots).
    #[error("TLS settings for {url}: {reason}")]
    Tls {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The transport could not be established (TCP/unix connect or websocket upgrade).
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect {
        /// Where we tried to connect.
        endpoint: String,
        /// The underlying error (an HTTP 401 shows up here as the status line).
        reason: String,
    },
    /// The server refused the websocket upgrade with HTTP 401: it requires a bearer token of
    /// this user (it is not the server's) and none was sent, or the one sent is not its token.
    #[error("{endpoint} answered 401 Unauthorized: {}{}", if *.token_sent {
        "the bearer token sent is not the server's"
    } else {
        "the server requires a bearer token (Authorization: Bearer) and none was sent"
    }, server_says(.reason))]
    Unauthorized {
        /// Where we tried to connect.
        endpoint: String,
        /// Whether a token was sent.
        token_sent: bool,
        /// The server's explanation (the answer's body), empty when it gave none.
        reason: String,
    },
    /// The server answered the request with an error.
    #[error("{method} failed: {error}")]
    Rpc {
        /// The method.
        method: String,
        /// The server's error, with code and `data.kind` (boxed: it is large and rare).
        error: Box<RpcError>,
    },
    /// The connection closed while a request that changes state was in flight. It is not
    /// replayed on the resumed connection because the server may already have applied it.
    #[error(
        "the connection to the exec server closed while {method} was in flight; it was not \
         replayed because the server may already have applied it"
    )]
    Disconnected {
        /// The method.
        method: String,
    },
    /// `process/start` was in flight when the connection closed, so whether the process started
    /// is unknown. Recovery terminates it if it did; start it again under a new id.
    #[error(
        "process/start of {process_id:?} was in flight when the connection closed; if it \
         started it is terminated during recovery (start it again under a new processId)"
    )]
    StartAmbiguous {
        /// The process id of the ambiguous start.
        process_id: String,
    },
    /// The client already has a live process with this id.
    #[error("process id {process_id:?} is already in use by this client; choose another processId")]
    DuplicateProcessId {
        /// The id.
        process_id: String,
    },
    /// A process could not be recovered after a reconnect; only this process is affected.
    #[error("process {process_id:?} failed: {reason}")]
    ProcessFailed {
        /// The process.
        process_id: String,
        /// Why (e.g. its missed output is no longer retained by the server).
        reason: String,
    },
    /// Recovery after a lost connection gave up; the client is unusable from now on.
    #[error("the exec-server connection was lost and could not be recovered: {reason}")]
    RecoveryFailed {
        /// The last error, or the deadline that passed.
        reason: String,
    },
    /// A file stream (`fs/open` handle) cannot survive a reconnect: handles belong to the
    /// connection and the file may have changed meanwhile.
    #[error("the connection closed during a streaming read of {path}; open the file again")]
    StreamInterrupted {
        /// The file.
        path: String,
    },
    /// `process/write` was answered with a status other than `accepted`.
    #[error("process/write to {process_id:?} was not accepted: {}", describe_write_status(*.status))]
    WriteNotAccepted {
        /// The process.
        process_id: String,
        /// The server's status.
        status: WriteStatus,
    },
    /// The server sent something this client cannot interpret.
    #[error("unexpected reply to {method}: {reason}")]
    Protocol {
        /// The method.
        method: String,
        /// What was wrong.
        reason: String,
    },
    /// A step with a deadline did not finish in time.
    #[error("{what} took longer than {timeout:?}")]
    Timeout {
        /// The step.
        what: String,
        /// Its deadline.
        timeout: Duration,
    },
    /// The client was closed with [`crate::ExecServerClient::close`].
    #[error("the exec-server client was closed")]
    Closed,
}

impl ExecServerError {
    /// The server's JSON-RPC error, when this is one.
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            ExecServerError::Rpc { error, .. } => Some(error.as_ref()),
            _ => None,
        }
    }

    /// The JSON-RPC code of a server error (e.g. -32004 not found).
    pub fn rpc_code(&self) -> Option<i64> {
        self.rpc_error().map(|error| error.code)
    }

    /// The `data.kind` of a server error.
    pub fn rpc_kind(&self) -> Option<ErrorKind> {
        self.rpc_error()
            .and_then(|error| error.data.as_ref())
            .map(|data| data.kind)
    }

    /// A -32010 "session still attached" answer: retry shortly.
    pub fn is_session_attached(&self) -> bool {
        self.rpc_code() == Some(SESSION_ATTACHED)
    }

    /// A -32004 answer (unknown process, path or handle).
    pub fn is_not_found(&self) -> bool {
        self.rpc_code() == Some(NOT_FOUND)
    }
}
