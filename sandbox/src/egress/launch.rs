//! The outer `sandbox-run`'s side of the proxy: exec it with the listening socket PID 1 made
//! inside the sandbox's network namespace, read its events while the sandbox runs, and stop it
//! when the sandbox has ended (the proxy outlives nothing).
//!
//! The proxy is found next to the running `sandbox-run` ([`super::PROXY_BINARY`]), never
//! through `$PATH`, and starts with an empty environment; it confines itself
//! (`egress-proxy`'s `main`). Its descriptors: the listener, the event pipe's write end and the
//! configuration memfd, passed by number; nothing else is inherited (everything of the outer's
//! is close-on-exec).

use std::io::{Read, Seek, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

use super::config::{EgressEvent, ProxyConfig};

/// Largest event line kept while waiting for its end (events are a few hundred bytes).
const MAX_EVENT_LINE_BYTES: usize = 64 * 1024;

/// Why the proxy could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The binary is not next to `sandbox-run`.
    #[error("the egress proxy {path} cannot be found next to sandbox-run: {source}")]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A pipe, memfd or descriptor flag could not be set up.
    #[error("setting up the egress proxy's {what} failed: {source}")]
    Plumbing {
        /// Which descriptor.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The inspection CA did not arrive (the proxy failed before sending it).
    #[error("the egress proxy sent no inspection CA: {0}")]
    Ca(#[from] super::trust::TrustError),
    /// `exec` failed.
    #[error("starting the egress proxy {path} failed: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn plumbing(what: &'static str) -> impl Fn(nix::Error) -> LaunchError {
    move |source| LaunchError::Plumbing {
        what,
        source: source.into(),
    }
}

/// The running proxy.
pub struct ProxyProcess {
    child: Child,
    events: OwnedFd,
    pending: Vec<u8>,
    /// The event pipe reached end of file (the proxy exited).
    closed: bool,
    /// The inspection CA's certificate, when a pattern inspects.
    ca: Option<super::trust::InspectionCa>,
}

/// Where an installation keeps the proxy, relative to the directory of `sandbox-run`
/// (`PREFIX/bin/sandbox-run` finds `PREFIX/libexec/execward/egress-proxy`; see `install.sh`):
/// an internal program stays off `$PATH`.
pub const INSTALLED_PROXY_DIR: &str = "../libexec/execward";

/// Where the proxy binary is: next to the running executable, else in [`INSTALLED_PROXY_DIR`]
/// beside its directory.
///
/// # Errors
/// [`LaunchError::Missing`] (naming the path next to the executable).
pub fn proxy_binary() -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe().map_err(|source| LaunchError::Missing {
        path: PathBuf::from(super::PROXY_BINARY),
        source,
    })?;
    let path = exe
        .parent()
        .map(|dir| dir.join(super::PROXY_BINARY))
        .unwrap_or_else(|| PathBuf::from(super::PROXY_BINARY));
    if let Some(installed) = exe
        .parent()
        .map(|dir| dir.join(INSTALLED_PROXY_DIR).join(super::PROXY_BINARY))
        .filter(|installed| !path.is_file() && installed.is_file())
    {
        return Ok(installed);
    }
    std::fs::metadata(&path).map_err(|source| LaunchError::Missing {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

impl ProxyProcess {
    /// Execs the proxy serving `listener` under `config`.
    ///
    /// # Errors
    /// [`LaunchError`].
    /// `ask`: the proxy's end of the question socket ([`super::ask`]).
    /// When a pattern asks for `inspect=true`, waits for the proxy's CA certificate
    /// ([`Self::inspection_ca`]).
    pub fn spawn(
        listener: OwnedFd,
        config: &ProxyConfig,
        ask: Option<OwnedFd>,
    ) -> Result<Self, LaunchError> {
        let path = proxy_binary()?;
        let (events_read, events_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(plumbing("event pipe"))?;
        let config_fd = config_memfd(config)?;
        let ca = if config.rules.inspects_any() {
            Some(nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(plumbing("CA pipe"))?)
        } else {
            None
        };
        let (ca_read, ca_write) = ca.unzip();
        for fd in [
            Some(&listener),
            Some(&events_write),
            Some(&config_fd),
            ask.as_ref(),
            ca_write.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            // Inherited on purpose by the proxy alone: this process is single-threaded and
            // execs nothing else while these are open.
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).map_err(plumbing("descriptor flags"))?;
        }
        let mut command = Command::new(&path);
        if let Some(ask) = &ask {
            command.arg("--ask-fd").arg(ask.as_raw_fd().to_string());
        }
        if let Some(ca) = &ca_write {
            command.arg("--ca-fd").arg(ca.as_raw_fd().to_string());
        }
        let child = command
            .arg("--listen-fd")
            .arg(listener.as_raw_fd().to_string())
            .arg("--events-fd")
            .arg(events_write.as_raw_fd().to_string())
            .arg("--config-fd")
            .arg(config_fd.as_raw_fd().to_string())
            .arg("--parent-pid")
            .arg(std::process::id().to_string())
            .env_clear()
            .stdin(Stdio::null())
            .current_dir("/")
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                path: path.clone(),
                source,
            })?;
        drop((listener, events_write, config_fd, ask, ca_write));
        let mut proxy = Self {
            child,
            events: events_read,
            pending: Vec::new(),
            closed: false,
            ca: None,
        };
        fcntl(&proxy.events, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(plumbing("event pipe"))?;
        if let Some(ca_read) = ca_read {
            // The proxy writes it before it confines itself, or exits (end of file).
            match super::trust::InspectionCa::receive(std::fs::File::from(ca_read)) {
                Ok(ca) => proxy.ca = Some(ca),
                Err(err) => {
                    let _ = proxy.stop();
                    return Err(err.into());
                }
            }
        }
        Ok(proxy)
    }

    /// The inspection CA's certificate (`inspect=true`), to install inside the sandbox.
    pub fn inspection_ca(&self) -> Option<&super::trust::InspectionCa> {
        self.ca.as_ref()
    }

    /// The event descriptor, to poll; `None` once the proxy has exited.
    pub fn events_fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.closed).then(|| self.events.as_fd())
    }

    /// The events that arrived (non-blocking).
    pub fn read_events(&mut self) -> Vec<EgressEvent> {
        let mut chunk = [0u8; 8192];
        loop {
            match nix::unistd::read(&self.events, &mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            if let Ok(event) = serde_json::from_slice::<EgressEvent>(&line) {
                out.push(event);
            }
        }
        if self.pending.len() > MAX_EVENT_LINE_BYTES {
            self.pending.clear();
        }
        out
    }

    /// Kills and reaps the proxy; returns the events it had written.
    pub fn stop(mut self) -> Vec<EgressEvent> {
        let mut events = self.read_events();
        let _ = self.child.kill();
        let _ = self.child.wait();
        events.extend(self.read_events());
        events
    }
}

/// The configuration as JSON in a sealed memfd, at offset 0.
fn config_memfd(config: &ProxyConfig) -> Result<OwnedFd, LaunchError> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let io = |source: std::io::Error| LaunchError::Plumbing {
        what: "configuration",
        source,
    };
    let json = serde_json::to_vec(config).map_err(|err| io(err.into()))?;
    let fd = memfd_create(
        c"execward-egress",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(plumbing("configuration"))?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&json).map_err(io)?;
    file.rewind().map_err(io)?;
    let seals = nix::fcntl::SealFlag::F_SEAL_SEAL
        | nix::fcntl::SealFlag::F_SEAL_SHRINK
        | nix::fcntl::SealFlag::F_SEAL_GROW
        | nix::fcntl::SealFlag::F_SEAL_WRITE;
    fcntl(&file, FcntlArg::F_ADD_SEALS(seals)).map_err(plumbing("configuration"))?;
    Ok(OwnedFd::from(file))
}

/// Largest configuration the proxy reads.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Why the proxy could not read its configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigReadError {
    /// Reading the descriptor failed.
    #[error("reading the configuration failed: {0}")]
    Read(#[source] std::io::Error),
    /// It is larger than [`MAX_CONFIG_BYTES`].
    #[error("the configuration is larger than MAX_CONFIG_BYTES ({limit})")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// It is not the JSON of a [`ProxyConfig`].
    #[error("the configuration is malformed: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// Reads the configuration from inherited descriptor `fd` (the proxy's side).
///
/// # Errors
/// [`ConfigReadError`] naming what was wrong.
pub fn read_config(fd: OwnedFd) -> Result<ProxyConfig, ConfigReadError> {
    let mut text = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(ConfigReadError::Read)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigReadError::TooLarge {
            limit: MAX_CONFIG_BYTES,
        });
    }
    serde_json::from_slice(&text).map_err(ConfigReadError::Malformed)
}
