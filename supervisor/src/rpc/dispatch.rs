//! Method routing: parse params into the method's typed struct, call its handler, serialize the
//! result. Errors become JSON-RPC errors through `errors` (the only mapping). Handlers get only
//! what they use, not the connection: the session, the connection's budget, and a narrow context
//! built here (`process::handlers::LaunchContext` for `process/start`, `fs::FsContext` for
//! the `fs/*` methods, parsed once into an `fs::FsRequest`).
//!
//! [`respond`] sends the answer; what must follow the answer (the body notifications of a
//! streamed `http/request`) is started only once the answer is queued, so it arrives first.

use std::sync::Arc;

use proto::error::RpcError;
use proto::jsonrpc::Request;
use proto::methods::*;
use serde_json::Value;

use super::shared::{Connection, ConnectionError, reply_message};
use crate::budget::MemoryCharge;
use crate::process::handlers;
use crate::session::Session;
use crate::state::ServerState;
use crate::{environment, fs, http};

/// Handle one request and queue its answer (then start a streamed body, if any). The request's
/// memory reservation is given back once it ran; the answer's travels with the answer.
pub async fn respond(
    connection: &Arc<Connection>,
    session: &Arc<Session>,
    request: Request,
    request_charge: MemoryCharge,
    mut answer: MemoryCharge,
) {
    let Request { id, method, params } = request;
    // Answers whose size is known from the request are backed before the work starts.
    let known = match method.as_str() {
        FS_READ_BLOCK | HTTP_REQUEST => answer.inflight_bytes(),
        _ => 0,
    };
    if let Err(error) = answer.back(&connection.budget, known) {
        connection
            .send_answer(reply_message(id, Err(error.into())), answer)
            .await;
        return;
    }
    if method == HTTP_REQUEST {
        // An upstream answer nobody can receive is not waited for: when the connection ends the
        // request is dropped (its socket, slot and reserved memory with it).
        let mut closed = connection.closed.clone();
        let started = match parse_params(&method, params) {
            Ok(params) => tokio::select! {
                started = http::request(&connection.server.http, &connection.http, params) => {
                    started.map_err(RpcError::from)
                }
                _ = closed.wait_for(|closed| *closed) => return,
            },
            Err(error) => Err(error),
        };
        drop(request_charge);
        let (reply, body) = match started {
            Ok(started) => (to_value(started.result), started.body),
            Err(error) => (Err(error), None),
        };
        connection
            .send_answer(reply_message(id, reply), answer)
            .await;
        if let Some(body) = body {
            tokio::spawn(body.run(connection.outbound.clone(), connection.closed.clone()));
        }
        return;
    }
    let reply = if changes_nothing(&method) {
        // Its answer is all it produces: once nobody can receive it, stop working on it.
        let mut closed = connection.closed.clone();
        tokio::select! {
            reply = dispatch(connection, session, &method, params, &mut answer) => reply,
            _ = closed.wait_for(|closed| *closed) => return,
        }
    } else {
        // The rest change state a resumed session sees (a started process, a written file):
        // they run to the end even when the connection is gone.
        dispatch(connection, session, &method, params, &mut answer).await
    };
    drop(request_charge);
    connection
        .send_answer(reply_message(id, reply), answer)
        .await;
}

/// Whether `method` has no effect but its answer (reads, metadata, the environment), so its
/// work can stop when the connection ends.
fn changes_nothing(method: &str) -> bool {
    matches!(
        method,
        FS_READ_FILE
            | FS_READ_BLOCK
            | FS_GET_METADATA
            | FS_CANONICALIZE
            | FS_READ_DIRECTORY
            | FS_WALK
            | ENVIRONMENT_INFO
            | PROCESS_READ
            | PROCESS_LIST
    )
}

/// Route one request. `answer` is the memory reserved for its answer; a method that learns
/// only while it runs how large its answer will be (`process/read`) adds to it before it builds
/// the answer.
///
/// # Errors
/// The method's error, mapped to JSON-RPC.
pub async fn dispatch(
    connection: &Arc<Connection>,
    session: &Arc<Session>,
    method: &str,
    params: Option<Value>,
    answer: &mut MemoryCharge,
) -> Result<Value, RpcError> {
    match method {
        PROCESS_START => to_value(
            handlers::start(
                session,
                &launch_context(&connection.server),
                &connection.budget,
                parse_params(method, params)?,
            )
            .await?,
        ),
        PROCESS_READ => {
            let params = parse_params(method, params)?;
            let mut closed = connection.closed.clone();
            let reserve = |bytes: usize| answer.back(&connection.budget, bytes);
            tokio::select! {
                result = handlers::read(session, params, reserve) => to_value(result?),
                _ = closed.wait_for(|closed| *closed) => Err(ConnectionError::ClosedWhileReading.into()),
            }
        }
        PROCESS_WRITE => to_value(
            handlers::write(session, &connection.budget, parse_params(method, params)?).await?,
        ),
        PROCESS_SIGNAL => to_value(handlers::signal(session, parse_params(method, params)?)?),
        PROCESS_RESIZE => {
            handlers::resize(session, parse_params(method, params)?)?;
            to_value(Empty {})
        }
        PROCESS_TERMINATE => to_value(handlers::terminate(session, parse_params(method, params)?)),
        PROCESS_LIST => {
            let process::ListParams {} = parse_params(method, params)?;
            let table = session.processes.clone();
            to_value(
                connection
                    .budget
                    .blocking(move || handlers::list(&table))
                    .await
                    .map_err(crate::process::ProcessError::from)?,
            )
        }
        ENVIRONMENT_INFO => {
            let Empty {} = parse_params(method, params)?;
            to_value(environment::info(&connection.server.environment).await)
        }
        FS_READ_BLOCK => {
            fs::read_block(
                &connection.handles,
                &connection.budget,
                parse_params(method, params)?,
            )
            .await
        }
        FS_CLOSE => fs::close(&connection.handles, parse_params(method, params)?),
        method if method.starts_with("fs/") => {
            let Some(request) = fs::FsRequest::parse(method, params)? else {
                return Err(RpcError::method_not_found(method));
            };
            let context = fs::FsContext {
                handles: &connection.handles,
                budget: &connection.budget,
                sandboxing: &connection.server.sandboxing,
                helpers: &connection.server.helpers,
                session_id: &session.id,
            };
            fs::handle(&context, request, answer).await
        }
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// What `process/start` may use of the server-wide state.
fn launch_context(server: &ServerState) -> handlers::LaunchContext<'_> {
    handlers::LaunchContext {
        budgets: &server.budgets,
        containment: &server.containment,
        sandboxing: &server.sandboxing,
        guardian: &server.guardian,
        reaper: &server.reaper,
        launchers: &server.launchers,
        metrics: &server.metrics,
    }
}

pub use proto::methods::{parse_params, to_value};
