//! Stage 2 of `process/start`: what will run and how. The limits become a containment plan, the
//! environment is built, the request's `sandbox` is resolved (off the runtime), and the launch
//! decision is made here and only here ([`How`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proto::methods::process::StartParams;

use super::LaunchContext;
use crate::budget::ConnectionBudget;
use crate::containment::ChildCgroupFds;
use crate::containment::plan::Plan;
use crate::limits::{DEFAULT_PTY_COLS, DEFAULT_PTY_ROWS};
use crate::process::spawn::{ASK_FD, AUDIT_FD, LAUNCH_FD, SpawnError, SpawnSpec};
use crate::process::{ProcessError, UnsupportedFeature, bounds, env_policy};
use crate::sandboxing::Sandboxing;
use crate::session::Session;

/// A start decided: how its process is made, under which limits.
pub struct Planned {
    /// How the process is made.
    pub how: How,
    /// Its limits, as this host enforces them.
    pub limits: Plan,
    /// Whether it runs in a sandbox.
    pub sandboxed: bool,
    /// How long resolving the sandbox took (for the start's phase log).
    pub resolved: Duration,
    /// What the last stage needs of the request.
    pub adopting: Adopting,
}

/// What adopting a process needs of its request.
pub struct Adopting {
    /// Its id.
    pub process_id: String,
    /// Whether it has a terminal.
    pub tty: bool,
    /// Whether its sandbox's denials are audited.
    pub audit: bool,
    /// Whether it runs in a sandbox.
    pub sandboxed: bool,
}

/// How a start's process is made.
pub enum How {
    /// Spawned by the server (unsandboxed, or through a `sandbox-run` of its own).
    Spawn(Box<SpawnSpec>),
    /// Through the session's launcher (boxed: the policy it carries is large).
    Launcher(Box<LauncherStart>),
}

/// A start for the session's launcher, with what its one-shot fallback needs.
pub struct LauncherStart {
    /// The server's launchers.
    pub launchers: Arc<crate::process::launcher::Launchers>,
    sandboxing: Arc<Sandboxing>,
    /// The session whose launcher serves the start.
    pub session_id: String,
    /// The resolved policy (a launcher serves one).
    pub policy: sandbox::ResolvedPolicy,
    /// The command as the launcher receives it.
    pub command: sandbox::linux::launcher::StartCommand,
    /// Whether the command's stdin is a pipe.
    pub pipe_stdin: bool,
}

impl LauncherStart {
    /// No launcher took it (bounds reached, unsupported here, other limits than the
    /// defaults): a `sandbox-run` of its own.
    ///
    /// # Errors
    /// The launch request cannot be written.
    pub fn one_shot(self) -> Result<SpawnSpec, ProcessError> {
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

/// Plan the start of `params` in `session`.
///
/// # Errors
/// Limits this host cannot enforce, a program not found on `PATH`, a sandbox that does not
/// resolve, a working directory missing or planted, and the combinations refused
/// (`arg0` or an open network with a sandbox asked to be managed, the audit without a sandbox).
pub async fn plan(
    session: &Session,
    context: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    params: StartParams,
) -> Result<Planned, ProcessError> {
    let cwd = params.cwd.as_path().to_path_buf();
    let mut limits = context.containment.plan(params.limits.as_ref())?;
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
    let policy = resolve_sandbox(context, budget, params.sandbox, &cwd).await?;
    let resolved = began.elapsed();
    if params.enforce_managed_network && policy.as_ref().is_none_or(|(p, _)| p.network_fully_on()) {
        // A managed proxy is what was asked for; running with the network open would give more.
        return Err(ProcessError::Unsupported {
            feature: UnsupportedFeature::EnforceManagedNetworkWithOpenNetwork,
        });
    }
    if policy.is_some() {
        // Its default share of the host's tasks.
        limits.for_sandbox(
            context.containment.caps(),
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
                && !limits.rlimits.pools.set_at_setup()
                && context.launchers.eligible(&policy, pty.is_some(), audit) =>
        {
            How::Launcher(Box::new(LauncherStart {
                launchers: context.launchers.clone(),
                sandboxing: context.sandboxing.clone(),
                session_id: session.id.clone(),
                policy,
                command: sandbox::linux::launcher::StartCommand {
                    argv: params.argv,
                    env: env.into_iter().collect(),
                    cwd,
                    limits: limits.rlimits.clone(),
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
                limits.without_sandbox()?;
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
                    rlimits: limits.rlimits.clone(),
                }
            }
            Some(_) if params.arg0.is_some() => {
                return Err(ProcessError::Arg0WithSandbox {
                    arg0: params.arg0.unwrap_or_default(),
                });
            }
            Some((policy, cwd)) => sandboxed_spec(
                context.sandboxing,
                policy,
                params.argv,
                env,
                cwd,
                pty,
                params.pipe_stdin,
                audit,
                limits.rlimits.clone(),
            )?,
        })),
    };
    let sandboxed = match &how {
        How::Spawn(spec) => spec.launch.is_some(),
        How::Launcher(_) => true,
    };
    Ok(Planned {
        how,
        limits,
        sandboxed,
        resolved,
        adopting: Adopting {
            process_id: params.process_id,
            tty: params.tty,
            audit,
            sandboxed,
        },
    })
}

/// Resolves the request's `sandbox` once, off the runtime (globs walk the filesystem), with the
/// server's protections, and the command's working directory under it (canonical; refused when
/// a symlink an earlier command could have planted is on its way); `None` when nothing is
/// restricted. What the policy lets the command write is recorded before it starts.
async fn resolve_sandbox(
    context: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    sandbox: Option<serde_json::Value>,
    cwd: &Path,
) -> Result<Option<(sandbox::ResolvedPolicy, PathBuf)>, ProcessError> {
    if sandbox.as_ref().is_none_or(serde_json::Value::is_null) {
        return Ok(None);
    }
    let sandboxing = context.sandboxing.clone();
    let cwd = cwd.to_owned();
    // The blocking pool, not the CPU pool: resolution walks paths the client names (see
    // `HelperPool::call_sandboxed`).
    budget
        .blocking(move || {
            let Some(policy) = sandboxing.resolve(sandbox.as_ref())? else {
                directory_check(&cwd)?;
                return Ok(None);
            };
            // Examined only as far as the policy lets the command see (`cwd`).
            let canonical = super::cwd::sandboxed_cwd(&policy, &cwd)?;
            sandboxing
                .refuse_planted_cwd(&policy, &cwd)
                .map_err(|source| ProcessError::CwdRefused {
                    path: cwd.clone(),
                    source,
                })?;
            let cwd = canonical;
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

/// `cwd` exists and is a directory.
///
/// # Errors
/// [`ProcessError::CwdMissing`], [`ProcessError::CwdNotDirectory`].
pub fn directory_check(cwd: &Path) -> Result<(), ProcessError> {
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
/// the launch request on descriptor [`LAUNCH_FD`]; nothing of the request reaches `sandbox-run`
/// before it is confined.
#[allow(clippy::too_many_arguments)]
fn sandboxed_spec(
    sandboxing: &Sandboxing,
    policy: sandbox::ResolvedPolicy,
    argv: Vec<String>,
    env: std::collections::BTreeMap<String, String>,
    cwd: PathBuf,
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
        ProcessError::Spawn(SpawnError::Setup {
            what: "launch request",
            source: std::io::Error::other(e.to_string()),
        })
    })?;
    let runner = sandboxing.sandbox_run.exec_path().display().to_string();
    let mut wrapped = vec![runner, "--launch-fd".to_owned(), LAUNCH_FD.to_string()];
    if audit {
        wrapped.extend(["--audit-fd".to_owned(), AUDIT_FD.to_string()]);
    }
    // An allowlist that asks: sandbox-run asks the server on a socket of their own
    // (`egress/approve`, [`crate::process::approve`]).
    let (ask, ask_server) = if asks {
        let (server, child) = std::os::unix::net::UnixStream::pair().map_err(|source| {
            ProcessError::Spawn(SpawnError::Setup {
                what: "egress question socket",
                source,
            })
        })?;
        wrapped.extend(["--ask-fd".to_owned(), ASK_FD.to_string()]);
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
