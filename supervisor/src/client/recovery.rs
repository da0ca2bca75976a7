//! The recovery state machine: Connected → Recovering → Connected, or Failed.
//!
//! ```text
//!  Connected ──transport closes──▶ Recovering ──session resumed, processes caught up──▶ Connected
//!                                      │  └─ -32010 / connect error: retry with backoff
//!                                      └─ RECOVERY_DEADLINE passed or permanent error ──▶ Failed
//! ```
//!
//! Order of a recovery, and why:
//! 1. Only a loss of the *current* generation starts recovery (late events of older
//!    connections cannot replace the active one); the transition is a compare-and-set.
//! 2. Process starts already in flight are resolved first (their requests failed with the
//!    connection); a start whose answer was lost is *ambiguous*.
//! 3. Connect and `initialize {resumeSessionId}`. The new connection's reader runs before the
//!    handshake completes, so notifications of busy processes never block the response.
//!    -32010 (the server has not noticed the old connection is gone) is retried.
//! 4. Ambiguous starts are cleaned up (`process/terminate`), never adopted.
//! 5. Every open process is caught up with `process/read` from its last published seq; the
//!    result is merged with live notifications by seq. A process whose missing events are no
//!    longer retained fails alone (and is terminated); the others continue.
//! 6. Only then is the connection installed and waiting calls released.

use std::sync::Arc;
use std::time::Duration;

use proto::error::{NOT_FOUND, SESSION_ATTACHED};
use proto::methods::initialize::{InitializeParams, InitializeResult};
use proto::methods::process::{ReadParams, ReadResult, TerminateParams};
use proto::methods::{INITIALIZE, INITIALIZED, PROCESS_READ, PROCESS_TERMINATE};
use tokio::time::Instant;

use super::connection::{CallError, RpcConnection};
use super::core::{
    ConnectionState, Inner, Phase, StartState, decode_base64, from_result, to_params,
};
use super::error::ExecServerError;
use crate::limits::OUTPUT_READ_CHUNK_BYTES;

/// How long the client tries to resume a lost session before it fails. Below the server's
/// `DETACHED_SESSION_TTL` (30 s), so a session the client still tries to resume is still there.
pub const RECOVERY_DEADLINE: Duration = Duration::from_secs(25);
/// First pause between reconnect attempts (doubles up to [`RECONNECT_BACKOFF_MAX`]). Short,
/// because the usual retry is -32010 while the server closes the old connection.
pub const RECONNECT_BACKOFF_FIRST: Duration = Duration::from_millis(5);
/// Longest pause between reconnect attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// `maxBytes` of a catch-up `process/read` (the server's cap, `MAX_READ_BYTES`).
pub const CATCH_UP_READ_MAX_BYTES: u64 = crate::limits::MAX_READ_BYTES;
/// `waitMs` of a repeated catch-up read that found nothing new while events still wait for a
/// lower seq (bounds the loop's rate; the read returns as soon as something exists).
const CATCH_UP_WAIT_MS: u64 = 50;

/// Why one reconnect attempt did not produce a usable connection.
enum Attempt {
    /// Try again (connect error, -32010, connection lost during the handshake).
    Retry(String),
    /// Give up (unknown session, a different session id, a malformed answer).
    Permanent(ExecServerError),
}

impl From<CallError> for Attempt {
    fn from(error: CallError) -> Self {
        match error {
            CallError::Disconnected => Attempt::Retry("the new connection closed too".into()),
            CallError::Rpc(error) => Attempt::Retry(error.to_string()),
        }
    }
}

impl Inner {
    /// The connection of `generation` ended. Starts recovery if it was the current one.
    pub(crate) fn connection_lost(self: Arc<Self>, generation: u64) {
        let started = self.phase.send_if_modified(|phase| match phase {
            Phase::Connected(connection) if connection.generation == generation => {
                *phase = Phase::Recovering;
                true
            }
            _ => false,
        });
        if !started {
            return;
        }
        tracing::info!(generation, "connection lost; resuming the session");
        self.state.send_replace(ConnectionState::Recovering {
            lost_generation: generation,
        });
        tokio::spawn(self.recover());
    }

    async fn recover(self: Arc<Self>) {
        let timeout = self.settings.recovery_timeout;
        let deadline = Instant::now() + timeout;
        let mut last_error = String::from("no attempt finished");
        let outcome = tokio::time::timeout_at(deadline, async {
            self.wait_for_starts_in_flight().await;
            let mut backoff = RECONNECT_BACKOFF_FIRST;
            loop {
                match self.resume_once().await {
                    Ok(connection) => return Ok(connection),
                    Err(Attempt::Permanent(error)) => return Err(error),
                    Err(Attempt::Retry(reason)) => {
                        tracing::debug!(%reason, "resume attempt failed; retrying");
                        last_error = reason;
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                    }
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(connection)) => {
                tracing::info!(generation = connection.generation, "session resumed");
                self.install(connection);
            }
            Ok(Err(error)) => {
                let reason = error.to_string();
                self.fail(
                    ExecServerError::RecoveryFailed {
                        reason: reason.clone(),
                    },
                    ConnectionState::Failed { reason },
                );
            }
            Err(_elapsed) => {
                let reason = format!(
                    "no session resume within {timeout:?} (RECOVERY_DEADLINE); last error: {last_error}"
                );
                self.fail(
                    ExecServerError::RecoveryFailed {
                        reason: reason.clone(),
                    },
                    ConnectionState::Failed { reason },
                );
            }
        }
    }

    /// Starts whose request was on the lost connection fail with it; wait until each has
    /// recorded whether it started, so none is caught half-way.
    async fn wait_for_starts_in_flight(&self) {
        let mut starts = self.starts_in_flight.subscribe();
        let _ = starts.wait_for(|count| *count == 0).await;
    }

    async fn resume_once(self: &Arc<Self>) -> Result<Arc<RpcConnection>, Attempt> {
        let transport = self
            .transport
            .connect()
            .await
            .map_err(|error| Attempt::Retry(error.to_string()))?;
        let connection =
            RpcConnection::start(self.new_generation(), transport, Arc::downgrade(self));
        let result = self.resume_on(&connection).await;
        if result.is_err() {
            connection.shutdown();
        }
        result.map(|()| connection)
    }

    async fn resume_on(&self, connection: &Arc<RpcConnection>) -> Result<(), Attempt> {
        let session_id = self
            .session_id
            .get()
            .cloned()
            .ok_or(Attempt::Permanent(ExecServerError::Closed))?;
        let params = InitializeParams {
            client_name: self.settings.client_name.clone(),
            resume_session_id: Some(session_id.clone()),
            detached_session_ttl_seconds: super::ttl_seconds(self.settings.detached_session_ttl),
            binary_output: self.settings.binary_output,
            egress_approve: false,
        };
        let params = to_params(INITIALIZE, &params).map_err(Attempt::Permanent)?;
        let answer = tokio::time::timeout(
            self.settings.initialize_timeout,
            connection.request(self.request_id(), INITIALIZE, params),
        )
        .await
        .map_err(|_| Attempt::Retry("initialize timed out".into()))?;
        let result: InitializeResult = match answer {
            Ok(result) => from_result(INITIALIZE, result).map_err(Attempt::Permanent)?,
            Err(CallError::Rpc(error)) if error.code == SESSION_ATTACHED => {
                return Err(Attempt::Retry(error.to_string()));
            }
            Err(CallError::Rpc(error)) => {
                return Err(Attempt::Permanent(ExecServerError::Rpc {
                    method: INITIALIZE.into(),
                    error: Box::new(error),
                }));
            }
            Err(CallError::Disconnected) => {
                return Err(Attempt::Retry("connection closed during initialize".into()));
            }
        };
        if result.session_id != session_id {
            return Err(Attempt::Permanent(ExecServerError::Protocol {
                method: INITIALIZE.into(),
                reason: format!(
                    "asked to resume session {session_id} but the server attached {}",
                    result.session_id
                ),
            }));
        }
        connection.notify(INITIALIZED, serde_json::json!({})).await;
        self.clean_up_ambiguous_starts(connection).await?;
        let ids: Vec<String> = self
            .lock_processes()
            .iter()
            .filter(|(_, entry)| entry.start == StartState::Started)
            .map(|(id, _)| id.clone())
            .collect();
        let catch_ups = ids.iter().map(|id| self.catch_up(connection, id));
        for outcome in futures_util::future::join_all(catch_ups).await {
            outcome?;
        }
        Ok(())
    }

    /// Terminate every process whose start answer was lost, and forget it.
    async fn clean_up_ambiguous_starts(&self, connection: &RpcConnection) -> Result<(), Attempt> {
        let ambiguous: Vec<String> = self
            .lock_processes()
            .iter()
            .filter(|(_, entry)| entry.start == StartState::Ambiguous)
            .map(|(id, _)| id.clone())
            .collect();
        for process_id in ambiguous {
            self.terminate_on(connection, &process_id).await?;
            self.lock_processes().remove(&process_id);
        }
        Ok(())
    }

    pub(crate) async fn terminate_on(
        &self,
        connection: &RpcConnection,
        process_id: &str,
    ) -> Result<(), CallError> {
        let params = TerminateParams {
            process_id: process_id.to_owned(),
        };
        let params = serde_json::to_value(params).unwrap_or_default();
        match connection
            .request(self.request_id(), PROCESS_TERMINATE, params)
            .await
        {
            Ok(_) | Err(CallError::Rpc(_)) => Ok(()),
            Err(CallError::Disconnected) => Err(CallError::Disconnected),
        }
    }

    /// Read `process_id` from its last published seq until it is contiguous with the live
    /// notifications of `connection`.
    async fn catch_up(&self, connection: &RpcConnection, process_id: &str) -> Result<(), Attempt> {
        let mut wait_ms = 0;
        loop {
            let Some((after_seq, after_denial)) = self.update_process(process_id, |s| {
                (Vec::new(), (s.last_published(), s.last_denial()))
            }) else {
                return Ok(()); // finished meanwhile (closed arrived live)
            };
            let params = ReadParams {
                process_id: process_id.to_owned(),
                after_seq: Some(after_seq),
                max_bytes: Some(CATCH_UP_READ_MAX_BYTES),
                wait_ms: Some(wait_ms),
                after_denial: Some(after_denial),
            };
            let params = serde_json::to_value(params).unwrap_or_default();
            let answer = connection
                .request(self.request_id(), PROCESS_READ, params)
                .await;
            let read: ReadResult = match answer {
                Ok(result) => match from_result(PROCESS_READ, result) {
                    Ok(read) => read,
                    Err(error) => {
                        self.fail_process(process_id, error.to_string());
                        return Ok(());
                    }
                },
                Err(CallError::Disconnected) => return Err(CallError::Disconnected.into()),
                Err(CallError::Rpc(error)) if error.code == NOT_FOUND => {
                    self.fail_process(
                        process_id,
                        format!(
                            "the server no longer knows the process after the reconnect ({error})"
                        ),
                    );
                    return Ok(());
                }
                Err(CallError::Rpc(error)) => {
                    self.fail_process(process_id, format!("catching up failed: {error}"));
                    return Ok(());
                }
            };
            let read_bytes: u64 = read
                .chunks
                .iter()
                .map(|chunk| chunk.chunk.len() as u64 / 4 * 3)
                .sum();
            let merged = self.update_process(process_id, |sequencer| {
                let before = sequencer.last_published();
                match sequencer.merge_read(&read, decode_base64) {
                    Ok(events) => {
                        let progressed = sequencer.last_published() > before;
                        let done = sequencer.is_finished() || !sequencer.has_pending();
                        (events, Ok((done, progressed)))
                    }
                    Err(gap) => (Vec::new(), Err(gap)),
                }
            });
            match merged {
                None => return Ok(()),
                Some(Err(gap)) => {
                    let retained = gap
                        .first_retained
                        .map(|seq| format!("; the oldest event still retained is seq {seq}"))
                        .unwrap_or_default();
                    self.fail_process(
                        process_id,
                        format!(
                            "output missed while disconnected is no longer retained by the server \
                             (events from seq {} on were dropped by OUTPUT_RETENTION_BYTES{retained}); \
                             the process was terminated",
                            gap.missing_from
                        ),
                    );
                    self.terminate_on(connection, process_id).await?;
                    return Ok(());
                }
                Some(Ok((done, progressed))) => {
                    // A read that returned less than a chunk below its byte budget was not cut
                    // short, so it reached the server's newest event; later ones arrive live.
                    let complete =
                        read_bytes + OUTPUT_READ_CHUNK_BYTES as u64 <= CATCH_UP_READ_MAX_BYTES;
                    if done && complete {
                        return Ok(());
                    }
                    wait_ms = if progressed { 0 } else { CATCH_UP_WAIT_MS };
                }
            }
        }
    }
}
