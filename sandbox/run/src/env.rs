//! The command's environment under `sandbox-run`: the caller's, less what looks like a secret.
//!
//! The same default filter as exec-server's `envPolicy`: names containing `KEY`, `SECRET` or
//! `TOKEN` (without regard to ASCII case) are dropped, and so is the server's own `EXECWARD_*`
//! configuration. Then, in order: `--clearenv` starts from nothing instead; `--env NAME` passes
//! the caller's `NAME` through even when the filter dropped it; `--unsetenv NAME` removes a
//! name; `--setenv NAME=VALUE` sets one. A CI job with `GITHUB_TOKEN` in its environment and
//! `github.com` allowed would otherwise hand the token to the command it is sandboxing.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

/// Substrings (compared in upper case) that mark a name as a credential.
pub const SECRET_NAME_PARTS: &[&str] = &["KEY", "SECRET", "TOKEN"];
/// Prefix of exec-server's own configuration and credentials: never passed on by default.
pub const SERVER_PREFIX: &str = "EXECWARD_";

/// What the command line says about the command's environment.
#[derive(Clone, Debug, Default)]
pub struct EnvFlags {
    /// `--clearenv`: start from an empty environment.
    pub clear: bool,
    /// `--env NAME`: pass these names through from the caller's environment.
    pub keep: Vec<OsString>,
    /// `--unsetenv NAME`.
    pub unset: Vec<OsString>,
    /// `--setenv NAME=VALUE`.
    pub set: Vec<(OsString, OsString)>,
}

/// Whether the default filter drops `name`.
pub fn filtered_by_default(name: &OsStr) -> bool {
    let upper = name.as_bytes().to_ascii_uppercase();
    upper.starts_with(SERVER_PREFIX.as_bytes())
        || SECRET_NAME_PARTS
            .iter()
            .any(|part| upper.windows(part.len()).any(|w| w == part.as_bytes()))
}

/// The command's environment built from `caller` (the caller's variables, in order).
pub fn command_env(
    caller: impl IntoIterator<Item = (OsString, OsString)>,
    flags: &EnvFlags,
) -> Vec<(OsString, OsString)> {
    let caller: Vec<(OsString, OsString)> = caller.into_iter().collect();
    let mut env: Vec<(OsString, OsString)> = if flags.clear {
        Vec::new()
    } else {
        caller
            .iter()
            .filter(|(name, _)| !filtered_by_default(name))
            .cloned()
            .collect()
    };
    for name in &flags.keep {
        if let Some((_, value)) = caller.iter().find(|(n, _)| n == name) {
            set(&mut env, name.clone(), value.clone());
        }
    }
    env.retain(|(name, _)| !flags.unset.contains(name));
    for (name, value) in &flags.set {
        set(&mut env, name.clone(), value.clone());
    }
    env
}

fn set(env: &mut Vec<(OsString, OsString)>, name: OsString, value: OsString) {
    match env.iter_mut().find(|(n, _)| *n == name) {
        Some(entry) => entry.1 = value,
        None => env.push((name, value)),
    }
}

/// `--setenv`'s value: `NAME=VALUE` with a non-empty name.
///
/// # Errors
/// A message showing the expected form.
pub fn parse_assignment(text: &str) -> Result<(OsString, OsString), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.into(), value.into())),
        _ => Err(format!("expected NAME=VALUE (got {text:?})")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn secrets_and_server_variables_are_dropped_by_default() {
        let caller = vars(&[
            ("PATH", "/bin"),
            ("MY_SECRET_TOKEN", "s"),
            ("GITHUB_TOKEN", "t"),
            ("aws_access_key_id", "k"),
            ("EXECWARD_REGISTRY_TOKEN", "r"),
            ("execward_x", "r"),
            ("HOME", "/root"),
        ]);
        let env = command_env(caller, &EnvFlags::default());
        assert_eq!(env, vars(&[("PATH", "/bin"), ("HOME", "/root")]));
    }

    #[test]
    fn env_lifts_one_name_unset_removes_and_setenv_sets_last() {
        let caller = vars(&[("PATH", "/bin"), ("GITHUB_TOKEN", "t"), ("LANG", "C")]);
        let flags = EnvFlags {
            clear: false,
            keep: vec!["GITHUB_TOKEN".into(), "ABSENT".into()],
            unset: vec!["LANG".into()],
            set: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("NEW".into(), "1".into()),
            ],
        };
        let env = command_env(caller, &flags);
        assert_eq!(
            env,
            vars(&[("PATH", "/usr/bin"), ("GITHUB_TOKEN", "t"), ("NEW", "1")])
        );
    }

    #[test]
    fn clearenv_keeps_only_what_is_named() {
        let caller = vars(&[("PATH", "/bin"), ("HOME", "/root")]);
        let flags = EnvFlags {
            clear: true,
            keep: vec!["PATH".into()],
            ..EnvFlags::default()
        };
        assert_eq!(command_env(caller, &flags), vars(&[("PATH", "/bin")]));
    }

    #[test]
    fn setenv_needs_a_name_and_an_equals_sign() {
        assert_eq!(
            parse_assignment("A=b=c").unwrap(),
            ("A".into(), "b=c".into())
        );
        assert!(parse_assignment("=x").unwrap_err().contains("NAME=VALUE"));
        assert!(parse_assignment("novalue").is_err());
    }
}
