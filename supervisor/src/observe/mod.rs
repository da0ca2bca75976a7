//! Seeing what runs: `GET /status` ([`status`]), `GET /metrics` ([`metrics`]), `process/list`
//! (one session's processes, `ManagedProcess::info`) and the lifecycle log events (process
//! started and exited, at info, with typed fields and no argv or environment).
//!
//! The two pages are served on the listener only to a peer admitted exactly as a websocket
//! upgrade is (the bearer token, or the peer's owner: `transport::access`); `/readyz` alone
//! answers anyone.

pub mod metrics;
pub mod status;

pub use metrics::Metrics;
