//! The fs-helper's wire: the JSON [`HelperRequest`] a helper decodes from each frame (serve mode)
//! or from stdin (one-shot), and the JSON [`HelperResponse`] the supervisor decodes from a helper
//! (a helper runs sandboxed code paths, so the supervisor must not trust its bytes either).
//!
//! The serve-mode framing (4-byte length prefix, skip-if-larger-than-MAX) lives in I/O code
//! (`fs_helper::helper::run_serve`, `supervisor::fs::helpers::exchange`) and is not a pure
//! function, so this target fuzzes what each frame's body goes through: the request decode, the
//! `sandbox` decode (parsed, not resolved: see the `policy` target) and the params of the named
//! operation as `fs_helper::wire::execute` parses them, stopping before any filesystem call.
//!
//! Invariants: no panic; accepted requests and responses survive a serde round trip unchanged
//! (floats to within an ulp, see `same_json`);
//! rejected params give a JSON-RPC error with a negative code.
#![no_main]

use base64::Engine;
use fs_helper::wire::{HelperRequest, HelperResponse, MAX_HELPER_REQUEST_BYTES};
use libfuzzer_sys::fuzz_target;
use proto::methods::fs::{
    CopyParams, CreateDirectoryParams, OpenParams, PathParams, ReadFileParams, RemoveParams,
    WriteFileParams,
};
use proto::methods::{self, parse_params};
use serde::de::DeserializeOwned;
use serde_json::Value;

#[path = "shared/same_json.rs"]
mod shared;
use shared::same_json;

fn params<T: DeserializeOwned>(operation: &str, value: &Value) -> Option<T> {
    match parse_params::<T>(operation, Some(value.clone())) {
        Ok(parsed) => Some(parsed),
        Err(error) => {
            assert!(error.code < 0);
            None
        }
    }
}

/// What `execute` parses before it touches the filesystem.
fn decode_operation(operation: &str, value: &Value) {
    match operation {
        methods::FS_READ_FILE => {
            params::<ReadFileParams>(operation, value);
        }
        methods::FS_WRITE_FILE => {
            if let Some(p) = params::<WriteFileParams>(operation, value) {
                if let Ok(data) =
                    base64::engine::general_purpose::STANDARD.decode(p.data_base64.as_bytes())
                {
                    assert!(data.len() <= p.data_base64.len());
                }
            }
        }
        methods::FS_CREATE_DIRECTORY => {
            params::<CreateDirectoryParams>(operation, value);
        }
        methods::FS_GET_METADATA | methods::FS_CANONICALIZE | methods::FS_READ_DIRECTORY => {
            params::<PathParams>(operation, value);
        }
        methods::FS_REMOVE => {
            params::<RemoveParams>(operation, value);
        }
        methods::FS_COPY => {
            params::<CopyParams>(operation, value);
        }
        methods::FS_OPEN => {
            params::<OpenParams>(operation, value);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    assert!(data.len() <= MAX_HELPER_REQUEST_BYTES);
    if let Ok(request) = serde_json::from_slice::<HelperRequest>(data) {
        let bytes = serde_json::to_vec(&request).expect("requests serialize");
        let again: HelperRequest = serde_json::from_slice(&bytes).expect("re-encoded request");
        assert_eq!(again.operation, request.operation);
        assert!(same_json(&again.params, &request.params));
        let null = Value::Null;
        let (a, b) = (again.sandbox.as_ref(), request.sandbox.as_ref());
        assert!(same_json(a.unwrap_or(&null), b.unwrap_or(&null)) && a.is_some() == b.is_some());
        if let Some(sandbox) = request.sandbox.as_ref().filter(|v| !v.is_null()) {
            let _ = serde_json::from_value::<sandbox::SandboxSpec>(sandbox.clone());
        }
        // The operation named and, for coverage, every other one on the same params.
        decode_operation(&request.operation, &request.params);
        for operation in [
            methods::FS_READ_FILE,
            methods::FS_WRITE_FILE,
            methods::FS_CREATE_DIRECTORY,
            methods::FS_GET_METADATA,
            methods::FS_REMOVE,
            methods::FS_COPY,
            methods::FS_OPEN,
        ] {
            decode_operation(operation, &request.params);
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
