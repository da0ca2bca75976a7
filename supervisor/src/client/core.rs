//! The shared state behind every clone of [`super::ExecServerClient`]: the current connection
//! phase, the process table with each process's event sequencer, request ids, and the call
//! plumbing that waits while recovery runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use proto::jsonrpc::Notification;
use proto::methods::process::binary::OutputFrame;
use proto::methods::process::{
    ClosedNotification, DeniedNotification, ExitedNotification, OutputNotification,
};
use proto::methods::{
    HTTP_REQUEST_BODY_DELTA, PROCESS_CLOSED, PROCESS_DENIED, PROCESS_EXITED, PROCESS_OUTPUT,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::connection::{CallError, ConnectionEvents, RpcConnection};
use super::error::ExecServerError;
use super::events::{EventSequencer, ProcessEvent};
use super::transport::Transport;

/// Where the client is in its connection life cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionState {
    /// Calls go to connection `generation` (1 for the first, one more per recovery).
    Connected {
        /// The connection generation.
        generation: u64,
    },
    /// The connection was lost; calls wait while the client resumes the session.
    Recovering {
        /// The generation that was lost.
        lost_generation: u64,
    },
    /// Recovery gave up (deadline or permanent error); every call fails.
    Failed {
        /// Why.
        reason: String,
    },
    /// [`super::ExecServerClient::close`] was called.
    Closed,
}

/// Internal phase: like [`ConnectionState`] but holding the live connection.
#[derive(Clone)]
pub(crate) enum Phase {
    Connecting,
    Connected(Arc<RpcConnection>),
    Recovering,
    Failed(ExecServerError),
    Closed,
}

/// Whether a call may be sent again on the next connection when the connection drops under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// Reads, and writes carrying a `writeId` (the server applies those once).
    Safe,
    /// Anything else that changes state: the server may already have applied it.
    Never,
}

/// How far a `process/start` got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartState {
    Starting,
    Started,
    /// The connection dropped before the answer: cleaned up during recovery.
    Ambiguous,
}

pub(crate) struct ProcessEntry {
    pub sequencer: EventSequencer,
    pub events: mpsc::UnboundedSender<ProcessEvent>,
    /// Output bytes sent on `events` and not yet read (shared with the `ProcessEvents`).
    pub unread: Arc<AtomicUsize>,
    pub start: StartState,
}

/// Remove a process and end its events with `Failed` (the caller holds the process table).
fn fail_locked(processes: &mut HashMap<String, ProcessEntry>, process_id: &str, reason: String) {
    if let Some(mut entry) = processes.remove(process_id) {
        tracing::warn!(process_id, %reason, "process failed");
        entry.sequencer.fail();
        let _ = entry.events.send(ProcessEvent::Failed {
            error: ExecServerError::ProcessFailed {
                process_id: process_id.to_owned(),
                reason,
            },
        });
    }
}

/// Settings that do not depend on the transport.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub client_name: String,
    /// `detachedSessionTtlSeconds` of every `initialize`.
    pub detached_session_ttl: Option<Duration>,
    pub initialize_timeout: Duration,
    pub recovery_timeout: Duration,
    /// `binaryOutput` of every `initialize`.
    pub binary_output: bool,
}

pub(crate) struct Inner {
    pub transport: Arc<dyn Transport>,
    pub settings: Settings,
    pub session_id: OnceLock<String>,
    pub phase: watch::Sender<Phase>,
    pub state: watch::Sender<ConnectionState>,
    processes: Mutex<HashMap<String, ProcessEntry>>,
    pub starts_in_flight: watch::Sender<usize>,
    /// Open `http/request` body streams.
    pub http_streams: super::http_streams::HttpStreams,
    next_request_id: AtomicI64,
    next_generation: AtomicU64,
}

impl Inner {
    pub fn new(transport: Arc<dyn Transport>, settings: Settings) -> Arc<Self> {
        Arc::new(Self {
            transport,
            settings,
            session_id: OnceLock::new(),
            phase: watch::channel(Phase::Connecting).0,
            state: watch::channel(ConnectionState::Recovering { lost_generation: 0 }).0,
            processes: Mutex::new(HashMap::new()),
            starts_in_flight: watch::channel(0).0,
            http_streams: super::http_streams::HttpStreams::default(),
            next_request_id: AtomicI64::new(1),
            next_generation: AtomicU64::new(1),
        })
    }

    pub fn request_id(&self) -> i64 {
        self.next_request_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn new_generation(&self) -> u64 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    pub fn lock_processes(&self) -> MutexGuard<'_, HashMap<String, ProcessEntry>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make `connection` the one calls use.
    pub fn install(self: &Arc<Self>, connection: Arc<RpcConnection>) {
        let generation = connection.generation;
        self.phase
            .send_replace(Phase::Connected(connection.clone()));
        self.state
            .send_replace(ConnectionState::Connected { generation });
        // The connection may have died between the last recovery step and now; its reader
        // then reported the loss while we were not yet Connected, so report it again.
        if !connection.is_open() {
            Arc::clone(self).connection_lost(generation);
        }
    }

    /// Every process gets a terminal `Failed`; every waiting and future call fails.
    pub fn fail(&self, error: ExecServerError, state: ConnectionState) {
        let previous = self.phase.send_replace(match &state {
            ConnectionState::Closed => Phase::Closed,
            _ => Phase::Failed(error.clone()),
        });
        if let Phase::Connected(connection) = previous {
            connection.shutdown();
        }
        self.state.send_replace(state);
        self.http_streams.fail_all(&error);
        let entries: Vec<ProcessEntry> = self.lock_processes().drain().map(|(_, e)| e).collect();
        for entry in entries {
            let _ = entry.events.send(ProcessEvent::Failed {
                error: error.clone(),
            });
        }
    }

    /// Fail one process alone (the rest of the client is unaffected).
    pub fn fail_process(&self, process_id: &str, reason: String) {
        fail_locked(&mut self.lock_processes(), process_id, reason);
    }

    /// Apply `update` to a process's sequencer and publish what it releases. The entry is
    /// removed once its last event is out. Returns `None` for unknown processes.
    pub fn update_process<R>(
        &self,
        process_id: &str,
        update: impl FnOnce(&mut EventSequencer) -> (Vec<ProcessEvent>, R),
    ) -> Option<R> {
        let mut processes = self.lock_processes();
        let entry = processes.get_mut(process_id)?;
        let (events, result) = update(&mut entry.sequencer);
        for event in events {
            let bytes = event.buffered_bytes();
            if bytes > 0 {
                let unread = entry.unread.fetch_add(bytes, Ordering::Relaxed) + bytes;
                if unread > super::CLIENT_EVENT_BUFFER_BYTES {
                    let reason = format!(
                        "its events were not read: more than CLIENT_EVENT_BUFFER_BYTES ({} MiB) of output waiting; the process still runs on the server",
                        super::CLIENT_EVENT_BUFFER_BYTES / (1024 * 1024)
                    );
                    fail_locked(&mut processes, process_id, reason);
                    return Some(result);
                }
            }
            let _ = entry.events.send(event);
        }
        if entry.sequencer.is_finished() {
            processes.remove(process_id);
        }
        Some(result)
    }

    /// The live connection, waiting while the client recovers.
    ///
    /// # Errors
    /// The failure that ended recovery, or [`ExecServerError::Closed`].
    pub async fn connection(&self) -> Result<Arc<RpcConnection>, ExecServerError> {
        let mut phase = self.phase.subscribe();
        loop {
            match &*phase.borrow_and_update() {
                Phase::Connected(connection) => return Ok(connection.clone()),
                Phase::Failed(error) => return Err(error.clone()),
                Phase::Closed => return Err(ExecServerError::Closed),
                Phase::Connecting | Phase::Recovering => {}
            }
            phase.changed().await.map_err(|_| ExecServerError::Closed)?;
        }
    }

    /// Call `method`, waiting through recovery; with [`Replay::Safe`] a call cut off by a lost
    /// connection is sent again on the next one.
    ///
    /// # Errors
    /// The server's error, [`ExecServerError::Disconnected`] for a cut-off call that may not be
    /// replayed, or the client's failure.
    pub async fn call_value(
        &self,
        method: &str,
        params: Value,
        replay: Replay,
    ) -> Result<Value, ExecServerError> {
        loop {
            let connection = self.connection().await?;
            match connection
                .request(self.request_id(), method, params.clone())
                .await
            {
                Ok(result) => return Ok(result),
                Err(CallError::Rpc(error)) => {
                    return Err(ExecServerError::Rpc {
                        method: method.to_owned(),
                        error: Box::new(error),
                    });
                }
                Err(CallError::Disconnected) if replay == Replay::Safe => continue,
                Err(CallError::Disconnected) => {
                    return Err(ExecServerError::Disconnected {
                        method: method.to_owned(),
                    });
                }
            }
        }
    }

    /// Typed [`Inner::call_value`].
    ///
    /// # Errors
    /// See [`Inner::call_value`]; [`ExecServerError::Protocol`] for an unreadable result.
    pub async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        replay: Replay,
    ) -> Result<R, ExecServerError> {
        let params = to_params(method, params)?;
        let result = self.call_value(method, params, replay).await?;
        from_result(method, result)
    }

    fn on_notification(&self, notification: Notification) {
        let Some(params) = notification.params else {
            return;
        };
        let parsed = match notification.method.as_str() {
            PROCESS_OUTPUT => serde_json::from_value::<OutputNotification>(params)
                .ok()
                .and_then(|n| {
                    let data = decode_base64(&n.chunk)?;
                    Some((
                        n.process_id,
                        ProcessEvent::Output {
                            seq: n.seq,
                            stream: n.stream,
                            data,
                        },
                    ))
                }),
            PROCESS_EXITED => serde_json::from_value::<ExitedNotification>(params)
                .ok()
                .map(|n| {
                    (
                        n.process_id,
                        ProcessEvent::Exited {
                            seq: n.seq,
                            exit_code: n.exit_code,
                            signal: n.signal,
                            reason: n.reason,
                            usage: n.usage,
                        },
                    )
                }),
            PROCESS_CLOSED => serde_json::from_value::<ClosedNotification>(params)
                .ok()
                .map(|n| (n.process_id, ProcessEvent::Closed { seq: n.seq })),
            PROCESS_DENIED => {
                let Ok(n) = serde_json::from_value::<DeniedNotification>(params) else {
                    tracing::warn!(method = PROCESS_DENIED, "ignoring a malformed notification");
                    return;
                };
                // A server without `number` sends its records in order on one connection.
                self.update_process(&n.process_id, |sequencer| {
                    let number = n.number.unwrap_or(sequencer.last_denial() + 1);
                    (sequencer.offer_denial(number, n.denial), ())
                });
                return;
            }
            other => {
                tracing::debug!(method = other, "ignoring an unknown notification");
                return;
            }
        };
        let Some((process_id, event)) = parsed else {
            tracing::warn!(method = %notification.method, "ignoring a malformed notification");
            return;
        };
        self.update_process(&process_id, |sequencer| (sequencer.offer(event), ()));
    }
}

impl ConnectionEvents for Inner {
    fn notification(&self, generation: u64, notification: Notification) {
        if notification.method == HTTP_REQUEST_BODY_DELTA {
            // A body belongs to the connection that carried its request.
            self.http_streams.deliver(generation, notification.params);
            return;
        }
        // Events carry their seq, so a late notification from an older connection is merged
        // (or dropped as a repeat) like any other.
        self.on_notification(notification);
    }

    fn output_frame(&self, _generation: u64, frame: OutputFrame<'_>) {
        // Like a `process/output` notification: merged by seq, whichever connection brought it.
        let event = ProcessEvent::Output {
            seq: frame.seq,
            stream: frame.stream,
            data: frame.data.to_vec(),
        };
        self.update_process(frame.process_id, |sequencer| (sequencer.offer(event), ()));
    }

    fn disconnected(self: Arc<Self>, generation: u64) {
        self.http_streams.connection_lost(generation);
        self.connection_lost(generation);
    }
}

/// Standard base64, fast path.
pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    base64_simd::STANDARD.decode_to_vec(text.as_bytes()).ok()
}

/// Standard base64.
pub(crate) fn encode_base64(bytes: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(bytes)
}

pub(crate) fn to_params<P: Serialize>(method: &str, params: &P) -> Result<Value, ExecServerError> {
    serde_json::to_value(params).map_err(|error| ExecServerError::Protocol {
        method: method.to_owned(),
        reason: format!("cannot serialize the params: {error}"),
    })
}

pub(crate) fn from_result<R: DeserializeOwned>(
    method: &str,
    result: Value,
) -> Result<R, ExecServerError> {
    serde_json::from_value(result).map_err(|error| ExecServerError::Protocol {
        method: method.to_owned(),
        reason: error.to_string(),
    })
}
