//! Glob entries: expanded against the filesystem when the policy is resolved.
//!
//! Syntax per path component: `*` (any run of characters), `?` (one character), `[abc]`,
//! `[a-z]`, `[!x]`; a whole component `**` matches zero or more directories. The walk never
//! follows symlinked directories and is bounded in depth and in matches.

use std::path::{Path, PathBuf};

use super::PolicyError;

/// Default depth a `**` walk descends below the literal prefix of a pattern.
pub const DEFAULT_GLOB_SCAN_MAX_DEPTH: usize = 8;

/// At most this many paths per pattern; more is an error (a deny glob silently truncated would
/// widen access).
pub const MAX_GLOB_MATCHES: usize = 4096;

/// Whether `text` contains glob metacharacters.
pub fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// Expands an absolute pattern into the existing paths it matches, sorted.
///
/// # Errors
/// [`PolicyError::Glob`] when the pattern matches more than [`MAX_GLOB_MATCHES`] paths.
pub fn expand(pattern: &Path, max_depth: usize) -> Result<Vec<PathBuf>, PolicyError> {
    let text = pattern.to_string_lossy();
    let components: Vec<&str> = text.split('/').filter(|c| !c.is_empty()).collect();
    let literal = components.iter().take_while(|c| !is_glob(c)).count();
    let mut base = PathBuf::from("/");
    for component in &components[..literal] {
        base.push(component);
    }
    let mut found = Vec::new();
    walk(&base, &components[literal..], max_depth, &mut found);
    found.sort();
    found.dedup();
    if found.len() > MAX_GLOB_MATCHES {
        return Err(PolicyError::Glob {
            pattern: text.into_owned(),
            message: format!("matches more than {MAX_GLOB_MATCHES} paths; narrow it"),
        });
    }
    Ok(found)
}

fn walk(dir: &Path, rest: &[&str], depth_left: usize, found: &mut Vec<PathBuf>) {
    if found.len() > MAX_GLOB_MATCHES {
        return;
    }
    let Some((first, tail)) = rest.split_first() else {
        if dir.symlink_metadata().is_ok() {
            found.push(dir.to_owned());
        }
        return;
    };
    if *first == "**" {
        walk(dir, tail, depth_left, found);
        if depth_left == 0 {
            return;
        }
        for entry in read_dir(dir) {
            if entry.1 {
                walk(&entry.0, rest, depth_left - 1, found);
            }
        }
        return;
    }
    for (path, is_dir) in read_dir(dir) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !matches(first, name) {
            continue;
        }
        if tail.is_empty() {
            found.push(path);
        } else if is_dir && depth_left > 0 {
            walk(&path, tail, depth_left - 1, found);
        }
    }
}

/// Directory entries as `(path, is_real_directory)`; unreadable directories yield nothing.
fn read_dir(dir: &Path) -> Vec<(PathBuf, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| {
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            (entry.path(), is_dir)
        })
        .collect()
}

/// Matches one path component against one pattern component.
pub fn matches(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    match_from(&pattern, &name)
}

fn match_from(pattern: &[char], name: &[char]) -> bool {
    let Some((&first, rest)) = pattern.split_first() else {
        return name.is_empty();
    };
    match first {
        '*' => (0..=name.len()).any(|skip| match_from(rest, &name[skip..])),
        '?' => !name.is_empty() && match_from(rest, &name[1..]),
        '[' => {
            let Some(close) = rest.iter().position(|c| *c == ']') else {
                return name.first() == Some(&'[') && match_from(rest, &name[1..]);
            };
            let Some(&c) = name.first() else {
                return false;
            };
            class_matches(&rest[..close], c) && match_from(&rest[close + 1..], &name[1..])
        }
        literal => name.first() == Some(&literal) && match_from(rest, &name[1..]),
    }
}

fn class_matches(class: &[char], c: char) -> bool {
    let (negated, class) = match class.split_first() {
        Some(('!' | '^', rest)) => (true, rest),
        _ => (false, class),
    };
    let mut hit = false;
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' {
            hit |= class[i] <= c && c <= class[i + 2];
            i += 3;
        } else {
            hit |= class[i] == c;
            i += 1;
        }
    }
    hit != negated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_matching_covers_star_question_and_classes() {
        assert!(matches("*.pem", "key.pem"));
        assert!(!matches("*.pem", "key.pem.bak"));
        assert!(matches("?.txt", "a.txt"));
        assert!(matches("[a-c]x", "bx"));
        assert!(!matches("[!a-c]x", "bx"));
        assert!(matches(".env*", ".env.local"));
    }

    #[test]
    fn expand_walks_double_star_and_stops_at_depth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b/c")).unwrap();
        std::fs::write(dir.path().join("a/top.pem"), "").unwrap();
        std::fs::write(dir.path().join("a/b/c/deep.pem"), "").unwrap();
        let pattern = dir.path().join("**/*.pem");
        let all = expand(&pattern, 8).unwrap();
        assert_eq!(
            all,
            vec![
                dir.path().join("a/b/c/deep.pem"),
                dir.path().join("a/top.pem")
            ]
        );
        let shallow = expand(&pattern, 1).unwrap();
        assert_eq!(shallow, vec![dir.path().join("a/top.pem")]);
    }
}
