//! Background threads: one for cleanup that waits on processes: reaping a killed launcher,
//! emptying and removing the cgroups of a tree nobody runs in. Its callers may be async
//! workers, which must not wait for a process to die (a PID 1 takes a moment to tear down its
//! namespaces, and a cgroup removal can wait for the kernel's cgroup mutex); a thread per job
//! would let a burst of retired launchers start a burst of threads. Jobs run one after another,
//! in the order given. A second thread moves new trees into the server's CPU group.

use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};

type Job = Box<dyn FnOnce() + Send>;

/// The cleanup thread's queue; none when the thread could not be started.
static QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();
/// The queue of the thread that moves new process trees into the server's CPU group
/// (`Tree::join_cpu_group`): apart from cleanup, whose jobs can wait seconds for a tree to die.
static CPU_GROUP_QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();

/// Run `job` on the cleanup thread, after the jobs queued before it. Where that thread cannot
/// be started, `job` runs here.
pub fn in_background(job: impl FnOnce() + Send + 'static) {
    run_on(&QUEUE, "cleanup", Box::new(job));
}

/// Run `job` on the CPU-group thread, after the jobs queued before it (each move into a
/// cgroup may wait for an RCU grace period; one thread keeps a burst of starts from starting a
/// burst of threads). Where that thread cannot be started, `job` runs here.
pub fn joining_cpu_group(job: impl FnOnce() + Send + 'static) {
    run_on(&CPU_GROUP_QUEUE, "cpu-group", Box::new(job));
}

fn run_on(queue: &'static OnceLock<Option<Sender<Job>>>, name: &str, job: Job) {
    let queue = queue.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in receiver {
                    // A job that panics must not take the queue down with it.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
        match started {
            Ok(_) => Some(sender),
            Err(error) => {
                tracing::warn!(%error, thread = name, "cannot start a background thread; running its jobs in place");
                None
            }
        }
    });
    let job = match queue {
        Some(sender) => match sender.send(job) {
            Ok(()) => return,
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    job();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_off_the_callers_thread_in_order_and_survive_a_panicking_one() {
        let caller = std::thread::current().id();
        let (sender, receiver) = mpsc::channel();
        let first = sender.clone();
        in_background(move || {
            let _ = first.send((1, std::thread::current().id()));
        });
        in_background(|| panic!("a failing cleanup job"));
        in_background(move || {
            let _ = sender.send((2, std::thread::current().id()));
        });
        let timeout = std::time::Duration::from_secs(10);
        let runs = [
            receiver.recv_timeout(timeout),
            receiver.recv_timeout(timeout),
        ];
        let [Ok((1, first)), Ok((2, second))] = runs else {
            panic!("jobs did not run in order: {runs:?}");
        };
        assert_ne!(first, caller, "the first job ran on the caller's thread");
        assert_eq!(first, second, "jobs ran on different threads");
    }
}
