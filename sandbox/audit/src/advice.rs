//! "The policy rule that would allow it": a pure function of the resolved policy and a denial.
//!
//! The advice names the rule that actually decided, so it says what to change:
//! - no rule covers the path (a path no rule covers is denied): add a `read` (or `write`) rule;
//! - a `deny` entry covers it: remove that entry (named, with the path it covers);
//! - a protected path (`.git`, `.agents`, `.codex` in a writable root) covers it;
//! - a path the supervisor hides (its socket, token, keys) or keeps read-only (its binaries):
//!   no policy allows it;
//! - a read-only rule covers it: make it (or the directory) writable;
//! - seccomp: the JSON file and rule that refuse the call; network: `network = true`;
//! - unexplained refusals: what can cause them.
//!
//! Each names a profile-file line (`policies/README.md`, "Profile files") and the `sandbox-run`
//! flag with the same effect when there is one.

use std::path::{Path, PathBuf};

use sandbox::denial::Layer;
use sandbox::linux::seccomp;
use sandbox::linux::seccomp_policy::Filter;
use sandbox::policy::{
    Access, Allowance, AllowanceBases, BUILTIN_ALLOWANCES, PathRule, ResolvedPolicy,
};

/// Computes advice for one run: the policy and the parsed seccomp filters, parsed once (a flood
/// of seccomp denials must not parse the JSON policies once each).
#[derive(Debug)]
pub struct Advisor {
    policy: ResolvedPolicy,
    filters: Vec<(String, Filter)>,
    /// Hidden paths that came from `sandbox-run --deny` (the rest are the supervisor's own).
    cli_denied: Vec<PathBuf>,
    /// Where the named allowances' paths point (`policies/allowances/`): a write one of them
    /// covers is answered with that allowance.
    bases: AllowanceBases,
}

impl Advisor {
    /// An advisor for `policy`.
    pub fn new(policy: ResolvedPolicy) -> Self {
        let variant = seccomp::Variant {
            network_allowed: true,
            audit: true,
        };
        Self {
            policy,
            filters: seccomp::filters_for(variant).unwrap_or_default(),
            cli_denied: Vec::new(),
            bases: AllowanceBases::from_env(),
        }
    }

    /// Resolve the allowances' paths from `bases` instead of this process's environment.
    pub fn with_allowance_bases(mut self, bases: AllowanceBases) -> Self {
        self.bases = bases;
        self
    }

    /// Says which hidden paths of the policy are `sandbox-run --deny PATH`s (absolute, as the
    /// policy holds them) rather than the supervisor's own files: their advice is to drop the
    /// flag.
    pub fn with_cli_denied(mut self, paths: Vec<PathBuf>) -> Self {
        self.cli_denied = paths;
        self
    }

    /// The policy the advice is about.
    pub fn policy(&self) -> &ResolvedPolicy {
        &self.policy
    }

    /// The rule that would allow `operation` on `path` (refused by `layer`, with `errno` when
    /// the syscall's error is known), or why none would.
    pub fn allow_rule(
        &self,
        layer: Layer,
        operation: &str,
        path: Option<&str>,
        errno: Option<&str>,
    ) -> String {
        let policy = &self.policy;
        if layer == Layer::Unexplained {
            return unexplained_reason(
                policy,
                &self.cli_denied,
                &self.bases,
                operation,
                path,
                errno,
            );
        }
        if operation.starts_with("net.") || operation == "socket" || operation == "socketpair" {
            return "network = true (sandbox-run --allow-network)".to_owned();
        }
        if layer == Layer::Seccomp {
            return self.seccomp_reason(operation);
        }
        if operation.starts_with("scope.") {
            return "none: processes outside the sandbox cannot be signalled or reached through \
                    abstract sockets under any restricting policy"
                .to_owned();
        }
        let Some(path) = path.map(PathBuf::from) else {
            return "unknown: the kernel record names no path".to_owned();
        };
        path_reason(policy, &self.cli_denied, &self.bases, operation, &path)
    }

    fn seccomp_reason(&self, syscall: &str) -> String {
        let rule_in = |part: &str| {
            self.filters
                .iter()
                .filter(|(name, _)| name == part)
                .flat_map(|(_, filter)| filter.filter.iter())
                .find(|rule| rule.syscall == syscall)
        };
        if let Some(rule) = rule_in("restrictions") {
            let when = if rule.args.is_empty() {
                "under every restricting policy"
            } else {
                "with the arguments its rule names"
            };
            return format!(
                "none: policies/seccomp/restrictions.json refuses {syscall} {when} ({})",
                rule.comment
            );
        }
        if let Some(rule) = rule_in("audit") {
            return format!(
                "none: policies/seccomp/audit.json refuses {syscall} while the denial audit runs \
                 ({}); the report is marked incomplete",
                rule.comment
            );
        }
        match rule_in("allow") {
            Some(rule) => format!(
                "none: {syscall} is allowed ({}); refused here by another layer",
                rule.comment
            ),
            None => format!(
                "none: {syscall} is not on the reviewed allow-list (policies/seccomp/allow.json); \
                 unlisted calls get ENOSYS"
            ),
        }
    }
}

/// Advice for a filesystem denial of `operation` on `path`.
fn path_reason(
    policy: &ResolvedPolicy,
    cli_denied: &[PathBuf],
    bases: &AllowanceBases,
    operation: &str,
    path: &Path,
) -> String {
    let wants_write = !matches!(
        operation,
        "fs.read_file" | "fs.read_dir" | "fs.execute" | "fs.ioctl_dev"
    );
    // Make/remove operations name the directory (Landlock's convention, which the mount layer
    // follows); other paths are the object itself.
    let dir = if is_directory_operation(operation) {
        path.to_path_buf()
    } else {
        path.parent().map_or(path.to_path_buf(), Path::to_path_buf)
    };
    if let Some(hidden) = covering(policy.hidden_paths(), path) {
        if cli_denied.iter().any(|denied| denied == hidden) {
            return format!(
                "remove --deny {h} (sandbox-run's command line hides {h}, which covers {p})",
                h = hidden.display(),
                p = path.display()
            );
        }
        return format!(
            "none: {} is hidden from every sandbox (the supervisor's own socket, token or key \
             file, added to every policy it resolves); no policy exposes it",
            hidden.display()
        );
    }
    if wants_write && let Some(kept) = covering(policy.read_only_paths(), path) {
        return format!(
            "none: {} is kept read-only in every sandbox (the supervisor's own binaries); no \
             policy makes it writable",
            kept.display()
        );
    }
    match governing_rule(policy.rules(), path) {
        None if policy.restricts_filesystem() => {
            if wants_write && let Some(name) = allowance_covering(policy, path, bases) {
                allowance_advice(name)
            } else if wants_write {
                format!(
                    "no rule covers {p} (a path no rule covers is denied): \"{d}\" = \"write\" \
                     (sandbox-run --writable-root {d})",
                    p = path.display(),
                    d = dir.display()
                )
            } else {
                format!(
                    "no rule grants read on {p} (a path no rule covers is denied): \"{p}\" = \
                     \"read\" in a profile file",
                    p = path.display()
                )
            }
        }
        None => "none: the policy restricts no path; refused by another cause".to_owned(),
        Some(rule) if rule.access == Access::Deny => format!(
            "remove the deny entry \"{r}\" = \"deny\" of the policy, which covers {p}",
            r = rule.path.display(),
            p = path.display()
        ),
        Some(_) if !wants_write => format!(
            "none: {} is readable under the policy; refused by another cause (a file's own \
             mode or owner)",
            path.display()
        ),
        Some(PathRule {
            access: Access::Read,
            ..
        }) => {
            if let Some(protected) = protected_ancestor(policy, path) {
                format!(
                    "{p} is a protected path (read-only in every writable root of the built-in \
                     profiles); only a profile file that leaves it out of protected_subpaths and \
                     says \"{p}\" = \"write\" allows it",
                    p = protected.display()
                )
            } else if let Some(name) = allowance_covering(policy, path, bases) {
                allowance_advice(name)
            } else {
                format!(
                    "\"{d}\" = \"write\" (sandbox-run --writable-root {d})",
                    d = dir.display()
                )
            }
        }
        Some(rule) => format!(
            "none: \"{}\" = \"write\" covers {}; refused by another cause (a read-only host \
             mount, or the file's own mode)",
            rule.path.display(),
            path.display()
        ),
    }
}

/// The first built-in allowance that makes `path` writable under `policy`.
fn allowance_covering(
    policy: &ResolvedPolicy,
    path: &Path,
    bases: &AllowanceBases,
) -> Option<&'static str> {
    BUILTIN_ALLOWANCES
        .iter()
        .map(|(name, _)| *name)
        .find(|name| {
            Allowance::builtin(name)
                .and_then(|allowance| allowance.apply(policy.clone(), bases))
                .is_ok_and(|widened| widened.can_write(path))
        })
}

/// Advice naming an allowance.
fn allowance_advice(name: &str) -> String {
    format!("the {name} allowance, policies/allowances/{name}.toml (sandbox-run --allow {name})")
}

/// Advice for a refusal no layer logged.
fn unexplained_reason(
    policy: &ResolvedPolicy,
    cli_denied: &[PathBuf],
    bases: &AllowanceBases,
    syscall: &str,
    path: Option<&str>,
    errno: Option<&str>,
) -> String {
    let errno = errno.unwrap_or("EACCES/EPERM");
    let likely = match (errno, path) {
        ("EPERM", _) => {
            "most often a capability the sandbox does not grant (every capability is dropped) or \
             another user's process or file"
                .to_owned()
        }
        (_, Some(path)) if !policy.can_read(Path::new(path)) => format!(
            "the policy does not grant {path} either, so a Landlock layer that did not log (a \
             kernel without Landlock audit) is possible; {}",
            path_reason(policy, cli_denied, bases, "fs.read_file", Path::new(path))
        ),
        (_, Some(path)) => format!(
            "most often the file's own mode or owner ({path}; the sandbox holds no \
             CAP_DAC_OVERRIDE, even as uid 0)"
        ),
        (_, None) => "most often a file's own mode or owner".to_owned(),
    };
    format!(
        "unknown: {syscall} failed with {errno} and no sandbox layer logged it: {likely}; the \
         audit cannot tell this from a layer it cannot see, so it is reported"
    )
}

fn is_directory_operation(operation: &str) -> bool {
    operation.starts_with("fs.make_")
        || operation.starts_with("fs.remove_")
        || operation == "fs.refer"
}

/// The most specific of `paths` that contains `path`.
fn covering<'a>(paths: &'a [PathBuf], path: &Path) -> Option<&'a PathBuf> {
    paths
        .iter()
        .filter(|p| path.starts_with(p))
        .max_by_key(|p| p.components().count())
}

/// The rule that decides `path`'s access (the most specific covering rule; at equal depth the
/// stronger access), as [`ResolvedPolicy::access_for`] picks it. `None`: no rule covers it.
fn governing_rule<'a>(rules: &'a [PathRule], path: &Path) -> Option<&'a PathRule> {
    rules
        .iter()
        .filter(|rule| path.starts_with(&rule.path))
        .max_by_key(|rule| (rule.path.components().count(), rule.access))
}

/// The read-only carve-out (`.git`, ...) inside a writable root that covers `path`.
fn protected_ancestor(policy: &ResolvedPolicy, path: &Path) -> Option<PathBuf> {
    policy
        .writable_roots()
        .into_iter()
        .flat_map(|root| root.read_only_subpaths)
        .filter(|sub| path.starts_with(sub))
        .max_by_key(|sub| sub.as_os_str().len())
}

/// Whether `path` is covered by the mount layer's mask (a `deny` entry or a hidden path: an
/// empty mode-000 file or directory, so access fails with `EACCES` and no layer logs it).
pub fn masked(policy: &ResolvedPolicy, path: &Path) -> bool {
    covering(policy.hidden_paths(), path).is_some()
        || governing_rule(policy.rules(), path).is_some_and(|rule| rule.access == Access::Deny)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use sandbox::policy::{FilesystemPolicy, PathRule};

    fn policy() -> ResolvedPolicy {
        let rule = |path: &str, access| PathRule {
            path: PathBuf::from(path),
            access,
        };
        ResolvedPolicy {
            filesystem: FilesystemPolicy::Restricted {
                rules: vec![
                    rule("/", Access::Read),
                    rule("/ws", Access::Write),
                    rule("/ws/.git", Access::Read),
                    rule("/ws/secret", Access::Deny),
                    rule("/srv/run/exec.sock", Access::Deny),
                ],
            },
            network: sandbox::policy::NetworkPolicy::Off,
            hidden: vec![PathBuf::from("/srv/run/exec.sock")],
            read_only: vec![PathBuf::from("/opt/execward/bin")],
            denied_tcp_ports: Vec::new(),
            tmpdir: None,
            unix_sockets: Vec::new(),
        }
    }

    /// A custom profile that grants read only on /usr and /ws.
    fn narrow_policy() -> ResolvedPolicy {
        let rule = |path: &str, access| PathRule {
            path: PathBuf::from(path),
            access,
        };
        ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: vec![rule("/usr", Access::Read), rule("/ws", Access::Write)],
            },
            false,
        )
    }

    fn advice(policy: ResolvedPolicy, layer: Layer, op: &str, path: &str) -> String {
        Advisor::new(policy).allow_rule(layer, op, Some(path), None)
    }

    #[test]
    fn write_outside_suggests_the_parent_as_writable_root() {
        assert_eq!(
            advice(policy(), Layer::Mount, "fs.write_file", "/etc/x.conf"),
            "\"/etc\" = \"write\" (sandbox-run --writable-root /etc)"
        );
        assert_eq!(
            advice(policy(), Layer::Landlock, "fs.make_dir", "/opt"),
            "\"/opt\" = \"write\" (sandbox-run --writable-root /opt)"
        );
    }

    #[test]
    fn a_path_no_rule_covers_asks_for_a_read_rule_not_a_deny_removal() {
        let rule = advice(
            narrow_policy(),
            Layer::Landlock,
            "fs.read_file",
            "/etc/hosts",
        );
        assert_eq!(
            rule,
            "no rule grants read on /etc/hosts (a path no rule covers is denied): \"/etc/hosts\" \
             = \"read\" in a profile file"
        );
        let rule = advice(narrow_policy(), Layer::Landlock, "fs.make_reg", "/var/out");
        assert_eq!(
            rule,
            "no rule covers /var/out (a path no rule covers is denied): \"/var/out\" = \"write\" \
             (sandbox-run --writable-root /var/out)"
        );
    }

    #[test]
    fn a_deny_entry_is_named_with_the_path_it_covers() {
        let rule = advice(policy(), Layer::Mount, "fs.read_file", "/ws/secret/k");
        assert_eq!(
            rule,
            "remove the deny entry \"/ws/secret\" = \"deny\" of the policy, which covers \
             /ws/secret/k"
        );
    }

    #[test]
    fn a_path_hidden_by_the_deny_flag_asks_to_drop_the_flag() {
        let rule = Advisor::new(policy())
            .with_cli_denied(vec![PathBuf::from("/srv/run/exec.sock")])
            .allow_rule(
                Layer::Mount,
                "fs.read_file",
                Some("/srv/run/exec.sock"),
                None,
            );
        assert_eq!(
            rule,
            "remove --deny /srv/run/exec.sock (sandbox-run's command line hides \
             /srv/run/exec.sock, which covers /srv/run/exec.sock)"
        );
    }

    #[test]
    fn protected_paths_are_named() {
        let rule = advice(policy(), Layer::Mount, "fs.write_file", "/ws/.git/config");
        assert!(rule.starts_with("/ws/.git is a protected path"), "{rule}");
        assert!(rule.contains("\"/ws/.git\" = \"write\""), "{rule}");
    }

    #[test]
    fn the_supervisors_hidden_and_read_only_paths_cannot_be_allowed() {
        let rule = advice(policy(), Layer::Mount, "fs.read_file", "/srv/run/exec.sock");
        assert_eq!(
            rule,
            "none: /srv/run/exec.sock is hidden from every sandbox (the supervisor's own socket, \
             token or key file, added to every policy it resolves); no policy exposes it"
        );
        let rule = Advisor::new(policy())
            .with_cli_denied(vec![PathBuf::from("/other")])
            .allow_rule(
                Layer::Mount,
                "fs.read_file",
                Some("/srv/run/exec.sock"),
                None,
            );
        assert!(rule.contains("the supervisor's own socket"), "{rule}");
        let rule = advice(
            policy(),
            Layer::Mount,
            "fs.write_file",
            "/opt/execward/bin/exec-server",
        );
        assert!(
            rule.starts_with("none: /opt/execward/bin is kept read-only in every sandbox"),
            "{rule}"
        );
    }

    #[test]
    fn unexplained_refusals_say_what_can_cause_them() {
        let advisor = Advisor::new(policy());
        let rule = advisor.allow_rule(
            Layer::Unexplained,
            "openat",
            Some("/root/.ssh/id_ed25519"),
            Some("EACCES"),
        );
        assert!(
            rule.starts_with("unknown: openat failed with EACCES and no sandbox layer logged it: most often the file's own mode or owner"),
            "{rule}"
        );
        let rule = advisor.allow_rule(Layer::Unexplained, "setuid", None, Some("EPERM"));
        assert!(
            rule.contains("capability the sandbox does not grant"),
            "{rule}"
        );
        let rule = Advisor::new(narrow_policy()).allow_rule(
            Layer::Unexplained,
            "openat",
            Some("/etc/hosts"),
            Some("EACCES"),
        );
        assert!(rule.contains("a Landlock layer that did not log"), "{rule}");
        assert!(rule.contains("no rule grants read on /etc/hosts"), "{rule}");
    }

    #[test]
    fn masked_paths_are_deny_entries_and_hidden_paths_only() {
        assert!(masked(&policy(), Path::new("/ws/secret/k")));
        assert!(masked(&policy(), Path::new("/srv/run/exec.sock")));
        assert!(!masked(&policy(), Path::new("/etc/hosts")));
        // Denied because no rule covers it: Landlock's refusal, not a mask.
        assert!(!masked(&narrow_policy(), Path::new("/etc/hosts")));
    }

    #[test]
    fn a_cache_write_names_the_allowance_and_the_cache_directory_itself_does_not() {
        let bases = AllowanceBases::from_vars(|name| {
            (name == "HOME").then(|| PathBuf::from("/nonexistent-home"))
        });
        let advisor = Advisor::new(policy()).with_allowance_bases(bases);
        let advice = |operation: &str, path: &str| {
            advisor.allow_rule(Layer::Mount, operation, Some(path), None)
        };
        assert_eq!(
            advice("fs.write_file", "/nonexistent-home/.cargo/.package-cache"),
            "the toolchain-caches allowance, policies/allowances/toolchain-caches.toml \
             (sandbox-run --allow toolchain-caches)"
        );
        assert!(
            advice("fs.make_reg", "/nonexistent-home/.cargo").ends_with(
                "\"/nonexistent-home/.cargo\" = \"write\" (sandbox-run --writable-root /nonexistent-home/.cargo)"
            ),
            "{}",
            advice("fs.make_reg", "/nonexistent-home/.cargo")
        );
    }

    #[test]
    fn network_and_seccomp_advice() {
        let advisor = Advisor::new(policy());
        let seccomp = |op| advisor.allow_rule(Layer::Seccomp, op, None, None);
        assert_eq!(
            seccomp("socket"),
            "network = true (sandbox-run --allow-network)"
        );
        assert!(
            seccomp("ptrace")
                .starts_with("none: policies/seccomp/restrictions.json refuses ptrace")
        );
        let rule = seccomp("landlock_restrict_self");
        assert!(
            rule.starts_with("none: policies/seccomp/audit.json refuses"),
            "{rule}"
        );
        assert!(rule.ends_with("the report is marked incomplete"), "{rule}");
        let rule = seccomp("prlimit64");
        assert!(
            rule.starts_with(
                "none: policies/seccomp/restrictions.json refuses prlimit64 with the arguments"
            ),
            "{rule}"
        );
        let rule = seccomp("clone3");
        assert!(rule.contains("not on the reviewed allow-list"), "{rule}");
    }
}
