//! Starting a child: pipes or a PTY, an exact environment, its own session, no inherited
//! descriptors, death with the server. Exec failures are reported by std's exec-error pipe, so a
//! missing program is an error here, never a process that "started" and exited 127.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::Stdio;

use portable_pty::{MasterPty, PtySize, native_pty_system};
use tokio::io::unix::AsyncFd;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::sys::{duplicate_raw_fd, isolate_child, register_async_fd};
use crate::limits::CHILD_PIPE_BYTES;

/// What to run.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// `argv[0]` override.
    pub arg0: Option<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    /// PTY size, when running under a PTY.
    pub pty: Option<PtySize>,
    /// Keep stdin writable (pipe mode).
    pub pipe_stdin: bool,
}

/// Why a spawn failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Creating the PTY failed.
    #[error("cannot create a pseudo-terminal: {0}")]
    Pty(String),
    /// exec (or the pre-exec setup) failed.
    #[error("cannot start {program:?}: {source}")]
    Exec {
        /// argv[0].
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The PTY master: async I/O on a non-blocking duplicate of its descriptor, plus the
/// portable-pty handle for resizing.
pub struct PtyMaster {
    /// Non-blocking master descriptor.
    pub io: AsyncFd<OwnedFd>,
    /// Resize handle.
    pub control: Box<dyn MasterPty + Send>,
}

/// The child's I/O ends.
pub enum ChildIo {
    /// Pipe mode.
    Pipes {
        /// Stdin, when `pipeStdin` was asked.
        stdin: Option<ChildStdin>,
        /// Stdout.
        stdout: ChildStdout,
        /// Stderr.
        stderr: ChildStderr,
    },
    /// PTY mode.
    Pty(PtyMaster),
}

/// A started child.
pub struct Spawned {
    /// The child handle (waits for exit).
    pub child: Child,
    /// Its pid, which is also its process group id.
    pub pid: i32,
    /// Its I/O.
    pub io: ChildIo,
}

fn command(spec: &SpawnSpec) -> Command {
    let mut command = Command::new(&spec.argv[0]);
    command
        .args(&spec.argv[1..])
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.cwd)
        .kill_on_drop(false);
    if let Some(arg0) = &spec.arg0 {
        command.arg0(arg0);
    }
    command
}

/// Start the child.
///
/// # Errors
/// [`SpawnError`] when the PTY cannot be created or exec fails (missing program, permission).
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, SpawnError> {
    let exec_error = |source| SpawnError::Exec {
        program: spec.argv[0].clone(),
        source,
    };
    match spec.pty {
        None => {
            let mut command = command(spec);
            command
                .stdin(if spec.pipe_stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            isolate_child(&mut command, false);
            let mut child = command.spawn().map_err(exec_error)?;
            let pid = child.id().map_or(-1, |pid| pid as i32);
            let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
                return Err(exec_error(std::io::Error::other("child pipes missing")));
            };
            enlarge_pipe(&stdout);
            enlarge_pipe(&stderr);
            Ok(Spawned {
                pid,
                io: ChildIo::Pipes {
                    stdin: child.stdin.take(),
                    stdout,
                    stderr,
                },
                child,
            })
        }
        Some(size) => {
            let pair = native_pty_system()
                .openpty(size)
                .map_err(|e| SpawnError::Pty(e.to_string()))?;
            let slave_path = pair
                .master
                .tty_name()
                .ok_or_else(|| SpawnError::Pty("PTY has no device name".into()))?;
            let slave = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
                .open(&slave_path)
                .map_err(|e| SpawnError::Pty(format!("opening {}: {e}", slave_path.display())))?;
            let io = master_io(pair.master.as_ref())?;
            let stdio = || {
                slave
                    .try_clone()
                    .map(Stdio::from)
                    .map_err(|e| SpawnError::Pty(e.to_string()))
            };
            let mut command = command(spec);
            command.stdin(stdio()?).stdout(stdio()?).stderr(stdio()?);
            isolate_child(&mut command, true);
            let child = command.spawn().map_err(exec_error)?;
            // Our copies of the slave must go, or the master never sees EOF.
            drop(slave);
            drop(pair.slave);
            let pid = child.id().map_or(-1, |pid| pid as i32);
            Ok(Spawned {
                child,
                pid,
                io: ChildIo::Pty(PtyMaster {
                    io,
                    control: pair.master,
                }),
            })
        }
    }
}

fn master_io(master: &dyn MasterPty) -> Result<AsyncFd<OwnedFd>, SpawnError> {
    let raw = master
        .as_raw_fd()
        .ok_or_else(|| SpawnError::Pty("PTY master has no descriptor".into()))?;
    let owned = duplicate_raw_fd(raw).map_err(|e| SpawnError::Pty(e.to_string()))?;
    set_nonblocking(&owned).map_err(|e| SpawnError::Pty(e.to_string()))?;
    register_async_fd(owned).map_err(|e| SpawnError::Pty(e.to_string()))
}

fn set_nonblocking(fd: &OwnedFd) -> nix::Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(|_| ())
}

fn enlarge_pipe(fd: impl AsFd) {
    // Best effort: a larger pipe means fewer, larger chunks; the default size still works.
    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHILD_PIPE_BYTES));
}
