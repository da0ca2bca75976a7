//! One task per process moves its output, exit and close into the event log and out as
//! notifications. A single task per process is what keeps notifications in seq order across
//! stdout, stderr and exit.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use proto::jsonrpc::{Message, Notification};
use proto::methods::process::binary::{OUTPUT_FRAME_HEADER_BYTES, OutputFrame};
use proto::methods::process::{
    ClosedNotification, DeniedNotification, ExitedNotification, OutputStream,
};
use proto::methods::{PROCESS_CLOSED, PROCESS_DENIED, PROCESS_EXITED, PROCESS_OUTPUT};
use serde::Serialize;
use tokio::io::AsyncReadExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio_tungstenite::tungstenite::Bytes;

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::ProcessTable;
use super::guardian::Guardian;
use super::managed::ManagedProcess;
use super::spawn::Leader;
use crate::containment::plan::{ExitFacts, exit_reason};
use crate::containment::reaper::Reaper;
use crate::limits::{CLOSED_PROCESS_RETENTION, OUTPUT_READ_CHUNK_BYTES, OUTPUT_RUNTIME_THREADS};
use crate::session::Attachment;
use crate::sys::ChildExit;

/// The output side of a child.
pub enum PumpIo {
    /// stdout and stderr pipes.
    Pipes(pipe::Receiver, pipe::Receiver),
    /// The PTY master (shared with stdin writes).
    Pty(Arc<AsyncFd<OwnedFd>>),
}

/// Where a pump reports and whom it tells about the reaped leader.
pub struct PumpContext {
    /// The session's notification sink.
    pub sink: Arc<Attachment>,
    /// The session's table (the process leaves it after its retention).
    pub table: Weak<ProcessTable>,
    /// Told when the leader is reaped, when it was registered (no cgroup).
    pub guardian: Option<Arc<Guardian>>,
    /// Told when the leader is reaped (no cgroup).
    pub reaper: Option<Arc<Reaper>>,
    /// `cpuSeconds` and `wallSeconds`, for the exit reason.
    pub cpu_limit: Option<Duration>,
    /// See `cpu_limit`.
    pub wall_limit: Option<Duration>,
    /// Counts the exit.
    pub metrics: Arc<crate::observe::Metrics>,
    /// The session's id, for the exit's log event.
    pub session_id: String,
}

impl PumpContext {
    /// The leader was just reaped: its pid may be recycled from now on, so nobody may keep it.
    fn reaped(&self, pid: i32) {
        if let Some(guardian) = &self.guardian {
            guardian.unregister(pid);
        }
        if let Some(reaper) = &self.reaper {
            reaper.forget(pid);
        }
    }

    /// The leader exited: count it and log it (ids, outcome, reason, duration and usage; no
    /// argv, no environment).
    fn exited(
        &self,
        process: &ManagedProcess,
        exit: ChildExit,
        reason: proto::methods::process::ExitReason,
        usage: &proto::methods::process::ResourceUsage,
    ) {
        self.metrics.process_exited(reason);
        tracing::info!(
            session_id = %self.session_id,
            process_id = %crate::untrusted::LogField(&process.id),
            pid = process.pid,
            exit_code = exit.code,
            signal = exit.signal,
            reason = %crate::observe::metrics::reason_label(reason),
            duration_ms = usage.wall_millis,
            cpu_ms = usage.cpu_millis,
            peak_memory_bytes = usage.peak_memory_bytes,
            "process exited"
        );
    }

    /// Why the process ended.
    fn reason(
        &self,
        process: &ManagedProcess,
        exit: ChildExit,
    ) -> proto::methods::process::ExitReason {
        exit_reason(&ExitFacts {
            code: exit.code,
            signal: exit.signal,
            terminated: process.kills.terminated.load(Ordering::Relaxed),
            wall_fired: process.kills.wall.load(Ordering::Relaxed),
            cpu_budget_fired: process.kills.cpu.load(Ordering::Relaxed),
            oom_kills: process.tree().oom_kills(),
            cpu_used: exit.cpu,
            cpu_limit: self.cpu_limit,
            elapsed: process.started.elapsed(),
            wall_limit: self.wall_limit,
        })
    }
}

/// Start the pump of a process on the output runtime ([`start_output_runtime`]), its pipes
/// registered with that runtime's reactor; on the current runtime where there is none.
pub fn start(
    process: Arc<ManagedProcess>,
    leader: Arc<Leader>,
    io: PumpIo,
    audit: Option<pipe::Receiver>,
    context: PumpContext,
) {
    let pump = async move {
        let io = match io {
            PumpIo::Pipes(stdout, stderr) => {
                match (registered_here(stdout), registered_here(stderr)) {
                    (Ok(stdout), Ok(stderr)) => PumpIo::Pipes(stdout, stderr),
                    (Err(error), _) | (_, Err(error)) => {
                        // Cannot happen for a pipe the server made: registering its descriptor
                        // again only fails when the reactor is out of memory.
                        tracing::error!(%error, "cannot watch a process's output pipes");
                        return;
                    }
                }
            }
            pty => pty,
        };
        let audit = audit.and_then(|pipe| {
            registered_here(pipe)
                .map_err(|error| {
                    tracing::error!(%error, "cannot watch a process's denial records");
                })
                .ok()
        });
        run(process, leader, io, audit, context).await;
    };
    match OUTPUT_RUNTIME.get() {
        Some(runtime) => drop(runtime.spawn(pump)),
        None => drop(tokio::spawn(pump)),
    }
}

/// See [`start_output_runtime`].
static OUTPUT_RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// Start the runtime every process's output is read on (once per process; later calls do
/// nothing): its own threads and task queue, so reading the output of a thousand busy processes
/// (each woken for every 64 KiB) never queues a request of any client behind them. Requests are
/// served on the server's runtime, whose queue then holds only requests (measured: with 1,200
/// processes writing 1 MB each at once, a neighbour's p99 went from 70-280 ms to about 3 ms on
/// two cores). [`OUTPUT_RUNTIME_THREADS`] workers: reading output is cheap per byte, and the
/// other cores stay free for requests.
///
/// # Errors
/// The runtime's threads or reactor could not be made.
pub fn start_output_runtime() -> std::io::Result<()> {
    if OUTPUT_RUNTIME.get().is_none() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(OUTPUT_RUNTIME_THREADS)
            .thread_name("exec-output")
            .enable_all()
            .build()?;
        // A concurrent call may have set one first: the spare is dropped.
        let _ = OUTPUT_RUNTIME.set(runtime);
    }
    Ok(())
}

/// `pipe` registered with the current runtime's reactor instead of the one that made it.
fn registered_here(pipe: pipe::Receiver) -> std::io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd_unchecked(pipe.into_nonblocking_fd()?)
}

/// Run until the process closed, then keep it readable for [`CLOSED_PROCESS_RETENTION`] and
/// remove it from the table. Its cgroups are removed once empty; a tree that still holds
/// processes then (a daemon the command left behind) stays with the session until the session
/// ends or the process is terminated.
async fn run(
    process: Arc<ManagedProcess>,
    leader: Arc<Leader>,
    io: PumpIo,
    audit: Option<pipe::Receiver>,
    context: PumpContext,
) {
    let sink = context.sink.clone();
    let audit =
        audit.map(|pipe| tokio::spawn(forward_denials(process.clone(), pipe, sink.clone())));
    let emitter = Emitter {
        process: &process,
        sink: &sink,
    };
    let reaped = async || {
        let exit = leader.wait().await;
        context.reaped(process.pid);
        exit
    };
    match io {
        PumpIo::Pipes(stdout, stderr) => {
            let (mut out_open, mut err_open, mut exited) = (true, true, false);
            while out_open || err_open || !exited {
                tokio::select! {
                    read = read_pipe(&stdout, &emitter, OutputStream::Stdout), if out_open => match read {
                        Some(data) => emitter.output(OutputStream::Stdout, data).await,
                        None => out_open = false,
                    },
                    read = read_pipe(&stderr, &emitter, OutputStream::Stderr), if err_open => match read {
                        Some(data) => emitter.output(OutputStream::Stderr, data).await,
                        None => err_open = false,
                    },
                    status = reaped(), if !exited => {
                        exited = true;
                        // Output the child wrote before exiting is already in the pipes: emit it
                        // first, so `exited` follows it (only later writes by grandchildren can
                        // still come after `exited`). Read the descriptors directly: the
                        // reactor may not have seen them become readable yet.
                        if out_open {
                            out_open = drain(&emitter, OutputStream::Stdout, stdout.as_fd()).await;
                        }
                        if err_open {
                            err_open = drain(&emitter, OutputStream::Stderr, stderr.as_fd()).await;
                        }
                        let reason = context.reason(&process, status);
                        let usage = emitter.exit(status, reason).await;
                        context.exited(&process, status, reason, &usage);
                    }
                }
            }
        }
        PumpIo::Pty(master) => {
            let (mut open, mut exited) = (true, false);
            while open || !exited {
                tokio::select! {
                    read = read_pty(&master, &emitter), if open => match read {
                        Some(data) => emitter.output(OutputStream::Pty, data).await,
                        None => open = false,
                    },
                    status = reaped(), if !exited => {
                        exited = true;
                        if open {
                            open = drain(&emitter, OutputStream::Pty, master.get_ref().as_fd()).await;
                        }
                        let reason = context.reason(&process, status);
                        let usage = emitter.exit(status, reason).await;
                        context.exited(&process, status, reason, &usage);
                    }
                }
            }
        }
    }
    if let Some(audit) = audit {
        // sandbox-run writes its last records before it exits; collect them before `closed`.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), audit).await;
    }
    // The child is reaped and its output is at EOF: release its pidfd, stdin and terminal now,
    // not after the retention below (thousands of retained processes would otherwise hold
    // descriptors).
    drop(leader);
    process.release_io();
    emitter.closed().await;
    match context.table.upgrade() {
        // rmdir takes the kernel's cgroup mutex (held for milliseconds by a migration
        // elsewhere): on the blocking pool, not on an async worker.
        Some(table) => {
            let tree = process.tree().clone();
            let _ = tokio::task::spawn_blocking(move || table.release_tree(&tree)).await;
        }
        None => process.tree().kill_and_remove().await,
    }
    tokio::time::sleep(CLOSED_PROCESS_RETENTION).await;
    if let Some(table) = context.table.upgrade() {
        table.remove_if_same(&process);
    }
}

/// Read denial records (one JSON object per line) from `sandbox-run --audit-fd`, keep them and
/// send each as `process/denied`.
async fn forward_denials(
    process: Arc<ManagedProcess>,
    pipe: pipe::Receiver,
    sink: Arc<Attachment>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        let limit = crate::limits::MAX_DENIAL_RECORD_BYTES as u64 + 1;
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') && line.len() as u64 >= limit => {
                tracing::warn!(process_id = %crate::untrusted::LogField(&process.id), "dropping an oversized denial record");
                // Skip the rest of the oversized line.
                let mut rest = Vec::new();
                if reader.read_until(b'\n', &mut rest).await.is_err() {
                    return;
                }
            }
            Ok(_) => {
                let Ok(record) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                let number = process.record_denial(record.clone(), line.len());
                if let Some(sender) = sink.sender() {
                    let params = DeniedNotification {
                        process_id: process.id.clone(),
                        number: Some(number),
                        denial: record,
                    };
                    let message = Message::Notification(Notification {
                        method: PROCESS_DENIED.to_owned(),
                        params: serde_json::to_value(params).ok(),
                    });
                    let _ = sender
                        .send(crate::outbound::Outbound::Message(message))
                        .await;
                }
            }
        }
    }
}

thread_local! {
    /// Where a pump reads a child's output before copying out what arrived: one buffer per
    /// worker thread, not two per process (1,200 live chatty processes held 300 MiB of them).
    static READ_BUFFER: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0u8; OUTPUT_READ_CHUNK_BYTES]);
}

/// Output as it was copied out of the read buffer.
enum Read {
    /// The bytes alone.
    Plain(Vec<u8>),
    /// A binary output frame around them (for a client taking binary frames: the one copy the
    /// bytes need on their way out), its seq still to be patched in.
    Framed(Vec<u8>),
}

impl Read {
    fn len(&self, header: usize) -> usize {
        match self {
            Read::Plain(data) => data.len(),
            Read::Framed(frame) => frame.len() - header,
        }
    }
}

/// Run `read` on this thread's read buffer and copy out what it read, shaped for where it
/// goes (no `.await` in between, so the buffer is never held across a task switch).
/// `Ok(None)` at end of file.
fn read_now(
    read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    shape: impl FnOnce(&[u8]) -> Read,
) -> std::io::Result<Option<Read>> {
    READ_BUFFER.with_borrow_mut(|buf| read(buf).map(|n| (n > 0).then(|| shape(&buf[..n]))))
}

/// The next output of a pipe; `None` at end of file (or on an error).
async fn read_pipe(
    pipe: &pipe::Receiver,
    emitter: &Emitter<'_>,
    stream: OutputStream,
) -> Option<Read> {
    loop {
        pipe.readable().await.ok()?;
        match read_now(|buf| pipe.try_read(buf), |data| emitter.shape(stream, data)) {
            Ok(data) => return data,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
    }
}

/// Emits what `fd` (non-blocking) holds right now, reading it directly rather than waiting for
/// the reactor to report it readable; at most [`EXIT_DRAIN_LIMIT`] bytes, so a grandchild that
/// keeps writing cannot hold `exited` back. `false` when the stream reached end of file (for a
/// PTY master, EIO: every slave descriptor closed).
async fn drain(emitter: &Emitter<'_>, stream: OutputStream, fd: BorrowedFd<'_>) -> bool {
    let mut drained = 0;
    while drained < EXIT_DRAIN_LIMIT {
        let read = |buf: &mut [u8]| nix::unistd::read(fd, buf).map_err(std::io::Error::from);
        match read_now(read, |data| emitter.shape(stream, data)) {
            Ok(None) => return false,
            Ok(Some(data)) => {
                drained += data.len(emitter.header_len());
                emitter.output(stream, data).await;
            }
            Err(error) if error.raw_os_error() == Some(nix::libc::EINTR) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Where an output frame's seq sits (see `proto::methods::process::binary`).
const SEQ_OFFSET: usize = 2;

/// How much output [`drain`] takes from one stream when the child exits.
const EXIT_DRAIN_LIMIT: usize = 4 * 1024 * 1024;

/// The next output of the PTY master; EIO (every slave descriptor closed) is end of file.
async fn read_pty(master: &AsyncFd<OwnedFd>, emitter: &Emitter<'_>) -> Option<Read> {
    loop {
        let mut guard = master.readable().await.ok()?;
        match guard.try_io(|fd| {
            let read =
                |buf: &mut [u8]| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from);
            read_now(read, |data| emitter.shape(OutputStream::Pty, data))
        }) {
            Ok(Ok(data)) => return data,
            Ok(Err(_)) => return None,
            Err(_would_block) => continue,
        }
    }
}

struct Emitter<'a> {
    process: &'a Arc<ManagedProcess>,
    sink: &'a Attachment,
}

impl Emitter<'_> {
    /// Bytes of a binary output frame's header for this process.
    fn header_len(&self) -> usize {
        // `OutputFrame::encode` cuts an id longer than u16::MAX bytes to that length.
        OUTPUT_FRAME_HEADER_BYTES + self.process.id.len().min(usize::from(u16::MAX))
    }

    fn frame(&self, stream: OutputStream, data: &[u8]) -> Vec<u8> {
        OutputFrame {
            process_id: &self.process.id,
            stream,
            seq: 0,
            data,
        }
        .encode()
    }

    /// `data` as it leaves the read buffer: already framed when the client takes binary frames
    /// (the frame and the log then share one copy), else copied alone.
    fn shape(&self, stream: OutputStream, data: &[u8]) -> Read {
        match self.sink.sender() {
            Some(sender) if sender.binary_output() => Read::Framed(self.frame(stream, data)),
            _ => Read::Plain(data.to_vec()),
        }
    }

    async fn output(&self, stream: OutputStream, read: Read) {
        let header = self.header_len();
        let sender = self.sink.sender();
        let binary = sender.as_ref().is_some_and(|sender| sender.binary_output());
        // The client may have come or gone since the read: reshape (a copy) only then.
        let frame = match read {
            Read::Framed(frame) if binary || sender.is_none() => frame,
            Read::Framed(frame) => return self.output_json(stream, frame[header..].to_vec()).await,
            Read::Plain(data) if binary => self.frame(stream, &data),
            Read::Plain(data) => return self.output_json(stream, data).await,
        };
        let len = frame.len() - header;
        let mut sent = None;
        let seq = self.process.push_output_with(stream, len, |seq| {
            let mut frame = frame;
            frame[SEQ_OFFSET..SEQ_OFFSET + 8].copy_from_slice(&seq.to_be_bytes());
            let frame = Bytes::from(frame);
            sent = Some(frame.clone());
            frame.slice(header..)
        });
        self.process.publish(seq);
        if let (Some(sender), Some(frame)) = (sender.filter(|_| binary), sent) {
            let _ = sender.send(crate::outbound::Outbound::Binary(frame)).await;
        }
    }

    /// `data` to a client taking JSON notifications, or to none.
    async fn output_json(&self, stream: OutputStream, data: Vec<u8>) {
        let Some(sender) = self.sink.sender() else {
            let seq = self.process.push_output(stream, data);
            self.process.publish(seq);
            return;
        };
        // Hot path: write the notification text directly (base64 needs no JSON escaping),
        // instead of building a serde_json::Value and serializing it again. It is encoded
        // before the log takes the bytes (its seq goes last).
        let stream_name = match stream {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
            OutputStream::Pty => "pty",
        };
        let mut text = String::with_capacity(data.len() / 3 * 4 + 128 + self.process.id_json.len());
        text.push_str(r#"{"method":""#);
        text.push_str(PROCESS_OUTPUT);
        text.push_str(r#"","params":{"processId":"#);
        text.push_str(&self.process.id_json);
        text.push_str(&format!(r#","stream":"{stream_name}","chunk":""#));
        base64_simd::STANDARD.encode_append(&data, &mut text);
        let seq = self.process.push_output(stream, data);
        self.process.publish(seq);
        text.push_str(&format!(r#"","seq":{seq}}}}}"#));
        let _ = sender.send(crate::outbound::Outbound::Text(text)).await;
    }

    async fn exit(
        &self,
        status: ChildExit,
        reason: proto::methods::process::ExitReason,
    ) -> proto::methods::process::ResourceUsage {
        let (code, signal) = (status.code, status.signal);
        // Measured before the exit is published, so a `process/read` that sees the exit sees
        // its usage too.
        let usage = self.process.measure_usage(&status);
        let exit = self.process.log().push_exit(code, signal, Some(reason));
        self.process.publish(exit.seq);
        let params = ExitedNotification {
            process_id: self.process.id.clone(),
            seq: exit.seq,
            exit_code: code,
            signal,
            reason: Some(reason),
            usage: Some(usage),
        };
        self.send(PROCESS_EXITED, &params).await;
        usage
    }

    async fn closed(&self) {
        let seq = self.process.log().push_closed();
        self.process.publish(seq);
        self.send(
            PROCESS_CLOSED,
            &ClosedNotification {
                process_id: self.process.id.clone(),
                seq,
            },
        )
        .await;
    }

    async fn send<P: Serialize>(&self, method: &str, params: &P) {
        let Some(sender) = self.sink.sender() else {
            return;
        };
        let params = serde_json::to_value(params).ok();
        let message = Message::Notification(Notification {
            method: method.to_owned(),
            params,
        });
        // A closed connection drops the notification; the event stays in the log for
        // `process/read` after a resume.
        let _ = sender
            .send(crate::outbound::Outbound::Message(message))
            .await;
    }
}
