//! One typed request per method a client may call once its session is initialized.
//!
//! The method name is matched here, once, when a request is parsed ([`Call::parse`]); what runs
//! after (budget reservation, routing, cancellation on disconnect, metrics) matches on [`Call`]
//! and its properties, so the compiler checks that each of them covers every method.
//! `initialize` is not a `Call`: it is answered by the connection before a session exists.

use serde_json::Value;

use super::fs::{CloseParams, FsRequest, ReadBlockParams};
use super::http::HttpRequestParams;
use super::process::{
    ListParams, ReadParams, ResizeParams, SignalParams, StartParams, TerminateParams, WriteParams,
};
use super::{Empty, parse_params};
use crate::error::RpcError;

/// A parsed request of an initialized session.
#[derive(Debug)]
pub enum Call {
    /// `process/start`.
    ProcessStart(Box<StartParams>),
    /// `process/read`.
    ProcessRead(ReadParams),
    /// `process/write`.
    ProcessWrite(WriteParams),
    /// `process/signal`.
    ProcessSignal(SignalParams),
    /// `process/resize`.
    ProcessResize(ResizeParams),
    /// `process/terminate`.
    ProcessTerminate(TerminateParams),
    /// `process/list`.
    ProcessList(ListParams),
    /// `environment/info`.
    EnvironmentInfo,
    /// `http/request`.
    HttpRequest(Box<HttpRequestParams>),
    /// `fs/readBlock` (on a handle `fs/open` returned).
    FsReadBlock(ReadBlockParams),
    /// `fs/close`.
    FsClose(CloseParams),
    /// Every other `fs/*` method (run by a helper when sandboxed).
    Fs(FsRequest),
}

impl Call {
    /// Every method [`Call::parse`] accepts, in the order of the protocol document.
    pub const METHODS: &'static [&'static str] = &[
        super::PROCESS_START,
        super::PROCESS_READ,
        super::PROCESS_WRITE,
        super::PROCESS_SIGNAL,
        super::PROCESS_RESIZE,
        super::PROCESS_TERMINATE,
        super::PROCESS_LIST,
        super::FS_READ_FILE,
        super::FS_WRITE_FILE,
        super::FS_CREATE_DIRECTORY,
        super::FS_GET_METADATA,
        super::FS_CANONICALIZE,
        super::FS_READ_DIRECTORY,
        super::FS_REMOVE,
        super::FS_COPY,
        super::FS_WALK,
        super::FS_OPEN,
        super::FS_READ_BLOCK,
        super::FS_CLOSE,
        super::ENVIRONMENT_INFO,
        super::HTTP_REQUEST,
    ];

    /// Parse `params` as `method`'s params.
    ///
    /// # Errors
    /// `methodNotFound` for a method no session may call; `invalidParams` (naming the method
    /// and the field) when the params do not fit its type.
    pub fn parse(method: &str, params: Option<Value>) -> Result<Self, RpcError> {
        let call = match method {
            super::PROCESS_START => Call::ProcessStart(Box::new(parse_params(method, params)?)),
            super::PROCESS_READ => Call::ProcessRead(parse_params(method, params)?),
            super::PROCESS_WRITE => Call::ProcessWrite(parse_params(method, params)?),
            super::PROCESS_SIGNAL => Call::ProcessSignal(parse_params(method, params)?),
            super::PROCESS_RESIZE => Call::ProcessResize(parse_params(method, params)?),
            super::PROCESS_TERMINATE => Call::ProcessTerminate(parse_params(method, params)?),
            super::PROCESS_LIST => Call::ProcessList(parse_params(method, params)?),
            super::ENVIRONMENT_INFO => {
                let Empty {} = parse_params(method, params)?;
                Call::EnvironmentInfo
            }
            super::HTTP_REQUEST => Call::HttpRequest(Box::new(parse_params(method, params)?)),
            super::FS_READ_BLOCK => Call::FsReadBlock(parse_params(method, params)?),
            super::FS_CLOSE => Call::FsClose(parse_params(method, params)?),
            _ => match FsRequest::parse(method, params)? {
                Some(request) => Call::Fs(request),
                None => return Err(RpcError::method_not_found(method)),
            },
        };
        Ok(call)
    }

    /// The wire method name.
    pub fn method(&self) -> &'static str {
        match self {
            Call::ProcessStart(_) => super::PROCESS_START,
            Call::ProcessRead(_) => super::PROCESS_READ,
            Call::ProcessWrite(_) => super::PROCESS_WRITE,
            Call::ProcessSignal(_) => super::PROCESS_SIGNAL,
            Call::ProcessResize(_) => super::PROCESS_RESIZE,
            Call::ProcessTerminate(_) => super::PROCESS_TERMINATE,
            Call::ProcessList(_) => super::PROCESS_LIST,
            Call::EnvironmentInfo => super::ENVIRONMENT_INFO,
            Call::HttpRequest(_) => super::HTTP_REQUEST,
            Call::FsReadBlock(_) => super::FS_READ_BLOCK,
            Call::FsClose(_) => super::FS_CLOSE,
            Call::Fs(request) => request.method(),
        }
    }

    /// Whether the call has no effect but its answer (reads, metadata, listings, the
    /// environment): its work may stop once nobody can receive the answer. The others change
    /// state a resumed session sees (a started process, a written file) and run to the end.
    pub fn changes_nothing(&self) -> bool {
        match self {
            Call::ProcessRead(_) | Call::ProcessList(_) | Call::EnvironmentInfo => true,
            Call::FsReadBlock(_) => true,
            Call::Fs(request) => matches!(
                request,
                FsRequest::ReadFile(_)
                    | FsRequest::GetMetadata(_)
                    | FsRequest::Canonicalize(_)
                    | FsRequest::ReadDirectory(_)
                    | FsRequest::Walk(_)
            ),
            Call::ProcessStart(_)
            | Call::ProcessWrite(_)
            | Call::ProcessSignal(_)
            | Call::ProcessResize(_)
            | Call::ProcessTerminate(_)
            | Call::HttpRequest(_)
            | Call::FsClose(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Minimal valid params of each method, so that every name in [`Call::METHODS`] parses.
    fn minimal_params(method: &str) -> Value {
        let path = json!("file:///tmp/x");
        match method {
            super::super::PROCESS_START => {
                json!({"processId": "p", "argv": ["/bin/true"], "cwd": "/tmp"})
            }
            super::super::PROCESS_READ | super::super::PROCESS_TERMINATE => {
                json!({"processId": "p"})
            }
            super::super::PROCESS_WRITE => json!({"processId": "p", "chunk": ""}),
            super::super::PROCESS_SIGNAL => json!({"processId": "p", "signal": "terminate"}),
            super::super::PROCESS_RESIZE => json!({"processId": "p", "rows": 24, "cols": 80}),
            super::super::PROCESS_LIST | super::super::ENVIRONMENT_INFO => json!({}),
            super::super::HTTP_REQUEST => {
                json!({"method": "GET", "url": "http://localhost/", "requestId": "r"})
            }
            super::super::FS_WRITE_FILE => json!({"path": path, "dataBase64": ""}),
            super::super::FS_COPY => json!({"sourcePath": path, "destinationPath": path}),
            super::super::FS_OPEN => json!({"path": path, "handleId": "h"}),
            super::super::FS_READ_BLOCK => json!({"handleId": "h", "offset": 0, "len": 1}),
            super::super::FS_CLOSE => json!({"handleId": "h"}),
            _ => json!({"path": path}),
        }
    }

    #[test]
    fn every_method_parses_to_a_call_that_names_it_again() {
        for method in Call::METHODS {
            let call = Call::parse(method, Some(minimal_params(method)))
                .unwrap_or_else(|error| panic!("{method}: {error:?}"));
            assert_eq!(call.method(), *method);
        }
    }

    #[test]
    fn an_unknown_method_is_not_found_and_initialize_is_not_a_call() {
        for method in ["process/nope", "fs/", "initialize", "initialized", ""] {
            let error = Call::parse(method, Some(json!({}))).unwrap_err();
            assert_eq!(error.code, crate::error::METHOD_NOT_FOUND, "{method}");
        }
    }

    #[test]
    fn only_reads_change_nothing() {
        let reads = [
            super::super::PROCESS_READ,
            super::super::PROCESS_LIST,
            super::super::ENVIRONMENT_INFO,
            super::super::FS_READ_BLOCK,
            super::super::FS_READ_FILE,
            super::super::FS_GET_METADATA,
            super::super::FS_CANONICALIZE,
            super::super::FS_READ_DIRECTORY,
            super::super::FS_WALK,
        ];
        for method in Call::METHODS {
            let call = Call::parse(method, Some(minimal_params(method))).unwrap();
            assert_eq!(call.changes_nothing(), reads.contains(method), "{method}");
        }
    }
}
