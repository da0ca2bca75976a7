//! One request to a helper and its answer, over the helper's socket.

use std::time::Duration;

use fs_helper::frame::{read_frame, write_frame};
use fs_helper::wire::{HelperRequest, HelperResponse};
use proto::error::RpcError;
use proto::methods::fs::FsRequest;

use super::{Helper, HelperError, HelperReply, helper_failed};

/// `helper`, which failed `error` and is killed, as the request's error (with its stderr).
pub(super) fn failed(mut helper: Helper, error: HelperError) -> RpcError {
    // Give a crashed helper a moment to finish writing its stderr.
    let _ = helper.child.try_wait();
    std::thread::sleep(Duration::from_millis(10));
    let stderr = helper.stderr_text();
    helper.kill();
    helper_failed(error, &stderr)
}

/// What a helper answered.
pub(super) enum Answered {
    /// The request's answer.
    Reply(HelperReply),
    /// The size of the file a read with `sizeAbove` opened and did not read.
    Size(u64),
}

/// Send `request` (with `sizeAbove`, for a read) and read the answer; any failure means the
/// helper is unusable. The request comes back (to ask again) whatever happened.
pub(super) fn ask(
    helper: &mut Helper,
    request: FsRequest,
    size_above: Option<u64>,
) -> (FsRequest, Result<Answered, HelperError>) {
    // The server resolved the policy the helper serves: no sandbox of its own.
    let request = HelperRequest {
        request,
        sandbox: None,
        size_above,
    };
    let encoded = serde_json::to_vec(&request).map_err(HelperError::EncodeRequest);
    let answered = encoded.and_then(|encoded| exchange(helper, &encoded, size_above));
    (request.request, answered)
}

/// One framed request and its answer.
fn exchange(
    helper: &mut Helper,
    request: &[u8],
    size_above: Option<u64>,
) -> Result<Answered, HelperError> {
    write_frame(&mut helper.socket, request, None).map_err(HelperError::SendRequest)?;
    let frame = read_frame(&mut helper.socket, crate::limits::MAX_FRAME_BYTES)
        .map_err(HelperError::ReadResponse)?
        .ok_or(HelperError::ExitedBeforeAnswering)?;
    let response: HelperResponse =
        serde_json::from_slice(&frame.body).map_err(HelperError::UnparsableResponse)?;
    let file = frame.fd.map(std::fs::File::from);
    let result = match response {
        HelperResponse::Size(_) if size_above.is_none() => return Err(HelperError::UnaskedSize),
        HelperResponse::Size(size) => return Ok(Answered::Size(size)),
        HelperResponse::Ok(value) => Ok(value),
        HelperResponse::Error(error) => Err(error),
    };
    Ok(Answered::Reply(HelperReply { result, file }))
}
