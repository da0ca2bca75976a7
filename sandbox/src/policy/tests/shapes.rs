//! The input shapes (reference permissions, legacy policies, profile files), precedence and
//! round trips.

use pretty_assertions::assert_eq;

use super::*;

#[test]
fn permissions_profile_in_reference_shape_resolves_with_precedence() {
    let value = json!({
        "permissions": {
            "type": "managed",
            "network": "enabled",
            "file_system": {"type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                {"path": {"type": "special", "value": {"kind": "project_roots", "subpath": "out"}}, "access": "write"},
                {"path": {"type": "path", "path": "file:///srv/ws/out/secret%20dir"}, "access": "none"},
                {"path": {"type": "path", "path": "/srv/ws/out/x"}, "access": "read"},
                {"path": {"type": "path", "path": "/srv/ws/out/x"}, "access": "deny"},
                {"path": {"type": "special", "value": {"kind": "some_future_thing"}}, "access": "read"}
            ]}
        },
        "cwd": "file:///srv/ws",
        "windowsSandboxLevel": "disabled"
    });
    let policy = spec(value).resolve_with(&ctx()).unwrap();
    assert_eq!(
        policy.rules(),
        &[
            rule("/", Access::Read),
            rule("/dev/null", Access::Write),
            rule("/srv/ws/out", Access::Write),
            rule("/srv/ws/out/secret dir", Access::Deny),
            rule("/srv/ws/out/x", Access::Deny),
        ]
    );
    assert!(policy.network_allowed());
    assert!(!policy.can_read(Path::new("/srv/ws/out/secret dir/key")));
}

#[test]
fn unknown_special_with_deny_fails_closed() {
    let value = json!({"permissions": {"type": "managed", "network": "restricted", "file_system": {
        "type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "future"}}, "access": "deny"}]}}});
    let err = spec(value).resolve_with(&ctx()).unwrap_err();
    assert!(matches!(err, PolicyError::UnknownSpecial { .. }), "{err}");
}

#[test]
fn untagged_reference_permission_profile_is_accepted() {
    let value = json!({"permissions": {"network": {"enabled": false}, "file_system": {"entries": [
        {"path": {"type": "special", "value": {"kind": "minimal"}}, "access": "read"},
        {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"}]}}});
    let policy = spec(value).resolve_with(&ctx()).unwrap();
    assert!(policy.can_read(Path::new("/usr/bin/env")));
    assert!(!policy.can_read(Path::new("/root")));
    assert!(policy.can_write(Path::new("/tmp/x")));
}

#[test]
fn legacy_policy_flattened_and_nested_resolve_alike() {
    let flat = spec(
        json!({"type": "workspace-write", "writable_roots": ["/opt/cache"],
        "network_access": true, "exclude_tmpdir_env_var": true, "exclude_slash_tmp": false,
        "cwd": "/srv/ws"}),
    )
    .resolve_with(&ctx())
    .unwrap();
    let nested = spec(
        json!({"sandboxPolicy": {"type": "workspaceWrite", "writableRoots": ["/opt/cache"],
        "networkAccess": true, "excludeTmpdirEnvVar": true},
        "sandboxPolicyCwd": "file:///srv/ws"}),
    )
    .resolve_with(&ctx())
    .unwrap();
    assert_eq!(flat, nested);
    assert!(flat.network_allowed());
    assert!(flat.can_write(Path::new("/opt/cache/a")));
    assert!(!flat.can_write(Path::new("/var/tmp/a")));
    let full = spec(json!({"type": "danger-full-access"}))
        .resolve_with(&ctx())
        .unwrap();
    assert_eq!(full, ResolvedPolicy::unrestricted());
    assert!(!full.restricts_filesystem());
}

#[test]
fn malformed_specs_are_rejected_with_the_expected_form() {
    let cases = [
        (json!({"profile": "workspace-write", "bogus": 1}), "bogus"),
        (
            json!({"profile": "nope", "cwd": "/x"}),
            "read-only, workspace-write",
        ),
        (json!({"cwd": "/x"}), "\"profile\", \"permissions\""),
        (
            json!({"profile": "read-only", "cwd": "relative/dir"}),
            "file: URI",
        ),
        (
            json!({"profile": "read-only", "cwd": "file:///a/../b"}),
            "file: URI",
        ),
        (
            json!({"type": "read-only", "access": {"type": "restricted"}}),
            "full-access",
        ),
        (
            json!({"permissions": {"type": "managed"}, "profile": 1}),
            "profile",
        ),
        (json!([1]), "JSON object"),
    ];
    for (value, needle) in cases {
        let message = match SandboxSpec::try_from(value.clone()) {
            Ok(parsed) => parsed.resolve_with(&ctx()).unwrap_err().to_string(),
            Err(err) => err.to_string(),
        };
        assert!(message.contains(needle), "{value}: {message}");
    }
}

#[test]
fn spec_round_trips_through_json() {
    let inputs = [
        json!({"profile": "workspace-write", "cwd": "/srv/ws", "writableRoots": ["/opt/c"], "networkAccess": true}),
        json!({"type": "read-only", "network_access": false}),
        json!({"permissions": {"type": "disabled"}, "workspaceRoots": ["/a"]}),
    ];
    for input in inputs {
        let parsed = spec(input);
        let text = serde_json::to_string(&parsed).unwrap();
        let again = SandboxSpec::from_json(&text).unwrap();
        assert_eq!(parsed, again, "{text}");
    }
}

#[test]
fn resolved_policy_round_trips_and_hashes() {
    use std::collections::HashSet;
    let policy = SandboxSpec::named("workspace-write", Some(PathBuf::from("/srv/ws")))
        .resolve_with(&ctx())
        .unwrap();
    let text = serde_json::to_string(&policy).unwrap();
    let back: ResolvedPolicy = serde_json::from_str(&text).unwrap();
    assert_eq!(policy, back);
    let set: HashSet<ResolvedPolicy> = [policy.clone(), back].into_iter().collect();
    assert_eq!(set.len(), 1);
    let roots = policy.writable_roots();
    assert!(roots.iter().any(|r| r.root == Path::new("/srv/ws")));
}

#[test]
fn more_specific_rule_wins_and_deny_beats_write_at_equal_depth() {
    let rules = resolve::normalize_rules(
        vec![
            rule("/", Access::Read),
            rule("/a", Access::Write),
            rule("/a", Access::Deny),
            rule("/a/b", Access::Write),
            rule("/a/b/c", Access::Write),
        ],
        &[],
    );
    assert_eq!(
        rules,
        vec![
            rule("/", Access::Read),
            rule("/a", Access::Deny),
            rule("/a/b", Access::Write),
        ]
    );
}

#[test]
fn user_profile_file_parses_and_rejects_bad_keys() {
    let text = r#"
        description = "mine"
        network = true
        protected_subpaths = [".git"]
        [filesystem]
        ":minimal" = "read"
        ":project_roots/build" = "write"
        "/opt/tools" = "read"
    "#;
    let profile = ProfileFile::parse(text, "mine.toml").unwrap();
    let policy = profile
        .resolve(Some(Path::new("/srv/ws")), &[], &ctx())
        .unwrap();
    assert!(policy.can_write(Path::new("/srv/ws/build/x")));
    assert!(!policy.can_write(Path::new("/srv/ws/src")));
    assert!(policy.network_allowed());
    let bad = ProfileFile::parse("[filesystem]\n\"relative\" = \"read\"\n", "bad.toml");
    assert!(bad.unwrap_err().to_string().contains("absolute path"));
    let bad = ProfileFile::parse("[filesystem]\n\"/x\" = \"rw\"\n", "bad.toml");
    assert!(bad.is_err());
}

#[test]
fn builtin_profiles_all_parse() {
    for (name, _) in BUILTIN_PROFILES {
        builtin_profile(name).unwrap();
    }
    let denied = ResolvedPolicy::unrestricted().with_denied_path(Path::new("/run/x.sock"));
    assert_eq!(denied, ResolvedPolicy::unrestricted());
}

#[test]
fn file_uri_paths_keep_non_utf8_bytes() {
    use std::os::unix::ffi::OsStrExt;
    let path = crate::policy::wire::parse_abs("cwd", "file:///tmp/%FF%FEdir").unwrap();
    assert_eq!(path.as_os_str().as_bytes(), b"/tmp/\xff\xfedir");
    assert!(crate::policy::wire::parse_abs("cwd", "file://server/x").is_err());
    assert!(crate::policy::wire::parse_abs("cwd", "file:///a/../b").is_err());
}
