//! Method routing: parse params into the method's typed struct, call its handler, serialize the
//! result. Errors become JSON-RPC errors through `errors` (the only mapping).

use std::sync::Arc;

use proto::error::{ErrorKind, RpcError};
use proto::methods::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::connection::Connection;
use crate::fs;
use crate::process::handlers;
use crate::session::Session;

/// Route one request.
///
/// # Errors
/// The method's error, mapped to JSON-RPC.
pub async fn dispatch(
    connection: &Arc<Connection>,
    session: &Arc<Session>,
    method: &str,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    match method {
        PROCESS_START => {
            let guardian = &connection.server.guardian;
            to_value(handlers::start(session, guardian, parse_params(method, params)?).await?)
        }
        PROCESS_READ => {
            let params = parse_params(method, params)?;
            let mut closed = connection.closed.clone();
            tokio::select! {
                result = handlers::read(session, params) => to_value(result?),
                _ = closed.wait_for(|closed| *closed) => Err(RpcError::invalid_request(
                    ErrorKind::InvalidRequest,
                    "the connection closed while this read was waiting",
                )),
            }
        }
        PROCESS_WRITE => to_value(handlers::write(session, parse_params(method, params)?).await?),
        PROCESS_SIGNAL => to_value(handlers::signal(session, parse_params(method, params)?)?),
        PROCESS_RESIZE => {
            handlers::resize(session, parse_params(method, params)?)?;
            to_value(Empty {})
        }
        PROCESS_TERMINATE => to_value(handlers::terminate(session, parse_params(method, params)?)),
        FS_READ_FILE => fs::read_file(connection, parse_params(method, params)?).await,
        FS_WRITE_FILE => fs::write_file(connection, parse_params(method, params)?).await,
        FS_CREATE_DIRECTORY => {
            fs::create_directory(connection, parse_params(method, params)?).await
        }
        FS_GET_METADATA => fs::get_metadata(connection, parse_params(method, params)?).await,
        FS_CANONICALIZE => fs::canonicalize(connection, parse_params(method, params)?).await,
        FS_READ_DIRECTORY => fs::read_directory(connection, parse_params(method, params)?).await,
        FS_REMOVE => fs::remove(connection, parse_params(method, params)?).await,
        FS_COPY => fs::copy(connection, parse_params(method, params)?).await,
        FS_OPEN => fs::open(connection, parse_params(method, params)?).await,
        FS_READ_BLOCK => fs::read_block(connection, parse_params(method, params)?).await,
        FS_CLOSE => fs::close(connection, parse_params(method, params)?),
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// Parse params; absent params are read as `{}` so the error names the missing field.
///
/// # Errors
/// -32602 naming the method and what was wrong (`invalidPath` for a bad `file:` URI).
pub fn parse_params<T: DeserializeOwned>(
    method: &str,
    params: Option<Value>,
) -> Result<T, RpcError> {
    let params = match params {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(params) => params,
    };
    serde_json::from_value(params).map_err(|error| {
        let message = format!("invalid params for {method}: {error}");
        // FileUri's errors all say "file: URI"; classify them so clients can tell a path mistake.
        let kind = if message.contains("file: URI") {
            ErrorKind::InvalidPath
        } else {
            ErrorKind::InvalidParams
        };
        RpcError::new(proto::error::INVALID_PARAMS, kind, message)
    })
}

/// Serialize a result.
///
/// # Errors
/// -32603 if serialization fails (a bug).
pub fn to_value<T: Serialize>(result: T) -> Result<Value, RpcError> {
    serde_json::to_value(result)
        .map_err(|error| RpcError::internal(format!("cannot serialize the result: {error}")))
}
