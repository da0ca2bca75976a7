//! `envPolicy` of `process/start`: the child's environment built from the server's own.
//!
//! Order (the reference's): inherit (`core`, `all`, `none`) → default excludes (`*KEY*`,
//! `*SECRET*`, `*TOKEN*`, unless `ignoreDefaultExcludes`) → `exclude` → `set` → `includeOnly`
//! (when non-empty) → the request's `env` laid over the result. Without a policy the child gets
//! exactly `env`. Names are matched without regard to ASCII case; values are never looked at.
//! One addition to the reference: the server's own `EXECWARD_*` variables (its configuration and
//! credentials) are never inherited, whatever `inherit` and `ignoreDefaultExcludes` say.
//!
//! [`child_env`] is pure (the server's variables come in as an argument) so every step can be
//! tested without touching the process environment.

use std::collections::BTreeMap;

use proto::methods::process::{EnvInherit, EnvPolicy};

/// `inherit: "core"` on Unix: what a shell and most programs need to start.
pub const CORE_VARIABLES: &[&str] = &[
    "PATH", "SHELL", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME",
    "USER",
];

/// Names dropped unless `ignoreDefaultExcludes`: the usual shapes of credentials.
pub const DEFAULT_EXCLUDES: &[&str] = &["*KEY*", "*SECRET*", "*TOKEN*"];

/// The server's own configuration and credentials (`EXECWARD_REGISTRY_TOKEN`, ...): never
/// inherited, whatever the policy says (a request may still `set` such a name explicitly).
pub const NEVER_INHERITED: &str = "EXECWARD_*";

/// The child's environment: `env` alone without a policy, else the policy applied to
/// `server_env` with `env` laid over it.
pub fn child_env(
    policy: Option<&EnvPolicy>,
    server_env: impl IntoIterator<Item = (String, String)>,
    env: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let Some(policy) = policy else {
        return env;
    };
    let inheritable = server_env
        .into_iter()
        .filter(|(name, _)| !matches_any(name, &[NEVER_INHERITED]));
    let mut result: BTreeMap<String, String> = match policy.inherit {
        EnvInherit::All => inheritable.collect(),
        EnvInherit::None => BTreeMap::new(),
        EnvInherit::Core => inheritable
            .filter(|(name, _)| {
                CORE_VARIABLES
                    .iter()
                    .any(|core| core.eq_ignore_ascii_case(name))
            })
            .collect(),
    };
    if !policy.ignore_default_excludes {
        result.retain(|name, _| !matches_any(name, DEFAULT_EXCLUDES));
    }
    result.retain(|name, _| !matches_any(name, &policy.exclude));
    result.extend(policy.set.clone());
    if !policy.include_only.is_empty() {
        result.retain(|name, _| matches_any(name, &policy.include_only));
    }
    result.extend(env);
    result
}

/// The server's own environment, as strings (variables whose name or value is not UTF-8 cannot
/// travel in a JSON-RPC `env` either and are left out).
pub fn server_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
}

fn matches_any(name: &str, patterns: &[impl AsRef<str>]) -> bool {
    patterns
        .iter()
        .any(|pattern| glob_matches(pattern.as_ref().as_bytes(), name.as_bytes()))
}

/// `*` matches any run of bytes, `?` one byte, anything else itself without regard to ASCII
/// case. Iterative with one backtrack point, so a pattern costs O(pattern × name) at worst.
fn glob_matches(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == b'?' || c.eq_ignore_ascii_case(&name[n]) => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        vars(pairs).into_iter().collect()
    }

    const SERVER: &[(&str, &str)] = &[
        ("PATH", "/usr/bin"),
        ("HOME", "/root"),
        ("lang", "C.UTF-8"),
        ("EDITOR", "vi"),
        ("OPENAI_API_KEY", "sk"),
        ("GH_TOKEN", "ghp"),
        ("aws_secret_access", "x"),
        ("MY_APP_MODE", "prod"),
    ];

    #[test]
    fn without_a_policy_the_child_gets_exactly_env() {
        let env = map(&[("A", "1")]);
        assert_eq!(child_env(None, vars(SERVER), env.clone()), env);
    }

    #[test]
    fn core_keeps_core_names_in_any_case_and_drops_the_rest() {
        let policy = EnvPolicy::default();
        assert_eq!(
            child_env(Some(&policy), vars(SERVER), BTreeMap::new()),
            map(&[("HOME", "/root"), ("PATH", "/usr/bin"), ("lang", "C.UTF-8")])
        );
    }

    #[test]
    fn all_drops_default_excludes_without_regard_to_case() {
        let policy = EnvPolicy {
            inherit: EnvInherit::All,
            ..EnvPolicy::default()
        };
        assert_eq!(
            child_env(Some(&policy), vars(SERVER), BTreeMap::new()),
            map(&[
                ("EDITOR", "vi"),
                ("HOME", "/root"),
                ("MY_APP_MODE", "prod"),
                ("PATH", "/usr/bin"),
                ("lang", "C.UTF-8"),
            ])
        );
    }

    #[test]
    fn ignore_default_excludes_keeps_credentials() {
        let policy = EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: true,
            ..EnvPolicy::default()
        };
        let result = child_env(Some(&policy), vars(SERVER), BTreeMap::new());
        assert_eq!(result, vars(SERVER).into_iter().collect());
    }

    #[test]
    fn the_servers_own_credentials_are_never_inherited() {
        let policy = EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: true,
            ..EnvPolicy::default()
        };
        let server = vars(&[
            ("EXECWARD_REGISTRY_TOKEN", "t"),
            ("execward_x", "y"),
            ("A", "1"),
        ]);
        assert_eq!(
            child_env(Some(&policy), server, BTreeMap::new()),
            map(&[("A", "1")])
        );
    }

    #[test]
    fn exclude_set_include_only_and_env_apply_in_order() {
        let policy = EnvPolicy {
            inherit: EnvInherit::All,
            ignore_default_excludes: false,
            exclude: vec!["ed?tor".into(), "*_MODE".into()],
            set: map(&[("SET_BY_POLICY", "1"), ("DROPPED_BY_INCLUDE", "1")]),
            include_only: vec!["PATH".into(), "set_*".into(), "HOME".into()],
        };
        let env = map(&[("HOME", "/overlay"), ("EXTRA", "from-env")]);
        assert_eq!(
            child_env(Some(&policy), vars(SERVER), env),
            map(&[
                ("EXTRA", "from-env"),
                ("HOME", "/overlay"),
                ("PATH", "/usr/bin"),
                ("SET_BY_POLICY", "1"),
            ])
        );
    }

    #[test]
    fn none_starts_empty_and_env_still_applies() {
        let policy = EnvPolicy {
            inherit: EnvInherit::None,
            set: map(&[("A_TOKEN", "kept: set comes after the excludes")]),
            ..EnvPolicy::default()
        };
        assert_eq!(
            child_env(Some(&policy), vars(SERVER), map(&[("B", "2")])),
            map(&[
                ("A_TOKEN", "kept: set comes after the excludes"),
                ("B", "2")
            ])
        );
    }

    #[test]
    fn globs_match_star_question_mark_and_case() {
        for (pattern, name, expected) in [
            ("*KEY*", "OPENAI_API_KEY", true),
            ("*KEY*", "key", true),
            ("*KEY*", "KE", false),
            ("a*b*c", "AxxBxxC", true),
            ("a*b*c", "axxbxx", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("**x", "yyx", true),
        ] {
            assert_eq!(
                glob_matches(pattern.as_bytes(), name.as_bytes()),
                expected,
                "{pattern:?} vs {name:?}"
            );
        }
    }
}
