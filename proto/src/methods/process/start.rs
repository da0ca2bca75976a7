//! `process/start` params and result: the command, its environment policy and limits.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{AppliedLimits, Limits, is_false};
use crate::uri::FileUri;

/// Params of `process/start`.
///
/// Built with [`StartParams::new`] and the `with_*` methods, so a field added to the protocol
/// later (it is `#[non_exhaustive]`) breaks no caller:
///
/// ```
/// # use proto::methods::process::StartParams;
/// # use proto::FileUri;
/// let cwd = FileUri::from_path(std::path::Path::new("/srv")).unwrap();
/// let params = StartParams::new("build", ["make", "test"], cwd)
///     .with_env_var("PATH", "/usr/bin:/bin")
///     .with_pipe_stdin(true);
/// assert_eq!(params.argv, ["make", "test"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct StartParams {
    /// Caller-chosen id, unique within the session.
    pub process_id: String,
    /// Program and arguments; must be non-empty.
    pub argv: Vec<String>,
    /// Working directory: a `file:` URI of an existing directory, or an absolute native path
    /// (`/srv/project`), as the reference server accepts. Always sent as a `file:` URI.
    #[serde(deserialize_with = "uri_or_native_path")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::native_path_or_file_uri")
    )]
    pub cwd: FileUri,
    /// How to build the child's base environment from the server's own (absent: the child gets
    /// exactly `env`, nothing is inherited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_policy: Option<EnvPolicy>,
    /// The child's environment: all of it without `envPolicy`, laid over the policy's result
    /// with one.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Run under a pseudo-terminal (output stream `pty`).
    #[serde(default)]
    pub tty: bool,
    /// Keep stdin of a non-PTY process writable through `process/write`.
    #[serde(default)]
    pub pipe_stdin: bool,
    /// Override `argv[0]` as seen by the program.
    #[serde(default)]
    pub arg0: Option<String>,
    /// PTY width in columns (default 80).
    #[serde(default)]
    pub cols: Option<u16>,
    /// PTY height in rows (default 24).
    #[serde(default)]
    pub rows: Option<u16>,
    /// Run the command under this sandbox (see policies/README.md for the shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::schema::sandbox_field")
    )]
    pub sandbox: Option<Value>,
    /// Report the sandbox's denials as `process/denied` notifications (needs `sandbox`; the
    /// kernel audit log is only readable when the server runs as root, otherwise the records
    /// say the audit is unavailable).
    #[serde(default)]
    pub audit_denials: bool,
    /// The reference client's request that the command's network go only through a managed
    /// proxy. This server cannot enforce that, so a start asking for it is refused unless its
    /// sandbox turns the network off (see docs/protocol.md, compatibility).
    #[serde(default, skip_serializing_if = "is_false")]
    pub enforce_managed_network: bool,
    /// Bounds on the process tree (memory, processes, CPU and wall time, file size, open files),
    /// laid over the server's defaults field by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
}

impl StartParams {
    /// Params that run `argv` in `cwd` with an empty environment, on pipes, unsandboxed, with
    /// the server's default limits.
    pub fn new(
        process_id: impl Into<String>,
        argv: impl IntoIterator<Item = impl Into<String>>,
        cwd: FileUri,
    ) -> Self {
        Self {
            process_id: process_id.into(),
            argv: argv.into_iter().map(Into::into).collect(),
            cwd,
            env_policy: None,
            env: BTreeMap::new(),
            tty: false,
            pipe_stdin: false,
            arg0: None,
            cols: None,
            rows: None,
            sandbox: None,
            audit_denials: false,
            enforce_managed_network: false,
            limits: None,
        }
    }

    /// The whole environment (replacing what was set).
    #[must_use]
    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }

    /// One environment variable.
    #[must_use]
    pub fn with_env_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// The base environment built from the server's own (`envPolicy`).
    #[must_use]
    pub fn with_env_policy(mut self, policy: EnvPolicy) -> Self {
        self.env_policy = Some(policy);
        self
    }

    /// Run under a pseudo-terminal.
    #[must_use]
    pub fn with_tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// The PTY's size.
    #[must_use]
    pub fn with_size(mut self, cols: u16, rows: u16) -> Self {
        self.cols = Some(cols);
        self.rows = Some(rows);
        self
    }

    /// Keep stdin writable through `process/write`.
    #[must_use]
    pub fn with_pipe_stdin(mut self, pipe_stdin: bool) -> Self {
        self.pipe_stdin = pipe_stdin;
        self
    }

    /// `argv[0]` as the program sees it.
    #[must_use]
    pub fn with_arg0(mut self, arg0: impl Into<String>) -> Self {
        self.arg0 = Some(arg0.into());
        self
    }

    /// Run under this sandbox object (see policies/README.md).
    #[must_use]
    pub fn with_sandbox(mut self, sandbox: Value) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// Report the sandbox's denials as `process/denied`.
    #[must_use]
    pub fn with_audit_denials(mut self, audit: bool) -> Self {
        self.audit_denials = audit;
        self
    }

    /// Bounds on the process tree.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Some(limits);
        self
    }
}

/// Accept a `file:` URI or an absolute native path.
fn uri_or_native_path<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<FileUri, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.starts_with('/') {
        return FileUri::from_path(&text).map_err(serde::de::Error::custom);
    }
    FileUri::parse(&text).map_err(|error| {
        serde::de::Error::custom(format!(
            "{error}; an absolute native path such as \"/tmp\" is accepted too"
        ))
    })
}

/// `envPolicy` of `process/start`: the child's base environment, built from the server's own.
///
/// Steps, in order: take the server's variables per `inherit`; unless `ignoreDefaultExcludes`,
/// drop names matching `*KEY*`, `*SECRET*` or `*TOKEN*`; drop names matching `exclude`; add
/// `set`; when `includeOnly` is non-empty keep only names matching it; then lay `env` over the
/// result. Patterns are globs (`*`, `?`) matched without regard to ASCII case.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvPolicy {
    /// Which of the server's variables to start from (default `core`).
    #[serde(default)]
    pub inherit: EnvInherit,
    /// Keep names matching `*KEY*`, `*SECRET*`, `*TOKEN*`.
    #[serde(default)]
    pub ignore_default_excludes: bool,
    /// More names to drop (globs).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Variables to add (after the excludes).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// When non-empty, keep only names matching one of these globs (applied after `set`).
    #[serde(default)]
    pub include_only: Vec<String>,
}

/// `envPolicy.inherit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum EnvInherit {
    /// `PATH SHELL TMPDIR TEMP TMP HOME LANG LC_ALL LC_CTYPE LOGNAME USER` (names matched
    /// without regard to case).
    #[default]
    Core,
    /// Every variable of the server.
    All,
    /// Nothing.
    None,
}

/// Result of `process/start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StartResult {
    /// The id from the request.
    pub process_id: String,
    /// How each limit in force (requested or a server default) is enforced; absent when none
    /// is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AppliedLimits>,
}
