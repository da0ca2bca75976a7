//! Every `fs/*` method. Each takes the method's params (so the optional `sandbox` is always
//! available) and returns its typed result. Reads are replayed after a reconnect; changes
//! (`writeFile`, `createDirectory`, `remove`, `copy`) are not, because the server may already
//! have applied them: they fail with [`ExecServerError::Disconnected`] when cut off.

use proto::FileUri;
use proto::methods::fs::{
    CanonicalizeResult, CopyParams, CreateDirectoryParams, DirectoryEntry, GetMetadataResult,
    OpenParams, PathParams, ReadDirectoryResult, ReadFileParams, ReadFileResult, RemoveParams,
    WriteFileParams,
};
use proto::methods::{
    Empty, FS_CANONICALIZE, FS_COPY, FS_CREATE_DIRECTORY, FS_GET_METADATA, FS_READ_DIRECTORY,
    FS_READ_FILE, FS_REMOVE, FS_WRITE_FILE,
};

use super::ExecServerClient;
use super::core::{Replay, decode_base64, encode_base64};
use super::error::ExecServerError;
use super::stream::RemoteFileReader;

impl ExecServerClient {
    /// `fs/readFile`: a whole regular file (at most 32 MiB; use [`ExecServerClient::fs_open`]
    /// for larger files).
    ///
    /// # Errors
    /// -32004 missing path, -32600 `notAFile` / `limitExceeded` / `permissionDenied`.
    pub async fn fs_read_file(&self, params: ReadFileParams) -> Result<Vec<u8>, ExecServerError> {
        let result: ReadFileResult = self.inner.call(FS_READ_FILE, &params, Replay::Safe).await?;
        decode_base64(&result.data_base64).ok_or_else(|| ExecServerError::Protocol {
            method: FS_READ_FILE.into(),
            reason: "dataBase64 is not valid base64".into(),
        })
    }

    /// `fs/writeFile`: create or truncate `path` with `data` (`atomic`: via a temporary file
    /// renamed over the target).
    ///
    /// # Errors
    /// -32004 missing parent, -32600 `permissionDenied` / `isADirectory`.
    pub async fn fs_write_file(
        &self,
        path: FileUri,
        data: &[u8],
        atomic: bool,
        sandbox: Option<serde_json::Value>,
    ) -> Result<(), ExecServerError> {
        let params = WriteFileParams {
            path,
            data_base64: encode_base64(data),
            atomic,
            sandbox,
        };
        let _: Empty = self
            .inner
            .call(FS_WRITE_FILE, &params, Replay::Never)
            .await?;
        Ok(())
    }

    /// `fs/createDirectory`.
    ///
    /// # Errors
    /// -32600 `alreadyExists` (non-recursive on an existing path), -32004 missing parent.
    pub async fn fs_create_directory(
        &self,
        params: CreateDirectoryParams,
    ) -> Result<(), ExecServerError> {
        let _: Empty = self
            .inner
            .call(FS_CREATE_DIRECTORY, &params, Replay::Never)
            .await?;
        Ok(())
    }

    /// `fs/getMetadata`.
    ///
    /// # Errors
    /// -32004 missing path.
    pub async fn fs_get_metadata(
        &self,
        params: PathParams,
    ) -> Result<GetMetadataResult, ExecServerError> {
        self.inner
            .call(FS_GET_METADATA, &params, Replay::Safe)
            .await
    }

    /// `fs/canonicalize`: the path with every symlink, `.` and `..` resolved.
    ///
    /// # Errors
    /// -32004 missing path.
    pub async fn fs_canonicalize(&self, params: PathParams) -> Result<FileUri, ExecServerError> {
        let result: CanonicalizeResult = self
            .inner
            .call(FS_CANONICALIZE, &params, Replay::Safe)
            .await?;
        Ok(result.path)
    }

    /// `fs/readDirectory`: entries sorted by name.
    ///
    /// # Errors
    /// -32004 missing path, -32600 `notADirectory`.
    pub async fn fs_read_directory(
        &self,
        params: PathParams,
    ) -> Result<Vec<DirectoryEntry>, ExecServerError> {
        let result: ReadDirectoryResult = self
            .inner
            .call(FS_READ_DIRECTORY, &params, Replay::Safe)
            .await?;
        Ok(result.entries)
    }

    /// `fs/remove` (never follows symlinks).
    ///
    /// # Errors
    /// -32600 `directoryNotEmpty` without `recursive`, -32004 missing path without `force`.
    pub async fn fs_remove(&self, params: RemoveParams) -> Result<(), ExecServerError> {
        let _: Empty = self.inner.call(FS_REMOVE, &params, Replay::Never).await?;
        Ok(())
    }

    /// `fs/copy`.
    ///
    /// # Errors
    /// -32600 for a directory without `recursive` or a copy into itself, -32004 missing source.
    pub async fn fs_copy(&self, params: CopyParams) -> Result<(), ExecServerError> {
        let _: Empty = self.inner.call(FS_COPY, &params, Replay::Never).await?;
        Ok(())
    }

    /// Open a regular file for streaming: `fs/open`, then `fs/readBlock` as the returned
    /// [`RemoteFileReader`] (a [`tokio::io::AsyncRead`]) is read, and `fs/close` when it is
    /// dropped or reaches the end. The handle belongs to the connection: if the connection is
    /// lost mid-stream, reads fail with [`ExecServerError::StreamInterrupted`].
    ///
    /// # Errors
    /// -32004 missing path, -32600 `notAFile` / `limitExceeded` (too many open handles).
    pub async fn fs_open(
        &self,
        path: FileUri,
        sandbox: Option<serde_json::Value>,
    ) -> Result<RemoteFileReader, ExecServerError> {
        let handle_id = uuid::Uuid::new_v4().simple().to_string();
        let params = OpenParams {
            handle_id: handle_id.clone(),
            path: path.clone(),
            sandbox,
        };
        RemoteFileReader::open(&self.inner, params, path.to_uri_string()).await
    }
}
