//! The `fs/*` methods. There is one implementation, `fs_helper::wire::execute`:
//! - without a sandbox, or under a policy that does not restrict the filesystem, it runs in the
//!   server process on the blocking pool;
//! - under a restricting policy it runs in a pooled `fs-helper` ([`helpers`]) that applied the
//!   policy to itself; `fs/open` gets the descriptor back over `SCM_RIGHTS`.
//!
//! A request is never run with less restriction than it asked for: an unparsable sandbox is an
//! error, and a helper that cannot start fails the request.
//!
//! `rpc::dispatch` parses a request once into an [`FsRequest`]; [`handle`] runs it.
//! `fs/readBlock` and `fs/close` act on the connection's handles (`handles`), whichever path
//! opened them ([`read_block`], [`close`]). A request sees only what [`FsContext`] gives it: those handles, its
//! connection's budget, the sandboxing and the helper pool.

mod handles;
pub mod helpers;

use std::sync::Arc;

use proto::error::RpcError;
use proto::methods::fs::{CloseParams, ReadBlockParams, ReadBlockResult, ReadFileParams};
use proto::methods::{Empty, to_value};
use serde_json::Value;

pub use handles::HandleTable;
pub use proto::methods::fs::FsRequest;

use crate::budget::{ConnectionBudget, MemoryCharge, content_answer_bytes};
use crate::limits::BULK_READ_BYTES;
use fs_helper::wire::{Outcome, execute};
use helpers::{AwaitsBulkTurn, HelperPool, Sandboxed};

/// Why a handle operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FsRequestError {
    /// `fs/readBlock`'s `len` is 0 or above [`fs_helper::READ_BLOCK_MAX_BYTES`].
    #[error("len must be from 1 to {limit} (READ_BLOCK_MAX_BYTES), got {len}")]
    BlockLength {
        /// The `len` asked for.
        len: u64,
        /// The limit.
        limit: usize,
    },
    /// The request's `sandbox` does not parse or resolve (never run unsandboxed instead).
    #[error(transparent)]
    Sandbox(#[from] crate::sandboxing::SandboxRequestError),
    /// A helper answered `fs/open` without passing the descriptor.
    #[error("fs-helper answered fs/open without passing the descriptor")]
    OpenWithoutDescriptor,
    /// A file came back for a method other than `fs/open` (a bug).
    #[error("a file was opened for a method other than fs/open")]
    UnexpectedDescriptor,
    /// `handleId` is empty or longer than [`crate::limits::MAX_HANDLE_ID_BYTES`] (-32600, as the
    /// reference client maps it to `InvalidInput`).
    #[error("handleId must be 1 to {limit} bytes (MAX_HANDLE_ID_BYTES), got {length}")]
    HandleIdLength {
        /// Its length.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// No such handle.
    #[error("unknown handle {0:?}; open it with fs/open first")]
    UnknownHandle(String),
    /// Handle id in use.
    #[error("handle {0:?} is already open on this connection; choose another handleId")]
    DuplicateHandle(String),
    /// Too many open handles.
    #[error(
        "this connection already has {0} open handles (MAX_OPEN_HANDLES); close some with fs/close"
    )]
    TooManyHandles(usize),
    /// A server-wide budget has no room now.
    #[error(transparent)]
    Budget(#[from] crate::budget::BudgetError),
}

/// What the `fs/*` methods use of their connection and of the server (`rpc::dispatch` builds
/// it).
pub struct FsContext<'a> {
    /// The connection's open handles.
    pub handles: &'a HandleTable,
    /// The connection's memory and blocking-work share.
    pub budget: &'a ConnectionBudget,
    /// The pooled fs-helpers that run requests under a restricting policy.
    pub helpers: &'a Arc<HelperPool>,
    /// The session of the request (helpers are pooled per session).
    pub session_id: &'a str,
}

/// Serve one `fs/*` request (any but the handle methods [`read_block`] and [`close`]).
///
/// # Errors
/// The method's JSON-RPC error.
pub async fn handle(
    context: &FsContext<'_>,
    mut request: FsRequest,
    answer: &mut MemoryCharge,
) -> Result<Value, RpcError> {
    let reservation = match &request {
        FsRequest::Open(open) => Some(context.handles.reserve(&open.handle_id)?),
        _ => None,
    };
    let opens = reservation.is_some();
    let budget = context.budget;
    let sandbox = request
        .sandbox()
        .filter(|sandbox| !sandbox.is_null())
        .cloned();
    // A read's answer is backed with memory for the file's size before it is read, in the
    // blocking job that goes on to do the work (one trip to the blocking pool for a small
    // read, not two); a bulk read then waits for its turn and is done in a second job. Under a
    // restricting policy the size is the one the helper found for a file it could open, never
    // the server's own view of the path (`helpers`).
    let mut backing = match &request {
        FsRequest::ReadFile(params) => Some(AnswerBacking::new(budget, params, answer)),
        _ => None,
    };
    let mut _bulk = None;
    let Some(sandbox) = sandbox else {
        return finish(
            unsandboxed(budget, request, backing, answer).await?,
            reservation,
        );
    };
    let sandboxed = loop {
        let (call, backed) = context
            .helpers
            .call_sandboxed(
                budget,
                context.session_id,
                sandbox.clone(),
                request,
                backing.take(),
            )
            .await?;
        answer.merge(backed);
        match call {
            Ok(done) => break done,
            // Once more with its turn (and without backing: it is backed).
            Err(AwaitsBulkTurn(awaiting)) => {
                _bulk = Some(budget.bulk_read().await?);
                request = awaiting;
            }
        }
    };
    let outcome = match sandboxed {
        Sandboxed::Unrestricted(request, backing) => {
            unsandboxed(budget, request, backing, answer).await?
        }
        Sandboxed::Served(reply) => {
            let value = reply.result?;
            match (opens, reply.file) {
                (false, _) => Outcome::Value(value),
                (true, Some(file)) => Outcome::Opened(file, value),
                (true, None) => return Err(FsRequestError::OpenWithoutDescriptor.into()),
            }
        }
    };
    finish(outcome, reservation)
}

/// Run `request` in the server itself, on the blocking pool: with `backing`, its answer backed
/// first in the same job, a bulk read in a second job once it has its turn. On the blocking
/// pool even when it moves megabytes: it frees them too, and a low-priority thread must not
/// hold the address space's lock (see cpu_pool).
async fn unsandboxed(
    budget: &ConnectionBudget,
    request: FsRequest,
    backing: Option<AnswerBacking>,
    answer: &mut MemoryCharge,
) -> Result<Outcome, RpcError> {
    let Some(backing) = backing else {
        return budget.blocking(move || execute(request, false)).await?;
    };
    let (charge, read) = budget
        .blocking(move || {
            let (charge, bulk) = backing.back()?;
            let read = if bulk {
                Err(request)
            } else {
                Ok(execute(request, false))
            };
            Ok::<_, RpcError>((charge, read))
        })
        .await??;
    answer.merge(charge);
    match read {
        Ok(outcome) => outcome,
        Err(request) => {
            let _turn = budget.bulk_read().await?;
            budget.blocking(move || execute(request, false)).await?
        }
    }
}

/// The answer of a request, with the handle it opened (if any) filled into its reservation.
fn finish(
    outcome: Outcome,
    reservation: Option<handles::HandleReservation<'_>>,
) -> Result<Value, RpcError> {
    match (outcome, reservation) {
        (Outcome::Opened(file, value), Some(reservation)) => {
            reservation.fill(file);
            Ok(value)
        }
        (Outcome::Value(value), _) => Ok(value),
        (Outcome::Opened(..), None) => Err(FsRequestError::UnexpectedDescriptor.into()),
    }
}

/// `fs/close`: close a handle of the connection.
///
/// # Errors
/// -32600 for an unknown handle.
pub fn close(handles: &HandleTable, params: CloseParams) -> Result<Value, RpcError> {
    handles.close(&params.handle_id)?;
    to_value(Empty {})
}

/// Backing the answer of an `fs/readFile` with memory for the file's current size (capped at
/// `READ_FILE_MAX_BYTES`) before it is read. A file that cannot be examined is backed as empty
/// (its read will fail, or be backed when its answer is sent).
pub struct AnswerBacking {
    budget: ConnectionBudget,
    path: std::path::PathBuf,
    /// What the answer's own charge backs already.
    backed: usize,
    /// What this backing took from the budget so far.
    charge: MemoryCharge,
}

impl AnswerBacking {
    /// For the read `params`, whose answer is charged to `answer`.
    pub fn new(budget: &ConnectionBudget, params: &ReadFileParams, answer: &MemoryCharge) -> Self {
        Self {
            budget: budget.clone(),
            path: params.path.as_path().to_owned(),
            backed: answer.bytes(),
            charge: MemoryCharge::none(),
        }
    }

    /// Examine the file with the server's own view (a filesystem call: on the blocking pool;
    /// only where no policy restricts the filesystem) and back its answer: the charge to merge
    /// into the answer's, and whether the read is a bulk one (see [`Self::back_size`]).
    ///
    /// # Errors
    /// -32600 `limitExceeded` when the server's memory budget cannot take it now.
    pub fn back(mut self) -> Result<(MemoryCharge, bool), RpcError> {
        let size = std::fs::metadata(&self.path).map_or(0, |meta| meta.len());
        let bulk = self.back_size(size)?;
        Ok((self.charge, bulk))
    }

    /// Back the answer for a file of `size` bytes (capped at `READ_FILE_MAX_BYTES`), on top of
    /// what is backed already; whether the read is a bulk one (at least `BULK_READ_BYTES`: it
    /// waits for its turn before it is read; the size is never sent to the client).
    ///
    /// # Errors
    /// -32600 `limitExceeded` when the server's memory budget cannot take it now (what was
    /// backed before stays backed).
    pub fn back_size(&mut self, size: u64) -> Result<bool, RpcError> {
        let size = size.min(fs_helper::READ_FILE_MAX_BYTES);
        let answer = content_answer_bytes(size);
        // The charge holds at least what the answer's own charge does not back.
        self.charge
            .back(&self.budget, answer.saturating_sub(self.backed))?;
        Ok(size >= BULK_READ_BYTES)
    }

    /// What this backing took from the budget, to merge into the answer's charge.
    pub fn into_charge(self) -> MemoryCharge {
        self.charge
    }
}

/// `fs/readBlock`: read from a handle of the connection, on the blocking pool within `budget`.
///
/// # Errors
/// -32602 for a `len` out of range, -32600 for an unknown handle, the read's error.
pub async fn read_block(
    handles: &HandleTable,
    budget: &ConnectionBudget,
    params: ReadBlockParams,
) -> Result<Value, RpcError> {
    let limit = fs_helper::READ_BLOCK_MAX_BYTES;
    if params.len == 0 || params.len > limit as u64 {
        return Err(FsRequestError::BlockLength {
            len: params.len,
            limit,
        }
        .into());
    }
    let file = handles.get(&params.handle_id)?;
    let (offset, len) = (params.offset, params.len as usize);
    let (data, eof) = budget
        .blocking(move || fs_helper::read_block(&file, offset, len))
        .await?
        .map_err(|error| fs_helper::wire::fs_error(&error, false))?;
    to_value(ReadBlockResult {
        chunk: base64_simd::STANDARD.encode_to_string(data),
        eof,
    })
}

/// Whether `request` only reads, so its helper's policy can be the read-only one
/// ([`crate::sandboxing::Sandboxing::resolve_reads`]). Every variant is named: a new one must be placed.
pub(crate) fn only_reads(request: &FsRequest) -> bool {
    match request {
        FsRequest::ReadFile(_)
        | FsRequest::GetMetadata(_)
        | FsRequest::Canonicalize(_)
        | FsRequest::ReadDirectory(_)
        | FsRequest::Walk(_) => true,
        FsRequest::WriteFile(_)
        | FsRequest::CreateDirectory(_)
        | FsRequest::Remove(_)
        | FsRequest::Copy(_)
        | FsRequest::Open(_) => false,
    }
}
