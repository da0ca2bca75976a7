//! Method routing: parse params into the method's typed struct, call its handler, serialize the
//! result. Errors become JSON-RPC errors through `errors` (the only mapping).
//!
//! [`respond`] sends the answer; what must follow the answer (the body notifications of a
//! streamed `http/request`) is started only once the answer is queued, so it arrives first.

use std::sync::Arc;

use proto::error::{ErrorKind, RpcError};
use proto::jsonrpc::Request;
use proto::methods::*;
use serde::Serialize;
use serde_json::Value;

use super::connection::{Connection, reply_message};
use crate::process::handlers;
use crate::session::Session;
use crate::{environment, fs, http};

/// Handle one request and queue its answer (then start a streamed body, if any).
pub async fn respond(connection: &Arc<Connection>, session: &Arc<Session>, request: Request) {
    let Request { id, method, params } = request;
    if method == HTTP_REQUEST {
        let started = match parse_params(&method, params) {
            Ok(params) => http::request(&connection.server.http, &connection.http, params)
                .await
                .map_err(RpcError::from),
            Err(error) => Err(error),
        };
        let (reply, body) = match started {
            Ok(started) => (to_value(started.result), started.body),
            Err(error) => (Err(error), None),
        };
        connection.send(reply_message(id, reply)).await;
        if let Some(body) = body {
            tokio::spawn(body.run(connection.outbound.clone(), connection.closed.clone()));
        }
        return;
    }
    let reply = dispatch(connection, session, &method, params).await;
    connection.send(reply_message(id, reply)).await;
}

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
        PROCESS_START => to_value(
            handlers::start(session, &connection.server, parse_params(method, params)?).await?,
        ),
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
        ENVIRONMENT_INFO => {
            let Empty {} = parse_params(method, params)?;
            to_value(environment::info(&connection.server.environment).await)
        }
        method if method.starts_with("fs/") => {
            fs::handle(connection, session, method, params).await
        }
        _ => Err(RpcError::method_not_found(method)),
    }
}

pub use proto::methods::parse_params;

/// Serialize a result.
///
/// # Errors
/// -32603 if serialization fails (a bug).
pub fn to_value<T: Serialize>(result: T) -> Result<Value, RpcError> {
    serde_json::to_value(result)
        .map_err(|error| RpcError::internal(format!("cannot serialize the result: {error}")))
}
