//! Remote mode: the tokio glue around the sans-I/O relay in [`proto::relay`].
//!
//! - [`executor`]: `exec-server --remote`: register with the registry, hold one websocket to the
//!   rendezvous, run one JSON-RPC connection (`rpc::connection::serve_transport`) per
//!   relay stream, reconnect with backoff and resume every stream.
//! - [`harness`]: the client end of one stream ([`harness::RelayHarnessConnection`]).
//! - [`driver`]: the per-stream task both ends share (timers, frames in and out).
//! - [`registry`]: the HTTP client for the registry's register/connect endpoints.
//! - [`tls`]: rustls settings, and the rule that a token never crosses the network in clear.
//! - `identity`: the executor's persistent Noise key (`--identity-file`).
//!
//! Ordering rules: a stream task owns its [`proto::relay::SecureStream`]; the socket task only
//! decodes frames and routes them by `stream_id` into bounded inboxes (a full inbox drops the
//! frame: the peer retransmits), so one slow stream never blocks another.

pub mod driver;
#[cfg(feature = "server")]
pub mod executor;
#[cfg(feature = "client")]
pub mod harness;
#[cfg(feature = "server")]
mod identity;
pub mod registry;
pub mod tls;

use std::time::Duration;

#[cfg(feature = "server")]
pub use executor::{RemoteEnvironmentConfig, RemoteError, run_main_remote, run_remote_environment};
#[cfg(feature = "client")]
pub use harness::{REGISTRATION_WAIT, RelayHarnessConnection, RemoteConnectArgs};

/// Environment variable holding a harness's credential (`exec --remote` without
/// `--token-file`).
pub const REGISTRY_TOKEN_ENV: &str = "EXECWARD_REGISTRY_TOKEN";
/// Environment variable holding an executor's credential (`exec-server --remote` without
/// `--token-file`).
pub const EXECUTOR_TOKEN_ENV: &str = "EXECWARD_EXECUTOR_TOKEN";
pub use crate::limits::MAX_RELAY_STREAMS;
/// Streams one harness socket (one `source`) may have open on an executor. A harness opens one
/// socket per stream; this only stops one party from taking every slot.
pub const MAX_STREAMS_PER_SOURCE: usize = 32;
/// Streams whose handshake was answered but whose harness has not yet proven it holds the keys,
/// over all harnesses. Bounds the work (one DH each) pending handshakes hold. When full, the
/// oldest pending handshake of the harness socket with the most is dropped for a newcomer, so a
/// flood from one party never locks others out.
pub const MAX_PENDING_HANDSHAKES: usize = 32;
/// Start of the reset reason an executor gives when [`MAX_PENDING_HANDSHAKES`] are pending: a
/// passing state (each pending handshake is confirmed or expires within moments), so a harness
/// that hears it tries again ([`BUSY_RETRY_WINDOW`]).
pub const HANDSHAKES_BUSY: &str = "environment busy: MAX_PENDING_HANDSHAKES";
/// How long a harness keeps retrying a handshake refused with [`HANDSHAKES_BUSY`] (backing off
/// from [`BUSY_RETRY_FIRST_DELAY`], doubling up to [`BUSY_RETRY_MAX_DELAY`], with jitter), so an
/// orchestrator starting many sessions at once gets every one of them.
pub const BUSY_RETRY_WINDOW: Duration = Duration::from_secs(10);
/// First wait before retrying a busy handshake.
pub const BUSY_RETRY_FIRST_DELAY: Duration = Duration::from_millis(20);
/// Longest wait between retries of a busy handshake.
pub const BUSY_RETRY_MAX_DELAY: Duration = Duration::from_millis(400);
/// Pending handshakes one harness socket may hold; more are refused with a reset.
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = 4;
/// Handshake attempts (valid or not) one harness socket may make per second once its burst is
/// spent; more are dropped unanswered, so garbage costs no DH and no reset frame. The same as
/// the reference rendezvous's own limit, which is the first line; this one holds behind any
/// rendezvous.
pub const HANDSHAKES_PER_SOURCE_PER_SECOND: f64 = 8.0;
/// Handshake attempts one harness socket may make at once (token bucket size).
pub const HANDSHAKES_PER_SOURCE_BURST: f64 = 16.0;
/// How often the executor looks for unconfirmed streams older than
/// [`proto::relay::limits::UNCONFIRMED_STREAM_TIMEOUT`].
pub const UNCONFIRMED_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes a relay websocket reads from its socket at once (tungstenite's read buffer, 128 KiB by
/// default). tungstenite zero-fills this much before every read, including each read that finds
/// the socket empty, so at 128 KiB every small frame cost two 128 KiB memsets in each process it
/// crossed. A full segment frame (about 64 KiB) now takes a few reads instead of one.
pub const RELAY_READ_BUFFER_BYTES: usize = 16 * 1024;
/// Frames queued for one stream task; more are dropped (and retransmitted by the peer).
pub const STREAM_INBOX_FRAMES: usize = 1024;
/// Frames queued for the rendezvous socket; more are dropped (and retransmitted).
pub const SOCKET_OUTBOX_FRAMES: usize = 4096;
/// Messages queued between a stream task and its JSON-RPC connection, each way.
pub const APP_QUEUE_MESSAGES: usize = 256;
/// Closed stream ids remembered so that a late retransmitted handshake gets a reset instead of
/// opening a new stream.
pub const RECENTLY_CLOSED_STREAMS: usize = 1024;
/// First delay before reconnecting to the registry/rendezvous.
pub const RECONNECT_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Largest delay between reconnection attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a closing stream waits for its last messages to be acknowledged before it resets.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);
/// Largest registry HTTP response read.
pub const MAX_REGISTRY_RESPONSE_BYTES: usize = 64 * 1024;
/// Time allowed for one registry HTTP exchange.
pub const REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);

/// The next reconnection delay: doubled, capped.
pub fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(RECONNECT_BACKOFF_MAX)
}
