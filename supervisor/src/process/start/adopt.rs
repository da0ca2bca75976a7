//! Stage 4 of `process/start`: the started process becomes the session's. It holds its budget
//! charges for its life, is registered with the guardian where no cgroup tracks it, gets its
//! wall-clock and CPU watches, and its output pump starts; its id, reserved at admission, now
//! names it.

use std::sync::Arc;
use std::time::Duration;

use proto::methods::process::StartResult;

use super::LaunchContext;
use super::admit::Admitted;
use super::launch::Launched;
use super::plan::Adopting;
use crate::containment::plan::Plan;
use crate::limits::WALL_BACKSTOP_GRACE;
use crate::process::managed::{ManagedProcess, StartFacts, Stdin};
use crate::process::pump::{self, PumpContext, PumpIo};
use crate::process::spawn::ChildIo;
use crate::process::watch;
use crate::session::Session;
use crate::untrusted::LogField;

/// Make the `launched` process the session's, and answer the start.
pub fn adopt(
    session: &Session,
    context: &LaunchContext<'_>,
    admitted: Admitted<'_>,
    request: Adopting,
    limits: Plan,
    launched: Launched,
) -> StartResult {
    let Launched {
        spawned,
        through_launcher,
        tree,
        ask_server,
    } = launched;
    let sandboxed = request.sandboxed;
    // Without a cgroup the guardian kills the leader's group through its pidfd.
    let registered = !tree.tracked();
    if registered {
        context
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
        request.process_id.clone(),
        spawned.leader.clone(),
        spawned.pid,
        tree,
        stdin,
        pty_master,
        session.processes.retention().clone(),
    ));
    process.hold_charges(admitted.charges);
    process.record_start(StartFacts {
        sandboxed,
        limits: (limits.applied != Default::default()).then(|| limits.applied.clone()),
    });
    context.metrics.process_started();
    tracing::info!(
        session_id = %session.id,
        process_id = %LogField(&process.id),
        pid = process.pid,
        sandboxed,
        launched = through_launcher,
        tty = request.tty,
        "process started"
    );
    if request.audit {
        process.mark_audited();
    }
    admitted.reservation.fill(process.clone());
    if let Some(wall) = limits.wall {
        // A sandboxed command's own sandbox-run ends it first, draining its terminal.
        // A launched one has no sandbox-run of its own: the server's watch is the deadline.
        let backstop = if sandboxed && !through_launcher {
            WALL_BACKSTOP_GRACE
        } else {
            Duration::ZERO
        };
        watch::watch_wall_clock(process.clone(), wall + backstop);
    }
    if let Some(budget) = limits.cpu_budget {
        watch::watch_cpu_budget(process.clone(), budget);
    }
    let pump_context = PumpContext {
        sink: session.attachment.clone(),
        table: Arc::downgrade(&session.processes),
        guardian: registered.then(|| context.guardian.clone()),
        reaper: context.reaper.clone(),
        cpu_limit: limits.rlimits.cpu_seconds.map(Duration::from_secs),
        wall_limit: limits.wall,
        metrics: context.metrics.clone(),
        session_id: session.id.clone(),
    };
    if let Some(ask) = ask_server
        && ask.set_nonblocking(true).is_ok()
        && let Ok(ask) = tokio::net::UnixStream::from_std(ask)
    {
        tokio::spawn(crate::process::approve::serve(
            ask,
            process.id.clone(),
            session.attachment.clone(),
        ));
    }
    pump::start(
        process,
        spawned.leader,
        pump_io,
        spawned.audit,
        pump_context,
    );
    let applied = limits.applied;
    StartResult {
        process_id: request.process_id,
        limits: (applied != Default::default()).then_some(applied),
    }
}
