//! Starting a child with `posix_spawn`: its own session (`setsid`), an exact environment, stdio
//! on pipes or a PTY, nothing else inherited. `posix_spawn` avoids forking the whole server (the
//! spawn round trip is ~0.3 ms shorter than fork+exec) and glibc reports exec failures, so a
//! missing program is an error here, never a process that "started" and exited 127.
//!
//! Every descriptor the server holds is close-on-exec (see
//! [`sys::prepare_server_descriptors`]); the child's stdio is placed with `dup2` file actions. A
//! PTY slave is opened by path in the child after `setsid`, which makes it the controlling
//! terminal. Dying with the server is the guardian's job (`exec-guardian`).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::sys::{self, FileAction};

/// Where the program is searched when the child's environment has no `PATH` (as execvp does).
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What to run.
#[derive(Debug)]
pub struct SpawnSpec {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// `argv[0]` override.
    pub arg0: Option<String>,
    /// Working directory.
    pub cwd: PathBuf,
    /// The complete environment.
    pub env: BTreeMap<String, String>,
    /// PTY size (cols, rows), when running under a PTY.
    pub pty: Option<(u16, u16)>,
    /// Keep stdin writable (pipe mode).
    pub pipe_stdin: bool,
    /// Give the child a pipe as descriptor [`AUDIT_FD`] (`sandbox-run --audit-fd` writes denial
    /// records to it) and return its read end.
    pub audit_pipe: bool,
    /// A launch request for `sandbox-run`, given to the child as descriptor [`LAUNCH_FD`].
    pub launch: Option<OwnedFd>,
}

/// Why a spawn failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An argument or variable holds a NUL byte.
    #[error("{0} contains a NUL byte, which cannot be passed to a program")]
    Nul(&'static str),
    /// The program was not found.
    #[error(
        "program {} not found (searched PATH={})",
        crate::untrusted::Untrusted(program),
        crate::untrusted::Untrusted(path)
    )]
    NotFound {
        /// argv[0].
        program: String,
        /// The PATH searched.
        path: String,
    },
    /// Creating pipes or the PTY failed.
    #[error("cannot set up the child's {what}: {source}")]
    Setup {
        /// pipes, terminal, ...
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// exec failed.
    #[error("cannot start {program:?}: {source}")]
    Exec {
        /// argv[0].
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The child's I/O ends, as seen by the server.
pub enum ChildIo {
    /// Pipe mode.
    Pipes {
        /// Stdin, when `pipeStdin` was asked.
        stdin: Option<pipe::Sender>,
        /// Stdout.
        stdout: pipe::Receiver,
        /// Stderr.
        stderr: pipe::Receiver,
    },
    /// PTY mode: the non-blocking master.
    Pty(AsyncFd<OwnedFd>),
}

/// A started child.
pub struct Spawned {
    /// Its pid, also its session and process group id.
    pub pid: i32,
    /// Readable when the child exits.
    pub exit: ExitWaiter,
    /// Its I/O.
    pub io: ChildIo,
    /// The read end of the audit pipe, when asked for.
    pub audit: Option<pipe::Receiver>,
}

/// Waits for the child's exit through a pidfd (no SIGCHLD handling, no polling).
pub struct ExitWaiter {
    pidfd: AsyncFd<OwnedFd>,
}

impl ExitWaiter {
    /// Wait for the exit and reap the child; returns (exit code, killing signal). A signal `n`
    /// gives code `128 + n`.
    pub async fn wait(&self) -> (i32, Option<i32>) {
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        loop {
            let Ok(mut guard) = self.pidfd.readable().await else {
                return (-1, None);
            };
            match waitid(
                Id::PIDFd(std::os::fd::AsFd::as_fd(self.pidfd.get_ref())),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
            ) {
                Ok(WaitStatus::Exited(_, code)) => return (code, None),
                Ok(WaitStatus::Signaled(_, signal, _)) => {
                    return (128 + signal as i32, Some(signal as i32));
                }
                Ok(_) => guard.clear_ready(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return (-1, None),
            }
        }
    }
}

fn cstring(text: impl Into<Vec<u8>>, what: &'static str) -> Result<CString, SpawnError> {
    CString::new(text).map_err(|_| SpawnError::Nul(what))
}

/// Find the program as execvp would, using the child's PATH and cwd. A directory named twice is
/// searched once (the PATH's length is capped before this runs: `MAX_PATH_SEARCH_BYTES`). Blocking
/// (one stat per directory): run it off the async workers.
fn resolve_program(spec: &SpawnSpec) -> Result<PathBuf, SpawnError> {
    let program = &spec.argv[0];
    if program.contains('/') {
        return Ok(PathBuf::from(program));
    }
    let search = spec.env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let mut first_not_executable = None;
    let mut searched = std::collections::HashSet::new();
    for dir in search.split(':') {
        if !searched.insert(dir) {
            continue;
        }
        let dir = if dir.is_empty() {
            Path::new(".")
        } else {
            Path::new(dir)
        };
        let candidate = spec.cwd.join(dir).join(program);
        match std::fs::metadata(&candidate) {
            Ok(metadata) if metadata.is_file() && metadata.permissions().mode() & 0o111 != 0 => {
                return Ok(candidate);
            }
            Ok(metadata) if metadata.is_file() => {
                first_not_executable.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    // A match without execute permission gives EACCES from exec, as execvp reports it.
    first_not_executable.ok_or_else(|| SpawnError::NotFound {
        program: program.clone(),
        path: search.to_owned(),
    })
}

fn setup(what: &'static str) -> impl Fn(std::io::Error) -> SpawnError {
    move |source| SpawnError::Setup { what, source }
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd), SpawnError> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| setup("pipes")(e.into()))
}

/// Start the child.
///
/// # Errors
/// [`SpawnError`] for NUL bytes, a missing program, setup failures, and exec failures.
pub fn spawn(spec: &SpawnSpec) -> Result<Spawned, SpawnError> {
    let program_path = resolve_program(spec)?;
    let program = cstring(program_path.as_os_str().as_bytes(), "the program path")?;
    let mut argv = Vec::with_capacity(spec.argv.len());
    argv.push(cstring(
        spec.arg0.as_deref().unwrap_or(&spec.argv[0]),
        "argv",
    )?);
    for arg in &spec.argv[1..] {
        argv.push(cstring(arg.as_str(), "argv")?);
    }
    let envp = spec
        .env
        .iter()
        .map(|(key, value)| {
            if key.is_empty() || key.contains('=') {
                return Err(SpawnError::Nul(
                    "an environment variable name (empty or with '=')",
                ));
            }
            cstring(format!("{key}={value}"), "the environment")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = cstring(spec.cwd.as_os_str().as_bytes(), "cwd")?;
    let exec_error = |source| SpawnError::Exec {
        program: spec.argv[0].clone(),
        source,
    };
    let audit = audit_pipe(spec.audit_pipe)?;
    let mut extra_actions: Vec<FileAction<'_>> = Vec::new();
    extra_actions.extend(
        audit
            .as_ref()
            .map(|(_, write)| FileAction::Dup(write.as_raw_fd(), AUDIT_FD)),
    );
    extra_actions.extend(
        spec.launch
            .as_ref()
            .map(|launch| FileAction::Dup(launch.as_raw_fd(), LAUNCH_FD)),
    );
    match spec.pty {
        None => {
            let (stdout_read, stdout_write) = pipe_pair()?;
            let (stderr_read, stderr_write) = pipe_pair()?;
            let (stdin_child, stdin_parent) = if spec.pipe_stdin {
                let (read, write) = pipe_pair()?;
                (read, Some(write))
            } else {
                let null = nix::fcntl::open(
                    "/dev/null",
                    OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(|e| setup("stdin")(e.into()))?;
                (null, None)
            };
            let mut actions = vec![
                FileAction::Dup(stdin_child.as_raw_fd(), 0),
                FileAction::Dup(stdout_write.as_raw_fd(), 1),
                FileAction::Dup(stderr_write.as_raw_fd(), 2),
            ];
            actions.extend(extra_actions);
            let pid = sys::spawn_in_new_session(&program, &argv, &envp, &cwd, &actions)
                .map_err(exec_error)?;
            // Dropping the write end here leaves the child the only writer.
            let audit = audit.map(|(read, _write)| read);
            let exit = waiter(pid)?;
            drop((stdin_child, stdout_write, stderr_write));
            let stdin = stdin_parent
                .map(pipe::Sender::from_owned_fd)
                .transpose()
                .map_err(setup("stdin pipe"))?;
            let stdout =
                pipe::Receiver::from_owned_fd(stdout_read).map_err(setup("stdout pipe"))?;
            let stderr =
                pipe::Receiver::from_owned_fd(stderr_read).map_err(setup("stderr pipe"))?;
            enlarge_pipe(&stdout);
            enlarge_pipe(&stderr);
            Ok(Spawned {
                pid,
                exit,
                io: ChildIo::Pipes {
                    stdin,
                    stdout,
                    stderr,
                },
                audit,
            })
        }
        Some((cols, rows)) => {
            let (master, slave_path) = open_pty(cols, rows)?;
            let slave = cstring(slave_path.as_bytes(), "the terminal path")?;
            let mut actions = vec![
                FileAction::OpenReadWrite(0, &slave),
                FileAction::Dup(0, 1),
                FileAction::Dup(0, 2),
            ];
            actions.extend(extra_actions);
            let pid = sys::spawn_in_new_session(&program, &argv, &envp, &cwd, &actions)
                .map_err(exec_error)?;
            // Dropping the write end here leaves the child the only writer.
            let audit = audit.map(|(read, _write)| read);
            let exit = waiter(pid)?;
            let master = sys::register_async_fd(master).map_err(setup("terminal"))?;
            Ok(Spawned {
                pid,
                exit,
                io: ChildIo::Pty(master),
                audit,
            })
        }
    }
}

/// The descriptor number the launch request gets in `sandbox-run`.
pub const LAUNCH_FD: i32 = 3;
/// The descriptor number the audit pipe gets in the child.
pub const AUDIT_FD: i32 = 4;

/// A pipe for denial records: the parent's read end (registered with tokio) and the write end
/// for the child.
fn audit_pipe(wanted: bool) -> Result<Option<(pipe::Receiver, OwnedFd)>, SpawnError> {
    if !wanted {
        return Ok(None);
    }
    let (read, write) = pipe_pair()?;
    let read = pipe::Receiver::from_owned_fd(read).map_err(setup("audit pipe"))?;
    Ok(Some((read, write)))
}

fn waiter(pid: libc::pid_t) -> Result<ExitWaiter, SpawnError> {
    let pidfd = sys::pidfd_open(pid).map_err(setup("exit watch"))?;
    let pidfd = sys::register_async_fd(pidfd).map_err(setup("exit watch"))?;
    Ok(ExitWaiter { pidfd })
}

/// A new PTY: the master (non-blocking, close-on-exec, sized) and the slave's path. The slave is
/// only ever opened by the child, so the master sees EOF (EIO) once the child side is gone.
fn open_pty(cols: u16, rows: u16) -> Result<(OwnedFd, OsString), SpawnError> {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let terminal = setup("terminal");
    let master =
        posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| terminal(e.into()))?;
    grantpt(&master).map_err(|e| terminal(e.into()))?;
    unlockpt(&master).map_err(|e| terminal(e.into()))?;
    let slave_path = ptsname_r(&master).map_err(|e| terminal(e.into()))?;
    sys::set_window_size(&master, cols, rows).map_err(&terminal)?;
    Ok((master.into(), OsStr::new(&slave_path).to_owned()))
}

fn enlarge_pipe(fd: &impl std::os::fd::AsFd) {
    // Best effort: a larger pipe means fewer, larger chunks; the default size still works.
    let _ = nix::fcntl::fcntl(
        fd,
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(crate::limits::CHILD_PIPE_BYTES),
    );
}
