use std::path::{Path, PathBuf};

use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

fn ctx() -> ResolveContext {
    ResolveContext {
        tmpdir: Some(PathBuf::from("/var/tmp")),
        homes: Vec::new(),
        ..Default::default()
    }
}

fn rule(path: &str, access: Access) -> PathRule {
    PathRule {
        path: PathBuf::from(path),
        access,
    }
}

fn spec(value: serde_json::Value) -> SandboxSpec {
    serde_json::from_value(value).unwrap()
}

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

/// A directory outside /tmp and $TMPDIR (which every sandbox sees a private copy of), where a
/// writable root is a host directory a sandbox can plant symlinks in.
fn host_workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

/// A directory outside `/dev` (whose paths resolve lexically, not through symlinks) and `/tmp`
/// (every sandbox's private layer).
fn disk_workspace() -> (tempfile::TempDir, PathBuf) {
    // In /srv, outside /tmp and the test $TMPDIR (/var/tmp), wherever the checkout is (a
    // workspace under /tmp has its own test:
    // a_workspace_under_tmp_is_a_host_directory_sandboxes_write_and_its_plants_are_refused).
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/srv")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

#[test]
fn read_only_profile_reads_everywhere_and_writes_only_dev_null() {
    let policy = spec(json!({"profile": "read-only"}))
        .resolve_with(&ctx())
        .unwrap();
    assert_eq!(
        policy,
        ResolvedPolicy {
            filesystem: FilesystemPolicy::Restricted {
                rules: vec![rule("/", Access::Read), rule("/dev/null", Access::Write)],
            },
            network: NetworkPolicy::Off,
            hidden: Vec::new(),
            read_only: Vec::new(),
            denied_tcp_ports: Vec::new(),
            tmpdir: None,
            unix_sockets: Vec::new(),
        }
    );
    assert!(policy.restricts_filesystem());
    assert!(!policy.network_allowed());
    assert!(policy.narrowing_rules().is_empty());
}

#[test]
fn workspace_write_grants_cwd_tmp_and_tmpdir_and_protects_git() {
    let (_dir, ws) = workspace();
    std::fs::create_dir(ws.join(".git")).unwrap();
    let cwd = format!("file://{}", ws.display());
    let policy = spec(json!({"profile": "workspace-write", "cwd": cwd}))
        .resolve_with(&ctx())
        .unwrap();
    let ws_str = ws.display().to_string();
    let mut expected = vec![
        rule("/", Access::Read),
        rule("/dev/null", Access::Write),
        rule("/tmp", Access::Write),
        rule("/var/tmp", Access::Write),
    ];
    // Under /tmp too: a workspace there is a host directory bound into the private /tmp.
    expected.push(rule(&ws_str, Access::Write));
    expected.push(rule(&format!("{ws_str}/.git"), Access::Read));
    expected.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(policy.rules(), expected.as_slice());
    assert!(!policy.can_write(&ws.join(".git/config")));
    assert!(policy.can_write(&ws.join("src/main.rs")));
    assert!(!policy.can_write(Path::new("/etc/passwd")));
    assert_eq!(
        policy
            .narrowing_rules()
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>(),
        vec![ws.join(".git")]
    );
}

#[test]
fn gitdir_pointer_file_protects_the_directory_it_names() {
    let (_dir, ws) = workspace();
    std::fs::create_dir_all(ws.join("repo.git/worktrees/w")).unwrap();
    std::fs::create_dir(ws.join("w")).unwrap();
    std::fs::write(ws.join("w/.git"), "gitdir: ../repo.git/worktrees/w\n").unwrap();
    let policy = SandboxSpec::named("workspace-write", Some(ws.join("w")))
        .resolve_with(&ctx())
        .unwrap()
        .with_writable_root(&ws);
    assert!(!policy.can_write(&ws.join("repo.git/worktrees/w/HEAD")));
    assert!(!policy.can_write(&ws.join("w/.git")));
    assert!(policy.can_write(&ws.join("w/file")));
}

#[test]
fn cwd_dependent_profile_without_cwd_is_an_error_naming_the_entry() {
    let err = spec(json!({"profile": "workspace-write"}))
        .resolve_with(&ctx())
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains(":project_roots"), "{message}");
    assert!(message.contains("cwd"), "{message}");
}

#[test]
fn workspace_roots_stand_in_for_cwd() {
    let policy = spec(
        json!({"profile": "workspace-write", "workspaceRoots": ["file:///srv/a", "/srv/b"],
                             "excludeSlashTmp": true, "excludeTmpdirEnvVar": true}),
    )
    .resolve_with(&ctx())
    .unwrap();
    assert_eq!(
        policy.rules(),
        &[
            rule("/", Access::Read),
            rule("/dev/null", Access::Write),
            rule("/srv/a", Access::Write),
            rule("/srv/b", Access::Write),
        ]
    );
}

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
    let path = super::wire::parse_abs("cwd", "file:///tmp/%FF%FEdir").unwrap();
    assert_eq!(path.as_os_str().as_bytes(), b"/tmp/\xff\xfedir");
    assert!(super::wire::parse_abs("cwd", "file://server/x").is_err());
    assert!(super::wire::parse_abs("cwd", "file:///a/../b").is_err());
}

/// `n` `:project_roots` subpath entries over `n` workspace roots: `n * n` rules.
fn project_roots_product(n: usize) -> SandboxSpec {
    let entries: Vec<_> = (0..n)
        .map(|i| {
            json!({"path": {"type": "special", "value": {"kind": "project_roots", "subpath": format!("s{i}")}},
                   "access": "write"})
        })
        .collect();
    let roots: Vec<_> = (0..n)
        .map(|i| format!("/execward-no-such-root-{i}"))
        .collect();
    spec(json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": entries}},
        "cwd": "/tmp",
        "workspaceRoots": roots,
    }))
}

#[test]
fn policy_expanding_past_max_resolved_rules_is_refused_not_resolved() {
    // 100 x 100 = 10,000 rules: resolving them used to take tens of seconds of CPU.
    let err = project_roots_product(100).resolve_with(&ctx()).unwrap_err();
    assert!(
        matches!(
            err,
            PolicyError::TooManyRules {
                limit: MAX_RESOLVED_RULES
            }
        ),
        "{err}"
    );
    // 20 x 20 = 400 rules is within the limit.
    let policy = project_roots_product(20).resolve_with(&ctx()).unwrap();
    assert!(policy.can_write(Path::new("/execward-no-such-root-3/s7")));
}

#[test]
fn protected_names_are_found_at_any_depth_of_a_writable_root() {
    let (_dir, ws) = workspace();
    std::fs::create_dir_all(ws.join("vendor/lib/.git/hooks")).unwrap();
    std::fs::create_dir_all(ws.join("a/b/c/.agents")).unwrap();
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(ws.join(".git/modules/sub")).unwrap();
    std::fs::write(ws.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
    let cwd = format!("file://{}", ws.display());
    let policy = spec(json!({"profile": "workspace-write", "cwd": cwd}))
        .resolve_with(&ctx())
        .unwrap();
    for protected in [
        "vendor/lib/.git",
        "a/b/c/.agents",
        "sub/.git",
        ".git",
        // the submodule's pointer names a directory relative to its own location
        ".git/modules/sub",
    ] {
        let path = ws.join(protected);
        assert!(!policy.can_write(&path), "{protected} stays writable");
        assert!(policy.can_read(&path), "{protected} became unreadable");
    }
    assert!(policy.can_write(&ws.join("vendor/lib/src.rs")));
}

#[test]
fn a_symlink_a_sandbox_could_have_planted_is_refused_in_a_root_or_cwd() {
    let (_dir, ws) = host_workspace();
    let (_outside_dir, outside) = host_workspace();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
    let link = ws.join("link");
    // The next command's cwd through the planted link.
    let err = spec(json!({"profile": "workspace-write", "cwd": link.to_str().unwrap()}))
        .resolve_with(&ctx());
    // The cwd itself is the workspace root here, reached through a link in a directory that
    // is not writable yet: allowed (the user named it). A root inside the workspace is not.
    assert!(err.is_ok(), "{err:?}");
    let err = spec(json!({
        "profile": "workspace-write",
        "cwd": ws.to_str().unwrap(),
        "writableRoots": [link.join("sub").to_str().unwrap()],
    }))
    .resolve_with(&ctx())
    .unwrap_err();
    assert!(
        matches!(&err, PolicyError::PlantedSymlink { link: found, .. } if *found == link),
        "{err}"
    );
    let read_through = spec(json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "path", "path": ws.to_str().unwrap()}, "access": "write"},
            {"path": {"type": "path", "path": link.to_str().unwrap()}, "access": "read"},
        ]}}
    }))
    .resolve_with(&ctx())
    .unwrap_err();
    assert!(
        matches!(read_through, PolicyError::PlantedSymlink { .. }),
        "{read_through}"
    );
    // A deny rule through the link would hide the link's target, not what the user named
    // (which the plant moved away): refused as well.
    let deny = spec(json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "path", "path": ws.to_str().unwrap()}, "access": "write"},
            {"path": {"type": "path", "path": link.join("secret").to_str().unwrap()}, "access": "deny"},
        ]}}
    }))
    .resolve_with(&ctx())
    .unwrap_err();
    assert!(
        matches!(&deny, PolicyError::PlantedSymlink { link: found, .. } if *found == link),
        "{deny}"
    );
}

#[test]
fn a_cwd_planted_by_an_earlier_sandbox_is_refused_and_an_unplanted_one_resolves() {
    let (_dir, ws) = disk_workspace();
    let (_outside_dir, outside) = disk_workspace();
    // The earlier command: workspace-write at the workspace.
    let earlier_policy = spec(json!({"profile": "workspace-write", "cwd": ws.to_str().unwrap()}))
        .resolve_with(&ctx())
        .unwrap();
    let mut earlier = PlantableDirs::default();
    earlier.record(&earlier_policy);
    let after = ResolveContext {
        earlier_writable: std::sync::Arc::new(earlier.clone()),
        ..ctx()
    };
    // Control: `task` a real directory; the next start there resolves, its root is `task`.
    std::fs::create_dir(ws.join("task")).unwrap();
    let next =
        |cwd: &Path| spec(json!({"profile": "workspace-write", "cwd": cwd.to_str().unwrap()}));
    let control = next(&ws.join("task")).resolve_with(&after).unwrap();
    assert!(control.plantable_roots().contains(&ws.join("task")));
    assert!(!control.plantable_roots().contains(&outside));
    // The plant: `task` replaced by a symlink to a directory outside every root.
    std::fs::remove_dir(ws.join("task")).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("task")).unwrap();
    // Without the record, the workspace is not writable under the next policy: it would be
    // granted `outside` (what the attack relied on).
    let unrecorded = next(&ws.join("task")).resolve_with(&ctx()).unwrap();
    assert!(unrecorded.plantable_roots().contains(&outside));
    let err = next(&ws.join("task")).resolve_with(&after).unwrap_err();
    assert!(
        matches!(&err, PolicyError::PlantedSymlink { link, .. } if *link == ws.join("task")),
        "{err}"
    );
    assert!(
        err.to_string().contains("resolves through the symlink"),
        "{err}"
    );
    // A writable root, a read entry and a deny entry through it are refused the same way.
    for (entry, access) in [
        ("task", "write"),
        ("task/sub", "read"),
        ("task/sub", "deny"),
    ] {
        let err = spec(json!({
            "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
                {"path": {"type": "path", "path": ws.join(entry).to_str().unwrap()}, "access": access},
            ]}}
        }))
        .resolve_with(&after)
        .unwrap_err();
        assert!(
            matches!(err, PolicyError::PlantedSymlink { .. }),
            "{entry} {access}: {err}"
        );
    }
    // The same check on a resolved policy (what the server applies to the process's cwd).
    assert!(matches!(
        control.refuse_planted_symlink_after(&ws.join("task"), &earlier),
        Err(PolicyError::PlantedSymlink { .. })
    ));
}

/// A directory in the host's /tmp (the CI clone lives there), outside the test $TMPDIR.
fn tmp_workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/tmp")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

#[test]
fn a_workspace_under_tmp_is_a_host_directory_sandboxes_write_and_its_plants_are_refused() {
    let (_dir, ws) = tmp_workspace();
    let (_outside_dir, outside) = disk_workspace();
    let earlier_policy = spec(json!({"profile": "workspace-write", "cwd": ws.to_str().unwrap()}))
        .resolve_with(&ctx())
        .unwrap();
    // The workspace stays a rule of its own beside the private /tmp (not merged into it), so
    // it is carried in and recorded; /tmp itself is not a host directory sandboxes write.
    assert!(
        earlier_policy
            .rules()
            .contains(&rule(ws.to_str().unwrap(), Access::Write)),
        "{:?}",
        earlier_policy.rules()
    );
    let plantable = earlier_policy.plantable_roots();
    assert!(plantable.contains(&ws), "{plantable:?}");
    assert!(!plantable.contains(&PathBuf::from("/tmp")), "{plantable:?}");
    // Writable roots inside it are redundant again.
    let nested = earlier_policy.clone().with_writable_root(&ws.join("sub"));
    assert_eq!(nested.rules(), earlier_policy.rules());
    let mut earlier = PlantableDirs::default();
    earlier.record(&earlier_policy);
    let after = ResolveContext {
        earlier_writable: std::sync::Arc::new(earlier),
        ..ctx()
    };
    let next =
        |cwd: &Path| spec(json!({"profile": "workspace-write", "cwd": cwd.to_str().unwrap()}));
    // Control: a real `task` resolves.
    std::fs::create_dir(ws.join("task")).unwrap();
    next(&ws.join("task")).resolve_with(&after).unwrap();
    // The plant: refused both by the record and by the next policy itself (which makes the
    // workspace's `task` writable, not the workspace: the record is what refuses it).
    std::fs::remove_dir(ws.join("task")).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("task")).unwrap();
    let unrecorded = next(&ws.join("task")).resolve_with(&ctx()).unwrap();
    assert!(
        unrecorded.plantable_roots().contains(&outside),
        "without the record the plant is followed (the attack)"
    );
    let err = next(&ws.join("task")).resolve_with(&after).unwrap_err();
    assert!(
        matches!(&err, PolicyError::PlantedSymlink { link, .. } if *link == ws.join("task")),
        "{err}"
    );
    // Under the workspace's own policy the symlink is in a directory it writes.
    assert!(matches!(
        earlier_policy.refuse_planted_symlink(&ws.join("task")),
        Err(PolicyError::PlantedSymlink { .. })
    ));
}

#[test]
fn a_workspace_under_a_writable_tmpdir_stays_a_writable_root_of_its_own() {
    // ctx()'s $TMPDIR is /var/tmp, writable (a private layer) under workspace-write.
    let dir = tempfile::Builder::new()
        .prefix("policy-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let policy = spec(json!({"profile": "workspace-write", "cwd": ws.to_str().unwrap()}))
        .resolve_with(&ctx())
        .unwrap();
    assert_eq!(policy.tmpdir.as_deref(), Some(Path::new("/var/tmp")));
    assert!(
        policy
            .rules()
            .contains(&rule(ws.to_str().unwrap(), Access::Write)),
        "{:?}",
        policy.rules()
    );
    let plantable = policy.plantable_roots();
    assert!(plantable.contains(&ws), "{plantable:?}");
    assert!(
        !plantable.contains(&PathBuf::from("/var/tmp")),
        "{plantable:?}"
    );
    // Where $TMPDIR is not writable it is no private layer: a root there merges as usual
    // into a writable ancestor (here none: it stays).
    let excluded = spec(json!({
        "profile": "workspace-write", "cwd": ws.to_str().unwrap(), "excludeTmpdirEnvVar": true
    }))
    .resolve_with(&ctx())
    .unwrap();
    assert_eq!(excluded.tmpdir, None);
    assert!(excluded.plantable_roots().contains(&ws));
}

#[test]
fn a_working_directory_carried_writable_into_the_private_tmp_becomes_a_writable_root() {
    let (_dir, cwd) = tmp_workspace();
    std::fs::create_dir(cwd.join(".git")).unwrap();
    // /tmp writable, the cwd named by no entry: carried in writable by the mount layout.
    let policy = spec(json!({
        "permissions": {"type": "managed", "file_system": {"type": "restricted", "entries": [
            {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
            {"path": {"type": "special", "value": {"kind": "slash_tmp"}}, "access": "write"},
        ]}}
    }))
    .resolve_with(&ctx())
    .unwrap();
    assert!(
        !policy.plantable_roots().contains(&cwd),
        "{:?}",
        policy.rules()
    );
    let started = policy.clone().with_working_directory(&cwd);
    assert!(started.plantable_roots().contains(&cwd), "{started:?}");
    assert!(!started.can_write(&cwd.join(".git/config")), "{started:?}");
    // A cwd the policy does not let it write, or one outside the private layers, adds nothing.
    let read_only = spec(json!({"profile": "read-only"}))
        .resolve_with(&ctx())
        .unwrap();
    assert_eq!(read_only.clone().with_working_directory(&cwd), read_only);
    let (_other, disk) = disk_workspace();
    assert_eq!(policy.clone().with_working_directory(&disk), policy);
}

#[test]
fn plantable_dirs_keep_outer_roots_and_stay_bounded() {
    let mut dirs = PlantableDirs::default();
    let policy = |roots: &[&str]| {
        ResolvedPolicy::new(
            FilesystemPolicy::Restricted {
                rules: roots.iter().map(|root| rule(root, Access::Write)).collect(),
            },
            false,
        )
    };
    dirs.record(&policy(&["/w/a/b", "/tmp"]));
    dirs.record(&policy(&["/w/a"]));
    assert_eq!(dirs.roots().collect::<Vec<_>>(), vec![Path::new("/w/a")]);
    assert!(dirs.contains(Path::new("/w/a/b/c")));
    assert!(
        !dirs.contains(Path::new("/tmp")),
        "the private /tmp is no host directory"
    );
    let many: Vec<String> = (0..=MAX_PLANTABLE_ROOTS)
        .map(|i| format!("/m/{i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    dirs.record(&policy(&many));
    assert!(dirs.roots().count() <= MAX_PLANTABLE_ROOTS);
    assert!(
        dirs.contains(Path::new("/m/17")),
        "a root was dropped instead of widened"
    );
}

#[test]
fn symlinks_no_sandbox_can_write_are_followed() {
    let (_dir, ws) = workspace();
    // /proc/self/cwd-like system links and a link in a read-only area resolve as before.
    let (_links_dir, links) = workspace();
    std::os::unix::fs::symlink(&ws, links.join("to-ws")).unwrap();
    let policy = spec(json!({
        "profile": "workspace-write",
        "cwd": links.join("to-ws").to_str().unwrap(),
    }))
    .resolve_with(&ctx())
    .unwrap();
    assert!(policy.can_write(&ws));
}

#[test]
fn wire_network_allowlist_resolves_and_keeps_sockets_in_their_own_namespace() {
    let policy = spec(json!({
        "profile": "read-only",
        "network": {"allow": ["PyPI.org", "*.crates.io", "@git-hosts"], "deny": ["evil.crates.io"]}
    }))
    .resolve_with(&ctx())
    .unwrap();
    let rules = policy.egress().expect("an allowlist");
    assert!(rules.allow.iter().any(|p| p.to_string() == "pypi.org"));
    assert!(rules.allow.iter().any(|p| p.to_string() == "github.com"));
    assert_eq!(rules.deny[0].to_string(), "evil.crates.io");
    assert!(policy.network_allowed(), "AF_INET sockets may be created");
    assert!(!policy.network_fully_on());
    assert!(policy.needs_network_namespace());
    assert!(!policy.is_unrestricted());
    // The resolved policy round-trips through the launch request's JSON.
    let json = serde_json::to_string(&policy).unwrap();
    assert_eq!(
        serde_json::from_str::<ResolvedPolicy>(&json).unwrap(),
        policy
    );
}

#[test]
fn wire_network_overrides_the_sources_own_setting() {
    let on = spec(json!({"type": "read-only", "network_access": false, "network": "on"}))
        .resolve_with(&ctx())
        .unwrap();
    assert!(on.network_fully_on());
    let off = spec(json!({"profile": "read-only", "networkAccess": true, "network": "off"}))
        .resolve_with(&ctx())
        .unwrap();
    assert!(!off.network_allowed());
}

#[test]
fn malformed_network_values_are_refused_with_the_accepted_forms() {
    for bad in [
        json!({"profile": "read-only", "network": {"allow": ["pypi.org"], "extra": true}}),
        json!({"profile": "read-only", "network": "sometimes"}),
        json!({"profile": "read-only", "network": {"allow": ["*"]}}),
        json!({"profile": "read-only", "network": {"allow": ["@unknown-set"]}}),
    ] {
        let err = serde_json::from_value::<SandboxSpec>(bad.clone()).unwrap_err();
        assert!(err.to_string().contains("expected"), "{bad}: {err}");
    }
}

#[test]
fn toml_profiles_take_an_allowlist_table() {
    let profile = ProfileFile::parse(
        "network = { allow = [\"pypi.org\", \"files.pythonhosted.org\"], deny = [] }\n\
         [filesystem]\n\":root\" = \"read\"\n",
        "test",
    )
    .unwrap();
    let policy = profile.resolve(None, &[], &ctx()).unwrap();
    assert_eq!(policy.egress().unwrap().allow.len(), 2);
    let switch = ProfileFile::parse("network = true\n", "test").unwrap();
    assert_eq!(switch.network, NetworkPolicy::On);
    assert!(ProfileFile::parse("network = { allow = [\"a b\"] }\n", "test").is_err());
}

#[test]
fn a_mistyped_profile_name_gets_the_nearest_suggestion() {
    let message = |name: &str| builtin_profile(name).unwrap_err().to_string();
    assert!(
        message("worksapce-write").contains("did you mean \"workspace-write\"?"),
        "{}",
        message("worksapce-write")
    );
    assert!(message("read_only").contains("did you mean \"read-only\"?"));
    assert!(message("READ-ONLY").contains("did you mean \"read-only\"?"));
    // Nothing near: the list only.
    let far = message("strict");
    assert!(!far.contains("did you mean"), "{far}");
    assert!(far.contains("expected one of: read-only, workspace-write, danger-full-access"));
}
