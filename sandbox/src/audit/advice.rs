//! "The policy rule that would allow it": a pure function of the resolved policy and a denial.
//!
//! The advice names a profile-file line (`policies/README.md`, "Profile files") and the
//! `sandbox-run` flag with the same effect, or says plainly that no rule allows it.

use std::path::{Path, PathBuf};

use crate::audit::denial::Layer;
use crate::linux::seccomp;
use crate::policy::{Access, Allowance, AllowanceBases, BUILTIN_ALLOWANCES, ResolvedPolicy};

/// The rule that would allow `operation` on `path` / `address` under `policy`. A write a named
/// allowance (`policies/allowances/`) covers, with the paths of this process's environment, is
/// answered with that allowance.
pub fn allow_rule(
    policy: &ResolvedPolicy,
    layer: Layer,
    operation: &str,
    path: Option<&str>,
) -> String {
    allow_rule_with(policy, layer, operation, path, &AllowanceBases::from_env())
}

/// [`allow_rule`] with the allowances' bases given.
pub fn allow_rule_with(
    policy: &ResolvedPolicy,
    layer: Layer,
    operation: &str,
    path: Option<&str>,
    bases: &AllowanceBases,
) -> String {
    if operation.starts_with("net.") || operation == "socket" || operation == "socketpair" {
        return "network = true (sandbox-run --allow-network)".to_owned();
    }
    if layer == Layer::Seccomp {
        return seccomp_reason(operation);
    }
    if operation.starts_with("scope.") {
        return "none: processes outside the sandbox cannot be signalled or reached through \
                abstract sockets under any restricting policy"
            .to_owned();
    }
    let Some(path) = path.map(PathBuf::from) else {
        return "unknown: the kernel record names no path".to_owned();
    };
    let wants_write = !matches!(
        operation,
        "fs.read_file" | "fs.read_dir" | "fs.execute" | "fs.ioctl_dev"
    );
    // Make/remove operations name the directory (Landlock's convention, which the mount layer
    // follows); other paths are the object itself.
    let target = if is_directory_operation(operation) {
        path.clone()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or(path.clone())
    };
    if policy.access_for(&path) == Access::Deny {
        return format!(
            "remove the deny entry covering {} from the policy",
            path.display()
        );
    }
    if let Some(protected) = protected_ancestor(policy, &path) {
        return format!(
            "{p} is a protected path (read-only in every writable root of the built-in \
             profiles); only a profile file that leaves it out of protected_subpaths and says \
             \"{p}\" = \"write\" allows it",
            p = protected.display()
        );
    }
    if wants_write && let Some(name) = allowance_covering(policy, &path, bases) {
        return format!(
            "the {name} allowance, policies/allowances/{name}.toml (sandbox-run --allow {name})"
        );
    }
    if wants_write {
        format!(
            "\"{dir}\" = \"write\" (sandbox-run --writable-root {dir})",
            dir = target.display()
        )
    } else {
        format!("\"{}\" = \"read\"", path.display())
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

fn is_directory_operation(operation: &str) -> bool {
    operation.starts_with("fs.make_")
        || operation.starts_with("fs.remove_")
        || operation == "fs.refer"
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

fn seccomp_reason(syscall: &str) -> String {
    let variant = seccomp::Variant {
        network_allowed: true,
        audit: true,
    };
    let filters = seccomp::filters_for(variant).unwrap_or_default();
    let rule_in = |part: &str| {
        filters
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
            "none: policies/seccomp/audit.json refuses {syscall} while the denial audit runs ({})",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{FilesystemPolicy, PathRule};
    use pretty_assertions::assert_eq;

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
                ],
            },
            network: crate::policy::NetworkPolicy::Off,
            hidden: Vec::new(),
            read_only: Vec::new(),
            denied_tcp_ports: Vec::new(),
            tmpdir: None,
        }
    }

    #[test]
    fn write_outside_suggests_the_parent_as_writable_root() {
        let rule = allow_rule(
            &policy(),
            Layer::Mount,
            "fs.write_file",
            Some("/etc/x.conf"),
        );
        assert_eq!(
            rule,
            "\"/etc\" = \"write\" (sandbox-run --writable-root /etc)"
        );
        let rule = allow_rule(&policy(), Layer::Landlock, "fs.make_dir", Some("/opt"));
        assert_eq!(
            rule,
            "\"/opt\" = \"write\" (sandbox-run --writable-root /opt)"
        );
        let rule = allow_rule(&policy(), Layer::Mount, "fs.make_reg", Some("/opt"));
        assert_eq!(
            rule,
            "\"/opt\" = \"write\" (sandbox-run --writable-root /opt)"
        );
    }

    #[test]
    fn protected_paths_and_deny_entries_are_named() {
        let rule = allow_rule(
            &policy(),
            Layer::Mount,
            "fs.write_file",
            Some("/ws/.git/config"),
        );
        assert!(rule.starts_with("/ws/.git is a protected path"), "{rule}");
        let rule = allow_rule(
            &policy(),
            Layer::Landlock,
            "fs.read_file",
            Some("/ws/secret/k"),
        );
        assert!(rule.starts_with("remove the deny entry"), "{rule}");
    }

    #[test]
    fn a_cache_write_names_the_allowance_and_the_cache_directory_itself_does_not() {
        let bases = AllowanceBases::from_vars(|name| {
            (name == "HOME").then(|| PathBuf::from("/nonexistent-home"))
        });
        let advice = |operation: &str, path: &str| {
            allow_rule_with(&policy(), Layer::Mount, operation, Some(path), &bases)
        };
        assert_eq!(
            advice("fs.write_file", "/nonexistent-home/.cargo/.package-cache"),
            "the toolchain-caches allowance, policies/allowances/toolchain-caches.toml \
             (sandbox-run --allow toolchain-caches)"
        );
        assert_eq!(
            advice("fs.make_reg", "/nonexistent-home/.cargo"),
            "\"/nonexistent-home/.cargo\" = \"write\" (sandbox-run --writable-root /nonexistent-home/.cargo)"
        );
    }

    #[test]
    fn network_and_seccomp_advice() {
        let rule = allow_rule(&policy(), Layer::Seccomp, "socket", None);
        assert_eq!(rule, "network = true (sandbox-run --allow-network)");
        let rule = allow_rule(&policy(), Layer::Seccomp, "ptrace", None);
        assert!(rule.starts_with("none: policies/seccomp/restrictions.json refuses ptrace"));
        let rule = allow_rule(&policy(), Layer::Seccomp, "landlock_restrict_self", None);
        assert!(
            rule.starts_with("none: policies/seccomp/audit.json refuses"),
            "{rule}"
        );
        let rule = allow_rule(&policy(), Layer::Seccomp, "prlimit64", None);
        assert!(
            rule.starts_with(
                "none: policies/seccomp/restrictions.json refuses prlimit64 with the arguments"
            ),
            "{rule}"
        );
        let rule = allow_rule(&policy(), Layer::Seccomp, "clone3", None);
        assert!(rule.contains("not on the reviewed allow-list"), "{rule}");
    }
}
