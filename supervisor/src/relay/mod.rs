//! Remote mode: the tokio glue around the sans-I/O relay in [`proto::relay`].
//!
//! - [`executor`]: `exec-server --remote`: register with the registry, hold one websocket to the
//!   rendezvous, run one JSON-RPC connection ([`crate::rpc::connection::serve_transport`]) per
//!   relay stream, reconnect with backoff and resume every stream.
//! - [`harness`]: the client end of one stream ([`harness::RelayHarnessConnection`]).
//! - [`driver`]: the per-stream task both ends share (timers, frames in and out).
//! - [`registry`]: the small HTTP client for the registry's register/connect endpoints.
//!
//! Ordering rules: a stream task owns its [`proto::relay::SecureStream`]; the socket task only
//! decodes frames and routes them by `stream_id` into bounded inboxes (a full inbox drops the
//! frame: the peer retransmits), so one slow stream never blocks another.

pub mod driver;
pub mod executor;
pub mod harness;
pub mod registry;

use std::time::Duration;

pub use executor::{RemoteEnvironmentConfig, RemoteError, run_main_remote, run_remote_environment};
pub use harness::{RelayHarnessConnection, RemoteConnectArgs};

/// Environment variable holding the registry's bearer token (executor and harness).
pub const REGISTRY_TOKEN_ENV: &str = "EXECWARD_REGISTRY_TOKEN";
/// Relay streams one executor serves at once; handshakes beyond this are answered with a reset.
pub const MAX_RELAY_STREAMS: usize = 256;
/// Streams whose handshake was answered but whose harness has not yet proven it holds the keys.
/// Bounds the work (one DH each) a flood of handshakes can cause before they are refused.
pub const MAX_PENDING_HANDSHAKES: usize = 32;
/// Failed handshakes tolerated on one rendezvous socket; one more closes the socket (it is
/// reopened after the reconnect backoff).
pub const MAX_HANDSHAKE_FAILURES_PER_SOCKET: u32 = 16;
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
