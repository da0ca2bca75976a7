//! The JSON-RPC decode path the server runs on every websocket frame before acting: the
//! envelope ([`Message::from_slice`]), then the params of every method type
//! ([`parse_params`]) and the `sandbox` object inside them (parsed, not resolved: resolving
//! touches the filesystem and has its own target, `policy`). No side effects.
//!
//! Invariants:
//! - no panic; a rejected frame still yields an error response that serializes;
//! - an accepted message re-encodes ([`Message::to_bytes`]) to bytes that decode to the same
//!   message, with no `"jsonrpc"` member;
//! - accepted params re-serialize to JSON that parses to the same params (what a client reads
//!   back is what the server acted on).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::Message;
use proto::methods::fs::{
    CloseParams, CopyParams, CreateDirectoryParams, OpenParams, PathParams, ReadBlockParams,
    ReadFileParams, RemoveParams, WriteFileParams,
};
use proto::methods::http::HttpRequestParams;
use proto::methods::initialize::InitializeParams;
use proto::methods::process::{
    ReadParams, ResizeParams, SignalParams, StartParams, TerminateParams, WriteParams,
};
use proto::methods::{self, Empty, parse_params};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("serializes")
}

#[path = "shared/same_json.rs"]
mod shared;
use shared::same_json;

/// Parse `params` as `T`; when accepted, check the serde round trip and return the value.
fn check<T>(method: &str, params: &Option<Value>) -> Option<T>
where
    T: DeserializeOwned + Serialize,
{
    match parse_params::<T>(method, params.clone()) {
        Ok(parsed) => {
            let json = serde_json::to_value(&parsed).expect("accepted params serialize");
            let again: T =
                parse_params(method, Some(json.clone())).expect("re-serialized params parse");
            assert!(
                same_json(&to_value(&again), &json),
                "params changed in a serde round trip: {json}"
            );
            Some(parsed)
        }
        Err(error) => {
            assert!(error.code < 0, "error codes are negative JSON-RPC codes");
            serde_json::to_vec(&error).expect("errors serialize");
            None
        }
    }
}

/// The `sandbox` member is parsed the way the server parses it (serde into `SandboxSpec`).
fn check_sandbox(sandbox: &Option<Value>) {
    if let Some(value) = sandbox {
        let _ = serde_json::from_value::<sandbox::SandboxSpec>(value.clone());
    }
}

/// Every method's params, whatever the method name says, so one input exercises all of them.
fn dispatch(params: &Option<Value>) {
    check::<InitializeParams>(methods::INITIALIZE, params);
    check::<Empty>(methods::INITIALIZED, params);
    if let Some(p) = check::<StartParams>(methods::PROCESS_START, params) {
        assert!(p.cwd.as_path().is_absolute());
        check_sandbox(&p.sandbox);
    }
    check::<ReadParams>(methods::PROCESS_READ, params);
    check::<WriteParams>(methods::PROCESS_WRITE, params);
    check::<SignalParams>(methods::PROCESS_SIGNAL, params);
    check::<ResizeParams>(methods::PROCESS_RESIZE, params);
    check::<TerminateParams>(methods::PROCESS_TERMINATE, params);
    if let Some(p) = check::<ReadFileParams>(methods::FS_READ_FILE, params) {
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<WriteFileParams>(methods::FS_WRITE_FILE, params) {
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<CreateDirectoryParams>(methods::FS_CREATE_DIRECTORY, params) {
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<PathParams>(methods::FS_GET_METADATA, params) {
        assert!(p.path.as_path().is_absolute());
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<RemoveParams>(methods::FS_REMOVE, params) {
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<CopyParams>(methods::FS_COPY, params) {
        check_sandbox(&p.sandbox);
    }
    if let Some(p) = check::<OpenParams>(methods::FS_OPEN, params) {
        check_sandbox(&p.sandbox);
    }
    check::<ReadBlockParams>(methods::FS_READ_BLOCK, params);
    check::<CloseParams>(methods::FS_CLOSE, params);
    check::<Empty>(methods::ENVIRONMENT_INFO, params);
    if let Some(p) = check::<HttpRequestParams>(methods::HTTP_REQUEST, params) {
        check_sandbox(&p.sandbox);
    }
}

fuzz_target!(|data: &[u8]| {
    let message = match Message::from_slice(data) {
        Ok(message) => message,
        Err(error) => {
            let response = Message::Error(error.to_response());
            Message::from_slice(&response.to_bytes()).expect("error responses decode");
            return;
        }
    };
    let bytes = message.to_bytes();
    assert!(!bytes.is_empty());
    let again = Message::from_slice(&bytes).expect("a re-encoded message decodes");
    let (before, after) = (to_value(&message), to_value(&again));
    assert!(
        same_json(&before, &after),
        "message changed in a round trip: {before} -> {after}"
    );
    let object: Value = serde_json::from_slice(&bytes).expect("output is JSON");
    assert!(
        object.get("jsonrpc").is_none(),
        "\"jsonrpc\" is never produced"
    );
    match &message {
        Message::Request(request) => dispatch(&request.params),
        Message::Notification(notification) => dispatch(&notification.params),
        Message::Response(_) | Message::Error(_) => {}
    }
});
