//! What `exec` asks for, from its arguments alone (pure: unit-tested): the server to connect to
//! and the `process/start` parameters, with the sandbox policy built from `--sandbox` and the
//! policy flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proto::FileUri;
use proto::methods::process::StartParams;

use super::{ExecCommandError, FALLBACK_PATH, FALLBACK_TERM, FORWARDED_ENV};
use crate::cli::ExecArgs;
use crate::client::{ExecServerClientConnectOptions, RemoteExecServerConnectArgs};

/// Where `exec` connects.
#[derive(Debug, Clone)]
pub enum ExecTarget {
    /// A local server over `ws://` or `unix:` (`--connect`).
    Local(ExecServerClientConnectOptions),
    /// A remote environment through a registry and rendezvous (`--remote`).
    Remote(RemoteExecServerConnectArgs),
}

/// How long a server keeps exec's session after its connection is gone: enough for exec to
/// reconnect and resume after a dropped connection, short enough that a killed exec (SIGKILL,
/// which it cannot catch) does not leave its command running for the server's whole TTL.
pub const LOCAL_DETACHED_TTL: std::time::Duration = std::time::Duration::from_secs(3);
/// How long an executor keeps exec's session after its relay stream is gone: enough to resume
/// over a new stream when the rendezvous socket drops, short enough that a killed exec does not
/// leave its command running for the executor's whole TTL.
pub const REMOTE_DETACHED_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// Client name `exec` gives in `initialize`.
const CLIENT_NAME: &str = "exec-server exec";

/// Choose the server from the arguments: `--connect` with the `--token-file` token, or
/// `--remote`/`--environment-id` with the `--token-file` token or else `registry_env_token`
/// (the value of `$EXECWARD_REGISTRY_TOKEN`). Pure: unit-tested.
///
/// # Errors
/// [`ExecCommandError::MissingRegistryToken`] for `--remote` without a token,
/// [`ExecCommandError::NoServer`] when neither is given.
pub fn exec_target(
    args: &ExecArgs,
    file_token: Option<String>,
    registry_env_token: Option<String>,
) -> Result<ExecTarget, ExecCommandError> {
    match (&args.connect, &args.remote, &args.environment_id) {
        (Some(url), _, _) => Ok(ExecTarget::Local(
            ExecServerClientConnectOptions::new(url.clone())
                .with_auth_token(file_token)
                .with_ca_file(args.ca_file.clone())
                .with_client_name(CLIENT_NAME)
                // When exec goes (killed, even by SIGKILL), its command follows shortly.
                .with_detached_session_ttl(LOCAL_DETACHED_TTL),
        )),
        (None, Some(registry_url), Some(environment_id)) => {
            let token = file_token
                .or_else(|| {
                    registry_env_token
                        .map(|token| token.trim().to_owned())
                        .filter(|token| !token.is_empty())
                })
                .ok_or(ExecCommandError::MissingRegistryToken)?;
            let registration_wait = std::time::Duration::try_from_secs_f64(args.registration_wait)
                .map_err(|_| ExecCommandError::RegistrationWait(args.registration_wait))?;
            let executor_key = args
                .executor_key
                .as_deref()
                .map(crate::relay::registry::decode_public_key)
                .transpose()
                .map_err(ExecCommandError::ExecutorKey)?;
            Ok(ExecTarget::Remote(
                RemoteExecServerConnectArgs::new(
                    registry_url.clone(),
                    environment_id.clone(),
                    token,
                )
                .with_client_name(CLIENT_NAME)
                .with_ca_file(args.ca_file.clone())
                .with_executor_key(executor_key)
                .with_registration_wait(registration_wait)
                .with_detached_session_ttl(REMOTE_DETACHED_TTL),
            ))
        }
        _ => Err(ExecCommandError::NoServer),
    }
}

/// Build `process/start` params from the arguments, the local environment and the local
/// current directory (pure: unit-tested).
///
/// # Errors
/// [`ExecCommandError::InvalidEnv`], [`ExecCommandError::Cwd`].
pub fn start_params(
    args: &ExecArgs,
    local_env: impl IntoIterator<Item = (String, String)>,
    local_cwd: &Option<PathBuf>,
) -> Result<StartParams, ExecCommandError> {
    let mut env = BTreeMap::new();
    if !args.clear_env {
        env.extend(
            local_env
                .into_iter()
                .filter(|(key, _)| FORWARDED_ENV.contains(&key.as_str())),
        );
        env.entry("PATH".to_owned())
            .or_insert_with(|| FALLBACK_PATH.to_owned());
    }
    for pair in &args.env {
        match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                env.insert(key.to_owned(), value.to_owned());
            }
            _ => return Err(ExecCommandError::InvalidEnv(pair.clone())),
        }
    }
    if args.tty {
        env.entry("TERM".to_owned())
            .or_insert_with(|| FALLBACK_TERM.to_owned());
    }
    let cwd = cwd_uri(args.cwd.as_deref(), local_cwd)?;
    // The command's working directory is the sandbox's workspace: profiles such as
    // workspace-write need one, and the server never guesses it.
    let sandbox = args
        .sandbox
        .as_deref()
        .map(|text| {
            let object = sandbox_object(text, &cwd, local_cwd)?;
            with_policy_flags(object, args, &cwd).map_err(|reason| ExecCommandError::Sandbox {
                value: text.to_owned(),
                reason,
            })
        })
        .transpose()?;
    let mut params = StartParams::new(
        format!("exec-{}", uuid::Uuid::new_v4()),
        args.command.clone(),
        cwd,
    )
    .with_env(env)
    .with_tty(args.tty)
    .with_pipe_stdin(!args.tty);
    if let Some(sandbox) = sandbox {
        params = params.with_sandbox(sandbox);
    }
    if let Some(limits) = &args.limits {
        params = params.with_limits(limits.clone());
    }
    if args.audit {
        params = params.with_audit_denials(true);
    }
    Ok(params)
}

/// The wire `sandbox` object for `--sandbox`: a built-in profile name, a profile file (read
/// here, sent as `profileToml`, its paths resolved where the command runs), or a JSON sandbox
/// object (as `sandbox-run --policy` takes), each with the command's cwd as its workspace unless
/// the object names one.
///
/// # Errors
/// [`ExecCommandError::Sandbox`] for invalid JSON, a JSON value that is not an object, or a
/// profile file that cannot be read or does not parse.
pub fn sandbox_object(
    text: &str,
    cwd: &FileUri,
    local_cwd: &Option<PathBuf>,
) -> Result<serde_json::Value, ExecCommandError> {
    let error = |reason: String| ExecCommandError::Sandbox {
        value: text.to_owned(),
        reason,
    };
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let mut object = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(object)) => object,
            Ok(_) => return Err(error("a JSON sandbox object must be an object".into())),
            Err(err) => return Err(error(format!("not valid JSON: {err}"))),
        };
        object
            .entry("cwd")
            .or_insert_with(|| serde_json::Value::String(cwd.to_uri_string()));
        return Ok(serde_json::Value::Object(object));
    }
    if text.contains('/') || text.ends_with(".toml") {
        let path = match local_cwd {
            Some(base) => base.join(text),
            None => PathBuf::from(text),
        };
        let toml = std::fs::read_to_string(&path)
            .map_err(|err| error(format!("cannot read the profile file: {err}")))?;
        // Parsed here too, so a mistake is reported before anything is sent.
        sandbox::policy::ProfileFile::parse(&toml, &path.display().to_string())
            .map_err(|err| error(err.to_string()))?;
        return Ok(serde_json::json!({ "profileToml": toml, "cwd": cwd.to_uri_string() }));
    }
    Ok(serde_json::json!({ "profile": text, "cwd": cwd.to_uri_string() }))
}

/// `object` with exec's policy flags applied as the wire keys `sandbox-run`'s flags map to:
/// `--writable-root` (`writableRoots`, inside a `profile` object or beside `permissions` and
/// `profileToml`), `--allow` (`allowances`), `--deny` (`denyPaths`), `--allow-network`,
/// `--allow-domain`/`--deny-domain` (`network`), `--allow-credential-store`
/// (`readableCredentialStores`). Relative paths are taken relative to the command's cwd on the
/// server.
///
/// # Errors
/// What is wrong, for a flag the object's shape cannot take.
pub fn with_policy_flags(
    mut object: serde_json::Value,
    args: &ExecArgs,
    cwd: &FileUri,
) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    let serde_json::Value::Object(map) = &mut object else {
        return Err("a sandbox object must be a JSON object".into());
    };
    let remote = |path: &str| {
        let path = Path::new(path);
        let absolute = if path.is_absolute() {
            path.to_owned()
        } else {
            cwd.as_path().join(path)
        };
        Value::String(absolute.display().to_string())
    };
    let append = |map: &mut serde_json::Map<String, Value>, key: &str, items: Vec<Value>| {
        if items.is_empty() {
            return Ok(());
        }
        match map
            .entry(key.to_owned())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(existing) => {
                existing.extend(items);
                Ok(())
            }
            other => Err(format!(
                "the object's {key:?} must be an array (got {other})"
            )),
        }
    };
    if !args.writable_roots.is_empty() {
        let takes_roots = ["profile", "permissions", "profileToml"]
            .iter()
            .any(|key| map.contains_key(*key));
        if !takes_roots {
            return Err(
                "--writable-root needs a profile name, a profile file or a `permissions` object \
                 (a legacy `type` object names its own writableRoots)"
                    .into(),
            );
        }
        append(
            map,
            "writableRoots",
            args.writable_roots.iter().map(|p| remote(p)).collect(),
        )?;
    }
    append(
        map,
        "allowances",
        args.allowances.iter().cloned().map(Value::String).collect(),
    )?;
    append(
        map,
        "denyPaths",
        args.denies.iter().map(|p| remote(p)).collect(),
    )?;
    append(
        map,
        "readableCredentialStores",
        args.allow_credential_stores
            .iter()
            .cloned()
            .map(Value::String)
            .collect(),
    )?;
    if args.allow_network {
        map.insert("network".into(), Value::String("on".into()));
    }
    if !args.allow_domains.is_empty() || !args.deny_domains.is_empty() {
        let network = map
            .entry("network".to_owned())
            .or_insert_with(|| serde_json::json!({}));
        if !network.is_object() {
            // "off" or "on" beside domains: the allowlist is what was asked for.
            *network = serde_json::json!({});
        }
        if let Value::Object(network) = network {
            let strings = |items: &[String]| items.iter().cloned().map(Value::String).collect();
            append(network, "allow", strings(&args.allow_domains))?;
            append(network, "deny", strings(&args.deny_domains))?;
        }
    }
    Ok(object)
}

fn cwd_uri(cwd: Option<&str>, local_cwd: &Option<PathBuf>) -> Result<FileUri, ExecCommandError> {
    let error = |path: &str, reason: String| ExecCommandError::Cwd {
        path: path.to_owned(),
        reason,
    };
    match cwd {
        Some(text) if text.starts_with("file:") => {
            serde_json::from_value(serde_json::Value::String(text.to_owned()))
                .map_err(|e| error(text, e.to_string()))
        }
        Some(text) => {
            let path = Path::new(text);
            let path = match (path.is_absolute(), local_cwd) {
                (true, _) => path.to_owned(),
                (false, Some(base)) => base.join(path),
                (false, None) => {
                    return Err(error(
                        text,
                        "a relative directory needs a current directory".into(),
                    ));
                }
            };
            FileUri::from_path(&path).map_err(|e| error(text, e.to_string()))
        }
        None => {
            let Some(base) = local_cwd else {
                return Err(error(
                    ".",
                    "the current directory is unknown; pass --cwd".into(),
                ));
            };
            FileUri::from_path(base).map_err(|e| error(&base.display().to_string(), e.to_string()))
        }
    }
}
