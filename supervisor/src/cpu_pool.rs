//! A few low-priority threads for the CPU-bound part of requests: parsing and serializing large
//! messages, decoding large base64 payloads. Nothing that touches the filesystem: a path on a
//! slow or hung filesystem would hold one of these few threads, and every connection's large
//! messages with it (sandbox resolution and fs calls run on the blocking pool, within the
//! connection's slots).
//!
//! The async workers must stay responsive whatever one client asks for. Moving work off them is
//! half of it; the other half is that the work, once moved, must not take the CPU from them:
//! these threads run at nice [`CPU_POOL_NICE`], so when the machine is busy the kernel runs the
//! workers first. There are as many threads as cores (at most [`MAX_CPU_POOL_THREADS`]), so
//! CPU-bound requests beyond that wait in a queue instead of multiplying threads.
//!
//! Never run anything here that starts a process: children inherit the thread's priority, nor
//! free large buffers here: hand them back to be freed with [`free_off_runtime`].

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// Most threads the pool runs, whatever the core count; the nice value of its threads (both
/// defined with the other limits).
pub use crate::limits::{CPU_POOL_NICE, MAX_CPU_POOL_THREADS};

type Job = Box<dyn FnOnce() + Send>;

/// Why a job did not run to completion.
#[derive(Debug, thiserror::Error)]
pub enum CpuPoolError {
    /// The pool's threads are gone (shutdown).
    #[error("the CPU pool is shut down")]
    Closed,
    /// The job panicked (a bug).
    #[error("a CPU pool job panicked")]
    Panicked,
}

/// The pool.
#[derive(Debug)]
pub struct CpuPool {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl CpuPool {
    /// A pool of one thread per core, at most [`MAX_CPU_POOL_THREADS`].
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_threads(cores.clamp(1, MAX_CPU_POOL_THREADS))
    }

    /// A pool of `threads` threads.
    pub fn with_threads(threads: usize) -> Self {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("cpu-pool-{index}"))
                .spawn(move || {
                    if let Err(error) = crate::sys::lower_current_thread_priority(CPU_POOL_NICE) {
                        tracing::debug!(%error, "cannot lower the CPU pool's priority");
                    }
                    loop {
                        let job = {
                            let receiver = receiver.lock().unwrap_or_else(|p| p.into_inner());
                            receiver.recv()
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(error) = spawned {
                tracing::warn!(%error, "cannot start a CPU pool thread");
            }
        }
        Self {
            jobs: Mutex::new(sender),
        }
    }

    /// Run `work` on the pool and wait for its result.
    ///
    /// # Errors
    /// [`CpuPoolError`] when the pool is gone or `work` panicked.
    pub async fn run<F, R>(&self, work: F) -> Result<R, CpuPoolError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            let _ = sender.send(result);
        });
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| CpuPoolError::Closed)?;
        match receiver.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(_)) => Err(CpuPoolError::Panicked),
            Err(_) => Err(CpuPoolError::Closed),
        }
    }
}

/// Free `value` (a large buffer) on tokio's blocking pool, at the server's own priority, and
/// give the memory back to the system (`sys::release_free_memory`): not on an async
/// worker (that takes milliseconds) and not on a [`CpuPool`] thread, where the kernel's lock on
/// the address space would be held by a low-priority thread that the host's other work can
/// keep off the CPU while every server thread waits for that lock.
pub fn free_off_runtime<T: Send + 'static>(value: T) {
    drop(tokio::task::spawn_blocking(move || {
        drop(value);
        crate::sys::release_free_memory();
    }));
}

impl Default for CpuPool {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_lower_priority_threads_and_panics_are_contained() {
        let pool = CpuPool::with_threads(2);
        let nice = pool
            .run(|| {
                // The calling thread's nice value: field 19 of its stat line, counted after the
                // command name (which may hold spaces) as field 3.
                let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
                let after_name = &stat[stat.rfind(')').unwrap() + 1..];
                after_name
                    .split_whitespace()
                    .nth(19 - 3)
                    .unwrap()
                    .parse::<i32>()
                    .unwrap()
            })
            .await
            .unwrap();
        assert_eq!(nice, CPU_POOL_NICE);
        assert!(matches!(
            pool.run(|| panic!("a bug")).await,
            Err(CpuPoolError::Panicked)
        ));
        assert_eq!(pool.run(|| 2 + 2).await.unwrap(), 4);
    }
}
