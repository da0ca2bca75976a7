//! [`RemoteFileReader`]: a remote file as a [`tokio::io::AsyncRead`], over `fs/open`,
//! `fs/readBlock` and `fs/close`.
//!
//! The handle lives on the connection that opened it, so every block is requested on that
//! connection; when it is lost the stream fails (it is not resumed: the file may have changed,
//! and handles are closed with their connection).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use proto::methods::fs::{CloseParams, OpenParams, OpenResult, ReadBlockParams, ReadBlockResult};
use proto::methods::{FS_CLOSE, FS_OPEN, FS_READ_BLOCK};
use tokio::io::{AsyncRead, ReadBuf};

use super::connection::{CallError, RpcConnection};
use super::core::{Inner, decode_base64, from_result, to_params};
use super::error::ExecServerError;
use super::transport::BoxFuture;

/// Bytes asked for per `fs/readBlock` (the server's `READ_BLOCK_MAX_BYTES`, 1 MiB).
pub const READ_BLOCK_BYTES: u64 = crate::limits::READ_BLOCK_MAX_BYTES as u64;

type BlockFuture = BoxFuture<'static, Result<ReadBlockResult, ExecServerError>>;

/// A remote regular file, read front to back. See [`super::ExecServerClient::fs_open`].
pub struct RemoteFileReader {
    inner: Arc<Inner>,
    connection: Arc<RpcConnection>,
    handle_id: String,
    path: String,
    offset: u64,
    eof: bool,
    buffer: Vec<u8>,
    position: usize,
    in_flight: Option<BlockFuture>,
    open: bool,
}

impl RemoteFileReader {
    pub(crate) async fn open(
        inner: &Arc<Inner>,
        params: OpenParams,
        path: String,
    ) -> Result<Self, ExecServerError> {
        let connection = inner.connection().await?;
        let handle_id = params.handle_id.clone();
        let params = to_params(FS_OPEN, &params)?;
        let result: OpenResult = match connection
            .request(inner.request_id(), FS_OPEN, params)
            .await
        {
            Ok(result) => from_result(FS_OPEN, result)?,
            Err(CallError::Rpc(error)) => {
                return Err(ExecServerError::Rpc {
                    method: FS_OPEN.into(),
                    error: Box::new(error),
                });
            }
            // A lost open leaves no handle behind: handles close with their connection.
            Err(CallError::Disconnected) => {
                return Err(ExecServerError::StreamInterrupted { path });
            }
        };
        debug_assert_eq!(result.handle_id, handle_id);
        Ok(Self {
            inner: Arc::clone(inner),
            connection,
            handle_id,
            path,
            offset: 0,
            eof: false,
            buffer: Vec::new(),
            position: 0,
            in_flight: None,
            open: true,
        })
    }

    /// The file's `file:` URI.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn read_block(&self) -> BlockFuture {
        let inner = Arc::clone(&self.inner);
        let connection = Arc::clone(&self.connection);
        let params = ReadBlockParams {
            handle_id: self.handle_id.clone(),
            offset: self.offset,
            len: READ_BLOCK_BYTES,
        };
        let path = self.path.clone();
        Box::pin(async move {
            let params = to_params(FS_READ_BLOCK, &params)?;
            match connection
                .request(inner.request_id(), FS_READ_BLOCK, params)
                .await
            {
                Ok(result) => from_result(FS_READ_BLOCK, result),
                Err(CallError::Rpc(error)) => Err(ExecServerError::Rpc {
                    method: FS_READ_BLOCK.into(),
                    error: Box::new(error),
                }),
                Err(CallError::Disconnected) => Err(ExecServerError::StreamInterrupted { path }),
            }
        })
    }

    fn close_handle(&mut self) {
        if !std::mem::replace(&mut self.open, false) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the handle closes with the connection
        };
        let inner = Arc::clone(&self.inner);
        let connection = Arc::clone(&self.connection);
        let params = CloseParams {
            handle_id: self.handle_id.clone(),
        };
        runtime.spawn(async move {
            if let Ok(params) = to_params(FS_CLOSE, &params) {
                let _ = connection
                    .request(inner.request_id(), FS_CLOSE, params)
                    .await;
            }
        });
    }
}

impl AsyncRead for RemoteFileReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.position < self.buffer.len() {
                let available = &self.buffer[self.position..];
                let n = available.len().min(out.remaining());
                out.put_slice(&available[..n]);
                self.position += n;
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                self.close_handle();
                return Poll::Ready(Ok(()));
            }
            if self.in_flight.is_none() {
                let block = self.read_block();
                self.in_flight = Some(block);
            }
            let Some(in_flight) = self.in_flight.as_mut() else {
                continue;
            };
            let result = match in_flight.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => result,
            };
            self.in_flight = None;
            let block = result.map_err(std::io::Error::other)?;
            let data = decode_base64(&block.chunk).ok_or_else(|| {
                std::io::Error::other(ExecServerError::Protocol {
                    method: FS_READ_BLOCK.into(),
                    reason: "chunk is not valid base64".into(),
                })
            })?;
            self.offset += data.len() as u64;
            self.eof = block.eof || data.is_empty();
            self.buffer = data;
            self.position = 0;
        }
    }
}

impl Drop for RemoteFileReader {
    fn drop(&mut self) {
        self.close_handle();
    }
}
