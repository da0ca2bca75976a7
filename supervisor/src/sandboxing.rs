//! The server's side of the sandbox: the one trusted resolution of client `sandbox` objects,
//! the protections every sandbox gets, and the helper binaries it execs.
//!
//! - **One resolution.** A `sandbox` object is resolved here, once, from the server's own
//!   environment (`$TMPDIR` of the server, never of the request's `env`), and the resolved policy
//!   travels to `sandbox-run` (a launch request in a sealed memfd) and to `fs-helper` (its
//!   policy in a memfd): neither resolves anything again, so nothing in the command's `env`
//!   and no symlink planted between the two resolutions can widen it.
//! - **No way back.** Every sandbox hides the server's own unix socket, its token file and any
//!   key file it was given ([`ServerOptions::protected_files`](crate::ServerOptions)), keeps the
//!   directory of the server's binaries and the server's executable read-only, and, with the
//!   network on, refuses TCP connections to the server's listening port (Landlock); with the
//!   network off its network namespace has no route to the host at all.
//! - **Every server's, not only its own.** The server registers what it hides and keeps
//!   read-only in the per-user registry ([`sandbox::servers`]) before it listens, and adds every
//!   registered server's paths to each policy it resolves: a sandbox of this server cannot read
//!   another server's token either.
//! - **Binaries by descriptor.** The helpers are opened once at startup and executed through
//!   `/proc/self/fd/N`: replacing a file on disk afterwards changes nothing the server runs.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex, PoisonError};

use sandbox::policy::{PlantableDirs, ResolveContext};
use sandbox::{ResolvedPolicy, SandboxSpec};
use serde_json::Value;

use crate::paths::ExecServerRuntimePaths;

/// Why a helper binary could not be opened at startup.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot open the {name} helper {path}: {source}; it must sit next to exec-server (or in \
     --helper-dir)"
)]
pub struct HelperOpenError {
    /// Which helper.
    pub name: &'static str,
    /// Where it was expected.
    pub path: PathBuf,
    /// The OS error.
    pub source: std::io::Error,
}

/// A helper binary, opened once.
#[derive(Debug)]
pub struct HelperBinary {
    file: File,
    path: PathBuf,
}

impl HelperBinary {
    fn open(name: &'static str, path: &Path) -> Result<Self, HelperOpenError> {
        let error = |source| HelperOpenError {
            name,
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(error)?;
        let meta = file.metadata().map_err(error)?;
        if !meta.is_file() {
            return Err(error(std::io::Error::other("not a regular file")));
        }
        Ok(Self {
            file,
            path: path.to_owned(),
        })
    }

    /// The path to exec: the server's own descriptor, so the file on disk is not looked up
    /// again.
    pub fn exec_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Where it was found (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why a client's `sandbox` object was refused.
#[derive(Debug, thiserror::Error)]
pub enum SandboxRequestError {
    /// It does not parse.
    #[error("invalid sandbox: {0}; see policies/README.md for the accepted shapes")]
    Shape(#[source] serde_json::Error),
    /// It does not resolve.
    #[error("invalid sandbox: {0}")]
    Resolve(#[from] sandbox::PolicyError),
    /// The registry of running servers cannot be read, so their secrets could not be hidden.
    #[error("cannot build a sandbox: {0}")]
    Registry(#[from] sandbox::servers::RegistryError),
}

/// Everything the server needs to run work in a sandbox.
#[derive(Debug)]
pub struct Sandboxing {
    context: ResolveContext,
    hidden: Vec<PathBuf>,
    read_only: Vec<PathBuf>,
    tcp_ports: Vec<u16>,
    /// The host directories the server's sandboxed commands could write so far: a symlink in
    /// one of them on the way to a path a later start names is refused.
    earlier_writable: Mutex<Arc<PlantableDirs>>,
    registry: sandbox::servers::RegistryReader,
    /// `sandbox-run`.
    pub sandbox_run: HelperBinary,
    /// `fs-helper`.
    pub fs_helper: HelperBinary,
}

impl Sandboxing {
    /// Opens the helpers and records what every sandbox must be kept from: `hidden` files
    /// (sockets, token and key files), the listening `tcp_ports`; the helpers' directory and
    /// the server's executable stay read-only.
    ///
    /// # Errors
    /// [`HelperOpenError`] when a helper is missing or unreadable.
    pub fn new(
        paths: &ExecServerRuntimePaths,
        hidden: Vec<PathBuf>,
        tcp_ports: Vec<u16>,
    ) -> Result<Self, HelperOpenError> {
        let sandbox_run = HelperBinary::open("sandbox-run", &paths.sandbox_run)?;
        let fs_helper = HelperBinary::open("fs-helper", &paths.fs_helper)?;
        let mut read_only: Vec<PathBuf> = [&paths.sandbox_run, &paths.fs_helper, &paths.guardian]
            .iter()
            .filter_map(|path| path.parent())
            .map(Path::to_owned)
            .collect();
        // The server's own executable stays read-only to every sandbox; not knowing where it
        // is would leave it writable, so that refuses to start.
        let exe = std::env::current_exe().map_err(|source| HelperOpenError {
            name: "exec-server",
            path: PathBuf::from("/proc/self/exe"),
            source,
        })?;
        read_only.push(exe);
        read_only.sort();
        read_only.dedup();
        Ok(Self {
            context: ResolveContext::from_env(),
            hidden,
            read_only,
            tcp_ports,
            earlier_writable: Mutex::default(),
            registry: sandbox::servers::RegistryReader::new(),
            sandbox_run,
            fs_helper,
        })
    }

    /// Resolves a client's `sandbox` object, with the server's protections added. `None` when
    /// there is no sandbox (absent, null, or a policy that restricts nothing). A cwd-dependent
    /// profile must carry its own `cwd`. Walks globs: call it off the async runtime.
    ///
    /// # Errors
    /// [`SandboxRequestError`] when the object does not parse or resolve (the work is then never
    /// run unsandboxed instead).
    pub fn resolve(
        &self,
        sandbox: Option<&Value>,
    ) -> Result<Option<ResolvedPolicy>, SandboxRequestError> {
        let Some((spec, context)) = self.spec_and_context(sandbox)? else {
            return Ok(None);
        };
        let policy = spec.resolve_with(&context)?;
        if policy.is_unrestricted() {
            return Ok(None);
        }
        Ok(Some(self.protect(policy)?))
    }

    /// [`Self::resolve`] for work that only reads (`fs/readFile`, `fs/getMetadata`, ...): the
    /// same reads granted, nothing writable, and the writable roots not searched for protected
    /// names ([`sandbox::policy::ReadsOnly`]), which in a large workspace is most of a
    /// resolution's time.
    ///
    /// # Errors
    /// As [`Self::resolve`].
    pub fn resolve_reads(
        &self,
        sandbox: Option<&Value>,
    ) -> Result<Option<ResolvedPolicy>, SandboxRequestError> {
        let Some((spec, context)) = self.spec_and_context(sandbox)? else {
            return Ok(None);
        };
        let policy = spec.resolve_reads_with(&context)?;
        if policy.is_unrestricted() {
            return Ok(None);
        }
        Ok(Some(policy.narrow(|policy| self.protect(policy))?.finish()))
    }

    /// The client's `sandbox` object parsed, and the context to resolve it in; `None` when
    /// there is none (absent or null).
    fn spec_and_context(
        &self,
        sandbox: Option<&Value>,
    ) -> Result<Option<(SandboxSpec, ResolveContext)>, SandboxRequestError> {
        let Some(sandbox) = sandbox.filter(|value| !value.is_null()) else {
            return Ok(None);
        };
        let spec: SandboxSpec =
            serde_json::from_value(sandbox.clone()).map_err(SandboxRequestError::Shape)?;
        let context = ResolveContext {
            earlier_writable: self.earlier_writable(),
            ..self.context.clone()
        };
        Ok(Some((spec, context)))
    }

    fn earlier_writable(&self) -> Arc<PlantableDirs> {
        self.earlier_writable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Refuses `cwd` when the way to it passes a symlink a command under `policy`, or under any
    /// policy this server started a command with, could have planted.
    ///
    /// # Errors
    /// [`sandbox::PolicyError::PlantedSymlink`] naming the path and the link.
    pub fn refuse_planted_cwd(
        &self,
        policy: &ResolvedPolicy,
        cwd: &Path,
    ) -> Result<(), sandbox::PolicyError> {
        policy.refuse_planted_symlink_after(cwd, &self.earlier_writable())
    }

    /// Records that a command runs under `policy`: what it can write is where later starts'
    /// paths must not pass a symlink. Call it before the command starts.
    pub fn record_started(&self, policy: &ResolvedPolicy) {
        let mut earlier = self
            .earlier_writable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if policy
            .plantable_roots()
            .iter()
            .any(|root| !earlier.contains(root))
        {
            Arc::make_mut(&mut earlier).record(policy);
        }
    }

    /// What this server registers for every other server's sandboxes to hide
    /// ([`sandbox::servers`]): its hidden files, its binaries kept read-only, and its TCP ports
    /// refused.
    pub fn registration(&self) -> (&[PathBuf], &[PathBuf], &[u16]) {
        (&self.hidden, &self.read_only, &self.tcp_ports)
    }

    /// Adds the server's protections to `policy`, and those of every running server of this
    /// user ([`sandbox::servers`]), read now.
    ///
    /// # Errors
    /// [`SandboxRequestError::Registry`] when the registry cannot be read.
    pub fn protect(
        &self,
        mut policy: ResolvedPolicy,
    ) -> Result<ResolvedPolicy, SandboxRequestError> {
        policy = self.registry.current()?.apply(policy);
        policy = policy
            .with_hidden_paths(self.hidden.iter().map(PathBuf::as_path))
            .with_read_only_paths(self.read_only.iter().map(PathBuf::as_path));
        for port in &self.tcp_ports {
            policy = policy.with_denied_tcp_port(*port);
        }
        Ok(policy)
    }
}
