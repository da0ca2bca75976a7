//! Process handles: start a process, drive it, and receive its events in seq order.
//!
//! A [`ProcessHandle`] is two parts: a cloneable [`RemoteProcess`] to write, signal, resize and
//! terminate, and [`ProcessEvents`], the ordered event stream (output, exited, closed, or a
//! terminal failed). Both survive reconnects. Events are buffered in the client until read and
//! never back-pressure the connection (a caller awaiting a write while not reading events
//! cannot deadlock it); a process whose unread output passes
//! [`super::CLIENT_EVENT_BUFFER_BYTES`] is no longer followed and its events end with `Failed`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use proto::methods::process::{
    OutputStream, ReadParams, ReadResult, ResizeParams, RunningResult, SignalName, SignalParams,
    StartParams, StartResult, TerminateParams, WriteParams, WriteResult, WriteStatus,
};
use proto::methods::{
    Empty, PROCESS_READ, PROCESS_RESIZE, PROCESS_SIGNAL, PROCESS_START, PROCESS_TERMINATE,
    PROCESS_WRITE,
};
use tokio::sync::mpsc;

use super::connection::CallError;
use super::core::{Inner, Phase, ProcessEntry, Replay, StartState, encode_base64, to_params};
use super::error::ExecServerError;
use super::events::{EventSequencer, ProcessEvent};

/// A started process: control ([`RemoteProcess`]) plus its ordered events ([`ProcessEvents`]).
pub struct ProcessHandle {
    process: RemoteProcess,
    events: ProcessEvents,
}

/// Control of one process (cheap to clone; usable while another task reads the events).
#[derive(Clone)]
pub struct RemoteProcess {
    inner: Arc<Inner>,
    id: String,
}

/// The events of one process in seq order, each once: [`ProcessEvent::Output`]s,
/// [`ProcessEvent::Exited`], then [`ProcessEvent::Closed`] (or a terminal
/// [`ProcessEvent::Failed`]), with [`ProcessEvent::Denied`] records between them. Also a
/// [`futures_util::Stream`].
pub struct ProcessEvents {
    receiver: mpsc::UnboundedReceiver<ProcessEvent>,
    /// Output bytes received and not yet read; see [`super::CLIENT_EVENT_BUFFER_BYTES`].
    unread: Arc<AtomicUsize>,
}

/// Everything a process wrote, and how it ended (see [`ProcessHandle::wait`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutput {
    /// Bytes of stream `stdout`.
    pub stdout: Vec<u8>,
    /// Bytes of stream `stderr`.
    pub stderr: Vec<u8>,
    /// Bytes of stream `pty` (processes started with `tty: true`).
    pub pty: Vec<u8>,
    /// Exit code; 128+n when killed by signal n.
    pub exit_code: i32,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    /// Why it ended, when the server says.
    pub reason: Option<proto::methods::process::ExitReason>,
    /// What the sandbox denied it, in order (processes started with `auditDenials`; see
    /// [`ProcessEvent::Denied`]).
    pub denials: Vec<serde_json::Value>,
}

impl ProcessHandle {
    /// The process id.
    pub fn id(&self) -> &str {
        &self.process.id
    }

    /// Control of the process.
    pub fn process(&self) -> &RemoteProcess {
        &self.process
    }

    /// Split into control and events (e.g. to read events in one task and write in another).
    pub fn into_parts(self) -> (RemoteProcess, ProcessEvents) {
        (self.process, self.events)
    }

    /// The next event; `None` after the terminal one.
    pub async fn next_event(&mut self) -> Option<ProcessEvent> {
        self.events.next().await
    }

    /// Collect output until `closed`.
    ///
    /// # Errors
    /// The error of a [`ProcessEvent::Failed`], or [`ExecServerError::Closed`] if the stream
    /// ended without `closed`.
    pub async fn wait(mut self) -> Result<ProcessOutput, ExecServerError> {
        let mut output = ProcessOutput::default();
        while let Some(event) = self.events.next().await {
            match event {
                ProcessEvent::Output { stream, data, .. } => match stream {
                    OutputStream::Stdout => output.stdout.extend(data),
                    OutputStream::Stderr => output.stderr.extend(data),
                    OutputStream::Pty => output.pty.extend(data),
                },
                ProcessEvent::Exited {
                    exit_code,
                    signal,
                    reason,
                    ..
                } => {
                    output.exit_code = exit_code;
                    output.signal = signal;
                    output.reason = reason;
                }
                ProcessEvent::Denied { record, .. } => output.denials.push(record),
                ProcessEvent::Closed { .. } => return Ok(output),
                ProcessEvent::Failed { error } => return Err(error),
            }
        }
        Err(ExecServerError::Closed)
    }
}

impl ProcessEvents {
    /// The next event; `None` after the terminal one.
    pub async fn next(&mut self) -> Option<ProcessEvent> {
        let event = self.receiver.recv().await;
        self.taken(event.as_ref());
        event
    }

    fn taken(&self, event: Option<&ProcessEvent>) {
        if let Some(event) = event {
            self.unread
                .fetch_sub(event.buffered_bytes(), Ordering::Relaxed);
        }
    }
}

impl futures_util::Stream for ProcessEvents {
    type Item = ProcessEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.receiver.poll_recv(cx);
        if let Poll::Ready(event) = &polled {
            self.taken(event.as_ref());
        }
        polled
    }
}

impl RemoteProcess {
    /// The process id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Write `data` to stdin. Each write carries a fresh `writeId` (a UUID), so a write cut off
    /// by a lost connection is safely sent again after recovery: the server applies it once.
    ///
    /// # Errors
    /// [`ExecServerError::WriteNotAccepted`] with the server's status (`stdinClosed`: no
    /// `pipeStdin`, closed, or exited; `unknownProcess`).
    pub async fn write(&self, data: &[u8]) -> Result<(), ExecServerError> {
        self.write_with_id(data, &uuid::Uuid::new_v4().to_string(), false)
            .await
    }

    /// Write `data` and then close stdin.
    ///
    /// # Errors
    /// See [`RemoteProcess::write`].
    pub async fn write_and_close(&self, data: &[u8]) -> Result<(), ExecServerError> {
        self.write_with_id(data, &uuid::Uuid::new_v4().to_string(), true)
            .await
    }

    /// Close stdin.
    ///
    /// # Errors
    /// See [`RemoteProcess::write`].
    pub async fn close_stdin(&self) -> Result<(), ExecServerError> {
        self.write_and_close(&[]).await
    }

    /// Write with a caller-chosen `writeId` (retrying with the same id applies the write once).
    ///
    /// # Errors
    /// See [`RemoteProcess::write`].
    pub async fn write_with_id(
        &self,
        data: &[u8],
        write_id: &str,
        close: bool,
    ) -> Result<(), ExecServerError> {
        let params = WriteParams {
            process_id: self.id.clone(),
            chunk: encode_base64(data),
            write_id: Some(write_id.to_owned()),
            close,
        };
        let result: WriteResult = self
            .inner
            .call(PROCESS_WRITE, &params, Replay::Safe)
            .await?;
        match result.status {
            WriteStatus::Accepted => Ok(()),
            status => Err(ExecServerError::WriteNotAccepted {
                process_id: self.id.clone(),
                status,
            }),
        }
    }

    /// Send `signal` to the process group. Returns whether the process was still running.
    /// Not replayed after a lost connection ([`ExecServerError::Disconnected`]).
    ///
    /// # Errors
    /// -32004 unknown process.
    pub async fn signal(&self, signal: SignalName) -> Result<bool, ExecServerError> {
        let params = SignalParams {
            process_id: self.id.clone(),
            signal,
        };
        let result: RunningResult = self
            .inner
            .call(PROCESS_SIGNAL, &params, Replay::Never)
            .await?;
        Ok(result.running)
    }

    /// Resize the process's terminal (setting a size twice is harmless, so this is replayed).
    ///
    /// # Errors
    /// -32600 `unsupported` for a process without a PTY, -32004 unknown process.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), ExecServerError> {
        let params = ResizeParams {
            process_id: self.id.clone(),
            cols,
            rows,
        };
        let _: Empty = self
            .inner
            .call(PROCESS_RESIZE, &params, Replay::Safe)
            .await?;
        Ok(())
    }

    /// SIGTERM to the process group, SIGKILL after the server's grace period. Returns whether
    /// the process was running; the real exit status follows as [`ProcessEvent::Exited`].
    ///
    /// # Errors
    /// [`ExecServerError::Disconnected`] when cut off (not replayed), or the client's failure.
    pub async fn terminate(&self) -> Result<bool, ExecServerError> {
        let params = TerminateParams {
            process_id: self.id.clone(),
        };
        let result: RunningResult = self
            .inner
            .call(PROCESS_TERMINATE, &params, Replay::Never)
            .await?;
        Ok(result.running)
    }

    /// A raw `process/read` (events after `after_seq`, bounded by `max_bytes`, waiting up to
    /// `wait_ms` for something new). The event stream already delivers everything; this is for
    /// callers that poll instead.
    ///
    /// # Errors
    /// -32004 unknown process.
    pub async fn read(
        &self,
        after_seq: Option<u64>,
        max_bytes: Option<u64>,
        wait_ms: Option<u64>,
    ) -> Result<ReadResult, ExecServerError> {
        let params = ReadParams {
            process_id: self.id.clone(),
            after_seq,
            max_bytes,
            wait_ms,
            after_denial: None,
        };
        self.inner.call(PROCESS_READ, &params, Replay::Safe).await
    }
}

/// Decrements the in-flight start count when a start ends, however it ends. A start whose
/// caller dropped the future before the answer is ambiguous (recovery cleans it up).
struct StartInFlight<'a> {
    inner: &'a Inner,
    process_id: &'a str,
}

impl Drop for StartInFlight<'_> {
    fn drop(&mut self) {
        if let Some(entry) = self.inner.lock_processes().get_mut(self.process_id)
            && entry.start == StartState::Starting
        {
            entry.start = StartState::Ambiguous;
        }
        self.inner.starts_in_flight.send_modify(|count| *count -= 1);
    }
}

impl Inner {
    pub(crate) fn remote_process(self: &Arc<Self>, process_id: &str) -> RemoteProcess {
        RemoteProcess {
            inner: Arc::clone(self),
            id: process_id.to_owned(),
        }
    }

    /// `process/start`. The process is registered before the request is sent, so events that
    /// overtake the response are kept. A start cut off by a lost connection is ambiguous and
    /// cleaned up by recovery, never adopted.
    pub(crate) async fn start_process(
        self: &Arc<Self>,
        params: StartParams,
    ) -> Result<ProcessHandle, ExecServerError> {
        let connection = self.connection().await?;
        let process_id = params.process_id.clone();
        let (sender, receiver) = mpsc::unbounded_channel();
        let unread = Arc::new(AtomicUsize::new(0));
        {
            let mut processes = self.lock_processes();
            if processes.contains_key(&process_id) {
                return Err(ExecServerError::DuplicateProcessId { process_id });
            }
            processes.insert(
                process_id.clone(),
                ProcessEntry {
                    sequencer: EventSequencer::default(),
                    events: sender,
                    unread: Arc::clone(&unread),
                    start: StartState::Starting,
                },
            );
            self.starts_in_flight.send_modify(|count| *count += 1);
        }
        let in_flight = StartInFlight {
            inner: self,
            process_id: &process_id,
        };
        let answer = match to_params(PROCESS_START, &params) {
            Ok(params) => {
                connection
                    .request(self.request_id(), PROCESS_START, params)
                    .await
            }
            Err(error) => {
                self.lock_processes().remove(&process_id);
                return Err(error);
            }
        };
        let outcome = match answer {
            Ok(result) => match serde_json::from_value::<StartResult>(result) {
                Ok(_) => Ok(()),
                Err(error) => Err(ExecServerError::Protocol {
                    method: PROCESS_START.into(),
                    reason: error.to_string(),
                }),
            },
            Err(CallError::Rpc(error)) => Err(ExecServerError::Rpc {
                method: PROCESS_START.into(),
                error: Box::new(error),
            }),
            Err(CallError::Disconnected) => Err(ExecServerError::StartAmbiguous {
                process_id: process_id.clone(),
            }),
        };
        {
            let mut processes = self.lock_processes();
            match &outcome {
                Ok(()) => {
                    if let Some(entry) = processes.get_mut(&process_id) {
                        entry.start = StartState::Started;
                    }
                }
                Err(ExecServerError::StartAmbiguous { .. }) => {
                    if let Some(entry) = processes.get_mut(&process_id) {
                        entry.start = StartState::Ambiguous;
                    }
                }
                Err(_) => {
                    processes.remove(&process_id);
                }
            }
        }
        drop(in_flight);
        if matches!(outcome, Err(ExecServerError::StartAmbiguous { .. })) {
            self.clean_up_late_ambiguous_start(connection.generation, &process_id);
        }
        outcome.map(|()| ProcessHandle {
            process: self.remote_process(&process_id),
            events: ProcessEvents { receiver, unread },
        })
    }

    /// If recovery already passed its clean-up step before this start learned it was cut off,
    /// clean it up here, on the connection that replaced `lost_generation`.
    fn clean_up_late_ambiguous_start(self: &Arc<Self>, lost_generation: u64, process_id: &str) {
        let newer =
            matches!(&*self.phase.borrow(), Phase::Connected(c) if c.generation > lost_generation);
        if !newer {
            return; // recovery will clean it up
        }
        let inner = Arc::clone(self);
        let process_id = process_id.to_owned();
        tokio::spawn(async move {
            if let Ok(connection) = inner.connection().await {
                let _ = inner.terminate_on(&connection, &process_id).await;
            }
            inner.lock_processes().remove(&process_id);
        });
    }
}
