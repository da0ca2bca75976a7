//! Starting a child: its own session (`setsid`), an exact environment, stdio on pipes or a PTY,
//! nothing else inherited, its cgroups joined and its rlimits set before it execs. The child is
//! created like `posix_spawn` does it (`CLONE_VM | CLONE_VFORK`, see
//! `sys::spawn_in_new_session`), which avoids forking the whole server (the spawn round trip
//! is ~0.3 ms shorter than fork+exec) and reports exec failures, so a missing program is an
//! error here, never a process that "started" and exited 127. The child is born in its cgroup
//! v2 leaf (`clone3(CLONE_INTO_CGROUP)`) and joins any v1 cgroups before `execve`, which makes
//! containment race-free: nothing of the command runs outside its cgroups, so even a double fork
//! in its first microsecond stays inside. Being born there also spares the start a migration,
//! which after an idle moment waits out an RCU grace period (7 to 30 ms) in the kernel.
//!
//! Every descriptor the server holds is close-on-exec (see
//! `sys::prepare_server_descriptors`); the child's stdio is placed with `dup2` file actions. A
//! PTY slave is opened by path in the child after `setsid`, which makes it the controlling
//! terminal. Dying with the server is the guardian's job (`exec-guardian`).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sandbox::limits::{CommandLimits, Rlimit};

use nix::fcntl::OFlag;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

use crate::containment::ChildCgroupFds;
use crate::containment::reaper::Reaper;
use crate::sys::{self, ChildCgroups, ChildExit, ChildRlimit, ChildStep, FileAction, SpawnFailure};

mod leader;

use leader::leader;
pub use leader::{Leader, launched};

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
    /// The child's end of the egress question socket, given to it as descriptor [`ASK_FD`]
    /// (`sandbox-run --ask-fd`).
    pub ask: Option<OwnedFd>,
    /// The server's end of that socket (taken by the caller once the child runs).
    pub ask_server: Option<std::os::unix::net::UnixStream>,
    /// The cgroups the child is born in or joins before it execs.
    pub cgroups: ChildCgroupFds,
    /// Rlimits the child sets before it execs.
    pub rlimits: CommandLimits,
}

/// Why a spawn failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An argument or variable holds a NUL byte.
    #[error("{0} contains a NUL byte, which cannot be passed to a program")]
    Nul(&'static str),
    /// An environment variable name is empty or contains `=`.
    #[error(
        "environment variable name {} is empty or contains '=', which cannot be passed to a program",
        crate::untrusted::Untrusted(name)
    )]
    EnvName {
        /// The name given.
        name: String,
    },
    /// The program was not found.
    #[error(
        "program {} not found (searched PATH={})",
        crate::untrusted::Untrusted(program),
        crate::untrusted::Untrusted(path)
    )]
    NotFound {
        /// `argv[0]`.
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
    /// The child could not join its cgroup.
    #[error("cannot place {program:?} in its cgroup: {source}")]
    JoinCgroup {
        /// `argv[0]`.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The child could not set its rlimits.
    #[error("cannot set the limits of {program:?} ({limits:?}): {source}")]
    Rlimit {
        /// `argv[0]`.
        program: String,
        /// The limits asked for.
        limits: Box<CommandLimits>,
        /// The OS error.
        source: std::io::Error,
    },
    /// exec failed.
    #[error("cannot start {program:?}: {source}")]
    Exec {
        /// `argv[0]`.
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
    /// Its pidfd: exit and signals.
    pub leader: Arc<Leader>,
    /// Its I/O.
    pub io: ChildIo,
    /// The read end of the audit pipe, when asked for.
    pub audit: Option<pipe::Receiver>,
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

/// Start the child. Without cgroups, `reaper` learns the new leader before any orphan sweep can
/// run.
///
/// # Errors
/// [`SpawnError`] for NUL bytes, a missing program, setup failures, a cgroup it could not
/// join, limits it could not set, and exec failures.
pub fn spawn(spec: &SpawnSpec, reaper: Option<&Reaper>) -> Result<Spawned, SpawnError> {
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
                return Err(SpawnError::EnvName { name: key.clone() });
            }
            cstring(format!("{key}={value}"), "the environment")
        })
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = cstring(spec.cwd.as_os_str().as_bytes(), "cwd")?;
    let program_name = spec.argv[0].clone();
    let exec_error = |failure: SpawnFailure| match failure.step {
        ChildStep::JoinCgroup => SpawnError::JoinCgroup {
            program: program_name.clone(),
            source: failure.error,
        },
        ChildStep::Rlimit => SpawnError::Rlimit {
            program: program_name.clone(),
            limits: Box::new(spec.rlimits.clone()),
            source: failure.error,
        },
        ChildStep::Exec => SpawnError::Exec {
            program: program_name.clone(),
            source: failure.error,
        },
    };
    let join: Vec<i32> = spec.cgroups.v1.iter().map(AsRawFd::as_raw_fd).collect();
    let cgroups = ChildCgroups {
        born_in: spec
            .cgroups
            .leaf
            .as_ref()
            .map(|(directory, procs)| (directory.as_raw_fd(), procs.as_raw_fd())),
        join: &join,
    };
    let rlimits = child_rlimits(&spec.rlimits);
    let start = |actions: &[FileAction<'_>]| {
        let mut leaders = reaper.map(Reaper::spawning);
        let pid =
            sys::spawn_in_new_session(&program, &argv, &envp, &cwd, actions, cgroups, &rlimits)
                .map_err(&exec_error)?;
        if let Some(leaders) = leaders.as_mut() {
            leaders.insert(pid);
        }
        Ok::<_, SpawnError>(pid)
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
    extra_actions.extend(
        spec.ask
            .as_ref()
            .map(|ask| FileAction::Dup(ask.as_raw_fd(), ASK_FD)),
    );
    match spec.pty {
        None => {
            let ([stdin_child, stdout_write, stderr_write], pipes) = stdio_pipes(spec.pipe_stdin)?;
            let mut actions = vec![
                FileAction::Dup(stdin_child.as_raw_fd(), 0),
                FileAction::Dup(stdout_write.as_raw_fd(), 1),
                FileAction::Dup(stderr_write.as_raw_fd(), 2),
            ];
            actions.extend(extra_actions);
            let pid = start(&actions)?;
            // Dropping the write end here leaves the child the only writer.
            let audit = audit.map(|(read, _write)| read);
            let leader = leader(pid)?;
            drop((stdin_child, stdout_write, stderr_write));
            Ok(Spawned {
                pid,
                leader,
                io: pipes.into_io()?,
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
            let pid = start(&actions)?;
            // Dropping the write end here leaves the child the only writer.
            let audit = audit.map(|(read, _write)| read);
            let leader = leader(pid)?;
            let master = sys::register_async_fd(master).map_err(setup("terminal"))?;
            Ok(Spawned {
                pid,
                leader,
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
/// The descriptor number the egress question socket gets in the child
/// ([`super::approve`]).
pub const ASK_FD: i32 = 5;

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

/// The server's ends of a child's stdio pipes.
pub struct ServerPipes {
    stdin: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl ServerPipes {
    fn into_io(self) -> Result<ChildIo, SpawnError> {
        let stdin = self
            .stdin
            .map(pipe::Sender::from_owned_fd)
            .transpose()
            .map_err(setup("stdin pipe"))?;
        let stdout = pipe::Receiver::from_owned_fd(self.stdout).map_err(setup("stdout pipe"))?;
        let stderr = pipe::Receiver::from_owned_fd(self.stderr).map_err(setup("stderr pipe"))?;
        enlarge_pipe(&stdout);
        enlarge_pipe(&stderr);
        Ok(ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        })
    }
}

/// Stdio pipes for a child: its ends (stdin, stdout, stderr; stdin is `/dev/null` without
/// `pipe_stdin`) and the server's.
///
/// # Errors
/// [`SpawnError::Setup`].
pub fn stdio_pipes(pipe_stdin: bool) -> Result<([OwnedFd; 3], ServerPipes), SpawnError> {
    let (stdout_read, stdout_write) = pipe_pair()?;
    let (stderr_read, stderr_write) = pipe_pair()?;
    let (stdin_child, stdin_parent) = if pipe_stdin {
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
    Ok((
        [stdin_child, stdout_write, stderr_write],
        ServerPipes {
            stdin: stdin_parent,
            stdout: stdout_read,
            stderr: stderr_read,
        },
    ))
}

/// The rlimits as the child sets them.
fn child_rlimits(limits: &CommandLimits) -> Vec<ChildRlimit> {
    limits
        .rlimits()
        .into_iter()
        .map(|(resource, soft, hard)| ChildRlimit {
            resource: match resource {
                Rlimit::Cpu => libc::RLIMIT_CPU,
                Rlimit::FileSize => libc::RLIMIT_FSIZE,
                Rlimit::OpenFiles => libc::RLIMIT_NOFILE,
                Rlimit::AddressSpace => libc::RLIMIT_AS,
                Rlimit::Processes => libc::RLIMIT_NPROC,
            } as libc::c_int,
            soft,
            hard,
        })
        .collect()
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
