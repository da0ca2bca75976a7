//! Response bodies: read whole (bounded) for a buffered request, or sent as
//! `http/request/bodyDelta` notifications for a streamed one.
//!
//! A stream sends deltas numbered from 1, each at most [`HTTP_BODY_DELTA_BYTES`] of body, in
//! order, through the connection's bounded outbound queue (a client that does not read slows the
//! upstream read instead of growing memory). The last delta has `done: true`, and an `error`
//! when the body failed (a timeout included). A stream ends silently when its connection ends.

use proto::jsonrpc::{Message, Notification};
use proto::methods::HTTP_REQUEST_BODY_DELTA;
use proto::methods::http::HttpBodyDelta;
use tokio::sync::watch;

use super::{HttpError, Slots, StreamReservation};
use crate::limits::{HTTP_BODY_DELTA_BYTES, MAX_HTTP_RESPONSE_BODY_BYTES};
use crate::outbound::{Outbound, OutboundSender};

/// Read the whole body, at most `limit` bytes.
///
/// # Errors
/// [`HttpError::TooLarge`] past `limit`; [`HttpError::TimedOut`] or [`HttpError::Upstream`]
/// when reading fails.
pub async fn read_bounded(
    response: &mut reqwest::Response,
    limit: usize,
    timeout_ms: Option<u64>,
) -> Result<Vec<u8>, HttpError> {
    let too_large = || HttpError::TooLarge {
        what: "the response body",
        limit_name: "MAX_HTTP_RESPONSE_BODY_BYTES",
        limit: MAX_HTTP_RESPONSE_BODY_BYTES,
        hint: "; send streamResponse: true to receive it as http/request/bodyDelta notifications",
    };
    if response
        .content_length()
        .is_some_and(|length| length > limit as u64)
    {
        return Err(too_large());
    }
    let url = response.url().clone();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| HttpError::upstream(&url, error, timeout_ms))?
    {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The body of a streamed request, still to be sent.
pub struct BodyStream {
    request_id: String,
    response: reqwest::Response,
    timeout_ms: Option<u64>,
    _slots: Slots,
    _reservation: StreamReservation,
}

/// The connection is gone.
struct Gone;

impl BodyStream {
    pub(super) fn new(
        request_id: String,
        response: reqwest::Response,
        slots: Slots,
        reservation: StreamReservation,
        timeout_ms: Option<u64>,
    ) -> Self {
        Self {
            request_id,
            response,
            timeout_ms,
            _slots: slots,
            _reservation: reservation,
        }
    }

    /// Send the body to `outbound` until it ends, fails, or `closed` turns true. Start it only
    /// after the `http/request` answer is queued, so the answer comes first.
    pub async fn run(mut self, outbound: OutboundSender, mut closed: watch::Receiver<bool>) {
        let mut seq = 1;
        let url = self.response.url().clone();
        loop {
            let chunk = tokio::select! {
                chunk = self.response.chunk() => chunk,
                _ = closed.wait_for(|closed| *closed) => return,
            };
            let last = match chunk {
                Ok(Some(bytes)) => {
                    for piece in bytes.chunks(HTTP_BODY_DELTA_BYTES) {
                        if self
                            .send(&outbound, &mut closed, seq, piece, None)
                            .await
                            .is_err()
                        {
                            return;
                        }
                        seq += 1;
                    }
                    continue;
                }
                Ok(None) => None,
                Err(error) => Some(HttpError::upstream(&url, error, self.timeout_ms).to_string()),
            };
            if let Some(error) = &last {
                tracing::debug!(request_id = %self.request_id, %error, "http/request body failed");
            }
            let _ = self
                .send(&outbound, &mut closed, seq, &[], Some(last))
                .await;
            return;
        }
    }

    /// Send one delta; `end` is `Some(error)` for the last one.
    async fn send(
        &self,
        outbound: &OutboundSender,
        closed: &mut watch::Receiver<bool>,
        seq: u64,
        bytes: &[u8],
        end: Option<Option<String>>,
    ) -> Result<(), Gone> {
        let delta = HttpBodyDelta {
            request_id: self.request_id.clone(),
            seq,
            delta_base64: base64_simd::STANDARD.encode_to_string(bytes),
            done: end.is_some(),
            error: end.flatten(),
        };
        let params = serde_json::to_value(delta).map_err(|_| Gone)?;
        let message = Outbound::Message(Message::Notification(Notification {
            method: HTTP_REQUEST_BODY_DELTA.to_owned(),
            params: Some(params),
        }));
        tokio::select! {
            sent = outbound.send(message) => sent.map_err(|_| Gone),
            _ = closed.wait_for(|closed| *closed) => Err(Gone),
        }
    }
}
