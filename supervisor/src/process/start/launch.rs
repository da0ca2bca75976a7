//! Stage 3 of `process/start`: the process made, on the blocking pool. An unsandboxed start's
//! working directory is checked here (a sandboxed one's was, when its policy was resolved); the
//! session's launcher is asked first where the plan chose it, and a start it declines becomes a
//! `sandbox-run` of its own; the process tree's cgroups exist before the child does.

use std::sync::Arc;

use super::LaunchContext;
use super::plan::{How, directory_check};
use crate::budget::ConnectionBudget;
use crate::containment::Tree;
use crate::containment::plan::Plan;
use crate::process::ProcessError;
use crate::process::spawn::{self, Spawned};

/// A started process, not yet the session's.
pub struct Launched {
    /// Its pid, pidfd and I/O.
    pub spawned: Spawned,
    /// Whether the session's launcher started it.
    pub through_launcher: bool,
    /// Its process tree's containment.
    pub tree: Arc<Tree>,
    /// The server's end of its `sandbox-run`'s question socket (an allowlist that asks).
    pub ask_server: Option<std::os::unix::net::UnixStream>,
}

/// Start the process `how` says, contained as `limits` say.
///
/// # Errors
/// A missing or non-directory working directory, cgroups that cannot be made, a spawn or launch
/// that fails; whatever was made for the tree is removed again.
pub async fn launch(
    context: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    how: How,
    limits: &Plan,
) -> Result<Launched, ProcessError> {
    let reaper = context.reaper.clone();
    let containment = context.containment.clone();
    let tree_plan = limits.clone();
    let (spawned, through_launcher, tree, ask_server) = budget
        .blocking(move || {
            let mut spec = match how {
                How::Spawn(spec) => {
                    if spec.launch.is_none() {
                        directory_check(&spec.cwd)?;
                    }
                    *spec
                }
                How::Launcher(start) => {
                    let (child_ends, pipes) = spawn::stdio_pipes(start.pipe_stdin)?;
                    // The launcher's PID 1 joined its cgroups ahead (or joins new ones now).
                    if let Some((started, tree)) = start.launchers.start(
                        &start.session_id,
                        &start.policy,
                        &start.command,
                        child_ends,
                        &containment,
                        &tree_plan,
                    )? {
                        return match spawn::launched(started, pipes) {
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
                    spawn::spawn(&spec, reaper.as_deref()).map_err(ProcessError::from)
                });
            // The child holds its end now; the server's is served once the process exists.
            spec.ask = None;
            let ask_server = spec.ask_server.take();
            match spawned {
                Ok(spawned) => Ok((spawned, false, tree, ask_server)),
                Err(error) => {
                    let _ = tree.remove();
                    Err(error)
                }
            }
        })
        .await
        .map_err(ProcessError::from)
        .and_then(|spawned| spawned)?;
    let tree = Arc::new(tree);
    if !through_launcher && tree.joins_cpu_group_after_start() {
        // Off the start's path: the reply does not wait for the move (see `child_cgroups`).
        let joining = tree.clone();
        crate::containment::cleanup::joining_cpu_group(move || joining.join_cpu_group());
    }
    Ok(Launched {
        spawned,
        through_launcher,
        tree,
        ask_server,
    })
}
