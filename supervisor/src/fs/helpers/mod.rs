//! Sandboxed `fs/*` requests go to `fs-helper` processes in serve mode, pooled per
//! (session, resolved policy).
//!
//! - A helper serves one request at a time over a socketpair (its stdin and stdout), so a
//!   descriptor opened by `fs/open` under the policy comes back with `SCM_RIGHTS`.
//! - The pool keeps at most [`MAX_IDLE_HELPERS_PER_POLICY`] idle helpers per key and
//!   [`MAX_LIVE_HELPERS`] in all, busy and idle alike; when a new helper is needed and none is
//!   left, the least recently used idle helper is retired to make room. Idle helpers exit after
//!   [`HELPER_IDLE_TIMEOUT`]; a session's idle helpers are retired when it detaches or expires.
//! - Every helper holds [`HELPER_DESCRIPTORS`] of the server's client descriptor budget.
//! - A helper that crashes, hangs past [`HELPER_REQUEST_TIMEOUT`] or answers garbage is killed
//!   and never reused; its request fails with -32603 carrying the helper's stderr.
//! - With one-shot helpers (`--one-shot-helpers`) every request gets a fresh helper.
//! - A helper is started from the server's descriptor of `fs-helper` with
//!   `--serve --policy-frame`: the first frame it reads is the policy the server resolved (with
//!   the server's protections); it resolves nothing itself and confines itself before reading
//!   any request.
//!
//! The requests are blocking socket I/O and run on the bounded blocking pool
//! ([`crate::budget`]), within the calling connection's share of it.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error_text::StderrTail;
use fs_helper::frame::{FrameError, write_frame};
use proto::error::RpcError;
use proto::methods::fs::FsRequest;
use sandbox::ResolvedPolicy;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod exchange;

use super::AnswerBacking;
use crate::budget::{Budgets, ConnectionBudget, DescriptorCharge, MemoryCharge};
use crate::sandboxing::Sandboxing;
use exchange::{Answered, ask, failed};

/// Idle helpers kept per (session, policy).
pub const MAX_IDLE_HELPERS_PER_POLICY: usize = 4;
/// Helper processes alive at once, across all sessions, idle ones included.
pub const MAX_LIVE_HELPERS: usize = 64;
/// Descriptors the server holds per helper: its socket and its stderr pipe.
pub const HELPER_DESCRIPTORS: usize = 2;
/// An idle helper exits after this long unused.
pub const HELPER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a helper may take for one request before it is killed (big copies included).
pub const HELPER_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// What a sandboxed `fs/readFile`'s answer is backed for before the helper has looked at the
/// file, whichever file it is: a file up to this size is read in the same exchange. A larger one
/// the helper opens under the policy and answers with its size only (`sizeAbove`); the server
/// backs that and asks again (after the read's bulk turn, if it is one). So the budget and the
/// bulk turn learn a size only from a file the policy let the helper open, never from the
/// server's own view of a path the policy may deny.
pub const PREBACKED_READ_BYTES: u64 = 64 * 1024;
/// Sessions remembered as gone (their helpers retired): a helper one of their calls finishes
/// with afterwards is retired instead of pooled. The oldest is forgotten past this many.
const MAX_GONE_SESSIONS: usize = 4096;
/// Helper stderr kept for error messages.
const HELPER_STDERR_BYTES: usize = 8 * 1024;
/// The environment a helper starts with: only these variables, from the server's environment.
const HELPER_ENV_ALLOWLIST: [&str; 4] = ["PATH", "TMPDIR", "TMP", "TEMP"];

/// Why a helper could not be started or failed a request (it is then killed, never reused).
/// Reported as -32603 `helperFailed` with the helper's stderr.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The socketpair to a new helper could not be made.
    #[error("socketpair failed: {0}")]
    SocketPair(#[source] std::io::Error),
    /// Its end of the socketpair could not be duplicated for its stdout.
    #[error("socket dup failed: {0}")]
    DuplicateSocket(#[source] std::io::Error),
    /// The binary could not be started.
    #[error("cannot start {}: {source}", binary.display())]
    Spawn {
        /// The fs-helper binary.
        binary: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The resolved policy could not be encoded (a bug).
    #[error("cannot encode the policy: {0}")]
    EncodePolicy(#[source] serde_json::Error),
    /// The request could not be encoded (a bug).
    #[error("cannot encode the request: {0}")]
    EncodeRequest(#[source] serde_json::Error),
    /// The policy frame could not be sent.
    #[error("sending the policy: {0}")]
    SendPolicy(#[source] FrameError),
    /// The request frame could not be sent.
    #[error("sending the request: {0}")]
    SendRequest(#[source] FrameError),
    /// The response frame could not be read (too large, cut off, timed out, ...).
    #[error("reading the response: {0}")]
    ReadResponse(#[source] FrameError),
    /// The helper closed its socket before answering (it crashed or was killed).
    #[error("the helper exited before answering")]
    ExitedBeforeAnswering,
    /// The helper answered with a size when none was asked for.
    #[error("the helper answered with a size when the file's contents were asked for")]
    UnaskedSize,
    /// The response is not a helper response.
    #[error("unparsable response: {0}")]
    UnparsableResponse(#[source] serde_json::Error),
    /// Retiring an idle helper to make room panicked.
    #[error("retiring an idle helper: {0}")]
    Retire(#[source] tokio::task::JoinError),
    /// The pool is shutting down.
    #[error("the helper pool is closed")]
    PoolClosed,
}

/// A pool key: which session and which resolved policy.
pub type PoolKey = (String, ResolvedPolicy);

/// A helper's answer.
pub struct HelperReply {
    /// The result or the error the helper reported.
    pub result: Result<Value, RpcError>,
    /// A descriptor passed back (`fs/open`).
    pub file: Option<std::fs::File>,
}

struct Helper {
    child: Child,
    socket: UnixStream,
    stderr: StderrTail,
    idle_since: Instant,
    /// Its place among the [`MAX_LIVE_HELPERS`] (taken away when it is evicted for another).
    live: Option<OwnedSemaphorePermit>,
    _descriptors: DescriptorCharge,
}

impl Helper {
    fn stderr_text(&self) -> String {
        self.stderr.text()
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn retire(mut self) {
        // Closing the socket is EOF for the helper, which then exits.
        drop(self.socket);
        let _ = self.child.wait();
    }
}

/// The pool.
pub struct HelperPool {
    sandboxing: Arc<Sandboxing>,
    one_shot: bool,
    idle: Mutex<HashMap<PoolKey, Vec<Helper>>>,
    /// Sessions detached or expired and not resumed since (locked before `idle`).
    gone: Mutex<GoneSessions>,
    live: Arc<Semaphore>,
    budgets: Arc<Budgets>,
}

/// What [`HelperPool::call_sandboxed`] did.
pub enum Sandboxed {
    /// The sandbox restricts nothing: the request, to run unsandboxed (with its read's backing,
    /// which has backed nothing yet).
    Unrestricted(FsRequest, Option<AnswerBacking>),
    /// A helper under the resolved policy answered.
    Served(HelperReply),
}

/// A read whose answer [`HelperPool::call_sandboxed`] backed from the size its helper found, a
/// bulk read: the request, to call again (without backing) once it has its turn.
pub struct AwaitsBulkTurn(pub FsRequest);

/// How a call gets its helper.
enum Start {
    /// An idle helper of the same key.
    Reused(Helper),
    /// A new one, with its place and descriptors already taken.
    New(OwnedSemaphorePermit, DescriptorCharge),
}

impl HelperPool {
    /// A pool running `sandboxing`'s fs-helper, its helpers' descriptors drawn from `budgets`.
    pub fn new(sandboxing: Arc<Sandboxing>, one_shot: bool, budgets: Arc<Budgets>) -> Arc<Self> {
        let pool = Arc::new(Self {
            sandboxing,
            one_shot,
            idle: Mutex::new(HashMap::new()),
            gone: Mutex::new(GoneSessions::default()),
            live: Arc::new(Semaphore::new(MAX_LIVE_HELPERS)),
            budgets,
        });
        let weak = Arc::downgrade(&pool);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HELPER_IDLE_TIMEOUT / 4);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { return };
                let expired = pool.take_expired();
                if !expired.is_empty() {
                    let _ = tokio::task::spawn_blocking(move || {
                        expired.into_iter().for_each(Helper::retire)
                    })
                    .await;
                }
            }
        });
        pool
    }

    fn take_expired(&self) -> Vec<Helper> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let mut expired = Vec::new();
        for helpers in idle.values_mut() {
            let (old, fresh): (Vec<_>, Vec<_>) = std::mem::take(helpers)
                .into_iter()
                .partition(|h| h.idle_since.elapsed() >= HELPER_IDLE_TIMEOUT);
            *helpers = fresh;
            expired.extend(old);
        }
        idle.retain(|_, helpers| !helpers.is_empty());
        expired
    }

    /// Resolve `sandbox` and run `request` under it, on the blocking pool within `budget`'s
    /// share: with an idle helper of the same policy, resolution, the read's answer `backing`
    /// and the exchange are one blocking job (one hop off the async runtime, not three);
    /// otherwise as [`Self::call`]. [`Sandboxed::Unrestricted`] (the request and its backing
    /// back) when the sandbox restricts nothing; [`AwaitsBulkTurn`] when the helper found a
    /// bulk read (call again without backing once the read has its turn). Returns with it what
    /// backs the answer (nothing without `backing`), to merge into the answer's charge.
    ///
    /// # Errors
    /// -32602 when the sandbox object does not parse or resolve (never run unsandboxed
    /// instead), else as [`Self::call`].
    pub async fn call_sandboxed(
        self: &Arc<Self>,
        budget: &ConnectionBudget,
        session: &str,
        sandbox: Value,
        request: FsRequest,
        backing: Option<AnswerBacking>,
    ) -> Result<(Result<Sandboxed, AwaitsBulkTurn>, MemoryCharge), RpcError> {
        /// What the first blocking job got to.
        enum First {
            Done(Result<Sandboxed, AwaitsBulkTurn>),
            NeedsHelper(Box<(PoolKey, FsRequest)>),
        }
        let pool = self.clone();
        let session = session.to_owned();
        // The blocking pool, not the CPU pool: resolution walks paths the client names (and
        // what commands left in writable roots), which may be slow or hung filesystems; on
        // the CPU pool's few threads that would stall every connection's large messages.
        let (first, mut backing) = budget
            .blocking(move || {
                // A request that only reads gets a helper that can write nothing.
                let policy = if super::only_reads(&request) {
                    pool.sandboxing.resolve_reads(Some(&sandbox))
                } else {
                    pool.sandboxing.resolve(Some(&sandbox))
                };
                let policy =
                    policy.map_err(|e| RpcError::from(super::FsRequestError::Sandbox(e)))?;
                let Some(policy) = policy else {
                    let unrestricted = Sandboxed::Unrestricted(request, backing);
                    return Ok((First::Done(Ok(unrestricted)), None));
                };
                let mut backing = backing;
                if let Some(backing) = &mut backing {
                    // Whichever file it is: nothing about the file is known yet.
                    backing.back_size(PREBACKED_READ_BYTES)?;
                }
                let key = (session, policy);
                let first = match pool.idle_helper(&key) {
                    Some(helper) => First::Done(
                        pool.serve(Start::Reused(helper), key, request, backing.as_mut())?
                            .map(Sandboxed::Served),
                    ),
                    None => First::NeedsHelper(Box::new((key, request))),
                };
                Ok::<_, RpcError>((first, backing))
            })
            .await??;
        let done = match first {
            First::Done(done) => done,
            First::NeedsHelper(needs) => {
                let (key, request) = *needs;
                let (served, returned) = self.call(budget, key, request, backing).await?;
                backing = returned;
                served.map(Sandboxed::Served)
            }
        };
        let backed = backing.map_or_else(MemoryCharge::none, AnswerBacking::into_charge);
        Ok((done, backed))
    }

    /// Run one request under `key`'s policy, on the blocking pool within `budget`'s share
    /// (where it is also serialized), a read's answer backed by `backing` as
    /// [`Self::serve`] does; `backing` comes back with the answer.
    ///
    /// # Errors
    /// -32603 `helperFailed` when no helper can be started or it fails mid-request; -32600
    /// `limitExceeded` when the server's descriptor budget has no room for a new helper, or
    /// its memory budget none for the answer.
    async fn call(
        self: &Arc<Self>,
        budget: &ConnectionBudget,
        key: PoolKey,
        request: FsRequest,
        mut backing: Option<AnswerBacking>,
    ) -> Result<(Result<HelperReply, AwaitsBulkTurn>, Option<AnswerBacking>), RpcError> {
        let start = match self.idle_helper(&key) {
            Some(helper) => Start::Reused(helper),
            None => {
                let live = self.live_slot().await?;
                Start::New(live, self.budgets.descriptors(HELPER_DESCRIPTORS)?)
            }
        };
        let pool = self.clone();
        budget
            .blocking(move || {
                let served = pool.serve(start, key, request, backing.as_mut())?;
                Ok((served, backing))
            })
            .await?
    }

    /// Get the helper `start` says (starting a new one), exchange, and put the helper back
    /// (or retire it); blocks. With `backing` (an `fs/readFile` backed for
    /// [`PREBACKED_READ_BYTES`]), a larger file is answered with its size: `backing` backs
    /// that and, unless it is a bulk read ([`AwaitsBulkTurn`]), the same helper is asked
    /// for the contents.
    fn serve(
        self: &Arc<Self>,
        start: Start,
        key: PoolKey,
        request: FsRequest,
        backing: Option<&mut AnswerBacking>,
    ) -> Result<Result<HelperReply, AwaitsBulkTurn>, RpcError> {
        let mut helper = match start {
            Start::Reused(helper) => helper,
            Start::New(live, descriptors) => self.spawn(&key.1, live, descriptors)?,
        };
        let size_above = backing.is_some().then_some(PREBACKED_READ_BYTES);
        let (request, answered) = ask(&mut helper, request, size_above);
        let size = match answered {
            Ok(Answered::Reply(reply)) => {
                self.put_back(key, helper);
                return Ok(Ok(reply));
            }
            Ok(Answered::Size(size)) => size,
            Err(error) => return Err(failed(helper, error)),
        };
        let Some(backing) = backing else {
            return Err(failed(helper, HelperError::UnaskedSize));
        };
        match backing.back_size(size) {
            Ok(false) => {}
            bulk_or_refused => {
                self.put_back(key, helper);
                return bulk_or_refused.map(|_| Err(AwaitsBulkTurn(request)));
            }
        }
        match ask(&mut helper, request, None).1 {
            Ok(Answered::Reply(reply)) => {
                self.put_back(key, helper);
                Ok(Ok(reply))
            }
            Ok(Answered::Size(_)) => Err(failed(helper, HelperError::UnaskedSize)),
            Err(error) => Err(failed(helper, error)),
        }
    }

    /// Pool `helper` for `key` again, or retire it (one-shot helpers).
    fn put_back(&self, key: PoolKey, helper: Helper) {
        if self.one_shot {
            helper.retire();
        } else {
            self.checkin(key, helper);
        }
    }

    /// A place for one more helper: a free one, else the least recently used idle helper's
    /// (once it has exited: the cap counts processes), else wait until a busy helper is done.
    async fn live_slot(&self) -> Result<OwnedSemaphorePermit, RpcError> {
        if let Ok(permit) = self.live.clone().try_acquire_owned() {
            return Ok(permit);
        }
        if let Some(mut victim) = self.take_least_recently_used()
            && let Some(permit) = victim.live.take()
        {
            tokio::task::spawn_blocking(move || victim.retire())
                .await
                .map_err(|e| helper_failed(HelperError::Retire(e), ""))?;
            return Ok(permit);
        }
        self.live
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| helper_failed(HelperError::PoolClosed, ""))
    }

    fn take_least_recently_used(&self) -> Option<Helper> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let (key, index) = idle
            .iter()
            .flat_map(|(key, helpers)| {
                helpers
                    .iter()
                    .enumerate()
                    .map(move |(index, helper)| (helper.idle_since, key, index))
            })
            .min_by_key(|(since, ..)| *since)
            .map(|(_, key, index)| (key.clone(), index))?;
        let helpers = idle.get_mut(&key)?;
        let helper = helpers.swap_remove(index);
        if helpers.is_empty() {
            idle.remove(&key);
        }
        Some(helper)
    }

    /// Retire the idle helpers of `session_id` (it detached or expired). Helpers busy for it now
    /// are retired when done, unless it called again meanwhile (resumed).
    pub fn retire_session(&self, session_id: &str) {
        let retired: Vec<Helper> = {
            let mut gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
            gone.insert(session_id);
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<PoolKey> = idle
                .keys()
                .filter(|(session, _)| session == session_id)
                .cloned()
                .collect();
            keys.iter()
                .filter_map(|key| idle.remove(key))
                .flatten()
                .collect()
        };
        if !retired.is_empty() {
            tokio::task::spawn_blocking(move || retired.into_iter().for_each(Helper::retire));
        }
    }

    /// `session_id` was resumed: its helpers are pooled again.
    pub fn session_resumed(&self, session_id: &str) {
        self.gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session_id);
    }

    /// Helper processes alive now (busy and idle).
    pub fn live(&self) -> usize {
        MAX_LIVE_HELPERS - self.live.available_permits()
    }

    /// An idle helper of `key`'s policy to reuse; never one with `--one-shot-helpers`.
    fn idle_helper(&self, key: &PoolKey) -> Option<Helper> {
        if self.one_shot {
            return None;
        }
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(key)
            .and_then(Vec::pop)
    }

    fn checkin(&self, key: PoolKey, mut helper: Helper) {
        helper.idle_since = Instant::now();
        let gone = self.gone.lock().unwrap_or_else(|p| p.into_inner());
        if gone.contains(&key.0) {
            drop(gone);
            helper.retire();
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let helpers = idle.entry(key).or_default();
        if helpers.len() < MAX_IDLE_HELPERS_PER_POLICY {
            helpers.push(helper);
        } else {
            drop(idle);
            helper.retire();
        }
    }

    fn spawn(
        &self,
        policy: &ResolvedPolicy,
        live: OwnedSemaphorePermit,
        descriptors: DescriptorCharge,
    ) -> Result<Helper, RpcError> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| helper_failed(HelperError::SocketPair(e), ""))?;
        let theirs_out = theirs
            .try_clone()
            .map_err(|e| helper_failed(HelperError::DuplicateSocket(e), ""))?;
        let binary = &self.sandboxing.fs_helper;
        let mut command = Command::new(binary.exec_path());
        command
            .arg0("fs-helper")
            .arg("--serve")
            .arg("--policy-frame")
            .env_clear()
            .envs(
                HELPER_ENV_ALLOWLIST
                    .iter()
                    .filter_map(|key| std::env::var_os(key).map(|value| (key, value))),
            )
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::from(OwnedFd::from(theirs_out)))
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|source| {
            let binary = binary.path().to_path_buf();
            helper_failed(HelperError::Spawn { binary, source }, "")
        })?;
        // A helper moves file contents for clients: CPU work that must not take the CPU from
        // the async workers (it is single-threaded, so its pid names its only thread).
        crate::sys::lower_thread_priority(child.id(), crate::cpu_pool::CPU_POOL_NICE);
        let stderr = StderrTail::collect(child.stderr.take(), HELPER_STDERR_BYTES);
        let _ = ours.set_read_timeout(Some(HELPER_REQUEST_TIMEOUT));
        let _ = ours.set_write_timeout(Some(HELPER_REQUEST_TIMEOUT));
        let mut helper = Helper {
            child,
            socket: ours,
            stderr,
            idle_since: Instant::now(),
            live: Some(live),
            _descriptors: descriptors,
        };
        let policy = serde_json::to_vec(policy)
            .map_err(|e| helper_failed(HelperError::EncodePolicy(e), ""))?;
        if let Err(e) = write_frame(&mut helper.socket, &policy, None) {
            let stderr = helper.stderr_text();
            helper.kill();
            return Err(helper_failed(HelperError::SendPolicy(e), &stderr));
        }
        Ok(helper)
    }
}

/// A helper failure as reported to the client: the error and the helper's stderr (mapped to
/// -32603 `helperFailed` in `rpc::errors`).
#[derive(Debug)]
pub struct HelperFailure {
    /// What failed.
    pub error: HelperError,
    /// The helper's stderr (empty when it had not started or said nothing).
    pub stderr: String,
}

fn helper_failed(error: HelperError, stderr: &str) -> RpcError {
    HelperFailure {
        error,
        stderr: stderr.to_owned(),
    }
    .into()
}

/// The sessions remembered as gone, the oldest forgotten first past [`MAX_GONE_SESSIONS`].
#[derive(Default)]
struct GoneSessions {
    order: std::collections::VecDeque<String>,
    set: std::collections::HashSet<String>,
}

impl GoneSessions {
    fn insert(&mut self, session: &str) {
        if self.set.insert(session.to_owned()) {
            self.order.push_back(session.to_owned());
        }
        while self.order.len() > MAX_GONE_SESSIONS {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }

    fn remove(&mut self, session: &str) {
        if self.set.remove(session) {
            self.order.retain(|gone| gone != session);
        }
    }

    fn contains(&self, session: &str) -> bool {
        self.set.contains(session)
    }
}
