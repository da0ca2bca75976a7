//! Encoding helpers (base64, `file:` URIs) and assertions on JSON-RPC errors.

use std::path::Path;

use base64::Engine as _;
use serde_json::Value;

use crate::RpcError;

/// Standard base64 of `bytes`.
pub fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decode standard base64, panicking with the input on failure.
pub fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap_or_else(|e| panic!("server sent invalid base64 {text:?}: {e}"))
}

/// The `file:` URI of an absolute path, as the wire expects it.
pub fn file_uri(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    proto::FileUri::from_path(path)
        .unwrap_or_else(|e| panic!("{} has no file: URI: {e}", path.display()))
        .to_uri_string()
}

/// Assert that `result` is an error with `code` and `data.kind`, returning the error.
#[track_caller]
pub fn assert_rpc_error(result: Result<Value, RpcError>, code: i64, kind: &str) -> RpcError {
    let error = match result {
        Ok(value) => panic!("expected error {code} {kind}, got result {value}"),
        Err(error) => error,
    };
    let actual_kind = error
        .data
        .as_ref()
        .map(|d| serde_json::to_value(d.kind).unwrap());
    assert_eq!(
        (error.code, actual_kind),
        (code, Some(Value::String(kind.to_owned()))),
        "unexpected error code/kind; full error: {error:?}"
    );
    error
}

/// The message and, when the message is the reference server's text, this server's own wording
/// from `data.detail` after it: what a test that looks for the cause (an OS error) reads.
pub fn error_text(error: &RpcError) -> String {
    match error.data.as_ref().and_then(|d| d.detail.as_deref()) {
        Some(detail) => format!("{} ({detail})", error.message),
        None => error.message.clone(),
    }
}

/// The `data.kind` of an error as a string (empty when absent).
pub fn error_kind(error: &RpcError) -> String {
    error
        .data
        .as_ref()
        .and_then(|d| serde_json::to_value(d.kind).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}
