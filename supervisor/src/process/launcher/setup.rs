//! Making a launcher: `sandbox-run --launcher` on a socket pair, its setup exchange, and the
//! tree its first PID 1 joins ahead.

use super::*;

impl Launchers {
    pub(super) fn spawn(
        &self,
        key: &Key,
        policy: &ResolvedPolicy,
        containment: &Containment,
        ahead_plan: &Plan,
    ) -> Result<Arc<Launcher>, Setup> {
        let failed =
            |error: LauncherError, stderr: String| Setup::Failed(LauncherFailure { error, stderr });
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| failed(LauncherError::Socket { source: e.into() }, String::new()))?;
        let timeout = nix::sys::time::TimeVal::new(
            i64::try_from(LAUNCHER_REPLY_TIMEOUT.as_secs()).unwrap_or(10),
            0,
        );
        let _ = nix::sys::socket::setsockopt(
            &ours,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &timeout,
        );
        let _ =
            nix::sys::socket::setsockopt(&ours, nix::sys::socket::sockopt::SendTimeout, &timeout);
        let mut child = Command::new(&self.sandbox_run)
            .arg0("sandbox-run")
            .arg("--launcher")
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| {
                failed(
                    LauncherError::Spawn {
                        binary: self.sandbox_run.clone(),
                        source,
                    },
                    String::new(),
                )
            })?;
        let stderr = StderrTail::collect(child.stderr.take(), LAUNCHER_STDERR_BYTES);
        let launcher = Arc::new(Launcher {
            child: Mutex::new(child),
            socket: Mutex::new(ours),
            stderr,
            live: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            ahead: Mutex::new(None),
        });
        let request = sandbox::launch::LaunchRequest {
            policy: policy.clone(),
            argv: Vec::new(),
            env: Vec::new(),
            cwd: key.cwd.clone(),
            best_effort: false,
            limits: sandbox::limits::CommandLimits::default(),
        };
        let memfd = request
            .to_memfd()
            .map_err(|e| failed(e.into(), String::new()))?;
        // The first PID 1 joins its command's cgroups while it prepares.
        let ahead = ahead_tree(containment, ahead_plan);
        let mut fds = vec![memfd.as_fd()];
        if let Some((_, cgroups)) = &ahead {
            fds.extend(cgroups.iter().map(AsFd::as_fd));
        }
        let answer = {
            let socket = launcher.socket.lock().unwrap_or_else(|p| p.into_inner());
            exchange(socket.as_fd(), b"setup", &fds)
        };
        // Dropping the launcher on failure discards the tree.
        *launcher.ahead.lock().unwrap_or_else(|p| p.into_inner()) = ahead.map(|(tree, _)| tree);
        match answer {
            Ok((Reply::Ready, _)) => Ok(launcher),
            Ok((Reply::Failed { error, kind }, _)) => Err(Setup::Unsupported {
                reason: error,
                kind,
            }),
            Ok((other, _)) => Err(failed(
                LauncherError::Unexpected {
                    answer: format!("{other:?}"),
                },
                launcher.stderr_text(),
            )),
            Err(error) => Err(failed(error, launcher.stderr_text())),
        }
    }
}

/// A new tree for a launcher's next PID 1 to join while it prepares, with its `cgroup.procs`;
/// none when it cannot be made (that PID 1's command then joins its own as it starts).
pub(super) fn ahead_tree(containment: &Containment, plan: &Plan) -> Option<(Tree, Vec<OwnedFd>)> {
    let tree = containment
        .create_tree(plan)
        .map_err(|error| tracing::debug!(%error, "no cgroups ahead for a launcher's PID 1"))
        .ok()?;
    match tree.join_fds() {
        Ok(fds) => Some((tree, fds)),
        Err(error) => {
            tracing::debug!(%error, "no cgroups ahead for a launcher's PID 1");
            let _ = tree.remove();
            None
        }
    }
}

pub(super) enum Setup {
    /// The launcher said why it cannot serve this policy here.
    Unsupported {
        /// Its sentence.
        reason: String,
        /// The stage that failed.
        kind: launcher::FailureKind,
    },
    /// It failed otherwise.
    Failed(LauncherFailure),
}
