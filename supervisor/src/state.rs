//! The server-wide state every connection shares ([`ServerState`]): built once by
//! `server::BoundServer::bind`, handed to the transports (the listener, relay streams) and from
//! them to each connection (`rpc::connection`), which gives its handlers only the parts they use.

use std::sync::Arc;

use tokio::sync::{Semaphore, watch};

use crate::budget::Budgets;
use crate::containment::Containment;
use crate::containment::reaper::Reaper;
use crate::fs::helpers::HelperPool;
use crate::paths::ExecServerRuntimePaths;
use crate::process::guardian::Guardian;
use crate::sandboxing::Sandboxing;
use crate::session::SessionRegistry;
use crate::transport::admission::Admission;

/// Server-wide shared state.
pub struct ServerState {
    /// Sessions.
    pub sessions: Arc<SessionRegistry>,
    /// Helper binaries.
    pub runtime_paths: ExecServerRuntimePaths,
    /// Who may connect to the listener: the bearer token, the server's own user.
    pub access: crate::transport::access::ListenerAccess,
    /// Connection slots of local clients (taken by `initialize`).
    pub connection_slots: Arc<Semaphore>,
    /// Connection slots of relay streams (remote mode), apart from the local ones: harnesses at
    /// their [`crate::limits::MAX_RELAY_STREAMS`] never lock a local client out.
    pub relay_slots: Arc<Semaphore>,
    /// Connections accepted and not yet initialized.
    pub admission: Arc<Admission>,
    /// Memory, descriptor, process and blocking-work budgets.
    pub budgets: Arc<Budgets>,
    /// True once shutdown started.
    pub shutdown: watch::Receiver<bool>,
    /// Kills our process groups if the server dies.
    pub guardian: Arc<Guardian>,
    /// Pooled fs-helpers for sandboxed filesystem requests.
    pub helpers: Arc<HelperPool>,
    /// Policy resolution, protections and helper binaries for sandboxed work.
    pub sandboxing: Arc<Sandboxing>,
    /// `http/request`: pooled clients, the server's own listeners (never reachable by default),
    /// the server-wide slots.
    pub http: Arc<crate::http::HttpContext>,
    /// `environment/info`.
    pub environment: crate::environment::EnvironmentContext,
    /// How process trees are contained and limited on this host.
    pub containment: Arc<Containment>,
    /// Without cgroups: the orphan reaper (the server is a child subreaper).
    pub reaper: Option<Arc<Reaper>>,
    /// Pre-confined launchers for sandboxed starts.
    pub launchers: Arc<crate::process::launcher::Launchers>,
    /// Counters for `GET /metrics`.
    pub metrics: Arc<crate::observe::Metrics>,
    /// When the server started (`uptimeMs` of `GET /status`).
    pub started: std::time::Instant,
}
