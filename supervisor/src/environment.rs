//! `environment/info`: the server user's shell (the reference protocol's answer), plus this
//! server's additions: its working directory, OS and architecture, what its sandbox can
//! enforce on this host, and how it contains and limits process trees here (decided at
//! startup, see [`crate::containment`]).
//!
//! The sandbox facts come from `sandbox-run --explain` (the helper the server runs sandboxed
//! commands with), asked once and kept: the server itself never probes or restricts itself.
//! A failed probe is reported in the answer (`sandbox.available: false` with the reason) and
//! asked again next time.

use std::path::{Path, PathBuf};

use proto::FileUri;
use proto::methods::environment::{ContainmentSupport, EnvironmentInfo, SandboxSupport, ShellInfo};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::limits::SANDBOX_PROBE_TIMEOUT;

/// The shell used when the user database and `$SHELL` name none that exists.
pub const FALLBACK_SHELL: &str = "/bin/sh";

/// What `environment/info` needs: the `sandbox-run` path and the probe's cached answer, and the
/// containment found at startup.
pub struct EnvironmentContext {
    sandbox_run: PathBuf,
    sandbox: OnceCell<SandboxSupport>,
    containment: ContainmentSupport,
}

/// Why the sandbox probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `sandbox-run` could not be started.
    #[error("cannot run {path} --explain: {source}")]
    Spawn {
        /// The helper.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// It did not answer in time.
    #[error("{path} --explain did not answer within SANDBOX_PROBE_TIMEOUT ({timeout:?})")]
    Timeout {
        /// The helper.
        path: PathBuf,
        /// The limit.
        timeout: std::time::Duration,
    },
    /// It answered something else than its `--explain` document.
    #[error("{path} --explain answered {status} with unreadable output: {reason}")]
    Output {
        /// The helper.
        path: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What was wrong.
        reason: String,
    },
}

impl EnvironmentContext {
    /// A context that asks `sandbox_run` about the host and reports `containment`.
    pub fn new(sandbox_run: PathBuf, containment: ContainmentSupport) -> Self {
        Self {
            sandbox_run,
            sandbox: OnceCell::new(),
            containment,
        }
    }

    async fn sandbox_support(&self) -> SandboxSupport {
        if let Some(known) = self.sandbox.get() {
            return known.clone();
        }
        match probe(&self.sandbox_run).await {
            Ok(support) => self.sandbox.get_or_init(|| async { support }).await.clone(),
            Err(error) => {
                tracing::warn!(%error, "environment/info: the sandbox probe failed");
                SandboxSupport {
                    available: false,
                    error: Some(error.to_string()),
                    ..SandboxSupport::default()
                }
            }
        }
    }
}

/// `environment/info`.
pub async fn info(context: &EnvironmentContext) -> EnvironmentInfo {
    EnvironmentInfo {
        shell: user_shell(),
        cwd: std::env::current_dir()
            .ok()
            .and_then(|cwd| FileUri::from_path(cwd).ok()),
        os: std::env::consts::OS.to_owned(),
        arch: std::env::consts::ARCH.to_owned(),
        sandbox: Some(context.sandbox_support().await),
        containment: Some(context.containment.clone()),
    }
}

/// The server user's shell: the user database's login shell, else `$SHELL`, else
/// [`FALLBACK_SHELL`]; each only if it exists.
pub fn user_shell() -> ShellInfo {
    let from_passwd = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|user| user.shell);
    let from_env = std::env::var_os("SHELL").map(PathBuf::from);
    let path = [from_passwd, from_env]
        .into_iter()
        .flatten()
        .find(|path| path.is_absolute() && path.is_file())
        .unwrap_or_else(|| PathBuf::from(FALLBACK_SHELL));
    shell_info(&path)
}

fn shell_info(path: &Path) -> ShellInfo {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sh".to_owned());
    ShellInfo {
        name,
        path: path.to_string_lossy().into_owned(),
    }
}

/// Ask `sandbox-run --explain` what a restricting policy would get on this host.
async fn probe(sandbox_run: &Path) -> Result<SandboxSupport, ProbeError> {
    let mut command = tokio::process::Command::new(sandbox_run);
    command
        .args(["--policy", "read-only", "--explain", "--", "true"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SANDBOX_PROBE_TIMEOUT, command.output())
        .await
        .map_err(|_| ProbeError::Timeout {
            path: sandbox_run.to_path_buf(),
            timeout: SANDBOX_PROBE_TIMEOUT,
        })?
        .map_err(|source| ProbeError::Spawn {
            path: sandbox_run.to_path_buf(),
            source,
        })?;
    let unreadable = |reason: String| ProbeError::Output {
        path: sandbox_run.to_path_buf(),
        status: output.status,
        reason,
    };
    if !output.status.success() {
        return Err(unreadable("it failed".into()));
    }
    let explain: Value =
        serde_json::from_slice(&output.stdout).map_err(|error| unreadable(error.to_string()))?;
    support_from_explain(&explain, nix::unistd::geteuid().is_root())
        .ok_or_else(|| unreadable("no layers.landlock.abi or layers.namespaces.available".into()))
}

/// Read the facts out of an `--explain` document.
fn support_from_explain(explain: &Value, root: bool) -> Option<SandboxSupport> {
    let layers = explain.get("layers")?;
    let abi = layers.get("landlock")?.get("abi")?.as_u64()?;
    let namespaces = layers.get("namespaces")?.get("available")?.as_bool()?;
    let unix_sockets = layers
        .get("unix_sockets")
        .and_then(|u| u.get("mechanism"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(SandboxSupport {
        available: true,
        landlock_abi: u32::try_from(abi).ok()?,
        user_namespaces: namespaces,
        audit_denials: root,
        network_modes: vec!["off".into(), "on".into()],
        unix_sockets,
        error: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn explain_layers_become_sandbox_support() {
        let explain = serde_json::json!({"layers": {
            "landlock": {"abi": 6, "filesystem": true},
            "namespaces": {"enabled": true, "available": false},
            "unix_sockets": {"mechanism": "seccomp-notify", "allowed": []},
        }});
        assert_eq!(
            support_from_explain(&explain, false),
            Some(SandboxSupport {
                available: true,
                landlock_abi: 6,
                user_namespaces: false,
                audit_denials: false,
                network_modes: vec!["off".into(), "on".into()],
                unix_sockets: Some("seccomp-notify".into()),
                error: None,
            })
        );
        assert_eq!(support_from_explain(&serde_json::json!({}), true), None);
    }

    #[test]
    fn shell_name_is_the_file_name() {
        assert_eq!(
            shell_info(Path::new("/usr/bin/zsh")),
            ShellInfo {
                name: "zsh".into(),
                path: "/usr/bin/zsh".into()
            }
        );
    }
}
