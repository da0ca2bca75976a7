//! The working directory of a sandboxed command, examined only as far as its policy lets the
//! command see.
//!
//! The server looks at the filesystem with its own view, which a sandbox narrows for the
//! command: a path under a `deny` entry (or a server's hidden file) cannot even be `stat`ed
//! inside. Had the server checked the client's `cwd` with its own view, "does not exist", "is
//! not a directory" and "started" would tell a sandboxed client whether a path it may not see
//! exists, and what it is. So the path is walked one component at a time, as the kernel
//! resolves it, following symlinks, and each step is checked against the policy *before* it is
//! examined: a step the policy hides ends the walk with the same refusal whether or not
//! anything is there.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use sandbox::ResolvedPolicy;

use crate::process::ProcessError;

/// Symlinks followed on the way to a working directory before it is refused (the kernel's
/// `MAXSYMLINKS`).
const MAX_SYMLINK_HOPS: usize = 40;

/// Whether the sandboxed command may look at `path`: it is not hidden (a server's secrets are
/// masked whatever the filesystem rules say), and it may read it or it lies on the way to
/// something it may read (an ancestor of a readable rule, which it can traverse).
fn visible(policy: &ResolvedPolicy, path: &Path) -> bool {
    let hidden = policy.hidden.iter().any(|hidden| path.starts_with(hidden));
    let readable = policy.can_read(path)
        || policy
            .rules()
            .iter()
            .any(|rule| rule.access.can_read() && rule.path.starts_with(path));
    !hidden && readable
}

/// The canonical working directory `cwd` (absolute) names for a command under `policy`.
///
/// # Errors
/// - [`ProcessError::CwdDenied`] when the way to it, or it, is hidden by the policy (whatever
///   is or is not there);
/// - [`ProcessError::CwdMissing`] when a visible step does not exist (or symlinks loop);
/// - [`ProcessError::CwdNotDirectory`] when a visible step is not a directory.
pub fn sandboxed_cwd(policy: &ResolvedPolicy, cwd: &Path) -> Result<PathBuf, ProcessError> {
    let denied = || ProcessError::CwdDenied {
        path: cwd.to_owned(),
    };
    let missing = || ProcessError::CwdMissing {
        path: cwd.to_owned(),
    };
    // The components still to walk, the next one last.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, cwd);
    let mut at = PathBuf::from("/");
    let mut hops = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&name);
        if !visible(policy, &next) {
            return Err(denied());
        }
        let metadata = std::fs::symlink_metadata(&next).map_err(|_| missing())?;
        if metadata.file_type().is_symlink() {
            hops += 1;
            let target = std::fs::read_link(&next).map_err(|_| missing())?;
            if hops > MAX_SYMLINK_HOPS {
                return Err(missing());
            }
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            push_components(&mut pending, &target);
        } else if metadata.is_dir() {
            at = next;
        } else {
            return Err(ProcessError::CwdNotDirectory {
                path: cwd.to_owned(),
            });
        }
    }
    // The walk ends where the command's `cd` would: a directory it may look at.
    if visible(policy, &at) {
        Ok(at)
    } else {
        Err(denied())
    }
}

/// Push `path`'s normal and parent components onto `pending` so that the first pops first.
fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    let names: Vec<OsString> = path
        .components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    pending.extend(names.into_iter().rev());
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox::policy::{Access, FilesystemPolicy, NetworkPolicy, PathRule};

    fn policy(rules: Vec<(PathBuf, Access)>) -> ResolvedPolicy {
        let rules = rules
            .into_iter()
            .map(|(path, access)| PathRule { path, access })
            .collect();
        ResolvedPolicy::new(FilesystemPolicy::Restricted { rules }, NetworkPolicy::Off)
    }

    /// Under `deny`, a missing path, a file and a directory are refused alike; beside it, each
    /// gets its own answer; a symlink into the denied tree is refused where it leads, whether
    /// its target exists or not; `..` and symlinks resolve as the kernel does.
    #[test]
    fn a_path_the_policy_hides_is_refused_alike_whatever_is_there() {
        let root = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let (open, hidden) = (base.join("open"), base.join("hidden"));
        for dir in [&open, &hidden] {
            std::fs::create_dir_all(dir.join("dir")).unwrap();
            std::fs::write(dir.join("file"), b"x").unwrap();
        }
        std::os::unix::fs::symlink(hidden.join("dir"), open.join("to-dir")).unwrap();
        std::os::unix::fs::symlink(hidden.join("none"), open.join("to-none")).unwrap();
        std::os::unix::fs::symlink("open/dir", base.join("relative")).unwrap();
        std::os::unix::fs::symlink("../open/dir", open.join("up")).unwrap();
        std::os::unix::fs::symlink("loop", open.join("loop")).unwrap();
        let policy = policy(vec![
            (base.clone(), Access::Read),
            (hidden.clone(), Access::Deny),
        ]);
        let kind = |path: PathBuf| match sandboxed_cwd(&policy, &path) {
            Ok(at) => format!("ok {}", at.strip_prefix(&base).unwrap().display()),
            Err(ProcessError::CwdDenied { .. }) => "denied".to_owned(),
            Err(ProcessError::CwdMissing { .. }) => "missing".to_owned(),
            Err(ProcessError::CwdNotDirectory { .. }) => "not a directory".to_owned(),
            Err(other) => panic!("{other}"),
        };
        for name in ["dir", "file", "none", "none/deeper", "file/deeper", ""] {
            assert_eq!(kind(hidden.join(name)), "denied", "hidden/{name}");
        }
        assert_eq!(kind(open.join("dir")), "ok open/dir");
        assert_eq!(kind(open.join("file")), "not a directory");
        assert_eq!(kind(open.join("none")), "missing");
        assert_eq!(kind(open.join("to-dir")), "denied");
        assert_eq!(kind(open.join("to-none")), "denied");
        assert_eq!(kind(open.join("loop")), "missing");
        assert_eq!(kind(base.join("relative")), "ok open/dir");
        assert_eq!(kind(open.join("up")), "ok open/dir");
        assert_eq!(kind(open.join("up/../file")), "not a directory");
        assert_eq!(kind(open.join("dir/../dir")), "ok open/dir");
        assert_eq!(kind(open.join("../hidden/dir")), "denied");
        // A server's hidden path is masked even where the filesystem is not restricted.
        let unrestricted = ResolvedPolicy::new(FilesystemPolicy::Unrestricted, NetworkPolicy::Off)
            .with_hidden_path(&hidden.join("file"));
        assert_eq!(sandboxed_cwd(&unrestricted, &hidden).unwrap(), hidden);
        for name in ["file", "file/deeper"] {
            assert!(matches!(
                sandboxed_cwd(&unrestricted, &hidden.join(name)),
                Err(ProcessError::CwdDenied { .. })
            ));
        }
        // The way to a readable root is visible; a sibling of it is not.
        let narrow = policy_of_one(&open);
        assert_eq!(sandboxed_cwd(&narrow, &open).unwrap(), open);
        assert_eq!(sandboxed_cwd(&narrow, &base).unwrap(), base);
        assert!(matches!(
            sandboxed_cwd(&narrow, &hidden.join("dir")),
            Err(ProcessError::CwdDenied { .. })
        ));
    }

    fn policy_of_one(path: &Path) -> ResolvedPolicy {
        policy(vec![(path.to_owned(), Access::Write)])
    }
}
