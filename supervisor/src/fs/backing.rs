//! Backing an `fs/readFile` answer with memory for the file's size before it is read, and the
//! sandboxed read that the server finishes from the descriptor its helper opened
//! ([`super::helpers::finish_read`]).

use std::fs::File;

use proto::error::RpcError;
use proto::methods::fs::ReadFileParams;
use serde_json::Value;

use crate::budget::{ConnectionBudget, MemoryCharge, content_answer_bytes};
use crate::limits::BULK_READ_BYTES;

/// Backing the answer of an `fs/readFile` with memory for the file's current size (capped at
/// `READ_FILE_MAX_BYTES`) before it is read. A file that cannot be examined is backed as empty
/// (its read will fail, or be backed when its answer is sent).
pub struct AnswerBacking {
    budget: ConnectionBudget,
    path: std::path::PathBuf,
    /// What the answer's charge already backs.
    backed: usize,
}

impl AnswerBacking {
    /// For the read `params`, whose answer is charged to `answer`.
    pub fn new(budget: &ConnectionBudget, params: &ReadFileParams, answer: &MemoryCharge) -> Self {
        Self {
            budget: budget.clone(),
            path: params.path.as_path().to_owned(),
            backed: answer.bytes(),
        }
    }

    /// Examine the file (a filesystem call: on the blocking pool) and back its answer: the
    /// charge to merge into the answer's, and whether the read is a bulk one (at least
    /// `BULK_READ_BYTES`: it waits for its turn before it is read; the size is never sent to
    /// the client).
    ///
    /// # Errors
    /// -32600 `limitExceeded` when the server's memory budget cannot take it now.
    pub fn back(self) -> Result<(MemoryCharge, bool), RpcError> {
        let size = std::fs::metadata(&self.path).map_or(0, |meta| meta.len());
        self.back_size(size)
    }

    /// [`Self::back`] for the file a sandboxed helper opened for the read: its size comes from
    /// the descriptor, never from the server's own view of the client's path.
    ///
    /// # Errors
    /// As [`Self::back`].
    pub fn back_opened(self, file: &File) -> Result<(MemoryCharge, bool), RpcError> {
        let size = file.metadata().map_or(0, |meta| meta.len());
        self.back_size(size)
    }

    fn back_size(self, size: u64) -> Result<(MemoryCharge, bool), RpcError> {
        let size = size.min(fs_helper::READ_FILE_MAX_BYTES);
        let mut charge = MemoryCharge::none();
        let more = content_answer_bytes(size).saturating_sub(self.backed);
        charge.back(&self.budget, more)?;
        Ok((charge, size >= BULK_READ_BYTES))
    }
}

/// A sandboxed `fs/readFile` of the file its helper opened under the policy.
pub struct OpenedRead {
    /// The file the helper opened.
    pub file: File,
    /// The read's params.
    pub params: ReadFileParams,
}

impl OpenedRead {
    /// Read it (blocks): the answer, or `fs/readFile`'s error.
    pub fn read(self) -> Result<Value, RpcError> {
        fs_helper::wire::read_file_result(self.file, &self.params, true)
    }
}
