//! The policy parsers: the wire `sandbox` object ([`SandboxSpec::from_json`]) and the TOML
//! profile format ([`ProfileFile::parse`]), each followed by resolution against a fixed
//! [`ResolveContext`] and cwd, as the supervisor and fs-helper do before confining anything.
//!
//! The first input byte picks the parser and a few switches; the rest is the text.
//!
//! Resolution reads the filesystem (canonicalize, `.git` pointer files) but never writes it.
//! Inputs whose resolution would expand a glob are parsed but not resolved: a glob walks the
//! real filesystem below its literal prefix, which makes runs slow and non-deterministic.
//!
//! Invariants (no panic, and for every resolved policy):
//! - rules are absolute, lexically normal (no `.`/`..`), sorted and unique by path;
//! - each rule's own path gets exactly that rule's access (most specific wins);
//! - no rule repeats the access it would inherit (the list is normalised);
//! - adding a denied path never widens access anywhere and denies that path;
//! - the spec survives a serde round trip (the supervisor hands it to helpers as JSON) and
//!   resolves to the same policy after it;
//! - the resolved policy itself survives a serde round trip (it is the helper-pool key).
#![no_main]

use std::path::{Component, Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use sandbox::policy::{ProfileFile, ResolveContext};
use sandbox::{Access, ResolvedPolicy, SandboxSpec};

fn context() -> ResolveContext {
    ResolveContext {
        tmpdir: Some(PathBuf::from("/tmp/execward-fuzz-tmpdir")),
        homes: vec![PathBuf::from("/tmp/execward-fuzz-home")],
        ..Default::default()
    }
}

fn breadth(access: Access) -> u8 {
    match access {
        Access::Deny => 0,
        Access::Read => 1,
        Access::Write => 2,
    }
}

fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// Whether any string in the JSON (an entry path, a pattern, a root) has glob metacharacters.
fn has_glob_string(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(text) => has_glob(text),
        serde_json::Value::Array(items) => items.iter().any(has_glob_string),
        serde_json::Value::Object(map) => map
            .iter()
            .any(|(key, value)| has_glob(key) || has_glob_string(value)),
        _ => false,
    }
}

fn check_policy(policy: &ResolvedPolicy) {
    let rules = policy.rules();
    for pair in rules.windows(2) {
        assert!(
            pair[0].path < pair[1].path,
            "rules sorted and unique: {rules:?}"
        );
    }
    for rule in rules {
        assert!(rule.path.is_absolute(), "{rule:?}");
        assert!(
            rule.path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
            "rule path is lexically normal: {rule:?}"
        );
        assert_eq!(
            policy.access_for(&rule.path),
            rule.access,
            "{rule:?} in {rules:?}"
        );
        let inherited = rules
            .iter()
            .filter(|r| r.path != rule.path && rule.path.starts_with(&r.path))
            .max_by_key(|r| (r.path.components().count(), r.access))
            .map_or(Access::Deny, |r| r.access);
        assert_ne!(
            inherited, rule.access,
            "redundant rule {rule:?} in {rules:?}"
        );
    }
    let json = serde_json::to_string(policy).expect("policies serialize");
    let back: ResolvedPolicy = serde_json::from_str(&json).expect("policies deserialize");
    assert_eq!(&back, policy);

    if policy.restricts_filesystem() {
        let denied = Path::new("/tmp/execward-fuzz-denied/socket");
        let narrowed = policy.clone().with_denied_path(denied);
        assert_eq!(narrowed.access_for(denied), Access::Deny);
        let mut probes: Vec<&Path> = rules.iter().map(|r| r.path.as_path()).collect();
        probes.extend([
            Path::new("/"),
            Path::new("/tmp"),
            denied,
            Path::new("/tmp/x"),
        ]);
        for probe in probes {
            assert!(
                breadth(narrowed.access_for(probe)) <= breadth(policy.access_for(probe)),
                "denying {denied:?} widened {probe:?}"
            );
        }
    }
}

fn spec(text: &str) {
    let Ok(spec) = SandboxSpec::from_json(text) else {
        return;
    };
    let value = serde_json::to_value(&spec).expect("specs serialize");
    let wire = value.to_string();
    let globs = has_glob_string(&value);
    let again = SandboxSpec::try_from(value).expect("a serialized spec parses");
    assert_eq!(again, spec, "spec changed in a round trip through {wire}");
    if globs {
        return;
    }
    let resolved = spec.resolve_with(&context());
    if let Ok(policy) = &resolved {
        check_policy(policy);
    }
    let resolved_again = again.resolve_with(&context());
    assert_eq!(
        resolved.as_ref().ok(),
        resolved_again.as_ref().ok(),
        "round-tripped spec resolves differently"
    );
}

fn profile(text: &str, cwd: Option<&Path>, roots: &[PathBuf]) {
    let Ok(profile) = ProfileFile::parse(text, "fuzz.toml") else {
        return;
    };
    assert!(!(profile.full_filesystem_access && !profile.filesystem.is_empty()));
    let text = toml::to_string(&profile).expect("profiles serialize");
    let again = ProfileFile::parse(&text, "round-trip.toml").expect("a serialized profile parses");
    assert_eq!(
        again, profile,
        "profile changed in a round trip through {text}"
    );
    if profile.filesystem.keys().any(|key| has_glob(key)) {
        return;
    }
    if let Ok(policy) = profile.resolve(cwd, roots, &context()) {
        check_policy(&policy);
        if profile.full_filesystem_access {
            assert!(!policy.restricts_filesystem());
        }
        assert_eq!(policy.network, profile.network);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    if selector & 1 == 0 {
        spec(text);
    } else {
        let cwd = (selector & 2 != 0).then(|| Path::new("/tmp/execward-fuzz-cwd"));
        let roots = if selector & 4 != 0 {
            vec![
                PathBuf::from("/tmp/execward-fuzz-a"),
                PathBuf::from("/tmp/b"),
            ]
        } else {
            Vec::new()
        };
        profile(text, cwd, &roots);
    }
});
