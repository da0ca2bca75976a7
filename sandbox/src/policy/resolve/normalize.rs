//! Normalising resolved rules: canonical paths, deduplication against ancestor rules, and the
//! read rules that protect `.git` and the other protected names found in writable roots.

use std::path::{Component, Path, PathBuf};

use crate::policy::{Access, PathRule, effective_access};

/// Canonical path when it exists, else the lexically normalised absolute path.
pub(crate) fn normalize_existing(path: &Path) -> PathBuf {
    if path.starts_with("/proc") || path.starts_with("/dev") {
        // /proc/self and /dev/fd links resolve to the resolving process, not the sandboxed one.
        return lexical(path);
    }
    canonical(path).unwrap_or_else(|| lexical(path))
}

/// The canonical path of `path` when it exists. A path `open` cannot reach, `realpath` cannot
/// resolve either (both need every component and the same search permissions, and both fail on
/// a dangling link or a loop): one failed `openat` for the many rules naming paths that do not
/// exist (most of the credential stores, resolved for every sandboxed request). An existing one
/// is named by the kernel (`/proc/self/fd/N`): one `readlink`, where `realpath` takes one per
/// component. `O_PATH` follows symlinks as `stat` does, needs no read permission, and opens no
/// device or FIFO.
#[cfg(target_os = "linux")]
fn canonical(path: &Path) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()?;
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok();
    // Without `/proc`, or for a file unlinked meanwhile (" (deleted)"), the slow way.
    match name {
        Some(name)
            if name.is_absolute()
                && !name.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") =>
        {
            Some(name)
        }
        _ => std::fs::canonicalize(path).ok(),
    }
}

#[cfg(not(target_os = "linux"))]
fn canonical(path: &Path) -> Option<PathBuf> {
    std::fs::metadata(path).ok()?;
    std::fs::canonicalize(path).ok()
}

fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Dedupes (highest precedence per path wins), sorts, and drops rules that repeat the access of
/// their nearest ancestor rule (including `deny` at the top, which is the default), except a
/// writable root whose nearest ancestor rule is one of the private `layers` (`/tmp`, a writable
/// `$TMPDIR`, see [`ResolvedPolicy::private_layers`]): a command gets a fresh tmpfs there, and
/// a writable root inside it is a host directory bound into that tmpfs, which the command can
/// write (and plant symlinks in) on the host. Merged into the layer's rule it would be neither
/// carried in nor recorded as a host directory sandboxes write.
///
/// [`ResolvedPolicy::private_layers`]: crate::policy::ResolvedPolicy::private_layers
pub(crate) fn normalize_rules(mut rules: Vec<PathRule>, layers: &[PathBuf]) -> Vec<PathRule> {
    rules.sort_by(|a, b| a.path.cmp(&b.path).then(b.access.cmp(&a.access)));
    rules.dedup_by(|later, earlier| later.path == earlier.path);
    let nearest = nearest_ancestors(&rules);
    let keep: Vec<bool> = rules
        .iter()
        .zip(&nearest)
        .map(|(rule, nearest)| {
            let nearest = nearest.map(|at| &rules[at]);
            let host_root_in_layer = rule.access == Access::Write
                && nearest.is_some_and(|layer| layers.contains(&layer.path));
            host_root_in_layer
                || nearest.map_or(Access::Deny, |parent| parent.access) != rule.access
        })
        .collect();
    let mut keep = keep.into_iter();
    rules.retain(|_| keep.next().unwrap_or(true));
    rules
}

/// For each of `sorted` (sorted by path, one rule per path), the index of its strictly
/// shallower rule that decides its access when it has no rule of its own (what
/// `policy::parent_access` reads): the deepest rule whose path is an ancestor of its path.
///
/// One pass: paths compare component by component, so a path's descendants come right after
/// it, and the rules on the way down to the current one form a stack (each an ancestor of the
/// next). A start resolves its policy with some hundred rules (masks of credential stores and
/// of every running server's secrets); comparing every rule with every other was a tenth of the
/// server's CPU per sandboxed start.
fn nearest_ancestors(sorted: &[PathRule]) -> Vec<Option<usize>> {
    let mut stack: Vec<usize> = Vec::new();
    sorted
        .iter()
        .enumerate()
        .map(|(at, rule)| {
            while let Some(&top) = stack.last() {
                if rule.path.starts_with(&sorted[top].path) {
                    break;
                }
                stack.pop();
            }
            let nearest = stack.last().copied();
            stack.push(at);
            nearest
        })
        .collect()
}

/// Directory entries the search for nested protected names reads per writable root.
/// Protected names (`.git`, ...) are found at any depth up to this budget and
/// [`PROTECTED_SCAN_MAX_DEPTH`]; deeper or later ones (and ones created after the sandbox started)
/// are not protected (README, known limits). About 10 ms of `readdir` per start at the limit.
pub const PROTECTED_SCAN_MAX_ENTRIES: usize = 10_000;
/// Directory levels below a writable root searched for nested protected names.
pub const PROTECTED_SCAN_MAX_DEPTH: usize = 8;

/// Normalises `raw` and adds read rules for protected names (`.git`, ...) found in every
/// writable root in it (also roots nested in other writable roots, which normalisation drops),
/// at any depth within [`PROTECTED_SCAN_MAX_ENTRIES`]/[`PROTECTED_SCAN_MAX_DEPTH`] (a vendored
/// repository's `.git/hooks` runs code outside the sandbox as surely as the top-level one),
/// including the directory a `.git` pointer file names and a symlink's target, where they are
/// otherwise writable. `skip` lists writable roots that are the sandbox's own fresh directories
/// (`/tmp`, `$TMPDIR`), whose host contents no command sees (the private layers of
/// [`normalize_rules`]).
pub(crate) fn protect_subpaths(
    raw: Vec<PathRule>,
    protected: &[String],
    skip: &[PathBuf],
) -> Vec<PathRule> {
    let rules = normalize_rules(raw.clone(), skip);
    let mut extra = Vec::new();
    if !protected.is_empty() {
        for root in raw.iter().filter(|r| r.access == Access::Write) {
            if skip.contains(&root.path) {
                continue;
            }
            for found in find_protected(&root.path, protected) {
                let Ok(meta) = found.symlink_metadata() else {
                    continue;
                };
                let mut targets = vec![found.clone()];
                if meta.file_type().is_symlink() {
                    targets.extend(std::fs::canonicalize(&found).ok());
                }
                if meta.is_file() {
                    targets.extend(gitdir_target(&found));
                }
                extra.extend(targets.into_iter().map(|path| PathRule {
                    path: lexical(&path),
                    access: Access::Read,
                }));
            }
        }
    }
    let narrowing: Vec<PathRule> = extra
        .into_iter()
        .filter(|rule| {
            effective_access(&rules, &rule.path) == Access::Write
                && !rules.iter().any(|r| r.path == rule.path)
        })
        .collect();
    let mut all = rules;
    all.extend(narrowing);
    normalize_rules(all, skip)
}

/// Paths under `root` (breadth first, not following symlinks, not descending into what it
/// finds) whose name is one of `names`.
fn find_protected(root: &Path, names: &[String]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut budget = PROTECTED_SCAN_MAX_ENTRIES;
    let mut level = vec![root.to_path_buf()];
    for _ in 0..=PROTECTED_SCAN_MAX_DEPTH {
        let mut next = Vec::new();
        for dir in level {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if budget == 0 {
                    return found;
                }
                budget -= 1;
                let name = entry.file_name();
                let path = entry.path();
                if names.iter().any(|n| std::ffi::OsStr::new(n) == name) {
                    found.push(path);
                } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    next.push(path);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    found
}

/// The longest `.git` pointer file read: `gitdir: `, a path of up to `PATH_MAX` bytes and a
/// newline. A longer file is no pointer.
pub const GITDIR_POINTER_MAX_BYTES: usize = 4096 + 16;

/// The directory a `gitdir: PATH` pointer file names (worktrees, submodules); a relative
/// `PATH` is relative to the pointer's directory.
///
/// Whatever a command left at `.git` in a writable root, reading it costs the resolving server
/// one small read: opened without following a symlink and without waiting (a FIFO swapped in
/// since the scan saw a regular file would otherwise block the read for good), read only if it
/// is still a regular file, and at most [`GITDIR_POINTER_MAX_BYTES`] of it (a `.git` of
/// gigabytes, sparse or not, is no pointer; reading it whole stalled the server for seconds
/// per start and held its size in memory).
fn gitdir_target(pointer: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(pointer)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(GITDIR_POINTER_MAX_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .ok()?;
    if text.len() > GITDIR_POINTER_MAX_BYTES {
        return None;
    }
    let target = text.lines().next()?.strip_prefix("gitdir:")?.trim();
    let path = pointer.parent()?.join(target);
    Some(std::fs::canonicalize(&path).unwrap_or_else(|_| lexical(&path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_git_pointer_is_read_only_when_it_is_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("repo")).unwrap();
        let pointer = root.join("pointer");
        std::fs::write(&pointer, "gitdir: repo\n").unwrap();
        assert_eq!(gitdir_target(&pointer), Some(root.join("repo")));

        // The same line followed by a gigabyte (sparse): no pointer, and not read whole.
        let long = root.join("long");
        std::fs::write(&long, "gitdir: repo\n").unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&long)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert_eq!(gitdir_target(&long), None);
        let exact = root.join("exact");
        let line = format!("gitdir: {}\n", "r".repeat(GITDIR_POINTER_MAX_BYTES - 9));
        assert_eq!(line.len(), GITDIR_POINTER_MAX_BYTES);
        std::fs::write(&exact, &line).unwrap();
        assert!(
            gitdir_target(&exact).is_some(),
            "a pointer of the longest length is read"
        );

        // A symlink to a pointer is not followed (the scan protects a symlink's target itself).
        std::os::unix::fs::symlink(&pointer, root.join("link")).unwrap();
        assert_eq!(gitdir_target(&root.join("link")), None);
    }

    #[test]
    fn a_fifo_at_git_is_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join(".git");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || done.send(gitdir_target(&fifo)).unwrap());
        // A deadline, not a timing: a blocking open waits until a writer comes, which is never.
        let target = finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO at .git blocked");
        assert_eq!(target, None);
    }

    /// The definition [`nearest_ancestors`] computes in one pass: the deepest strictly shallower
    /// rule whose path is an ancestor.
    fn nearest_by_definition(rules: &[PathRule], path: &Path) -> Option<PathBuf> {
        rules
            .iter()
            .filter(|rule| rule.path != path && path.starts_with(&rule.path))
            .max_by_key(|rule| rule.path.components().count())
            .map(|rule| rule.path.clone())
    }

    #[test]
    fn the_one_pass_nearest_ancestor_is_the_deepest_ancestor_rule() {
        let names = [
            "/",
            "/a",
            "/a b",
            "/ab",
            "/a/b",
            "/a/b/c",
            "/a/bc",
            "/a/b c/d",
            "/a/c",
            "/b",
            "/b/a",
            "/a/b/c/d/e",
            "/a-b/c",
            "/a.b",
            "/a/b/",
            "/z/y/x",
            "/z",
        ];
        // Every subset of a rotating window, so that ancestors are missing in many ways.
        for start in 0..names.len() {
            for mask in 0u32..(1 << 7) {
                let mut rules: Vec<PathRule> = (0..7)
                    .filter(|bit| mask & (1 << bit) != 0)
                    .map(|bit| PathRule {
                        path: PathBuf::from(names[(start + bit) % names.len()]),
                        access: Access::Read,
                    })
                    .collect();
                rules.sort_by(|a, b| a.path.cmp(&b.path));
                rules.dedup_by(|later, earlier| later.path == earlier.path);
                let found = nearest_ancestors(&rules);
                for (rule, nearest) in rules.iter().zip(found) {
                    assert_eq!(
                        nearest.map(|at| rules[at].path.clone()),
                        nearest_by_definition(&rules, &rule.path),
                        "{} in {:?}",
                        rule.path.display(),
                        rules
                            .iter()
                            .map(|r| r.path.display().to_string())
                            .collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}
