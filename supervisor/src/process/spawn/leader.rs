//! The child's pidfd: waiting for its exit (reaping our child, or reading a launched PID 1's
//! status pipe) and signalling its group.

use super::*;

/// The child's pidfd, shared by its pump (which waits for the exit and reaps) and its
/// `process/*` handlers (which signal its group). No SIGCHLD handling, no polling, and no signal
/// by a bare pid once the child is reaped.
pub struct Leader {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    /// Set (under the lock) when the child is reaped: from then on its pid may be recycled.
    reaped: Mutex<bool>,
    /// Started by a launcher (the PID 1 of a sandboxed command): not our child.
    launched: Option<LaunchedLeader>,
}

/// What a launched leader has instead of being our child.
struct LaunchedLeader {
    /// PID 1's status pipe (non-blocking): the command's status, written once the command and
    /// everything it left in its namespace are gone.
    status: AsyncFd<OwnedFd>,
    /// Keeps the launcher (its commands die with it).
    _lease: crate::process::launcher::Lease,
}

impl Leader {
    /// Wait for the exit and reap the child; a signal `n` gives code `128 + n`.
    pub async fn wait(&self) -> ChildExit {
        let failed = ChildExit {
            code: -1,
            signal: None,
            cpu: std::time::Duration::ZERO,
            max_rss_bytes: None,
        };
        if let Some(launched) = &self.launched {
            return self.wait_launched(launched).await;
        }
        loop {
            let Ok(mut guard) = self.pidfd.readable().await else {
                return failed;
            };
            let mut reaped = self.reaped.lock().unwrap_or_else(|p| p.into_inner());
            match sys::reap_pidfd(self.pidfd.get_ref()) {
                Ok(Some(exit)) => {
                    *reaped = true;
                    return exit;
                }
                Ok(None) => guard.clear_ready(),
                Err(error) if error.raw_os_error() == Some(libc::EINTR) => {}
                Err(_) => {
                    *reaped = true;
                    return failed;
                }
            }
        }
    }

    /// The exit of a launched command: its status, as soon as PID 1 writes it (PID 1 has killed
    /// and reaped everything else in the namespace by then, and holds none of the command's
    /// stdio; its own exit, the teardown of its address space, is off the start's path). A
    /// pipe that closes without a status means PID 1 was killed: the exit is reported once
    /// PID 1 is gone, and the kernel has ended its namespace with it.
    async fn wait_launched(&self, launched: &LaunchedLeader) -> ChildExit {
        let said = loop {
            let Ok(mut guard) = launched.status.readable().await else {
                break None;
            };
            match launched_status(launched.status.get_ref()) {
                Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(nix::errno::Errno::EINTR) => {}
                Ok(said) => break said,
                Err(_) => break None,
            }
        };
        if said.is_none() {
            // Readable once PID 1 has exited, after the kernel killed its namespace.
            let _ = self.pidfd.readable().await;
        }
        *self.reaped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        said.unwrap_or(ChildExit {
            code: 128 + libc::SIGKILL,
            signal: Some(libc::SIGKILL),
            cpu: std::time::Duration::ZERO,
            max_rss_bytes: None,
        })
    }

    /// Send `signal` to the child's process group; false once the child is reaped. While it
    /// is not, its pid (the group's id: a session leader cannot change groups) is still its
    /// own, so the group cannot be a recycled one.
    pub fn signal_group(&self, signal: nix::sys::signal::Signal) -> bool {
        let reaped = self.reaped.lock().unwrap_or_else(|p| p.into_inner());
        if *reaped {
            return false;
        }
        if self.launched.is_some() {
            // PID 1 passes the signal on to the command's group; SIGKILL ends the namespace.
            let _ = sys::pidfd_send_signal(self.pidfd.get_ref(), signal as libc::c_int, false);
            return true;
        }
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.pid), signal);
        true
    }

    /// The pidfd (for the guardian).
    pub fn pidfd(&self) -> &OwnedFd {
        self.pidfd.get_ref()
    }
}

pub(super) fn leader(pid: libc::pid_t) -> Result<Arc<Leader>, SpawnError> {
    let pidfd = sys::pidfd_open(pid).map_err(setup("exit watch"))?;
    let pidfd = sys::register_async_fd(pidfd).map_err(setup("exit watch"))?;
    Ok(Arc::new(Leader {
        pid,
        pidfd,
        reaped: Mutex::new(false),
        launched: None,
    }))
}

/// The exit a launched PID 1 reported (`Ok(None)`: the pipe closed without one, PID 1 was
/// killed before it could say); `EAGAIN` while nothing has arrived yet.
fn launched_status(status: &OwnedFd) -> nix::Result<Option<ChildExit>> {
    let mut message = [0u8; sandbox::linux::launcher::STATUS_BYTES];
    // PID 1 writes the message with one write(2), smaller than PIPE_BUF: it arrives whole.
    let read = nix::unistd::read(status, &mut message)?;
    Ok(
        match sandbox::linux::launcher::decode_status(&message[..read]) {
            Some((sandbox::linux::command::Ended::Exited(code), cpu)) => Some(ChildExit {
                code,
                signal: None,
                cpu,
                max_rss_bytes: None,
            }),
            Some((sandbox::linux::command::Ended::Signaled(signal), cpu)) => Some(ChildExit {
                code: 128 + signal,
                signal: Some(signal),
                cpu,
                max_rss_bytes: None,
            }),
            None => None,
        },
    )
}

/// A sandboxed command a launcher started, with the server's ends of its pipes.
///
/// # Errors
/// [`SpawnError::Setup`] when its pidfd cannot be watched or a pipe registered.
pub fn launched(
    started: crate::process::launcher::Launched,
    pipes: ServerPipes,
) -> Result<Spawned, SpawnError> {
    let pid = started.pid;
    let pidfd = sys::register_async_fd(started.pidfd).map_err(setup("exit watch"))?;
    let leader = Arc::new(Leader {
        pid,
        pidfd,
        reaped: Mutex::new(false),
        launched: Some(LaunchedLeader {
            status: status_watch(started.status)?,
            _lease: started.lease,
        }),
    });
    Ok(Spawned {
        pid,
        leader,
        io: pipes.into_io()?,
        audit: None,
    })
}

/// PID 1's status pipe, non-blocking and registered with the runtime.
fn status_watch(status: OwnedFd) -> Result<AsyncFd<OwnedFd>, SpawnError> {
    nix::fcntl::fcntl(&status, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
        .map_err(|error| setup("exit watch")(error.into()))?;
    sys::register_async_fd(status).map_err(setup("exit watch"))
}
