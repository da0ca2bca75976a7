//! The `process/*` methods: params in, results out; errors are [`ProcessError`]s mapped to
//! JSON-RPC in one place (`rpc::errors`).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use nix::sys::signal::Signal;
use proto::methods::process::{
    ListResult, OutputChunk, ReadParams, ReadResult, ResizeParams, RunningResult, SignalName,
    SignalParams, StartParams, StartResult, TerminateParams, WriteParams, WriteResult, WriteStatus,
};

use super::guardian::Guardian;
use super::managed::{ManagedProcess, ProcessCharges, StartFacts, Stdin};
use super::pump::{self, PumpContext, PumpIo};
use super::spawn::{ChildIo, SpawnSpec, spawn};
use super::{Lookup, ProcessError, UnsupportedFeature, bounds, env_policy, watch};
use crate::budget::{BudgetError, Budgets, ConnectionBudget};
use crate::containment::reaper::Reaper;
use crate::containment::{ChildCgroupFds, Containment};
use crate::limits::{
    DEFAULT_PTY_COLS, DEFAULT_PTY_ROWS, MAX_READ_BYTES, MAX_WAIT_MS, MAX_WRITE_ID_BYTES,
    OUTPUT_READ_CHUNK_BYTES, WALL_BACKSTOP_GRACE,
};
use crate::sandboxing::Sandboxing;
use crate::session::Session;
use crate::untrusted::LogField;

/// What `process/start` uses of the server-wide state (`rpc::dispatch` builds it): budgets,
/// containment, the sandboxing (policy resolution, protections, the `sandbox-run` helper) and
/// who must hear of every started process (guardian, reaper).
pub struct LaunchContext<'a> {
    /// Process and descriptor budgets.
    pub budgets: &'a Budgets,
    /// How process trees are contained and limited on this host.
    pub containment: &'a Arc<Containment>,
    /// Policy resolution, protections and helper binaries for sandboxed work.
    pub sandboxing: &'a Arc<Sandboxing>,
    /// Kills our process groups if the server dies.
    pub guardian: &'a Arc<Guardian>,
    /// Without cgroups: the orphan reaper.
    pub reaper: &'a Option<Arc<Reaper>>,
    /// Pre-confined launchers for sandboxed starts.
    pub launchers: &'a Arc<super::launcher::Launchers>,
    /// Counts the start and, through the pump, the exit.
    pub metrics: &'a Arc<crate::observe::Metrics>,
}

/// `process/start`. Field lengths are checked first; the server's process and descriptor budgets
/// are taken before the id is reserved; the cwd check, policy resolution, program lookup and
/// spawn run on the blocking pool (never on the async workers).
///
/// # Errors
/// See [`ProcessError`].
pub async fn start(
    session: &Session,
    launch: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    params: StartParams,
) -> Result<StartResult, ProcessError> {
    if params.argv.is_empty() {
        return Err(ProcessError::EmptyArgv);
    }
    bounds::check_start(&params)?;
    let charges = ProcessCharges {
        live: launch.budgets.process()?,
        descriptors: launch
            .budgets
            .descriptors(bounds::descriptors_of(&params))?,
    };
    let cwd = params.cwd.as_path().to_path_buf();
    let reservation = session.processes.reserve(&params.process_id)?;
    let mut plan = launch.containment.plan(params.limits.as_ref())?;
    let pty = params.tty.then(|| {
        (
            params.cols.unwrap_or(DEFAULT_PTY_COLS),
            params.rows.unwrap_or(DEFAULT_PTY_ROWS),
        )
    });
    let audit = params.audit_denials;
    let env = env_policy::child_env(
        params.env_policy.as_ref(),
        env_policy::server_env(),
        params.env,
    );
    bounds::check_path_search(&params.argv[0], &env)?;
    let began = std::time::Instant::now();
    let policy = resolve_sandbox(launch, budget, params.sandbox, &cwd).await?;
    let resolved = began.elapsed();
    if params.enforce_managed_network && policy.as_ref().is_none_or(|(p, _)| p.network_fully_on()) {
        // A managed proxy is what was asked for; running with the network open would give more.
        return Err(ProcessError::Unsupported {
            feature: UnsupportedFeature::EnforceManagedNetworkWithOpenNetwork,
        });
    }
    if policy.is_some() {
        // Its default share of the host's tasks.
        plan.for_sandbox(
            launch.containment.caps(),
            sandbox::limits::host_processes_share(),
        );
    }
    let how = match policy {
        // A pipe-mode start in a policy a launcher can serve goes through the session's
        // launcher; its one-shot spec is made only if no launcher takes it.
        // A launcher prepares each command's sandbox before the command arrives, so bounds
        // set when a sandbox is built (its devpts instance, its inotify maxima) need a
        // one-shot `sandbox-run`.
        Some((policy, cwd))
            if params.arg0.is_none()
                && !plan.rlimits.pools.set_at_setup()
                && launch.launchers.eligible(&policy, pty.is_some(), audit) =>
        {
            How::Launcher(Box::new(LauncherStart {
                launchers: launch.launchers.clone(),
                sandboxing: launch.sandboxing.clone(),
                session_id: session.id.clone(),
                policy,
                command: sandbox::linux::launcher::StartCommand {
                    argv: params.argv,
                    env: env.into_iter().collect(),
                    cwd,
                    limits: plan.rlimits.clone(),
                },
                pipe_stdin: params.pipe_stdin,
            }))
        }
        policy => How::Spawn(Box::new(match policy {
            None if audit => {
                return Err(ProcessError::AuditWithoutSandbox);
            }
            None => {
                // The pool bounds hold only in a sandbox.
                plan.without_sandbox()?;
                SpawnSpec {
                    argv: params.argv,
                    arg0: params.arg0,
                    cwd,
                    env,
                    pty,
                    pipe_stdin: params.pipe_stdin,
                    audit_pipe: false,
                    launch: None,
                    ask: None,
                    ask_server: None,
                    cgroups: ChildCgroupFds::default(),
                    rlimits: plan.rlimits.clone(),
                }
            }
            Some(_) if params.arg0.is_some() => {
                return Err(ProcessError::Arg0WithSandbox {
                    arg0: params.arg0.unwrap_or_default(),
                });
            }
            Some((policy, cwd)) => sandboxed_spec(
                launch.sandboxing,
                policy,
                params.argv,
                env,
                cwd,
                pty,
                params.pipe_stdin,
                audit,
                plan.rlimits.clone(),
            )?,
        })),
    };
    let (sandboxed, check_cwd) = match &how {
        How::Spawn(spec) => (spec.launch.is_some(), policy_free_cwd(spec)),
        How::Launcher(_) => (true, None),
    };
    let specified = began.elapsed();
    let reaper = launch.reaper.clone();
    let containment = launch.containment.clone();
    let tree_plan = plan.clone();
    let spawned = budget
        .blocking(move || {
            if let Some(cwd) = check_cwd {
                directory_check(&cwd)?;
            }
            let mut spec = match how {
                How::Spawn(spec) => *spec,
                How::Launcher(start) => {
                    let (child_ends, pipes) = super::spawn::stdio_pipes(start.pipe_stdin)?;
                    // The launcher's PID 1 joined its cgroups ahead (or joins new ones now).
                    if let Some((started, tree)) = start.launchers.start(
                        &start.session_id,
                        &start.policy,
                        &start.command,
                        child_ends,
                        &containment,
                        &tree_plan,
                    )? {
                        return match super::spawn::launched(started, pipes) {
                            Ok(spawned) => Ok((spawned, true, tree, None)),
                            Err(error) => {
                                tree.discard();
                                Err(error.into())
                            }
                        };
                    }
                    start.one_shot()?
                }
            };
            // The tree's cgroups exist before the child does; it joins them before it execs.
            let tree = containment.create_tree(&tree_plan)?;
            let spawned = tree
                .child_cgroups()
                .map_err(ProcessError::from)
                .and_then(|cgroups| {
                    spec.cgroups = cgroups;
                    spawn(&spec, reaper.as_deref()).map_err(ProcessError::from)
                });
            // The child holds its end now; the server's is served once the process exists.
            spec.ask = None;
            let ask = spec.ask_server.take();
            match spawned {
                Ok(spawned) => Ok((spawned, false, tree, ask)),
                Err(error) => {
                    let _ = tree.remove();
                    Err(error)
                }
            }
        })
        .await
        .map_err(ProcessError::from)
        .and_then(|spawned| spawned);
    let (spawned, launched, tree, ask) = spawned?;
    let tree = Arc::new(tree);
    tracing::debug!(
        resolve_us = resolved.as_micros(),
        spec_us = (specified - resolved).as_micros(),
        spawn_us = (began.elapsed() - specified).as_micros(),
        sandboxed,
        launched,
        "process start phases"
    );
    // Without a cgroup the guardian kills the leader's group through its pidfd.
    let registered = !tree.tracked();
    if registered {
        launch
            .guardian
            .register(spawned.pid, spawned.leader.pidfd());
    }
    let (stdin, pty_master, pump_io) = match spawned.io {
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let stdin = match stdin {
                Some(pipe) => Stdin::Pipe(pipe),
                None => Stdin::Unavailable("the process was started without pipeStdin (or tty)"),
            };
            (stdin, None, PumpIo::Pipes(stdout, stderr))
        }
        ChildIo::Pty(master) => {
            let master = Arc::new(master);
            (
                Stdin::Pty(master.clone()),
                Some(master.clone()),
                PumpIo::Pty(master),
            )
        }
    };
    let process = Arc::new(ManagedProcess::new(
        params.process_id.clone(),
        spawned.leader.clone(),
        spawned.pid,
        tree,
        stdin,
        pty_master,
        session.processes.retention().clone(),
    ));
    process.hold_charges(charges);
    process.record_start(StartFacts {
        sandboxed,
        limits: (plan.applied != Default::default()).then(|| plan.applied.clone()),
    });
    launch.metrics.process_started();
    tracing::info!(
        session_id = %session.id,
        process_id = %LogField(&process.id),
        pid = process.pid,
        sandboxed,
        launched,
        tty = params.tty,
        "process started"
    );
    if audit {
        process.mark_audited();
    }
    reservation.fill(process.clone());
    if let Some(wall) = plan.wall {
        // A sandboxed command's own sandbox-run ends it first, draining its terminal.
        // A launched one has no sandbox-run of its own: the server's watch is the deadline.
        let backstop = if sandboxed && !launched {
            WALL_BACKSTOP_GRACE
        } else {
            Duration::ZERO
        };
        watch::watch_wall_clock(process.clone(), wall + backstop);
    }
    if let Some(budget) = plan.cpu_budget {
        watch::watch_cpu_budget(process.clone(), budget);
    }
    let context = PumpContext {
        sink: session.attachment.clone(),
        table: Arc::downgrade(&session.processes),
        guardian: registered.then(|| launch.guardian.clone()),
        reaper: launch.reaper.clone(),
        cpu_limit: plan.rlimits.cpu_seconds.map(Duration::from_secs),
        wall_limit: plan.wall,
        metrics: launch.metrics.clone(),
        session_id: session.id.clone(),
    };
    if let Some(ask) = ask
        && ask.set_nonblocking(true).is_ok()
        && let Ok(ask) = tokio::net::UnixStream::from_std(ask)
    {
        tokio::spawn(super::approve::serve(
            ask,
            process.id.clone(),
            session.attachment.clone(),
        ));
    }
    pump::start(process, spawned.leader, pump_io, spawned.audit, context);
    let applied = plan.applied;
    Ok(StartResult {
        process_id: params.process_id,
        limits: (applied != Default::default()).then_some(applied),
    })
}

/// `process/list`: the session's started processes, oldest first. Reads the running ones'
/// cgroup files: call it on the blocking pool.
pub fn list(table: &super::ProcessTable) -> ListResult {
    let mut processes: Vec<_> = table.all().iter().map(|process| process.info()).collect();
    processes
        .sort_by(|a, b| (a.started_at_ms, &a.process_id).cmp(&(b.started_at_ms, &b.process_id)));
    ListResult::new(processes)
}

/// `process/read`. Once there is something to return (or the wait is over), `reserve` is asked
/// for the memory of the answer, before it is built.
///
/// # Errors
/// [`ProcessError::NotFound`]; [`ProcessError::Budget`] when the answer's memory is refused.
pub async fn read(
    session: &Session,
    params: ReadParams,
    reserve: impl FnOnce(usize) -> Result<(), BudgetError>,
) -> Result<ReadResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let max_bytes = params
        .max_bytes
        .unwrap_or(MAX_READ_BYTES)
        .min(MAX_READ_BYTES);
    let wait = Duration::from_millis(params.wait_ms.unwrap_or(0).min(MAX_WAIT_MS));
    let after_seq = params.after_seq.unwrap_or(0);
    let after_denial = params.after_denial.unwrap_or(0);
    process.wait_for_events(after_seq, wait).await;
    // What the answer can hold: output up to maxBytes (one chunk more may arrive meanwhile,
    // and one chunk is returned even past maxBytes) and denial records, as base64 or JSON,
    // built once as a value and once as text.
    let data = max_bytes
        .min(process.log().bytes_after(after_seq) + process.denial_bytes_after(after_denial))
        + 2 * OUTPUT_READ_CHUNK_BYTES as u64;
    reserve(2 * usize::try_from(data.div_ceil(3) * 4).unwrap_or(usize::MAX))?;
    let read = process.log().read(after_seq, max_bytes);
    let chunk_bytes: u64 = read
        .chunks
        .iter()
        .map(|chunk| chunk.data.len() as u64)
        .sum();
    let denials = process.denials_after(
        after_denial,
        max_bytes.saturating_sub(chunk_bytes),
        read.chunks.is_empty(),
    );
    let audited = process.audited();
    Ok(ReadResult {
        chunks: read
            .chunks
            .into_iter()
            .map(|chunk| OutputChunk {
                seq: chunk.seq,
                stream: chunk.stream,
                chunk: base64_simd::STANDARD.encode_to_string(&chunk.data),
            })
            .collect(),
        next_seq: read.next_seq,
        exited: read.exit.is_some(),
        exit_code: read.exit.map(|exit| exit.code),
        signal: read.exit.and_then(|exit| exit.signal),
        exit_reason: read.exit.and_then(|exit| exit.reason),
        exit_seq: read.exit.map(|exit| exit.seq),
        exit_usage: read.exit.and_then(|_| process.usage()),
        closed: read.closed_seq.is_some(),
        closed_seq: read.closed_seq,
        failure: None,
        output_dropped: read.dropped.is_some(),
        first_retained_seq: read.dropped,
        output_dropped_chunks: read.dropped_total.0,
        output_dropped_bytes: read.dropped_total.1,
        denials: denials.records,
        denials_dropped: denials.dropped,
        next_denial: audited.then_some(denials.next),
    })
}

/// `process/write`: the state of the process is a status (`unknownProcess`, `starting`,
/// `stdinClosed`, `accepted`), never an error.
///
/// # Errors
/// Invalid base64 only.
pub async fn write(
    session: &Session,
    budget: &ConnectionBudget,
    params: WriteParams,
) -> Result<WriteResult, ProcessError> {
    if let Some(write_id) = &params.write_id
        && write_id.len() > MAX_WRITE_ID_BYTES
    {
        return Err(ProcessError::TooLong {
            field: "writeId".into(),
            length: write_id.len(),
            limit: MAX_WRITE_ID_BYTES,
            limit_name: "MAX_WRITE_ID_BYTES",
        });
    }
    let decode = |chunk: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(chunk.as_bytes())
            .map_err(ProcessError::InvalidBase64)
    };
    // Decoding megabytes takes milliseconds: not on an async worker.
    let data = if params.chunk.len() > LARGE_CHUNK_BYTES {
        let chunk = params.chunk;
        let (data, chunk) = budget.cpu(move || (decode(&chunk), chunk)).await?;
        crate::cpu_pool::free_off_runtime(chunk);
        data?
    } else {
        decode(&params.chunk)?
    };
    let status = match session.processes.lookup(&params.process_id) {
        Lookup::Missing => WriteStatus::UnknownProcess,
        Lookup::Starting => WriteStatus::Starting,
        Lookup::Ready(process) => {
            process
                .write(&data, params.write_id.as_deref(), params.close)
                .await
        }
    };
    Ok(WriteResult { status })
}

/// `process/write` chunks larger than this (base64) are decoded on the blocking pool.
const LARGE_CHUNK_BYTES: usize = 256 * 1024;

/// `process/signal`.
///
/// # Errors
/// [`ProcessError::NotFound`].
pub fn signal(session: &Session, params: SignalParams) -> Result<RunningResult, ProcessError> {
    let process = session.processes.get(&params.process_id)?;
    let signal = match params.signal {
        SignalName::Interrupt => Signal::SIGINT,
        SignalName::Terminate => Signal::SIGTERM,
        SignalName::Kill => Signal::SIGKILL,
        SignalName::Hangup => Signal::SIGHUP,
    };
    Ok(RunningResult {
        running: process.signal(signal),
    })
}

/// `process/resize`.
///
/// # Errors
/// Unknown process, not a PTY, resize failure.
pub fn resize(session: &Session, params: ResizeParams) -> Result<(), ProcessError> {
    if params.cols == 0 || params.rows == 0 {
        return Err(ProcessError::ZeroTerminalSize {
            cols: params.cols,
            rows: params.rows,
        });
    }
    session
        .processes
        .get(&params.process_id)?
        .resize(params.cols, params.rows)
}

/// `process/terminate`: `{running: false}` for unknown or exited processes (an exited process's
/// leftover tree is killed all the same).
pub fn terminate(session: &Session, params: TerminateParams) -> RunningResult {
    let running = session
        .processes
        .get(&params.process_id)
        .is_ok_and(|process| process.terminate());
    RunningResult { running }
}

/// How a start's process is made.
enum How {
    /// Spawned by the server (unsandboxed, or through a `sandbox-run` of its own).
    Spawn(Box<SpawnSpec>),
    /// Through the session's launcher (boxed: the policy it carries is large).
    Launcher(Box<LauncherStart>),
}

/// A start for the session's launcher, with what its one-shot fallback needs.
struct LauncherStart {
    launchers: Arc<super::launcher::Launchers>,
    sandboxing: Arc<Sandboxing>,
    session_id: String,
    policy: sandbox::ResolvedPolicy,
    command: sandbox::linux::launcher::StartCommand,
    pipe_stdin: bool,
}

impl LauncherStart {
    /// No launcher took it (bounds reached, unsupported here, other limits than the
    /// defaults): a `sandbox-run` of its own.
    fn one_shot(self) -> Result<SpawnSpec, ProcessError> {
        let command = self.command;
        sandboxed_spec(
            &self.sandboxing,
            self.policy,
            command.argv,
            command.env.into_iter().collect(),
            command.cwd,
            None,
            self.pipe_stdin,
            false,
            command.limits,
        )
    }
}

/// Resolves the request's `sandbox` once, off the runtime (globs walk the filesystem), with the
/// server's protections, and the command's working directory under it (canonical; refused when
/// a symlink an earlier command could have planted is on its way); `None` when nothing is
/// restricted. What the policy lets the command write is recorded before it starts.
async fn resolve_sandbox(
    launch: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    sandbox: Option<serde_json::Value>,
    cwd: &std::path::Path,
) -> Result<Option<(sandbox::ResolvedPolicy, std::path::PathBuf)>, ProcessError> {
    if sandbox.as_ref().is_none_or(serde_json::Value::is_null) {
        return Ok(None);
    }
    let sandboxing = launch.sandboxing.clone();
    let cwd = cwd.to_owned();
    budget
        .cpu(move || {
            directory_check(&cwd)?;
            let Some(policy) = sandboxing.resolve(sandbox.as_ref())? else {
                return Ok(None);
            };
            sandboxing
                .refuse_planted_cwd(&policy, &cwd)
                .map_err(|source| ProcessError::CwdRefused {
                    path: cwd.clone(),
                    source,
                })?;
            let cwd =
                std::fs::canonicalize(&cwd).map_err(|_| ProcessError::CwdMissing { path: cwd })?;
            if cwd.to_str().is_none() {
                return Err(ProcessError::CwdNotUtf8 { path: cwd });
            }
            // A cwd carried writable into the private /tmp is a host directory the command
            // writes: a writable root, recorded with the rest.
            let policy = policy.with_working_directory(&cwd);
            sandboxing.record_started(&policy);
            Ok(Some((policy, cwd)))
        })
        .await?
}

/// The cwd of an unsandboxed spawn, still to be checked (a sandboxed one was checked when its
/// policy was resolved).
fn policy_free_cwd(spec: &SpawnSpec) -> Option<std::path::PathBuf> {
    spec.launch.is_none().then(|| spec.cwd.clone())
}

/// `cwd` exists and is a directory.
fn directory_check(cwd: &std::path::Path) -> Result<(), ProcessError> {
    match std::fs::metadata(cwd) {
        Err(_) => Err(ProcessError::CwdMissing {
            path: cwd.to_owned(),
        }),
        Ok(metadata) if !metadata.is_dir() => Err(ProcessError::CwdNotDirectory {
            path: cwd.to_owned(),
        }),
        Ok(_) => Ok(()),
    }
}

/// The spawn of a sandboxed command: `sandbox-run` (from the server's own descriptor) with an
/// empty environment, reading the resolved policy and the command, environment included, from
/// the launch request on descriptor [`super::spawn::LAUNCH_FD`]; nothing of the request reaches
/// `sandbox-run` before it is confined.
#[allow(clippy::too_many_arguments)]
fn sandboxed_spec(
    sandboxing: &Sandboxing,
    policy: sandbox::ResolvedPolicy,
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    cwd: std::path::PathBuf,
    pty: Option<(u16, u16)>,
    pipe_stdin: bool,
    audit: bool,
    limits: sandbox::limits::CommandLimits,
) -> Result<SpawnSpec, ProcessError> {
    let asks = policy.egress().is_some_and(|rules| rules.ask);
    let request = sandbox::launch::LaunchRequest {
        policy,
        argv,
        env: env.into_iter().collect(),
        cwd: cwd.clone(),
        best_effort: false,
        limits,
    };
    let launch = request.to_memfd().map_err(|e| {
        ProcessError::Spawn(super::spawn::SpawnError::Setup {
            what: "launch request",
            source: std::io::Error::other(e.to_string()),
        })
    })?;
    let runner = sandboxing.sandbox_run.exec_path().display().to_string();
    let mut wrapped = vec![
        runner,
        "--launch-fd".to_owned(),
        super::spawn::LAUNCH_FD.to_string(),
    ];
    if audit {
        wrapped.extend(["--audit-fd".to_owned(), super::spawn::AUDIT_FD.to_string()]);
    }
    // An allowlist that asks: sandbox-run asks the server on a socket of their own
    // (`egress/approve`, [`super::approve`]).
    let (ask, ask_server) = if asks {
        let (server, child) = std::os::unix::net::UnixStream::pair().map_err(|source| {
            ProcessError::Spawn(super::spawn::SpawnError::Setup {
                what: "egress question socket",
                source,
            })
        })?;
        wrapped.extend(["--ask-fd".to_owned(), super::spawn::ASK_FD.to_string()]);
        (Some(std::os::fd::OwnedFd::from(child)), Some(server))
    } else {
        (None, None)
    };
    Ok(SpawnSpec {
        argv: wrapped,
        arg0: Some("sandbox-run".to_owned()),
        cwd,
        env: std::collections::BTreeMap::new(),
        pty,
        pipe_stdin,
        audit_pipe: audit,
        launch: Some(launch),
        ask,
        ask_server,
        cgroups: ChildCgroupFds::default(),
        // The command's rlimits are set by sandbox-run right before it execs the command, not
        // on sandbox-run itself (its terminal relay must not run out of CPU time).
        rlimits: sandbox::limits::CommandLimits::default(),
    })
}
