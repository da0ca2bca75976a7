//! The `process/*` methods but `process/start` (a pipeline of its own, [`super::start`]): params
//! in, results out; errors are [`ProcessError`]s mapped to
//! JSON-RPC in one place (`rpc::errors`).

use std::time::Duration;

use base64::Engine;
use nix::sys::signal::Signal;
use proto::methods::process::{
    ListResult, OutputChunk, ReadParams, ReadResult, ResizeParams, RunningResult, SignalName,
    SignalParams, TerminateParams, WriteParams, WriteResult, WriteStatus,
};

use super::{Lookup, ProcessError};
use crate::budget::{BudgetError, ConnectionBudget};
use crate::limits::{MAX_READ_BYTES, MAX_WAIT_MS, MAX_WRITE_ID_BYTES, OUTPUT_READ_CHUNK_BYTES};
use crate::session::Session;

/// `process/list`: the session's started processes, oldest first. Reads the running ones'
/// cgroup files: call it on the blocking pool.
pub fn list(table: &super::ProcessTable) -> ListResult {
    let mut processes: Vec<_> = table.all().iter().map(|process| process.info()).collect();
    processes
        .sort_by(|a, b| (a.started_at_ms, &a.process_id).cmp(&(b.started_at_ms, &b.process_id)));
    ListResult::new(processes)
}

/// `process/read`. Once there is something to return (or the wait is over), `reserve` is asked
/// for the memory of the answer, before it is built.
///
/// # Errors
/// [`ProcessError::NotFound`]; [`ProcessError::Budget`] when the answer's memory is refused.
pub async fn read(
    session: &Session,
    params: ReadParams,
    reserve: impl FnOnce(usize) -> Result<(), BudgetError>,
) -> Result<ReadResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let max_bytes = params
        .max_bytes
        .unwrap_or(MAX_READ_BYTES)
        .min(MAX_READ_BYTES);
    let wait = Duration::from_millis(params.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let after_seq = params.after_seq.unwrap_or(0);
    let after_denial = params.after_denial.unwrap_or(0);
    process.wait_for_events(after_seq, wait).await;
    // What the answer can hold: output up to maxBytes (one chunk more may arrive meanwhile,
    // and one chunk is returned even past maxBytes) and denial records, as base64 or JSON,
    // built once as a value and once as text.
    let data = max_bytes
        .min(process.log().bytes_after(after_seq) + process.denial_bytes_after(after_denial))
        + 2 * OUTPUT_READ_CHUNK_BYTES as u64;
    reserve(2 * usize::try_from(data.div_ceil(3) * 4).unwrap_or(usize::MAX))?;
    let read = process.log().read(after_seq, max_bytes);
    let chunk_bytes: u64 = read
        .chunks
        .iter()
        .map(|chunk| chunk.data.len() as u64)
        .sum();
    let denials = process.denials_after(
        after_denial,
        max_bytes.saturating_sub(chunk_bytes),
        read.chunks.is_empty(),
    );
    let audited = process.audited();
    Ok(ReadResult {
        chunks: read
            .chunks
            .into_iter()
            .map(|chunk| OutputChunk {
                seq: chunk.seq,
                stream: chunk.stream,
                chunk: base64_simd::STANDARD.encode_to_string(&chunk.data),
            })
            .collect(),
        next_seq: read.next_seq,
        exited: read.exit.is_some(),
        exit_code: read.exit.map(|exit| exit.code),
        signal: read.exit.and_then(|exit| exit.signal),
        exit_reason: read.exit.and_then(|exit| exit.reason),
        exit_seq: read.exit.map(|exit| exit.seq),
        exit_usage: read.exit.and_then(|_| process.usage()),
        closed: read.closed_seq.is_some(),
        closed_seq: read.closed_seq,
        failure: None,
        output_dropped: read.dropped.is_some(),
        first_retained_seq: read.dropped,
        output_dropped_chunks: read.dropped_total.0,
        output_dropped_bytes: read.dropped_total.1,
        denials: denials.records,
        denials_dropped: denials.dropped,
        next_denial: audited.then_some(denials.next),
    })
}

/// `process/write`: the state of the process is a status (`unknownProcess`, `starting`,
/// `stdinClosed`, `accepted`), never an error.
///
/// # Errors
/// Invalid base64 only.
pub async fn write(
    session: &Session,
    budget: &ConnectionBudget,
    params: WriteParams,
) -> Result<WriteResult, ProcessError> {
    if let Some(write_id) = &params.write_id
        && write_id.len() > MAX_WRITE_ID_BYTES
    {
        return Err(ProcessError::TooLong {
            field: "writeId".into(),
            length: write_id.len(),
            limit: MAX_WRITE_ID_BYTES,
            limit_name: "MAX_WRITE_ID_BYTES",
        });
    }
    let decode = |chunk: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(chunk.as_bytes())
            .map_err(ProcessError::InvalidBase64)
    };
    // Decoding megabytes takes milliseconds: not on an async worker.
    let data = if params.chunk.len() > LARGE_CHUNK_BYTES {
        let chunk = params.chunk;
        let (data, chunk) = budget.cpu(move || (decode(&chunk), chunk)).await?;
        crate::cpu_pool::free_off_runtime(chunk);
        data?
    } else {
        decode(&params.chunk)?
    };
    let status = match session.processes.lookup(&params.process_id) {
        Lookup::Missing => WriteStatus::UnknownProcess,
        Lookup::Starting => WriteStatus::Starting,
        Lookup::Ready(process) => {
            process
                .write(&data, params.write_id.as_deref(), params.close)
                .await
        }
    };
    Ok(WriteResult { status })
}

/// `process/write` chunks larger than this (base64) are decoded on the blocking pool.
const LARGE_CHUNK_BYTES: usize = 256 * 1024;

/// `process/signal`.
///
/// # Errors
/// [`ProcessError::NotFound`].
pub fn signal(session: &Session, params: SignalParams) -> Result<RunningResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let signal = match params.signal {
        SignalName::Interrupt => Signal::SIGINT,
        SignalName::Terminate => Signal::SIGTERM,
        SignalName::Kill => Signal::SIGKILL,
        SignalName::Hangup => Signal::SIGHUP,
    };
    Ok(RunningResult {
        running: process.signal(signal),
    })
}

/// `process/resize`.
///
/// # Errors
/// Unknown process, not a PTY, resize failure.
pub fn resize(session: &Session, params: ResizeParams) -> Result<(), ProcessError> {
    if params.cols == 0 || params.rows == 0 {
        return Err(ProcessError::ZeroTerminalSize {
            cols: params.cols,
            rows: params.rows,
        });
    }
    session
        .processes
        .get(&params.process_id)?
        .resize(params.cols, params.rows)
}

/// `process/terminate`: `{running: false}` for unknown or exited processes (an exited process's
/// leftover tree is killed all the same).
pub fn terminate(session: &Session, params: TerminateParams) -> RunningResult {
    let running = session
        .processes
        .get(&params.process_id)
        .is_ok_and(|process| process.terminate());
    RunningResult { running }
}
