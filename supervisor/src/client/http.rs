//! `http/request` from the client: [`ExecServerClient::http_request`] for a buffered body,
//! [`ExecServerClient::http_request_stream`] for a body that arrives as
//! `http/request/bodyDelta` notifications, read as an [`HttpBody`] (a [`Stream`] of chunks).
//!
//! A stream is registered under its `requestId` (a fresh UUID) *before* the request is sent, so
//! no delta can arrive unrouted. Deltas must come in seq order from 1; a gap is a protocol error.
//! A stream lives on the connection that carried its request: when that connection is lost the
//! body fails with [`ExecServerError::StreamInterrupted`] (a body is not resumable). Requests are
//! never replayed after a lost connection ([`ExecServerError::Disconnected`]): an HTTP request may
//! not be idempotent.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use proto::methods::environment::EnvironmentInfo;
use proto::methods::http::{HttpHeader, HttpRedirectPolicy, HttpRequestParams, HttpResponse};
use proto::methods::{ENVIRONMENT_INFO, Empty, HTTP_REQUEST, HTTP_REQUEST_BODY_DELTA};
use serde_json::Value;
use tokio::sync::mpsc;

use super::ExecServerClient;
use super::connection::CallError;
use super::core::{Inner, Replay, decode_base64, encode_base64, from_result, to_params};
use super::error::ExecServerError;
use super::http_streams::BodyEvent;

/// An HTTP request for the server to make.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    /// Headers in order (repeats kept).
    pub headers: Vec<HttpHeader>,
    /// The body.
    pub body: Option<Vec<u8>>,
    /// Deadline of the whole exchange, body included (none when `None`).
    pub timeout: Option<Duration>,
    /// Policy the request runs under (a sandbox whose network is off refuses it).
    pub sandbox: Option<Value>,
    /// Allow link-local and cloud metadata addresses.
    pub allow_link_local: bool,
    /// Allow execward servers' listeners (the server's own and every other registered one's).
    pub allow_own_listeners: bool,
    /// Follow redirects (default) or return them.
    pub redirect_policy: HttpRedirectPolicy,
}

impl HttpRequest {
    /// A request with no headers, body, timeout or sandbox.
    pub fn new(method: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
            timeout: None,
            sandbox: None,
            allow_link_local: false,
            allow_own_listeners: false,
            redirect_policy: HttpRedirectPolicy::Follow,
        }
    }

    /// Add a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push(HttpHeader {
            name: name.into(),
            value: value.into(),
            value_env_var: None,
        });
        self
    }

    /// Set the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// Set the timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    fn params(self, request_id: String, stream_response: bool) -> HttpRequestParams {
        HttpRequestParams {
            method: self.method,
            url: self.url,
            headers: self.headers,
            body_base64: self.body.as_deref().map(encode_base64),
            timeout_ms: self
                .timeout
                .map(|timeout| u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
            request_id,
            stream_response,
            sandbox: self.sandbox,
            allow_link_local: self.allow_link_local,
            allow_own_listeners: self.allow_own_listeners,
            redirect_policy: self.redirect_policy,
        }
    }
}

/// A buffered response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponseData {
    /// The status code.
    pub status: u16,
    /// Headers in order.
    pub headers: Vec<HttpHeader>,
    /// The whole body.
    pub body: Vec<u8>,
}

/// A streamed response: status and headers now, the body as it arrives.
pub struct HttpStreamResponse {
    /// The status code.
    pub status: u16,
    /// Headers in order.
    pub headers: Vec<HttpHeader>,
    /// The body.
    pub body: HttpBody,
}

/// The body of a streamed response: a [`Stream`] of chunks in order, ending after the last one,
/// or with one `Err` when the server reports a failure, the connection is lost or the client
/// fails.
pub struct HttpBody {
    inner: Arc<Inner>,
    request_id: String,
    receiver: mpsc::UnboundedReceiver<BodyEvent>,
    unread: Arc<AtomicUsize>,
    next_seq: u64,
    finished: bool,
}

impl HttpBody {
    /// The `requestId` the server streams under.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Read the rest of the body.
    ///
    /// # Errors
    /// The stream's error.
    pub async fn read_to_end(mut self) -> Result<Vec<u8>, ExecServerError> {
        let mut body = Vec::new();
        while let Some(chunk) = std::future::poll_fn(|cx| Pin::new(&mut self).poll_next(cx)).await {
            body.extend_from_slice(&chunk?);
        }
        Ok(body)
    }

    fn protocol(&self, reason: String) -> ExecServerError {
        ExecServerError::Protocol {
            method: HTTP_REQUEST_BODY_DELTA.into(),
            reason,
        }
    }
}

impl Stream for HttpBody {
    type Item = Result<Vec<u8>, ExecServerError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            let event = match self.receiver.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.finished = true;
                    let request_id = self.request_id.clone();
                    return Poll::Ready(Some(Err(ExecServerError::StreamInterrupted {
                        path: format!("http/request {request_id}"),
                    })));
                }
                Poll::Ready(Some(event)) => event,
            };
            let delta = match event {
                BodyEvent::Failed(error) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(error)));
                }
                BodyEvent::Delta(delta) => delta,
            };
            self.unread
                .fetch_sub(delta.delta_base64.len(), Ordering::Relaxed);
            if delta.seq != self.next_seq {
                self.finished = true;
                let error = self.protocol(format!(
                    "body delta seq {} of request {:?} where {} was expected",
                    delta.seq, self.request_id, self.next_seq
                ));
                return Poll::Ready(Some(Err(error)));
            }
            self.next_seq += 1;
            if let Some(error) = delta.error {
                self.finished = true;
                let error = self.protocol(format!("the server reported: {error}"));
                return Poll::Ready(Some(Err(error)));
            }
            self.finished = delta.done;
            let Some(data) = decode_base64(&delta.delta_base64) else {
                self.finished = true;
                let error = self.protocol("deltaBase64 is not valid base64".into());
                return Poll::Ready(Some(Err(error)));
            };
            if !data.is_empty() {
                return Poll::Ready(Some(Ok(data)));
            }
        }
    }
}

impl Drop for HttpBody {
    fn drop(&mut self) {
        self.inner.http_streams.remove(&self.request_id);
    }
}

impl ExecServerClient {
    /// `environment/info`: the server user's shell, the server's cwd, OS and architecture, and
    /// what its sandbox can enforce.
    ///
    /// # Errors
    /// The server's error (a server that predates `environment/info` answers -32601).
    pub async fn environment_info(&self) -> Result<EnvironmentInfo, ExecServerError> {
        self.inner
            .call(ENVIRONMENT_INFO, &Empty {}, Replay::Safe)
            .await
    }

    /// `process/list`: this session's processes (state, pid, start time, limits, live
    /// resources, exit), oldest first.
    ///
    /// # Errors
    /// The server's error (a server that predates `process/list` answers -32601).
    pub async fn list_processes(
        &self,
    ) -> Result<Vec<proto::methods::process::ProcessInfo>, ExecServerError> {
        let result: proto::methods::process::ListResult = self
            .inner
            .call(proto::methods::PROCESS_LIST, &Empty {}, Replay::Safe)
            .await?;
        Ok(result.processes)
    }

    /// `http/request` with the body returned whole (at most the server's
    /// `MAX_HTTP_RESPONSE_BODY_BYTES`, 32 MiB; use [`ExecServerClient::http_request_stream`]
    /// beyond).
    ///
    /// # Errors
    /// -32602 for a malformed request, -32600 `sandboxDenied` for a refused target or a sandbox
    /// whose network is off, -32600 `limitExceeded`, -32603 `timedOut` / `io` for upstream
    /// failures; [`ExecServerError::Disconnected`] when the connection was lost (never replayed).
    pub async fn http_request(
        &self,
        request: HttpRequest,
    ) -> Result<HttpResponseData, ExecServerError> {
        let params = request.params(uuid::Uuid::new_v4().to_string(), false);
        let response: HttpResponse = self
            .inner
            .call(HTTP_REQUEST, &params, Replay::Never)
            .await?;
        let body =
            decode_base64(&response.body_base64).ok_or_else(|| ExecServerError::Protocol {
                method: HTTP_REQUEST.into(),
                reason: "bodyBase64 is not valid base64".into(),
            })?;
        Ok(HttpResponseData {
            status: response.status,
            headers: response.headers,
            body,
        })
    }

    /// `http/request` with `streamResponse`: status and headers as soon as they arrive, the body
    /// as an [`HttpBody`] stream.
    ///
    /// # Errors
    /// As [`ExecServerClient::http_request`] (a second active stream with the same id cannot
    /// happen: every call gets a fresh UUID).
    pub async fn http_request_stream(
        &self,
        request: HttpRequest,
    ) -> Result<HttpStreamResponse, ExecServerError> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let params = to_params(HTTP_REQUEST, &request.params(request_id.clone(), true))?;
        let connection = self.inner.connection().await?;
        let (receiver, unread) = self
            .inner
            .http_streams
            .register(&request_id, connection.generation);
        let body = HttpBody {
            inner: Arc::clone(&self.inner),
            request_id,
            receiver,
            unread,
            next_seq: 1,
            finished: false,
        };
        let answer = connection
            .request(self.inner.request_id(), HTTP_REQUEST, params)
            .await;
        let response: HttpResponse = match answer {
            Ok(result) => from_result(HTTP_REQUEST, result)?,
            Err(CallError::Rpc(error)) => {
                return Err(ExecServerError::Rpc {
                    method: HTTP_REQUEST.into(),
                    error: Box::new(error),
                });
            }
            Err(CallError::Disconnected) => {
                return Err(ExecServerError::Disconnected {
                    method: HTTP_REQUEST.into(),
                });
            }
        };
        Ok(HttpStreamResponse {
            status: response.status,
            headers: response.headers,
            body,
        })
    }
}
