//! Server assembly: bind, build the server-wide state (`ServerState`), print the URL, accept
//! until SIGINT/SIGTERM, then terminate every child.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};

use crate::budget::Budgets;
use crate::containment::reaper::Reaper;
use crate::containment::{Containment, ContainmentOptions};
use crate::fs::helpers::HelperPool;
use crate::limits::{
    DETACHED_SESSION_TTL, MAX_CONNECTIONS, MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_SOURCE,
};
use crate::listen::{ExecServerListenUrlParseError, ListenAddress};
use crate::paths::ExecServerRuntimePaths;
use crate::process::guardian::Guardian;
use crate::sandboxing::Sandboxing;
use crate::session::SessionRegistry;
use crate::state::ServerState;
use crate::transport::admission::Admission;
use crate::transport::{BindError, Listener};

/// Everything configurable about a server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// `ws://IP:PORT`, `wss://IP:PORT` or `unix:PATH`; `None`: no local listener (remote mode
    /// serves relay streams only).
    pub listen_url: Option<String>,
    /// PEM certificate chain and private key a `wss://` listener serves.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Helper binaries.
    pub runtime_paths: ExecServerRuntimePaths,
    /// File holding the bearer token required on upgrade.
    pub auth_token_file: Option<PathBuf>,
    /// How long detached sessions keep their processes.
    pub detached_session_ttl: Duration,
    /// Start a fresh fs-helper for every sandboxed filesystem request instead of pooling.
    pub one_shot_helpers: bool,
    /// Start every sandboxed command with its own `sandbox-run` instead of a pooled launcher.
    pub one_shot_sandbox: bool,
    /// Files every sandboxed command and helper must not see, besides the server's own socket
    /// and token file (remote mode adds its identity key).
    pub protected_files: Vec<PathBuf>,
    /// Contain process trees in cgroups where the host allows (`--no-cgroups` clears it).
    pub use_cgroups: bool,
    /// Limits of every `process/start` that does not set its own (`--default-limits`).
    pub default_limits: proto::methods::process::Limits,
    /// Bytes of process output all sessions retain together (`--retained-output-bytes`).
    pub retained_output_bytes: usize,
    /// Bytes of requests, answers and unfinished messages all connections may hold beyond their
    /// allowances (`--memory-budget`, default [`crate::limits::MEMORY_BUDGET_BYTES`]).
    pub memory_budget_bytes: usize,
}

impl ServerOptions {
    /// Defaults for `listen_url`.
    pub fn new(listen_url: impl Into<String>, runtime_paths: ExecServerRuntimePaths) -> Self {
        Self {
            listen_url: Some(listen_url.into()),
            ..Self::without_listener(runtime_paths)
        }
    }

    /// Defaults, with no local listener (remote mode without `--listen`).
    pub fn without_listener(runtime_paths: ExecServerRuntimePaths) -> Self {
        Self {
            listen_url: None,
            tls: None,
            runtime_paths,
            auth_token_file: None,
            detached_session_ttl: DETACHED_SESSION_TTL,
            one_shot_helpers: false,
            one_shot_sandbox: false,
            protected_files: Vec::new(),
            use_cgroups: true,
            default_limits: proto::methods::process::Limits::default(),
            retained_output_bytes: crate::limits::RETAINED_OUTPUT_BUDGET_BYTES,
            memory_budget_bytes: crate::limits::MEMORY_BUDGET_BYTES,
        }
    }
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ExecServerError {
    /// Bad `--listen`.
    #[error(transparent)]
    ListenUrl(#[from] ExecServerListenUrlParseError),
    /// A non-loopback address without TLS.
    #[error(
        "refusing to listen on {0} in clear: the bearer token, commands and files would cross \
         the network readable by anyone on the path. Listen on wss://IP:PORT with --tls-cert PEM \
         --tls-key PEM (and --auth-token-file FILE), or on ws://127.0.0.1:PORT or unix:PATH"
    )]
    TlsRequired(String),
    /// `wss://` without a certificate and key.
    #[error("{0} serves TLS: pass --tls-cert PEM and --tls-key PEM")]
    TlsFilesMissing(String),
    /// A certificate and key for a listener that is not `wss://`.
    #[error(
        "--tls-cert and --tls-key serve a wss:// listener, but the listener is {0}: listen on \
         wss://IP:PORT"
    )]
    TlsWithoutWss(String),
    /// The certificate or key is unusable.
    #[error("--tls-cert/--tls-key: {0}")]
    Tls(#[from] crate::relay::tls::TlsError),
    /// Token missing for a non-loopback address.
    #[error(
        "refusing to listen on {0} without a bearer token: anyone on the network could run commands. \
         Pass --auth-token-file FILE, or listen on ws://127.0.0.1:PORT or unix:PATH"
    )]
    TokenRequired(String),
    /// The token file is unreadable or empty.
    #[error("cannot use auth token file {path}: {reason}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Bind failed.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// Signal handler installation failed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    /// A helper binary is missing.
    #[error(transparent)]
    Helper(#[from] crate::sandboxing::HelperOpenError),
    /// The guardian could not start.
    #[error(
        "cannot start the guardian helper {path}: {source}; it must sit next to exec-server (or in --helper-dir)"
    )]
    Guardian {
        /// Where it was expected.
        path: PathBuf,
        /// The spawn error.
        source: std::io::Error,
    },
    /// Writing the URL to stdout failed.
    #[error("cannot print the listen URL: {0}")]
    Stdout(std::io::Error),
    /// `--default-limits` cannot be enforced on this host.
    #[error("--default-limits: {0}")]
    DefaultLimits(#[from] crate::containment::plan::PlanError),
    /// The server could not register its secrets for every other server's sandboxes to hide.
    #[error(
        "cannot register this server's token, key and socket paths, which every other \
         server's sandboxes must hide: {0}"
    )]
    Registry(#[from] sandbox::servers::RegistryError),
    /// The server could not become a child subreaper (needed without cgroups).
    #[error("cannot make the server a child subreaper (PR_SET_CHILD_SUBREAPER): {0}")]
    Subreaper(std::io::Error),
    /// The threads that read processes' output could not be started.
    #[error("cannot start the threads that read processes' output: {0}")]
    OutputRuntime(std::io::Error),
}

impl ExecServerError {
    /// Whether the server failed while running (a bind the OS refused, a signal handler, the
    /// guardian, stdout, the registry) rather than on what it was given (a bad URL, token file,
    /// helper directory or limit): the two exit differently (see [`crate::cli::RUNTIME_FAILURE_STATUS`]).
    pub fn is_runtime_failure(&self) -> bool {
        match self {
            Self::ListenUrl(_)
            | Self::TlsRequired(_)
            | Self::TlsFilesMissing(_)
            | Self::TlsWithoutWss(_)
            | Self::Tls(_)
            | Self::TokenRequired(_)
            | Self::TokenFile { .. }
            | Self::Helper(_)
            | Self::DefaultLimits(_) => false,
            Self::Bind(_)
            | Self::Signals(_)
            | Self::Guardian { .. }
            | Self::Stdout(_)
            | Self::Registry(_)
            | Self::Subreaper(_)
            | Self::OutputRuntime(_) => true,
        }
    }
}

/// A bound server, not yet serving.
pub struct BoundServer {
    /// `None` in remote mode without `--listen`.
    listener: Option<Listener>,
    /// This server's entry in the per-user registry, removed when the server ends.
    _registration: sandbox::servers::Registration,
    state: Arc<ServerState>,
    shutdown: watch::Sender<bool>,
}

impl BoundServer {
    /// Validate options and bind.
    ///
    /// # Errors
    /// [`ExecServerError`] for a bad URL, a missing token on a non-loopback address, an unusable
    /// token file, or a failed bind.
    pub async fn bind(options: ServerOptions) -> Result<Self, ExecServerError> {
        let address = options
            .listen_url
            .as_deref()
            .map(ListenAddress::parse)
            .transpose()?;
        let auth_token = options
            .auth_token_file
            .as_deref()
            .map(read_token)
            .transpose()?;
        let tls = listener_tls(address.as_ref(), &options)?;
        // Its threads and descriptors exist from the start, not from the first process.
        crate::process::pump::start_output_runtime().map_err(ExecServerError::OutputRuntime)?;
        if let Some(address) = &address
            && !address.is_local_only()
        {
            if !address.is_tls() {
                return Err(ExecServerError::TlsRequired(url_of(&options)));
            }
            if auth_token.is_none() {
                return Err(ExecServerError::TokenRequired(url_of(&options)));
            }
        }
        let listener = match &address {
            Some(address) => Some(Listener::bind(address, tls).await?),
            None => None,
        };
        // Sandboxed code must not reach the server: its unix socket, token file and TLS key are
        // hidden from every sandbox, its TCP port refused (crate::sandboxing).
        let mut hidden = options.protected_files.clone();
        if let Some(ListenAddress::Unix(path)) = &address {
            hidden.push(path.clone());
        }
        hidden.extend(options.auth_token_file.iter().cloned());
        // The wss:// listener's private key: a command holding it could pose as this server.
        hidden.extend(options.tls.iter().map(|(_, key)| key.clone()));
        let sandboxing = Arc::new(Sandboxing::new(
            &options.runtime_paths,
            hidden,
            listener
                .as_ref()
                .and_then(Listener::tcp_port)
                .into_iter()
                .collect(),
        )?);
        // Before the first connection is served: from here on, every sandbox any server of this
        // user builds hides this server's secrets too.
        let (hidden, read_only, tcp_ports) = sandboxing.registration();
        let registration = sandbox::servers::Registration::register(hidden, read_only, tcp_ports)?;
        crate::sys::prepare_server_descriptors();
        let budgets =
            Arc::new(Budgets::for_current_process().with_memory_limit(options.memory_budget_bytes));
        tracing::debug!(
            descriptors = budgets.descriptor_limit(),
            "client descriptor budget"
        );
        let containment = Arc::new(Containment::detect(ContainmentOptions {
            use_cgroups: options.use_cgroups,
            default_limits: options.default_limits.clone(),
        }));
        let (guardian, reaper) = match start_guardian(&options, &containment) {
            Ok(started) => started,
            Err(error) => {
                containment.abandon();
                return Err(error);
            }
        };
        let helpers = HelperPool::new(
            sandboxing.clone(),
            options.one_shot_helpers,
            budgets.clone(),
        );
        let launchers = crate::process::launcher::Launchers::new(
            sandboxing.sandbox_run.exec_path(),
            options.one_shot_sandbox,
        );
        let own_listeners = match &listener {
            Some(Listener::Tcp(tcp, _)) => tcp.local_addr().into_iter().collect(),
            Some(Listener::Unix(..)) | None => Vec::new(),
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = Arc::new(ServerState {
            sessions: Arc::new(SessionRegistry::new(
                options.detached_session_ttl,
                crate::process::retention::RetentionPool::new(options.retained_output_bytes),
                helpers.clone(),
                launchers.clone(),
            )),
            runtime_paths: options.runtime_paths.clone(),
            access: crate::transport::access::ListenerAccess::for_current_user(auth_token),
            connection_slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            relay_slots: Arc::new(Semaphore::new(crate::limits::MAX_RELAY_STREAMS)),
            admission: Admission::new(MAX_PENDING_CONNECTIONS, MAX_PENDING_PER_SOURCE),
            budgets,
            shutdown: shutdown_rx,
            guardian,
            helpers,
            http: Arc::new(crate::http::HttpContext::new(own_listeners)),
            environment: crate::environment::EnvironmentContext::new(
                sandboxing.sandbox_run.exec_path(),
                containment.support(),
            ),
            launchers,
            sandboxing,
            containment,
            reaper,
            metrics: Arc::new(crate::observe::Metrics::new()),
            started: std::time::Instant::now(),
        });
        Ok(Self {
            listener,
            _registration: registration,
            state,
            shutdown,
        })
    }

    /// The URL clients connect to (`None` without a local listener).
    pub fn url(&self) -> Option<String> {
        self.listener.as_ref().map(Listener::url)
    }

    /// Print the URL clients connect to as the first stdout line ([`announce_url`]); without a
    /// local listener, nothing.
    ///
    /// # Errors
    /// The write error.
    pub fn announce(&self) -> std::io::Result<()> {
        self.url().as_deref().map_or(Ok(()), announce_url)
    }

    /// Serve until `stop` resolves, then close connections and terminate every child.
    pub async fn serve_until(self, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        match &self.listener {
            Some(listener) => loop {
                tokio::select! {
                    _ = &mut stop => break,
                    _ = listener.accept_and_spawn(&self.state) => {}
                }
            },
            None => stop.await,
        }
        tracing::info!("shutting down: terminating every child");
        let _ = self.shutdown.send(true);
        drop(self.listener);
        let tables: Vec<_> = self
            .state
            .sessions
            .all()
            .into_iter()
            .map(|session| session.processes.clone())
            .collect();
        crate::process::terminate_sessions(&tables).await;
        if let Some(reaper) = &self.state.reaper {
            reaper.kill_orphans().await;
        }
        self.state.containment.shutdown().await;
    }
}

/// Check the default limits, log the host's containment, and start what kills our trees if
/// the server dies (the guardian) and reaps orphans without cgroups (the subreaper).
fn start_guardian(
    options: &ServerOptions,
    containment: &Containment,
) -> Result<(Arc<Guardian>, Option<Arc<Reaper>>), ExecServerError> {
    containment.check_defaults()?;
    let support = containment.support();
    tracing::info!(
        tracking = ?support.tracking,
        cgroup = support.cgroup.as_deref().unwrap_or("-"),
        limits = ?support.limits,
        notes = ?support.notes,
        "containment"
    );
    let reaper = if containment.capabilities().tracking {
        None
    } else {
        Some(Reaper::install().map_err(ExecServerError::Subreaper)?)
    };
    let guardian = Guardian::start(
        &options.runtime_paths.guardian,
        containment.v2_base(),
        &containment.v1_bases(),
    )
    .map_err(|source| ExecServerError::Guardian {
        path: options.runtime_paths.guardian.clone(),
        source,
    })?;
    Ok((Arc::new(guardian), reaper))
}

/// The listen URL as given, for messages.
fn url_of(options: &ServerOptions) -> String {
    options.listen_url.clone().unwrap_or_default()
}

/// The TLS settings of the listener: a `wss://` address needs `--tls-cert`/`--tls-key`, and
/// they serve nothing else.
fn listener_tls(
    address: Option<&ListenAddress>,
    options: &ServerOptions,
) -> Result<Option<Arc<rustls::ServerConfig>>, ExecServerError> {
    match (address, &options.tls) {
        (Some(address), Some((cert, key))) if address.is_tls() => {
            Ok(Some(crate::relay::tls::server_config(cert, key)?))
        }
        (Some(address), None) if address.is_tls() => {
            Err(ExecServerError::TlsFilesMissing(url_of(options)))
        }
        (_, Some(_)) => Err(ExecServerError::TlsWithoutWss(
            options
                .listen_url
                .clone()
                .unwrap_or_else(|| "absent (no --listen)".to_owned()),
        )),
        _ => Ok(None),
    }
}

fn read_token(path: &std::path::Path) -> Result<Vec<u8>, ExecServerError> {
    let error = |reason: String| ExecServerError::TokenFile {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(error("the file is empty".into()));
    }
    Ok(token.as_bytes().to_vec())
}

/// Run the server: bind, print the URL as the first stdout line, serve until SIGINT/SIGTERM,
/// terminate every child, return.
///
/// # Errors
/// [`ExecServerError`] when the server cannot start.
pub async fn run_main_with_options(options: ServerOptions) -> Result<(), ExecServerError> {
    let signals = ShutdownSignals::install().map_err(ExecServerError::Signals)?;
    let server = BoundServer::bind(options).await?;
    server.announce().map_err(ExecServerError::Stdout)?;
    tracing::info!(url = %server.url().unwrap_or_default(), "listening");
    server.serve_until(signals.recv()).await;
    Ok(())
}

/// SIGINT and SIGTERM listeners. Install them before binding, so a signal sent right after the
/// URL is printed is not lost.
pub struct ShutdownSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Install the listeners.
    ///
    /// # Errors
    /// The OS error when a handler cannot be installed.
    pub fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Resolves on the first SIGINT or SIGTERM.
    pub async fn recv(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Print the URL clients connect to as the first line of stdout, flushed (tests and scripts read
/// it to find the server).
///
/// # Errors
/// The write error.
pub fn announce_url(url: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{url}")?;
    stdout.flush()
}

/// Run the server on `listen_url` with default options (see [`run_main_with_options`]).
///
/// # Errors
/// [`ExecServerError`] when the server cannot start.
pub async fn run_main(
    listen_url: &str,
    runtime_paths: ExecServerRuntimePaths,
) -> Result<(), ExecServerError> {
    run_main_with_options(ServerOptions::new(listen_url, runtime_paths)).await
}

impl BoundServer {
    /// The server-wide state, for transports other than the listener (remote mode serves relay
    /// streams with it beside the listener).
    pub fn state(&self) -> Arc<ServerState> {
        self.state.clone()
    }
}
