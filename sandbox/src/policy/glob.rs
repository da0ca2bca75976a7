//! Glob entries: expanded against the filesystem when the policy is resolved.
//!
//! Syntax per path component: `*` (any run of characters), `?` (one character), `[abc]`,
//! `[a-z]`, `[!x]`; a whole component `**` matches zero or more directories. The walk never
//! follows symlinked directories and is bounded in depth and in matches.

use std::path::{Path, PathBuf};

use super::PolicyError;

/// Default depth a `**` walk descends below the literal prefix of a pattern.
pub const DEFAULT_GLOB_SCAN_MAX_DEPTH: usize = 8;

/// Largest `glob_scan_max_depth` a policy may ask for; more is an error.
pub const MAX_GLOB_SCAN_MAX_DEPTH: usize = 32;

/// At most this many paths per pattern; more is an error (a deny glob silently truncated would
/// widen access).
pub const MAX_GLOB_MATCHES: usize = 4096;

/// Directory entries the glob entries of one policy may look at, together, while they are
/// expanded; more is an error. Policies come from clients and are resolved before every
/// sandboxed request, so `/**/x` must not turn into a walk of the whole filesystem, and neither
/// may a policy of many globs each just under a per-pattern limit.
pub const MAX_GLOB_SCANNED_ENTRIES: usize = 100_000;

/// Distinct glob entries one policy may hold (identical entries count once); more is an error.
/// Each costs a walk setup even when it matches nothing.
pub const MAX_GLOB_PATTERNS: usize = 256;

/// Whether `text` contains glob metacharacters.
pub fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// [`expand_within`] with a budget of its own (one pattern's expansion, in tests).
#[cfg(test)]
pub fn expand(
    pattern: &Path,
    max_depth: usize,
    for_deny: bool,
) -> Result<Vec<PathBuf>, PolicyError> {
    expand_within(pattern, max_depth, &mut GlobBudget::new(), for_deny)
}

/// What is left of one policy's glob work ([`MAX_GLOB_SCANNED_ENTRIES`] directory entries and
/// [`MAX_GLOB_PATTERNS`] patterns), shared by all its glob entries.
#[derive(Debug)]
pub struct GlobBudget {
    entries_left: usize,
    patterns_left: usize,
}

impl Default for GlobBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl GlobBudget {
    /// The budget of one policy.
    pub fn new() -> Self {
        Self::with_entries(MAX_GLOB_SCANNED_ENTRIES)
    }

    fn with_entries(entries: usize) -> Self {
        Self {
            entries_left: entries,
            patterns_left: MAX_GLOB_PATTERNS,
        }
    }
}

/// Expands an absolute pattern into the existing paths it matches, sorted, drawing on a
/// policy's `budget`.
///
/// # Errors
/// [`PolicyError::Glob`] when `max_depth` exceeds [`MAX_GLOB_SCAN_MAX_DEPTH`], or the pattern
/// matches more than [`MAX_GLOB_MATCHES`] paths, or the walk would read more than
/// [`MAX_GLOB_SCANNED_ENTRIES`] directory entries, or the policy's budget runs out (in entries,
/// or past [`MAX_GLOB_PATTERNS`] patterns).
///
/// `for_deny`: the pattern denies what it matches, so it fails closed: a directory the walk
/// cannot read is an error (a file there could match and would stay readable), never a skipped
/// subtree. An allowing pattern just matches less.
pub fn expand_within(
    pattern: &Path,
    max_depth: usize,
    budget: &mut GlobBudget,
    for_deny: bool,
) -> Result<Vec<PathBuf>, PolicyError> {
    let text = pattern.to_string_lossy();
    let fail = |message: String| PolicyError::Glob {
        pattern: text.clone().into_owned(),
        message,
    };
    if text.split('/').any(|c| c == ".." || c == ".") {
        return Err(fail(
            "\"..\" and \".\" components are not allowed in a glob; write the path out".to_owned(),
        ));
    }
    if budget.patterns_left == 0 {
        return Err(fail(format!(
            "the policy holds more than MAX_GLOB_PATTERNS ({MAX_GLOB_PATTERNS}) distinct glob \
             entries; merge them"
        )));
    }
    budget.patterns_left -= 1;
    if max_depth > MAX_GLOB_SCAN_MAX_DEPTH {
        return Err(fail(format!(
            "glob_scan_max_depth {max_depth} exceeds MAX_GLOB_SCAN_MAX_DEPTH ({MAX_GLOB_SCAN_MAX_DEPTH})"
        )));
    }
    let components: Vec<Vec<Token>> = text
        .split('/')
        .filter(|c| !c.is_empty())
        .map(|c| {
            if c == "**" {
                vec![Token::Globstar]
            } else {
                tokenize(c)
            }
        })
        .collect();
    let literal = components
        .iter()
        .take_while(|c| c.iter().all(|t| matches!(t, Token::Literal(_))))
        .count();
    let mut base = PathBuf::from("/");
    for component in &components[..literal] {
        let literal: String = component
            .iter()
            .filter_map(|t| match t {
                Token::Literal(c) => Some(*c),
                _ => None,
            })
            .collect();
        base.push(literal);
    }
    let mut walk = Walk {
        found: Vec::new(),
        entries_left: budget.entries_left,
        exhausted: false,
        strict: for_deny,
        unreadable: None,
    };
    walk.walk(&base, &components[literal..], max_depth);
    budget.entries_left = walk.entries_left;
    if let Some((dir, err)) = walk.unreadable {
        return Err(fail(format!(
            "cannot read {} ({err}); a deny pattern must see every directory it could match in, \
             or a matching file there would stay readable",
            dir.display()
        )));
    }
    if walk.exhausted {
        return Err(fail(
            "the policy's globs together read more than MAX_GLOB_SCANNED_ENTRIES \
             directory entries; start them deeper, merge them or lower glob_scan_max_depth"
                .to_owned(),
        ));
    }
    let mut found = walk.found;
    found.sort();
    found.dedup();
    if found.len() > MAX_GLOB_MATCHES {
        return Err(fail(format!(
            "matches more than {MAX_GLOB_MATCHES} paths; narrow it"
        )));
    }
    Ok(found)
}

/// One step of a pattern component.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A whole `**` component.
    Globstar,
    /// `*`.
    Star,
    /// `?`.
    One,
    /// `[...]`: ranges and single characters, possibly negated.
    Class {
        negated: bool,
        items: Vec<char>,
    },
    Literal(char),
}

impl Token {
    /// Whether this single-character token matches `c`.
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::One => true,
            Token::Literal(l) => *l == c,
            Token::Class { negated, items } => class_matches(items, c) != *negated,
            Token::Globstar | Token::Star => false,
        }
    }
}

fn tokenize(component: &str) -> Vec<Token> {
    let chars: Vec<char> = component.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                // Consecutive stars match the same as one.
                if tokens.last() != Some(&Token::Star) {
                    tokens.push(Token::Star);
                }
            }
            '?' => tokens.push(Token::One),
            '[' => match chars[i + 1..].iter().position(|c| *c == ']') {
                Some(close) => {
                    let class = &chars[i + 1..i + 1 + close];
                    let (negated, items) = match class.split_first() {
                        Some(('!' | '^', rest)) => (true, rest.to_vec()),
                        _ => (false, class.to_vec()),
                    };
                    tokens.push(Token::Class { negated, items });
                    i += close + 1;
                }
                // No closing bracket: a literal `[`.
                None => tokens.push(Token::Literal('[')),
            },
            c => tokens.push(Token::Literal(c)),
        }
        i += 1;
    }
    tokens
}

struct Walk {
    found: Vec<PathBuf>,
    entries_left: usize,
    /// An entry was left unread because the budget ran out.
    exhausted: bool,
    /// Unreadable directories are an error (deny patterns).
    strict: bool,
    /// The first directory that could not be read, under `strict`.
    unreadable: Option<(PathBuf, std::io::Error)>,
}

impl Walk {
    fn walk(&mut self, dir: &Path, rest: &[Vec<Token>], depth_left: usize) {
        if self.found.len() > MAX_GLOB_MATCHES || self.exhausted {
            return;
        }
        let Some((first, tail)) = rest.split_first() else {
            if dir.symlink_metadata().is_ok() {
                self.found.push(dir.to_owned());
            }
            return;
        };
        if first.as_slice() == [Token::Globstar] {
            self.walk(dir, tail, depth_left);
            if depth_left == 0 {
                return;
            }
            for (path, is_dir) in self.read_dir(dir) {
                if is_dir {
                    self.walk(&path, rest, depth_left - 1);
                }
            }
            return;
        }
        for (path, is_dir) in self.read_dir(dir) {
            // Names that are not UTF-8 are matched on their lossy form: a literal in the
            // pattern never matches a replacement character, and `*` still spans it, so
            // `*.pem` matches `\xff.pem` (a deny must not miss it).
            let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
                continue;
            };
            if !matches_tokens(first, &name) {
                continue;
            }
            if tail.is_empty() {
                self.found.push(path);
            } else if is_dir && depth_left > 0 {
                self.walk(&path, tail, depth_left - 1);
            }
        }
    }

    /// Directory entries as `(path, is_real_directory)`, charged to the budget; an unreadable
    /// directory yields nothing (and is recorded under `strict`; a missing one is fine).
    fn read_dir(&mut self, dir: &Path) -> Vec<(PathBuf, bool)> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err) => {
                if self.strict
                    && err.kind() != std::io::ErrorKind::NotFound
                    && self.unreadable.is_none()
                {
                    self.unreadable = Some((dir.to_owned(), err));
                }
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    if self.strict && self.unreadable.is_none() {
                        self.unreadable = Some((dir.to_owned(), err));
                    }
                    continue;
                }
            };
            if self.entries_left == 0 {
                self.exhausted = true;
                break;
            }
            self.entries_left -= 1;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            out.push((entry.path(), is_dir));
        }
        out
    }
}

/// Matches one path component against one pattern component.
#[cfg(test)]
fn matches(pattern: &str, name: &str) -> bool {
    matches_tokens(&tokenize(pattern), name)
}

/// Linear-time wildcard matching: on a mismatch, only the most recent `*` is retried one
/// character further, so hostile patterns like `*a*a*a*a*b` cannot backtrack exponentially.
fn matches_tokens(tokens: &[Token], name: &str) -> bool {
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match tokens.get(p) {
            Some(Token::Star) => {
                star = Some((p, n));
                p += 1;
            }
            Some(token) if token.accepts(name[n]) => {
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
    tokens[p..].iter().all(|t| *t == Token::Star)
}

fn class_matches(class: &[char], c: char) -> bool {
    let mut i = 0;
    while i < class.len() {
        if i + 2 < class.len() && class[i + 1] == '-' {
            if class[i] <= c && c <= class[i + 2] {
                return true;
            }
            i += 3;
        } else {
            if class[i] == c {
                return true;
            }
            i += 1;
        }
    }
    false
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
        assert!(matches("*", ""));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("[x", "[x"));
        assert!(matches("**.rs", "main.rs"));
        assert!(matches("[^a]?", "bz"));
    }

    #[test]
    fn hostile_patterns_match_in_linear_time() {
        // Exponential for a backtracking matcher: 40 stars against 255 characters.
        let pattern = format!("{}b", "*a".repeat(40));
        let name = "a".repeat(255);
        let started = std::time::Instant::now();
        assert!(!matches(&pattern, &name));
        assert!(matches(&pattern, &format!("{name}b")));
        // Generous: linear matching takes microseconds; backtracking would take years.
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn a_walk_over_budget_or_too_deep_is_an_error_not_a_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let too_deep =
            expand(&dir.path().join("**/x"), MAX_GLOB_SCAN_MAX_DEPTH + 1, false).unwrap_err();
        assert!(
            too_deep.to_string().contains("MAX_GLOB_SCAN_MAX_DEPTH"),
            "{too_deep}"
        );
        // 6 directories of 100 files against a budget of 500 entries (the real one is
        // MAX_GLOB_SCANNED_ENTRIES; creating 100,000 files takes a minute on some filesystems).
        for i in 0..6 {
            let sub = dir.path().join(format!("d{i}"));
            std::fs::create_dir(&sub).unwrap();
            for j in 0..100 {
                std::fs::write(sub.join(format!("f{j}")), "").unwrap();
            }
        }
        let budget = |entries| GlobBudget::with_entries(entries);
        let error = expand_within(
            &dir.path().join("*/nothing-matches"),
            8,
            &mut budget(500),
            false,
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("MAX_GLOB_SCANNED_ENTRIES"),
            "{error}"
        );
        // Reading exactly the budget is within it (d0 holds 100 entries).
        assert_eq!(
            expand_within(&dir.path().join("d0/*"), 8, &mut budget(100), false)
                .unwrap()
                .len(),
            100
        );
        // Starting deeper stays within the budget.
        assert_eq!(
            expand_within(&dir.path().join("d0/f1?"), 8, &mut budget(500), false)
                .unwrap()
                .len(),
            10
        );
    }

    #[test]
    fn one_budget_bounds_all_the_globs_of_a_policy() {
        let dir = tempfile::tempdir().unwrap();
        for j in 0..100 {
            std::fs::write(dir.path().join(format!("f{j}")), "").unwrap();
        }
        // Each walk of the directory reads its 100 entries: three fit a budget of 300, the
        // fourth does not, although each alone would.
        let mut budget = GlobBudget::with_entries(300);
        for suffix in ["1", "2", "3"] {
            expand_within(
                &dir.path().join(format!("*{suffix}")),
                8,
                &mut budget,
                false,
            )
            .unwrap();
        }
        let error = expand_within(&dir.path().join("*4"), 8, &mut budget, false).unwrap_err();
        assert!(error.to_string().contains("together"), "{error}");
        // The number of patterns is bounded too, even when they read nothing.
        let mut budget = GlobBudget::new();
        let missing = dir.path().join("missing");
        for i in 0..MAX_GLOB_PATTERNS {
            expand_within(&missing.join(format!("{i}/*")), 8, &mut budget, false).unwrap();
        }
        let error = expand_within(&missing.join("last/*"), 8, &mut budget, false).unwrap_err();
        assert!(error.to_string().contains("MAX_GLOB_PATTERNS"), "{error}");
    }

    #[test]
    fn a_deny_pattern_fails_closed_on_an_unreadable_directory_and_sees_non_utf8_names() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let odd = std::ffi::OsStr::from_bytes(b"\xffkey.pem");
        std::fs::write(dir.path().join(odd), "k").unwrap();
        let found = expand(&dir.path().join("*.pem"), 4, true).unwrap();
        assert_eq!(found, vec![dir.path().join(odd)]);
        if nix::unistd::geteuid().is_root() {
            // Root reads any directory; an unreadable one needs an unprivileged walker.
            return;
        }
        let locked = dir.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let err = expand(&dir.path().join("**/*.pem"), 4, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
        assert!(expand(&dir.path().join("**/*.pem"), 4, false).is_ok());
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn dot_dot_is_refused_in_a_glob() {
        for pattern in ["/tmp/../etc/*", "/tmp/*/../x", "/tmp/./*", "/tmp/**/.."] {
            let err = expand(Path::new(pattern), 4, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains("not allowed in a glob"), "{pattern}: {err}");
        }
    }

    #[test]
    fn expand_walks_double_star_and_stops_at_depth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b/c")).unwrap();
        std::fs::write(dir.path().join("a/top.pem"), "").unwrap();
        std::fs::write(dir.path().join("a/b/c/deep.pem"), "").unwrap();
        let pattern = dir.path().join("**/*.pem");
        let all = expand(&pattern, 8, false).unwrap();
        assert_eq!(
            all,
            vec![
                dir.path().join("a/b/c/deep.pem"),
                dir.path().join("a/top.pem")
            ]
        );
        let shallow = expand(&pattern, 1, false).unwrap();
        assert_eq!(shallow, vec![dir.path().join("a/top.pem")]);
    }
}
