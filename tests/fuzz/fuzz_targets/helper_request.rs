//! The fs-helper's wire: the JSON [`HelperRequest`] a helper decodes from each frame (serve mode)
//! or from stdin (one-shot), and the JSON [`HelperResponse`] the supervisor decodes from a helper
//! (a helper runs sandboxed code paths, so the supervisor must not trust its bytes either).
//!
//! The serve-mode framing (4-byte length prefix, skip-if-larger-than-MAX) lives in I/O code
//! (`fs_helper::helper::run_serve`, `supervisor::fs::helpers::exchange`) and is not a pure
//! function, so this target fuzzes what each frame's body goes through: the request decode, the
//! `sandbox` decode (parsed, not resolved: see the `policy` target) and the params of the named
//! operation into an `FsRequest` (as `HelperRequest::decode` and the server parse them), stopping
//! before any filesystem call.
//!
//! Invariants: no panic; accepted requests and responses survive a serde round trip unchanged
//! (floats to within an ulp, see `same_json`);
//! rejected params give a JSON-RPC error with a negative code.
#![no_main]

use base64::Engine;
use fs_helper::wire::{HelperRequest, HelperResponse, MAX_HELPER_REQUEST_BYTES};
use libfuzzer_sys::fuzz_target;
use proto::methods::fs::FsRequest;
use serde_json::Value;

#[path = "shared/same_json.rs"]
mod shared;
use shared::same_json;

/// What `execute` checks before it touches the filesystem.
fn check_request(request: &FsRequest) {
    if let FsRequest::WriteFile(p) = request {
        if let Ok(data) = base64::engine::general_purpose::STANDARD.decode(p.data_base64.as_bytes())
        {
            assert!(data.len() <= p.data_base64.len());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    assert!(data.len() <= MAX_HELPER_REQUEST_BYTES);
    match HelperRequest::decode(data) {
        Ok(request) => {
            let bytes = serde_json::to_vec(&request).expect("requests serialize");
            let again = HelperRequest::decode(&bytes).expect("re-encoded request");
            assert_eq!(again.request.method(), request.request.method());
            let before = serde_json::to_value(&request.request).expect("serializes");
            let after = serde_json::to_value(&again.request).expect("serializes");
            assert!(same_json(&before, &after), "{before} -> {after}");
            let null = Value::Null;
            let (a, b) = (again.sandbox.as_ref(), request.sandbox.as_ref());
            assert!(
                same_json(a.unwrap_or(&null), b.unwrap_or(&null)) && a.is_some() == b.is_some()
            );
            if let Some(sandbox) = request.sandbox.as_ref().filter(|v| !v.is_null()) {
                let _ = serde_json::from_value::<sandbox::SandboxSpec>(sandbox.clone());
            }
            check_request(&request.request);
        }
        Err(error) => assert!(error.code < 0),
    }
    // For coverage, the body's params under every operation.
    if let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(data) {
        let params = body.get("params").cloned();
        for operation in [
            proto::methods::FS_READ_FILE,
            proto::methods::FS_WRITE_FILE,
            proto::methods::FS_CREATE_DIRECTORY,
            proto::methods::FS_GET_METADATA,
            proto::methods::FS_REMOVE,
            proto::methods::FS_COPY,
            proto::methods::FS_OPEN,
        ] {
            match FsRequest::parse(operation, params.clone()) {
                Ok(Some(request)) => check_request(&request),
                Ok(None) => panic!("{operation} is a helper-executed method"),
                Err(error) => assert!(error.code < 0),
            }
        }
    }
    if let Ok(response) = serde_json::from_slice::<HelperResponse>(data) {
        let bytes = serde_json::to_vec(&response).expect("responses serialize");
        let again: HelperResponse = serde_json::from_slice(&bytes).expect("re-encoded response");
        let before = serde_json::to_value(&response).expect("serializes");
        let after = serde_json::to_value(&again).expect("serializes");
        assert!(same_json(&before, &after), "{before} -> {after}");
        let _: Result<Value, proto::RpcError> = response.into();
    }
});
