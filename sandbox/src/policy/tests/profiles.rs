//! The built-in profiles resolve to the documented rules, and a mistyped name gets a hint.

use pretty_assertions::assert_eq;

use super::*;

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
