//! Length caps on what a `process/start` carries, checked before any work (before the id is
//! reserved, a policy resolved or a `PATH` searched), and what a started process will cost in
//! descriptors.

use std::collections::BTreeMap;

use proto::methods::process::StartParams;

use super::ProcessError;
use crate::limits::{MAX_ARG_BYTES, MAX_ARGV_ENV_BYTES, MAX_PATH_SEARCH_BYTES};

/// `envPolicy` patterns (`exclude` and `includeOnly` together) one start may carry: each is
/// matched against every server variable.
pub const MAX_ENV_POLICY_PATTERNS: usize = 1024;

/// Check the sizes of `argv`, `arg0`, `env` and `envPolicy`.
///
/// # Errors
/// [`ProcessError::TooLong`] naming the field and its limit.
pub fn check_start(params: &StartParams) -> Result<(), ProcessError> {
    let too_long = |field: String, length: usize, limit: usize, limit_name: &'static str| {
        Err(ProcessError::TooLong {
            field,
            length,
            limit,
            limit_name,
        })
    };
    let mut total = 0usize;
    for (index, arg) in params.argv.iter().enumerate() {
        if arg.len() > MAX_ARG_BYTES {
            return too_long(
                format!("argv[{index}]"),
                arg.len(),
                MAX_ARG_BYTES,
                "MAX_ARG_BYTES",
            );
        }
        total += arg.len() + 1;
    }
    if let Some(arg0) = &params.arg0 {
        if arg0.len() > MAX_ARG_BYTES {
            return too_long("arg0".into(), arg0.len(), MAX_ARG_BYTES, "MAX_ARG_BYTES");
        }
        total += arg0.len() + 1;
    }
    total += env_bytes(&params.env, "env")?;
    if let Some(policy) = &params.env_policy {
        total += env_bytes(&policy.set, "envPolicy.set")?;
        let patterns = policy.exclude.len() + policy.include_only.len();
        if patterns > MAX_ENV_POLICY_PATTERNS {
            return too_long(
                "envPolicy.exclude and envPolicy.includeOnly (patterns)".into(),
                patterns,
                MAX_ENV_POLICY_PATTERNS,
                "MAX_ENV_POLICY_PATTERNS",
            );
        }
        for pattern in policy.exclude.iter().chain(&policy.include_only) {
            if pattern.len() > MAX_ARG_BYTES {
                return too_long(
                    "an envPolicy pattern".into(),
                    pattern.len(),
                    MAX_ARG_BYTES,
                    "MAX_ARG_BYTES",
                );
            }
            total += pattern.len() + 1;
        }
    }
    if total > MAX_ARGV_ENV_BYTES {
        return too_long(
            "argv, env and envPolicy together".into(),
            total,
            MAX_ARGV_ENV_BYTES,
            "MAX_ARGV_ENV_BYTES",
        );
    }
    Ok(())
}

fn env_bytes(env: &BTreeMap<String, String>, field: &str) -> Result<usize, ProcessError> {
    let mut total = 0;
    for (name, value) in env {
        let length = name.len() + 1 + value.len();
        if length > MAX_ARG_BYTES {
            return Err(ProcessError::TooLong {
                field: format!("{field} variable {}", crate::untrusted::Untrusted(name)),
                length,
                limit: MAX_ARG_BYTES,
                limit_name: "MAX_ARG_BYTES",
            });
        }
        total += length + 1;
    }
    Ok(total)
}

/// Check the `PATH` the program will be searched in (the child's final environment), when the
/// program is named without a `/`.
///
/// # Errors
/// [`ProcessError::TooLong`] past [`MAX_PATH_SEARCH_BYTES`].
pub fn check_path_search(
    program: &str,
    env: &BTreeMap<String, String>,
) -> Result<(), ProcessError> {
    match env.get("PATH") {
        Some(path) if !program.contains('/') && path.len() > MAX_PATH_SEARCH_BYTES => {
            Err(ProcessError::TooLong {
                field: "PATH (searched for the program)".into(),
                length: path.len(),
                limit: MAX_PATH_SEARCH_BYTES,
                limit_name: "MAX_PATH_SEARCH_BYTES",
            })
        }
        _ => Ok(()),
    }
}

/// Descriptors the server holds for a running process: stdout, stderr and the pidfd (stdin too
/// with `pipeStdin`), or the terminal and the pidfd; plus the audit pipe.
pub fn descriptors_of(params: &StartParams) -> usize {
    let io = if params.tty {
        2
    } else {
        3 + usize::from(params.pipe_stdin)
    };
    io + usize::from(params.audit_denials)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(argv: &[&str]) -> StartParams {
        serde_json::from_value(serde_json::json!({
            "processId": "p", "argv": argv, "cwd": "file:///tmp"
        }))
        .unwrap()
    }

    #[test]
    fn ordinary_starts_pass() {
        let mut start = params(&["/bin/sh", "-c", "echo hi"]);
        start.env.insert("PATH".into(), "/usr/bin:/bin".into());
        check_start(&start).unwrap();
        check_path_search("sh", &start.env).unwrap();
    }

    #[test]
    fn one_long_argument_value_or_pattern_is_refused_by_name() {
        let long = "x".repeat(MAX_ARG_BYTES + 1);
        let error = check_start(&params(&["/bin/echo", &long])).unwrap_err();
        assert!(error.to_string().contains("argv[1]"), "{error}");
        let mut start = params(&["/bin/true"]);
        start.env.insert("PATH".into(), long.clone());
        let error = check_start(&start).unwrap_err();
        assert!(error.to_string().contains("MAX_ARG_BYTES"), "{error}");
        let mut start = params(&["/bin/true"]);
        start.env_policy = Some(proto::methods::process::EnvPolicy {
            exclude: vec!["*".into(); MAX_ENV_POLICY_PATTERNS + 1],
            ..Default::default()
        });
        let error = check_start(&start).unwrap_err();
        assert!(
            error.to_string().contains("MAX_ENV_POLICY_PATTERNS"),
            "{error}"
        );
    }

    #[test]
    fn many_short_arguments_are_refused_in_total() {
        let arg = "y".repeat(1000);
        let argv: Vec<&str> =
            std::iter::repeat_n(arg.as_str(), MAX_ARGV_ENV_BYTES / 1000 + 1).collect();
        let error = check_start(&params(&argv)).unwrap_err();
        assert!(error.to_string().contains("MAX_ARGV_ENV_BYTES"), "{error}");
    }

    #[test]
    fn a_long_path_is_refused_only_when_it_would_be_searched() {
        let env = BTreeMap::from([("PATH".to_owned(), ":".repeat(MAX_PATH_SEARCH_BYTES + 1))]);
        assert!(check_path_search("ls", &env).is_err());
        check_path_search("/bin/ls", &env).unwrap();
    }

    #[test]
    fn descriptors_follow_the_io_mode() {
        let mut start = params(&["/bin/true"]);
        assert_eq!(descriptors_of(&start), 3);
        start.pipe_stdin = true;
        assert_eq!(descriptors_of(&start), 4);
        start.tty = true;
        start.audit_denials = true;
        assert_eq!(descriptors_of(&start), 3);
    }
}
