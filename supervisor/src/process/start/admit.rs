//! Stage 1 of `process/start`: what is refused before any work. The fields are checked, the
//! server's process and descriptor budgets taken, and the process id reserved in the session
//! (a second start with the same id is refused from here on).

use proto::methods::process::StartParams;

use crate::budget::Budgets;
use crate::process::managed::ProcessCharges;
use crate::process::{ProcessError, Reservation, bounds};
use crate::session::Session;

/// A start that may go ahead: its budget charges and its reserved id.
pub struct Admitted<'a> {
    /// The live-process and descriptor charges the process holds for its life.
    pub charges: ProcessCharges,
    /// Its id in the session's table, filled once it runs.
    pub reservation: Reservation<'a>,
}

/// Admit `params` into `session`.
///
/// # Errors
/// An empty argv, a field over its bound, a budget with no room, an id in use.
pub fn admit<'a>(
    session: &'a Session,
    budgets: &Budgets,
    params: &StartParams,
) -> Result<Admitted<'a>, ProcessError> {
    if params.argv.is_empty() {
        return Err(ProcessError::EmptyArgv);
    }
    bounds::check_start(params)?;
    let charges = ProcessCharges {
        live: budgets.process()?,
        descriptors: budgets.descriptors(bounds::descriptors_of(params))?,
    };
    let reservation = session.processes.reserve(&params.process_id)?;
    Ok(Admitted {
        charges,
        reservation,
    })
}
