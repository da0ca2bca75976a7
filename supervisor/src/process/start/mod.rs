//! `process/start` as a pipeline of named stages, each in its own file, each taking what the one
//! before returned:
//!
//! 1. [`admit`]: field checks, the server's process and descriptor budgets, the id reserved.
//! 2. [`plan`]: the limits as a containment plan, the environment, the sandbox resolved, and the
//!    one launch decision ([`plan::How`]: the session's launcher, a `sandbox-run` of its own, or
//!    a plain spawn).
//! 3. [`launch`]: on the blocking pool, the working directory checked, the process tree's
//!    cgroups made, the process started (a launcher that declines falls back to a one-shot
//!    `sandbox-run`).
//! 4. [`adopt`]: the started process becomes the session's: its charges, its watches (wall
//!    clock, CPU budget) and its output pump.
//!
//! The method layer (`rpc::dispatch`) calls [`start`]; the mechanism it uses (spawn, launcher,
//! containment, pump) lies below, and none of it imports this module.

mod admit;
mod adopt;
mod cwd;
mod launch;
mod plan;

use std::sync::Arc;

use proto::methods::process::{StartParams, StartResult};

use super::ProcessError;
use super::guardian::Guardian;
use crate::budget::{Budgets, ConnectionBudget};
use crate::containment::Containment;
use crate::containment::reaper::Reaper;
use crate::sandboxing::Sandboxing;
use crate::session::Session;

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
    context: &LaunchContext<'_>,
    budget: &ConnectionBudget,
    params: StartParams,
) -> Result<StartResult, ProcessError> {
    let began = std::time::Instant::now();
    let admitted = admit::admit(session, context.budgets, &params)?;
    let planned = plan::plan(session, context, budget, params).await?;
    let specified = began.elapsed();
    let launched = launch::launch(context, budget, planned.how, &planned.limits).await?;
    tracing::debug!(
        resolve_us = planned.resolved.as_micros(),
        spec_us = (specified - planned.resolved).as_micros(),
        spawn_us = (began.elapsed() - specified).as_micros(),
        sandboxed = planned.sandboxed,
        launched = launched.through_launcher,
        "process start phases"
    );
    Ok(adopt::adopt(
        session,
        context,
        admitted,
        planned.adopting,
        planned.limits,
        launched,
    ))
}
