//! Method routing: a request arrives here parsed into a typed [`Call`] (the connection parses it,
//! the only place a method name is matched), is routed to its handler by a `match` the compiler
//! checks for every method, and its result is serialized. Errors become JSON-RPC errors through
//! `errors` (the only mapping). Handlers get only what they use, not the connection: the
//! session, the connection's budget, and a narrow context built here
//! (`process::start::LaunchContext` for `process/start`, `fs::FsContext` for the `fs/*`
//! methods).
//!
//! [`respond`] sends the answer; what must follow the answer (the body notifications of a
//! streamed `http/request`) is started only once the answer is queued, so it arrives first.

use std::sync::Arc;

use proto::error::RpcError;
use proto::jsonrpc::RequestId;
use proto::methods::call::Call;
use proto::methods::{Empty, process};
use serde_json::Value;

use super::shared::{Connection, ConnectionError, reply_message};
use crate::budget::MemoryCharge;
use crate::process::handlers;
use crate::session::Session;
use crate::state::ServerState;
use crate::{environment, fs, http};

/// Handle one parsed request and queue its answer (then start a streamed body, if any). The
/// request's memory reservation is given back once it ran; the answer's travels with the answer.
pub async fn respond(
    connection: &Arc<Connection>,
    session: &Arc<Session>,
    id: RequestId,
    call: Call,
    request_charge: MemoryCharge,
    mut answer: MemoryCharge,
) {
    // Answers whose size is known from the request are backed before the work starts.
    let known = match call {
        Call::FsReadBlock(_) | Call::HttpRequest(_) => answer.inflight_bytes(),
        _ => 0,
    };
    if let Err(error) = answer.back(&connection.budget, known) {
        connection
            .send_answer(reply_message(id, Err(error.into())), answer)
            .await;
        return;
    }
    // A call that only produces its answer stops once nobody can receive it; so does an
    // `http/request` (an upstream answer nobody can receive is not waited for: its socket, slot
    // and reserved memory go with the connection). The rest change state a resumed session sees
    // (a started process, a written file): they run to the end even when the connection is gone.
    let stops_with_connection = call.changes_nothing() || matches!(call, Call::HttpRequest(_));
    let answered = if stops_with_connection {
        let mut closed = connection.closed.clone();
        tokio::select! {
            answered = dispatch(connection, session, call, &mut answer) => answered,
            _ = closed.wait_for(|closed| *closed) => return,
        }
    } else {
        dispatch(connection, session, call, &mut answer).await
    };
    drop(request_charge);
    let (reply, body) = match answered {
        Ok((value, body)) => (Ok(value), body),
        Err(error) => (Err(error), None),
    };
    connection
        .send_answer(reply_message(id, reply), answer)
        .await;
    // What follows the answer (a streamed body's notifications) starts once the answer is queued.
    if let Some(body) = body {
        tokio::spawn(body.run(connection.outbound.clone(), connection.closed.clone()));
    }
}

/// Route one call. `answer` is the memory reserved for its answer; a method that learns only
/// while it runs how large its answer will be (`process/read`) adds to it before it builds the
/// answer. Besides the result: the body of a streamed `http/request`, to run after the answer.
///
/// # Errors
/// The method's error, mapped to JSON-RPC.
async fn dispatch(
    connection: &Arc<Connection>,
    session: &Arc<Session>,
    call: Call,
    answer: &mut MemoryCharge,
) -> Result<(Value, Option<http::BodyStream>), RpcError> {
    let value = match call {
        Call::HttpRequest(params) => {
            let started = http::request(&connection.server.http, &connection.http, *params).await?;
            return Ok((to_value(started.result)?, started.body));
        }
        Call::ProcessStart(params) => to_value(
            crate::process::start::start(
                session,
                &launch_context(&connection.server),
                &connection.budget,
                *params,
            )
            .await?,
        ),
        Call::ProcessRead(params) => {
            let mut closed = connection.closed.clone();
            let reserve = |bytes: usize| answer.back(&connection.budget, bytes);
            tokio::select! {
                result = handlers::read(session, params, reserve) => to_value(result?),
                _ = closed.wait_for(|closed| *closed) => Err(ConnectionError::ClosedWhileReading.into()),
            }
        }
        Call::ProcessWrite(params) => {
            to_value(handlers::write(session, &connection.budget, params).await?)
        }
        Call::ProcessSignal(params) => to_value(handlers::signal(session, params)?),
        Call::ProcessResize(params) => {
            handlers::resize(session, params)?;
            to_value(Empty {})
        }
        Call::ProcessTerminate(params) => to_value(handlers::terminate(session, params)),
        Call::ProcessList(process::ListParams {}) => {
            let table = session.processes.clone();
            to_value(
                connection
                    .budget
                    .blocking(move || handlers::list(&table))
                    .await
                    .map_err(crate::process::ProcessError::from)?,
            )
        }
        Call::EnvironmentInfo => to_value(environment::info(&connection.server.environment).await),
        Call::FsReadBlock(params) => {
            fs::read_block(&connection.handles, &connection.budget, params).await
        }
        Call::FsClose(params) => fs::close(&connection.handles, params),
        Call::Fs(request) => {
            let context = fs::FsContext {
                handles: &connection.handles,
                budget: &connection.budget,
                helpers: &connection.server.helpers,
                session_id: &session.id,
            };
            fs::handle(&context, request, answer).await
        }
    }?;
    Ok((value, None))
}

/// What `process/start` may use of the server-wide state.
fn launch_context(server: &ServerState) -> crate::process::start::LaunchContext<'_> {
    crate::process::start::LaunchContext {
        budgets: &server.budgets,
        containment: &server.containment,
        sandboxing: &server.sandboxing,
        guardian: &server.guardian,
        reaper: &server.reaper,
        launchers: &server.launchers,
        metrics: &server.metrics,
    }
}

use proto::methods::to_value;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use proto::methods::call::Call;

    /// Every `.rs` file below `dir`.
    fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
    }

    /// The name of `method`'s constant in `proto::methods` (`fs/readFile` → `FS_READ_FILE`).
    fn constant_of(method: &str) -> String {
        let mut name = String::new();
        for c in method.chars() {
            match c {
                '/' => name.push('_'),
                c if c.is_ascii_uppercase() => {
                    name.push('_');
                    name.push(c);
                }
                c => name.push(c.to_ascii_uppercase()),
            }
        }
        name
    }

    /// Whether `line` names a method a client calls: its constant in `proto::methods` or the
    /// name itself as a string literal.
    fn names_a_method(line: &str) -> bool {
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        Call::METHODS.iter().any(|method| {
            words.contains(&constant_of(method).as_str()) || line.contains(&format!("\"{method}\""))
        })
    }

    /// The server side (everything but the client library and the CLIs that use it) never
    /// matches or compares a method name: `Call::parse` in `proto` is the only place, and a
    /// request is routed by its typed `Call` after. A line that names a method and compares
    /// (`==`, `!=`, a `match` arm, `matches!`, `starts_with`) is the regression this catches.
    #[test]
    fn no_method_name_is_matched_after_parsing() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&root, &mut files);
        let client_side = ["client", "exec_cmd", "ps_cmd.rs", "bin"];
        let mut matched = Vec::new();
        for file in &files {
            let relative = file.strip_prefix(&root).unwrap();
            let first = relative.components().next().unwrap().as_os_str();
            if client_side.iter().any(|side| first == *side) {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            // A file's tests may name methods as they like; its code above them may not.
            let code_end = text.find("#[cfg(test)]").unwrap_or(text.len());
            for (number, line) in text[..code_end].lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") || !names_a_method(code) {
                    continue;
                }
                if ["==", "!=", "=>", "matches!", "starts_with"]
                    .iter()
                    .any(|compare| code.contains(compare))
                {
                    matched.push(format!("{}:{}: {code}", relative.display(), number + 1));
                }
            }
        }
        assert!(
            files.len() > 50,
            "the walk found only {} files",
            files.len()
        );
        assert!(
            matched.is_empty(),
            "method names matched outside Call::parse (route on the typed Call instead):\n{}",
            matched.join("\n")
        );
    }

    #[test]
    fn the_check_sees_a_match_on_a_method_name() {
        assert!(names_a_method(
            "proto::methods::FS_READ_BLOCK | proto::methods::HTTP_REQUEST => 1,"
        ));
        assert!(names_a_method("if method == \"process/start\" {"));
        assert!(!names_a_method("Call::FsReadBlock(_) => 1,"));
        assert!(!names_a_method(
            "None if x => Some(HTTP_REQUEST_DEFAULT_TIMEOUT_MS),"
        ));
        assert_eq!(constant_of("fs/readFile"), "FS_READ_FILE");
        assert_eq!(constant_of("environment/info"), "ENVIRONMENT_INFO");
    }
}
