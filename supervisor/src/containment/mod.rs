//! Containment: every process tree the server starts is tracked as a whole, killed as a whole,
//! and can be bounded.
//!
//! - **Tracking.** Where the server can create a cgroup v2 directory (as root, or in a delegated
//!   subtree such as systemd's `user@.service`), it makes one for itself at startup
//!   (`<its own cgroup>/execward-<pid>`) and a leaf below it for each started process
//!   ([`Tree`]). The child is born in its leaf (`clone3(CLONE_INTO_CGROUP)`; where the kernel
//!   cannot do that it joins the leaf before it execs, see `sys::spawn_in_new_session`), so
//!   everything it ever starts is in it: `setsid`, `setpgid` and double forks change nothing.
//!   `cgroup.kill` ends a tree at once (terminate after the grace, session expiry, shutdown) and
//!   `exec-guardian` kills the server's whole directory if the server dies.
//! - **Without a cgroup** (no v2 hierarchy, not writable, or `--no-cgroups`) trees are process
//!   groups: the server is a child subreaper so orphans come back to it ([`reaper`]), and kills
//!   go through pidfds, never a bare pid that may have been recycled.
//! - **Limits** ([`plan`]): memory and process counts need a controller (v2 where delegated,
//!   else a v1 hierarchy on hybrid hosts); CPU time, file size and open files are rlimits of
//!   every process; wall time is the server's timer. A limit nothing here can enforce fails the
//!   start unless best effort was asked.
//! - **CPU weight.** All processes of a server share one CPU group (the v1 cpu hierarchy's
//!   `execward-<pid>`, or the server's v2 directory where the cpu controller is delegated), so
//!   together they weigh as one task against the server: a thousand runnable children cannot
//!   starve the server serving its other clients.
//!
//! The directories the server creates are always below its own cgroup in each hierarchy, so
//! whatever bounds the server (a service's limits) bounds its children too, and they are removed
//! when empty (by the server, or by the guardian after the server's death).

pub mod cgroupfs;
pub mod cleanup;
pub mod detect;
pub mod plan;
pub mod reaper;
mod tree;

pub use tree::{ChildCgroupFds, Tree};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::methods::environment::{ContainmentSupport, Tracking};
use proto::methods::process::Limits;

use crate::limits::{CGROUP_EMPTY_DEADLINE, CGROUP_EMPTY_POLL};
use cgroupfs::CgroupDir;
use plan::{Capabilities, CgroupVersion, Plan, PlanError};

/// A failed cgroup operation, naming the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum ContainmentError {
    /// `mkdir` of a cgroup.
    #[error("cannot create cgroup {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing an interface file.
    #[error("cannot write {value:?} to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Reading an interface file.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Opening `cgroup.procs` for the child to join.
    #[error("cannot open {path} for the child to join: {source}")]
    Join {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `rmdir` of a cgroup.
    #[error("cannot remove cgroup {path}: {source}")]
    Remove {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// How the server contains trees, decided once at startup.
#[derive(Debug, Clone, Default)]
pub struct ContainmentOptions {
    /// Use cgroups where the host allows (`--no-cgroups` clears it).
    pub use_cgroups: bool,
    /// Limits of every start that sets none of its own (`--default-limits`).
    pub default_limits: Limits,
}

/// A v1 hierarchy the server may write: its own directory there, and its base below it
/// (created on first use, so a server that never limits anything leaves no trace there).
#[derive(Debug)]
struct V1Hierarchy {
    base: CgroupDir,
    created: Mutex<bool>,
}

/// The host's containment, decided at startup.
#[derive(Debug)]
pub struct Containment {
    caps: Capabilities,
    v2_base: Option<CgroupDir>,
    v1: BTreeMap<&'static str, V1Hierarchy>,
    next_tree: AtomicU64,
    defaults: Limits,
    notes: Vec<String>,
}

/// The v1 controllers used for limits, when v2 does not offer them.
const V1_CONTROLLERS: [&str; 2] = ["memory", "pids"];
/// The v1 controller of the CPU group every process of the server shares.
const CPU_CONTROLLER: &str = "cpu";

impl Containment {
    /// Find what this host offers, create the server's cgroup v2 directory, and say why
    /// anything weaker is used (in [`Containment::support`] and the startup log). Never fails:
    /// a host without cgroups gets process groups.
    pub fn detect(options: ContainmentOptions) -> Self {
        let mut containment = Self {
            caps: Capabilities::default(),
            v2_base: None,
            v1: BTreeMap::new(),
            next_tree: AtomicU64::new(1),
            defaults: options.default_limits,
            notes: Vec::new(),
        };
        if !options.use_cgroups {
            containment
                .notes
                .push("cgroups are not used (--no-cgroups)".into());
            return containment;
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let locations = detect::locate(&mountinfo, &own);
        let name = free_name(&locations);
        containment.detect_v2(locations.v2.as_deref(), &name);
        for controller in V1_CONTROLLERS {
            let offered = match controller {
                "memory" => containment.caps.memory,
                _ => containment.caps.pids,
            };
            if offered.is_some() {
                continue;
            }
            match locations.v1.get(controller) {
                Some(own_dir) => containment.detect_v1(controller, own_dir, &name),
                None => containment.notes.push(format!(
                    "no {controller} controller: neither delegated in cgroup v2 nor mounted as \
                     cgroup v1"
                )),
            }
        }
        containment.detect_cpu_group(locations.v1.get("cpu").map(PathBuf::as_path), &name);
        containment
    }

    /// One CPU group for every process of this server, where the cpu controller is a v1
    /// hierarchy: its processes then weigh together as one ordinary task (`cpu.shares` 1024)
    /// against the server and the rest of the host, however many of them are runnable, so
    /// 1,200 processes woken at once cannot take the CPU from the server serving its other
    /// clients (measured: a neighbour's slowest request went from 250-850 ms to under 100 ms).
    /// CPU shares only count under contention: alone on the host they still use every core.
    /// On a v2 host with the cpu controller the server's cgroup is already one such group.
    fn detect_cpu_group(&mut self, own: Option<&Path>, name: &str) {
        let Some(own) = own else {
            return;
        };
        let group = match CgroupDir::create(own.join(name)) {
            Ok(group) => group,
            Err(error) => {
                self.notes.push(format!(
                    "cannot create a CPU group under {} ({error}): each process competes for \
                     CPU on its own",
                    own.display()
                ));
                return;
            }
        };
        self.notes.push(format!(
            "processes share one CPU weight in the cgroup v1 cpu group {}",
            group.path().display()
        ));
        self.v1.insert(
            CPU_CONTROLLER,
            V1Hierarchy {
                base: group,
                created: Mutex::new(true),
            },
        );
    }

    /// The shared CPU group, when there is one.
    fn cpu_group(&self) -> Option<&CgroupDir> {
        self.v1.get(CPU_CONTROLLER).map(|hierarchy| &hierarchy.base)
    }

    fn detect_v2(&mut self, own: Option<&Path>, name: &str) {
        let Some(own) = own else {
            self.notes
                .push("no cgroup v2 hierarchy is mounted: trees are process groups".into());
            return;
        };
        let base = match CgroupDir::create(own.join(name)) {
            Ok(base) => base,
            Err(error) => {
                self.notes.push(format!(
                    "cannot create a cgroup under {} ({error}): trees are process groups",
                    own.display()
                ));
                return;
            }
        };
        if !base.has("cgroup.kill") {
            self.notes.push(
                "the kernel has no cgroup.kill (Linux 5.14): trees are process groups".into(),
            );
            let _ = base.remove_tree();
            return;
        }
        self.caps.tracking = true;
        // Controllers the server's own cgroup passes down to ours, enabled for our leaves.
        let own_dir = CgroupDir::at(own.to_owned());
        let passed_down = own_dir.read("cgroup.subtree_control").unwrap_or_default();
        for controller in V1_CONTROLLERS {
            if !passed_down.split_whitespace().any(|c| c == controller) {
                continue;
            }
            match base.write("cgroup.subtree_control", &format!("+{controller}")) {
                Ok(()) => match controller {
                    "memory" => self.caps.memory = Some(CgroupVersion::V2),
                    _ => self.caps.pids = Some(CgroupVersion::V2),
                },
                Err(error) => self.notes.push(format!(
                    "cannot enable the v2 {controller} controller for process cgroups: {error}"
                )),
            }
        }
        self.v2_base = Some(base);
    }

    fn detect_v1(&mut self, controller: &'static str, own: &Path, name: &str) {
        // Probe: the server may create (and remove) a directory there.
        let probe = own.join(name);
        match CgroupDir::create(probe.clone()).and_then(|dir| dir.remove_tree()) {
            Ok(()) => {
                let version = Some(CgroupVersion::V1);
                match controller {
                    "memory" => self.caps.memory = version,
                    _ => self.caps.pids = version,
                }
                self.v1.insert(
                    controller,
                    V1Hierarchy {
                        base: CgroupDir::at(probe),
                        created: Mutex::new(false),
                    },
                );
                self.notes.push(format!(
                    "{controller} limits use the cgroup v1 {controller} hierarchy under {} (no \
                     v2 {controller} controller is delegated to this server)",
                    own.display()
                ));
            }
            Err(error) => self.notes.push(format!(
                "the v1 {controller} hierarchy is not writable ({error}): no {controller} limit"
            )),
        }
    }

    /// What the host offers.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// The cgroup v2 directory of this server, when trees are tracked by cgroup.
    pub fn v2_base(&self) -> Option<&Path> {
        self.v2_base.as_ref().map(CgroupDir::path)
    }

    /// The v1 directories this server may create (for the guardian to remove after its death).
    pub fn v1_bases(&self) -> Vec<PathBuf> {
        self.v1.values().map(|h| h.base.path().to_owned()).collect()
    }

    /// What the host offers for limits.
    pub fn caps(&self) -> Capabilities {
        self.caps
    }

    /// The `--default-limits`.
    pub fn defaults(&self) -> &Limits {
        &self.defaults
    }

    /// The report for `environment/info` and the startup log.
    pub fn support(&self) -> ContainmentSupport {
        ContainmentSupport {
            tracking: if self.caps.tracking {
                Tracking::CgroupV2
            } else {
                Tracking::ProcessGroup
            },
            cgroup: self.v2_base().map(|p| p.display().to_string()),
            limits: plan::support(self.caps),
            default_limits: (!self.defaults.is_empty()).then(|| self.defaults.clone()),
            sandbox_processes: Some(sandbox::limits::host_processes_share()),
            notes: self.notes.clone(),
        }
    }

    /// The limits of a start: `requested` laid over the defaults, planned for this host.
    ///
    /// # Errors
    /// [`PlanError`] naming the limit.
    pub fn plan(&self, requested: Option<&Limits>) -> Result<Plan, PlanError> {
        let limits = match requested {
            Some(requested) => requested.over(&self.defaults),
            None => self.defaults.clone(),
        };
        plan::plan(&limits, self.caps)
    }

    /// The limits of a sandboxed start: [`Containment::plan`], then [`Plan::for_sandbox`] with
    /// this host's share of its tasks.
    ///
    /// # Errors
    /// [`PlanError`] naming the limit.
    pub fn plan_sandboxed(&self, requested: Option<&Limits>) -> Result<Plan, PlanError> {
        let mut plan = self.plan(requested)?;
        plan.for_sandbox(self.caps, sandbox::limits::host_processes_share());
        Ok(plan)
    }

    /// Check at startup that the defaults can be enforced here.
    ///
    /// # Errors
    /// [`PlanError`] naming the limit.
    pub fn check_defaults(&self) -> Result<(), PlanError> {
        self.plan(None).map(|_| ())
    }

    /// Create the cgroups of one process and configure its limits.
    ///
    /// # Errors
    /// [`ContainmentError`] naming the directory or file; whatever was created is removed.
    pub fn create_tree(&self, plan: &Plan) -> Result<Tree, ContainmentError> {
        let name = format!("p{}", self.next_tree.fetch_add(1, Ordering::Relaxed));
        let mut tree = Tree::default();
        let result = self.fill_tree(&mut tree, &name, plan);
        if let Err(error) = result {
            let _ = tree.remove();
            return Err(error);
        }
        Ok(tree)
    }

    fn fill_tree(&self, tree: &mut Tree, name: &str, plan: &Plan) -> Result<(), ContainmentError> {
        if let Some(base) = &self.v2_base {
            let leaf = CgroupDir::create(base.child(name))?;
            tree.leaf = Some(leaf.clone());
            if let Some((CgroupVersion::V2, bytes)) = plan.memory {
                leaf.write("memory.max", &bytes.to_string())?;
                if leaf.has("memory.swap.max") {
                    leaf.write("memory.swap.max", "0")?;
                }
                tree.oom = Some((leaf.clone(), "memory.events"));
            }
            if let Some((CgroupVersion::V2, count)) = plan.pids {
                leaf.write("pids.max", &count.to_string())?;
            }
        }
        if let Some((CgroupVersion::V1, bytes)) = plan.memory {
            let leaf = CgroupDir::create(self.v1_base("memory")?.child(name))?;
            tree.v1.push(leaf.clone());
            leaf.write("memory.limit_in_bytes", &bytes.to_string())?;
            if leaf.has("memory.memsw.limit_in_bytes") {
                leaf.write("memory.memsw.limit_in_bytes", &bytes.to_string())?;
            }
            tree.oom = Some((leaf, "memory.oom_control"));
        }
        if let Some((CgroupVersion::V1, count)) = plan.pids {
            let leaf = CgroupDir::create(self.v1_base("pids")?.child(name))?;
            tree.v1.push(leaf.clone());
            leaf.write("pids.max", &count.to_string())?;
        }
        tree.cpu_group = self.cpu_group().cloned();
        Ok(())
    }

    /// The server's base in a v1 hierarchy, created on first use.
    fn v1_base(&self, controller: &str) -> Result<&CgroupDir, ContainmentError> {
        let hierarchy = self
            .v1
            .get(controller)
            .ok_or_else(|| ContainmentError::Create {
                path: PathBuf::from(controller),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            })?;
        let mut created = hierarchy
            .created
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !*created {
            match CgroupDir::create(hierarchy.base.path().to_owned()) {
                Err(ContainmentError::Create { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(error),
                Ok(_) => {}
            }
            *created = true;
        }
        Ok(&hierarchy.base)
    }

    /// The server did not start after all: remove its (still empty) cgroup directory.
    pub fn abandon(&self) {
        if let Some(base) = &self.v2_base {
            let _ = base.remove_tree();
        }
        if let Some(group) = self.cpu_group() {
            let _ = group.remove_tree();
        }
    }

    /// Server shutdown, after every process was terminated: kill whatever is left in the
    /// server's cgroups and remove them.
    pub async fn shutdown(&self) {
        if let Some(base) = &self.v2_base {
            let _ = base.kill();
            wait_until(|| !base.populated()).await;
            if let Err(error) = base.remove_tree() {
                tracing::warn!(%error, "leaving a cgroup behind");
            }
        }
        for hierarchy in self.v1.values() {
            let removed = wait_until(|| hierarchy.base.remove_tree().is_ok()).await;
            if !removed {
                tracing::warn!(path = %hierarchy.base.path().display(), "leaving a v1 cgroup behind");
            }
        }
    }
}

/// A base name no hierarchy holds yet: `execward-<pid>`, or with a suffix when a dead server
/// with the same pid left one behind.
fn free_name(locations: &detect::CgroupLocations) -> String {
    let pid = std::process::id();
    let taken = |name: &str| {
        locations.v2.iter().any(|dir| dir.join(name).exists())
            || V1_CONTROLLERS
                .iter()
                .chain(&[CPU_CONTROLLER])
                .filter_map(|c| locations.v1.get(*c))
                .any(|dir| dir.join(name).exists())
    };
    let mut name = format!("execward-{pid}");
    let mut suffix = 1;
    while taken(&name) {
        name = format!("execward-{pid}-{suffix}");
        suffix += 1;
    }
    name
}

/// Poll `done` every [`CGROUP_EMPTY_POLL`] until it holds or [`CGROUP_EMPTY_DEADLINE`] passed
/// (a killed tree takes a moment to exit); whether it held.
pub async fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + CGROUP_EMPTY_DEADLINE;
    loop {
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(CGROUP_EMPTY_POLL).await;
    }
}
