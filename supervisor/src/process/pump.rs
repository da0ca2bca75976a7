//! One task per process moves its output, exit and close into the event log and out as
//! notifications. A single task per process is what keeps notifications in seq order across
//! stdout, stderr and exit.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};

use proto::jsonrpc::{Message, Notification};
use proto::methods::process::{
    ClosedNotification, DeniedNotification, ExitedNotification, OutputStream,
};
use proto::methods::{PROCESS_CLOSED, PROCESS_DENIED, PROCESS_EXITED, PROCESS_OUTPUT};
use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::unix::pipe;

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::ProcessTable;
use super::guardian::Guardian;
use super::managed::ManagedProcess;
use super::spawn::Leader;
use crate::containment::plan::{ExitFacts, exit_reason};
use crate::containment::reaper::Reaper;
use crate::limits::{CLOSED_PROCESS_RETENTION, OUTPUT_READ_CHUNK_BYTES};
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

/// Run until the process closed, then keep it readable for [`CLOSED_PROCESS_RETENTION`] and
/// remove it from the table. Its cgroups are removed once empty; a tree that still holds
/// processes then (a daemon the command left behind) stays with the session until the session
/// ends or the process is terminated.
pub async fn run(
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
        PumpIo::Pipes(mut stdout, mut stderr) => {
            let (mut out_buf, mut err_buf) = (
                vec![0u8; OUTPUT_READ_CHUNK_BYTES],
                vec![0u8; OUTPUT_READ_CHUNK_BYTES],
            );
            let (mut out_open, mut err_open, mut exited) = (true, true, false);
            while out_open || err_open || !exited {
                tokio::select! {
                    read = read_some(&mut stdout, &mut out_buf), if out_open => match read {
                        Some(n) => emitter.output(OutputStream::Stdout, &out_buf[..n]).await,
                        None => out_open = false,
                    },
                    read = read_some(&mut stderr, &mut err_buf), if err_open => match read {
                        Some(n) => emitter.output(OutputStream::Stderr, &err_buf[..n]).await,
                        None => err_open = false,
                    },
                    status = reaped(), if !exited => {
                        exited = true;
                        // Output the child wrote before exiting is already in the pipes: emit it
                        // first, so `exited` follows it (only later writes by grandchildren can
                        // still come after `exited`). Read the descriptors directly: the
                        // reactor may not have seen them become readable yet.
                        if out_open {
                            out_open = drain(&emitter, OutputStream::Stdout, stdout.as_fd(), &mut out_buf).await;
                        }
                        if err_open {
                            err_open = drain(&emitter, OutputStream::Stderr, stderr.as_fd(), &mut err_buf).await;
                        }
                        emitter.exit(status, context.reason(&process, status)).await;
                    }
                }
            }
        }
        PumpIo::Pty(master) => {
            let mut buf = vec![0u8; OUTPUT_READ_CHUNK_BYTES];
            let (mut open, mut exited) = (true, false);
            while open || !exited {
                tokio::select! {
                    read = read_pty(&master, &mut buf), if open => match read {
                        Some(n) => emitter.output(OutputStream::Pty, &buf[..n]).await,
                        None => open = false,
                    },
                    status = reaped(), if !exited => {
                        exited = true;
                        if open {
                            open = drain(&emitter, OutputStream::Pty, master.get_ref().as_fd(), &mut buf).await;
                        }
                        emitter.exit(status, context.reason(&process, status)).await;
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
                tracing::warn!(process_id = %crate::untrusted::Untrusted(&process.id), "dropping an oversized denial record");
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

async fn read_some<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> Option<usize> {
    match reader.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Emits what `fd` (non-blocking) holds right now, reading it directly rather than waiting for
/// the reactor to report it readable; at most [`EXIT_DRAIN_LIMIT`] bytes, so a grandchild that
/// keeps writing cannot hold `exited` back. `false` when the stream reached end of file (for a
/// PTY master, EIO: every slave descriptor closed).
async fn drain(
    emitter: &Emitter<'_>,
    stream: OutputStream,
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
) -> bool {
    let mut drained = 0;
    while drained < EXIT_DRAIN_LIMIT {
        match nix::unistd::read(fd, buf) {
            Ok(0) => return false,
            Ok(n) => {
                drained += n;
                emitter.output(stream, &buf[..n]).await;
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => return true,
            Err(_) => return false,
        }
    }
    true
}

/// How much output [`drain`] takes from one stream when the child exits.
const EXIT_DRAIN_LIMIT: usize = 4 * 1024 * 1024;

/// Read the PTY master; EIO (every slave descriptor closed) is end of file.
async fn read_pty(master: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> Option<usize> {
    loop {
        let mut guard = master.readable().await.ok()?;
        match guard.try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from))
        {
            Ok(Ok(0) | Err(_)) => return None,
            Ok(Ok(n)) => return Some(n),
            Err(_would_block) => continue,
        }
    }
}

struct Emitter<'a> {
    process: &'a Arc<ManagedProcess>,
    sink: &'a Attachment,
}

impl Emitter<'_> {
    async fn output(&self, stream: OutputStream, data: &[u8]) {
        let seq = self.process.log().push_output(stream, data.to_vec());
        self.process.publish(seq);
        // Hot path: write the notification text directly (base64 needs no JSON escaping),
        // instead of building a serde_json::Value and serializing it again.
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
        text.push_str(&format!(
            r#","seq":{seq},"stream":"{stream_name}","chunk":""#
        ));
        base64_simd::STANDARD.encode_append(data, &mut text);
        text.push_str("\"}}");
        if let Some(sender) = self.sink.sender() {
            let _ = sender.send(crate::outbound::Outbound::Text(text)).await;
        }
    }

    async fn exit(&self, status: ChildExit, reason: proto::methods::process::ExitReason) {
        let (code, signal) = (status.code, status.signal);
        let exit = self.process.log().push_exit(code, signal, Some(reason));
        self.process.publish(exit.seq);
        let params = ExitedNotification {
            process_id: self.process.id.clone(),
            seq: exit.seq,
            exit_code: code,
            signal,
            reason: Some(reason),
        };
        self.send(PROCESS_EXITED, &params).await;
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
