//! The process table of a session, the `process/*` methods ([`handlers`]), and the end of a
//! session's processes ([`terminate_sessions`]).
//!
//! Lifecycle: `start` reserves the id (so racing starts with one id cannot both win), spawns the
//! child, and hands its I/O to one pump task ([`pump`]); the pump records every event in the
//! process's log ([`output`]) and notifies the attached connection; after `closed` the process
//! stays readable for a while, then leaves the table.

pub mod approvals;
pub mod approve;
pub mod bounds;
pub mod env_policy;
pub mod guardian;
pub mod handlers;
pub mod launcher;
pub mod managed;
pub mod output;
pub mod pump;
pub mod retention;
pub mod spawn;
pub mod start;
pub mod watch;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

pub use managed::ManagedProcess;

use crate::limits::{MAX_PROCESS_ID_BYTES, MAX_PROCESSES_PER_SESSION};

/// Why a `process/*` call failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// `argv` is empty.
    #[error("argv must not be empty; pass at least the program")]
    EmptyArgv,
    /// `processId` is empty or longer than its limit.
    #[error("processId must be 1 to {limit} bytes (got {length})")]
    ProcessIdLength {
        /// Its length in bytes.
        length: usize,
        /// The limit ([`MAX_PROCESS_ID_BYTES`]).
        limit: usize,
    },
    /// `auditDenials` without a sandbox that restricts anything (there would be nothing to
    /// audit).
    #[error("auditDenials needs a restricting sandbox")]
    AuditWithoutSandbox,
    /// `arg0` together with a sandbox.
    #[error(
        "arg0 {} cannot be combined with a sandbox (the sandbox execs argv[0])",
        crate::untrusted::Untrusted(arg0)
    )]
    Arg0WithSandbox {
        /// The `arg0` given.
        arg0: String,
    },
    /// `process/resize` to a zero size.
    #[error("cols and rows must be at least 1 (got cols {cols}, rows {rows})")]
    ZeroTerminalSize {
        /// The `cols` given.
        cols: u16,
        /// The `rows` given.
        rows: u16,
    },
    /// The request's `sandbox` does not parse or resolve.
    #[error(transparent)]
    Sandbox(#[from] crate::sandboxing::SandboxRequestError),
    /// The sandbox refuses the cwd (a symlink an earlier command could have planted is on its
    /// way).
    #[error("cwd: {source}")]
    CwdRefused {
        /// The cwd, as given.
        path: PathBuf,
        /// Why the sandbox refuses it.
        #[source]
        source: sandbox::PolicyError,
    },
    /// A sandboxed command's cwd is not UTF-8 (it travels to `sandbox-run` as text).
    #[error(
        "cwd {} is not valid UTF-8: a sandboxed command's working directory travels to \
         sandbox-run as text; run it from a directory with a UTF-8 path",
        crate::untrusted::Untrusted(&path.to_string_lossy())
    )]
    CwdNotUtf8 {
        /// The canonical cwd.
        path: PathBuf,
    },
    /// No process with this id in the session.
    #[error("unknown process {process_id:?} in this session")]
    NotFound {
        /// The id.
        process_id: String,
    },
    /// The id is taken.
    #[error(
        "process id {process_id:?} is already in use in this session; choose another processId"
    )]
    DuplicateId {
        /// The id.
        process_id: String,
    },
    /// Too many processes.
    #[error(
        "this session already holds {limit} processes (MAX_PROCESSES_PER_SESSION); wait for some to close"
    )]
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// `cwd` does not exist.
    #[error("cwd {path:?} does not exist")]
    CwdMissing {
        /// The cwd.
        path: PathBuf,
    },
    /// `cwd` is not a directory.
    #[error("cwd {path:?} is not a directory")]
    CwdNotDirectory {
        /// The cwd.
        path: PathBuf,
    },
    /// A sandboxed command's `cwd`, or the way to it, is hidden by its policy (refused alike
    /// whether anything is there: the server does not examine it for the client).
    #[error(
        "cwd {path:?} is not visible under the sandbox policy (a deny entry or a hidden path is on the way to it); choose a directory the policy lets the command read"
    )]
    CwdDenied {
        /// The cwd.
        path: PathBuf,
    },
    /// The child could not be started.
    #[error(transparent)]
    Spawn(#[from] spawn::SpawnError),
    /// The sandbox launcher failed this start.
    #[error(transparent)]
    Launcher(#[from] launcher::LauncherFailure),
    /// `chunk` is not base64.
    #[error("chunk is not valid base64: {0}")]
    InvalidBase64(#[source] base64::DecodeError),
    /// Resize of a pipe-mode process.
    #[error("process {process_id:?} has no terminal (start it with tty: true to resize it)")]
    NotPty {
        /// The id.
        process_id: String,
    },
    /// Resize of a process whose terminal is already closed.
    #[error(
        "resizing the terminal of process {process_id:?} failed: the process has closed its terminal"
    )]
    TerminalClosed {
        /// The id.
        process_id: String,
    },
    /// The PTY refused the size.
    #[error("resizing the terminal of process {process_id:?} to {cols}x{rows} failed: {source}")]
    Resize {
        /// The id.
        process_id: String,
        /// The `cols` asked for.
        cols: u16,
        /// The `rows` asked for.
        rows: u16,
        /// The `TIOCSWINSZ` error.
        #[source]
        source: std::io::Error,
    },
    /// The request needs a capability this server does not have (in the combination asked for).
    #[error("{}: {}", feature.field(), feature.explanation())]
    Unsupported {
        /// What was asked for.
        feature: UnsupportedFeature,
    },
    /// A field is longer than its limit.
    #[error("{field} is {length} bytes; at most {limit} ({limit_name}) are accepted")]
    TooLong {
        /// Which field.
        field: String,
        /// Its length (bytes, or entries for a list).
        length: usize,
        /// The limit.
        limit: usize,
        /// The limit's name.
        limit_name: &'static str,
    },
    /// A server-wide budget (processes, descriptors, memory) has no room now.
    #[error(transparent)]
    Budget(#[from] crate::budget::BudgetError),
    /// The limits are invalid or cannot be enforced here.
    #[error(transparent)]
    Limits(#[from] crate::containment::plan::PlanError),
    /// The process's cgroups could not be set up.
    #[error(transparent)]
    Containment(#[from] crate::containment::ContainmentError),
}

/// A request feature this server cannot honour as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnsupportedFeature {
    /// `enforceManagedNetwork: true` with a sandbox whose network is fully on: there is no
    /// managed proxy to confine the command to, and running with the open network would give
    /// more than was asked.
    EnforceManagedNetworkWithOpenNetwork,
}

impl UnsupportedFeature {
    /// The request field that asked for it.
    pub fn field(self) -> &'static str {
        match self {
            UnsupportedFeature::EnforceManagedNetworkWithOpenNetwork => "enforceManagedNetwork",
        }
    }

    /// Why it is refused and what to send instead.
    pub fn explanation(self) -> &'static str {
        match self {
            UnsupportedFeature::EnforceManagedNetworkWithOpenNetwork => {
                "the sandbox's network is fully on, so it does not go through a managed proxy; \
                 send a sandbox whose network is off or an allowlist \
                 (\"network\": {\"allow\": [...]}), or leave enforceManagedNetwork out to run \
                 with the network the sandbox allows"
            }
        }
    }
}

enum Slot {
    Starting,
    Ready(Arc<ManagedProcess>),
}

/// What a process id names in a session.
pub enum Lookup {
    /// Nothing.
    Missing,
    /// A `process/start` with this id is in progress.
    Starting,
    /// A started process.
    Ready(Arc<ManagedProcess>),
}

/// The processes of one session, the trees they left behind, and the output they retain.
pub struct ProcessTable {
    slots: Mutex<HashMap<String, Slot>>,
    /// Trees of closed processes that still hold processes (a daemon the command started):
    /// killed with the session.
    lingering: Mutex<Vec<Arc<crate::containment::Tree>>>,
    /// The session's retained output, charged to the server's pool.
    retention: Arc<retention::SessionRetention>,
}

/// A reserved id; dropping it without [`Reservation::fill`] frees the id again.
pub struct Reservation<'a> {
    table: &'a ProcessTable,
    id: Option<String>,
}

impl Reservation<'_> {
    /// Install the started process under the reserved id.
    pub fn fill(mut self, process: Arc<ManagedProcess>) {
        if let Some(id) = self.id.take() {
            self.table.lock().insert(id, Slot::Ready(process));
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.table.lock().remove(&id);
        }
    }
}

impl ProcessTable {
    /// An empty table whose processes' output is charged to `pool`.
    pub fn new(pool: &Arc<retention::RetentionPool>) -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            lingering: Mutex::new(Vec::new()),
            retention: pool.session(),
        }
    }

    /// The session's retained output.
    pub fn retention(&self) -> &Arc<retention::SessionRetention> {
        &self.retention
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserve `id` for a start.
    ///
    /// # Errors
    /// Invalid, duplicate id, or the session is full.
    pub fn reserve(&self, id: &str) -> Result<Reservation<'_>, ProcessError> {
        if id.is_empty() || id.len() > MAX_PROCESS_ID_BYTES {
            return Err(ProcessError::ProcessIdLength {
                length: id.len(),
                limit: MAX_PROCESS_ID_BYTES,
            });
        }
        let mut slots = self.lock();
        if slots.len() >= MAX_PROCESSES_PER_SESSION {
            return Err(ProcessError::TooMany {
                limit: MAX_PROCESSES_PER_SESSION,
            });
        }
        match slots.entry(id.to_owned()) {
            Entry::Occupied(_) => Err(ProcessError::DuplicateId {
                process_id: id.to_owned(),
            }),
            Entry::Vacant(vacant) => {
                vacant.insert(Slot::Starting);
                Ok(Reservation {
                    table: self,
                    id: Some(id.to_owned()),
                })
            }
        }
    }

    /// The process with this id.
    ///
    /// # Errors
    /// [`ProcessError::NotFound`] (also while it is still starting).
    pub fn get(&self, id: &str) -> Result<Arc<ManagedProcess>, ProcessError> {
        match self.lock().get(id) {
            Some(Slot::Ready(process)) => Ok(process.clone()),
            _ => Err(ProcessError::NotFound {
                process_id: id.to_owned(),
            }),
        }
    }

    /// What `id` names, telling a start in progress from an unknown id.
    pub fn lookup(&self, id: &str) -> Lookup {
        match self.lock().get(id) {
            Some(Slot::Ready(process)) => Lookup::Ready(process.clone()),
            Some(Slot::Starting) => Lookup::Starting,
            None => Lookup::Missing,
        }
    }

    /// Every started process.
    pub fn all(&self) -> Vec<Arc<ManagedProcess>> {
        self.lock()
            .values()
            .filter_map(|slot| match slot {
                Slot::Ready(process) => Some(process.clone()),
                Slot::Starting => None,
            })
            .collect()
    }

    /// A process closed: remove its cgroups if its tree is empty, else keep the tree until the
    /// session ends (trees that emptied meanwhile are removed now).
    pub fn release_tree(&self, tree: &Arc<crate::containment::Tree>) {
        let mut lingering = self
            .lingering
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lingering.push(tree.clone());
        lingering.retain(|tree| {
            if tree.populated() {
                return true;
            }
            if let Err(error) = tree.remove() {
                tracing::warn!(%error, "leaving a process cgroup behind");
            }
            false
        });
    }

    /// Every lingering tree, taken out of the table.
    pub fn take_lingering(&self) -> Vec<Arc<crate::containment::Tree>> {
        std::mem::take(
            &mut *self
                .lingering
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// Remove `process` unless its id was reused by a newer process.
    pub fn remove_if_same(&self, process: &Arc<ManagedProcess>) {
        let mut slots = self.lock();
        if matches!(slots.get(&process.id), Some(Slot::Ready(current)) if Arc::ptr_eq(current, process))
        {
            slots.remove(&process.id);
        }
    }
}

/// Terminate every process of a session and wait (bounded) for them to exit.
pub async fn terminate_all(processes: Vec<Arc<ManagedProcess>>) {
    for process in &processes {
        process.terminate();
    }
    for process in &processes {
        if !process
            .wait_exit(crate::limits::TERMINATE_GRACE + std::time::Duration::from_secs(1))
            .await
        {
            process.kill_tree().await;
        }
    }
}

/// Sessions end (expiry, server shutdown): terminate their processes (all at once, one grace
/// period), then kill every tree they leave behind, lingering ones of closed processes
/// included, and remove the cgroups.
pub async fn terminate_sessions(tables: &[Arc<ProcessTable>]) {
    let processes: Vec<_> = tables.iter().flat_map(|table| table.all()).collect();
    terminate_all(processes.clone()).await;
    for process in &processes {
        process.tree().kill_and_remove().await;
    }
    for table in tables {
        for tree in table.take_lingering() {
            tree.kill_and_remove().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_id_looks_up_as_starting_until_filled_or_dropped() {
        let table = ProcessTable::new(&retention::RetentionPool::new(1 << 20));
        assert!(matches!(table.lookup("p"), Lookup::Missing));
        let reservation = table.reserve("p").unwrap();
        assert!(matches!(table.lookup("p"), Lookup::Starting));
        assert!(matches!(table.get("p"), Err(ProcessError::NotFound { .. })));
        drop(reservation);
        assert!(matches!(table.lookup("p"), Lookup::Missing));
    }
}
