//! Writable roots: the rule limit, protected names at any depth, symlinks a sandbox could have
//! planted, and workspaces under /tmp.

use pretty_assertions::assert_eq;

use super::*;

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
