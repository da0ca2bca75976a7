//! The policy of a sandbox that only reads: the same reads as the full resolution, nothing
//! writable, and no search of the writable roots.

use super::*;

#[test]
fn a_reads_only_policy_grants_every_read_of_the_full_one_and_no_write() {
    let (_dir, ws) = workspace();
    let (_outside_dir, outside) = workspace();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::create_dir_all(ws.join("vendor/lib/.git")).unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {}").unwrap();
    std::fs::write(outside.join("secret"), "s").unwrap();
    let cwd = format!("file://{}", ws.display());
    let secret = format!("file://{}", outside.join("secret").display());
    let sandbox = spec(json!({
        "profile": "workspace-write",
        "cwd": cwd,
        "denyPaths": [secret],
        "writableRoots": ["file:///var/tmp/execward-reads-root"],
    }));
    let full = sandbox.resolve_with(&ctx()).unwrap();
    let reads = sandbox.resolve_reads_with(&ctx()).unwrap();
    assert!(!reads.is_unrestricted());
    let reads = reads.finish();
    let probes = [
        ws.clone(),
        ws.join("src/main.rs"),
        ws.join(".git/hooks/pre-commit"),
        ws.join("vendor/lib/.git/config"),
        outside.join("secret"),
        outside.clone(),
        PathBuf::from("/var/tmp/execward-reads-root/x"),
        PathBuf::from("/etc/passwd"),
        PathBuf::from("/"),
    ];
    for path in &probes {
        assert_eq!(
            reads.can_read(path),
            full.can_read(path),
            "{} is read differently",
            path.display()
        );
        assert!(!reads.can_write(path), "{} is writable", path.display());
    }
    // The probes cover both answers, and the full policy did write somewhere.
    assert!(!reads.can_read(&outside.join("secret")));
    assert!(reads.can_read(&ws.join(".git/hooks/pre-commit")));
    assert!(full.can_write(&ws.join("src/main.rs")));
    assert!(!full.can_write(&ws.join(".git/hooks/pre-commit")));
    assert!(
        reads
            .rules()
            .iter()
            .all(|rule| rule.access != Access::Write)
    );
    // The workspace was not searched: no rule names what only the search finds.
    for found in [".git", "vendor/lib/.git"] {
        let path = ws.join(found);
        assert!(full.rules().iter().any(|rule| rule.path == path), "{found}");
        assert!(
            !reads.rules().iter().any(|rule| rule.path == path),
            "{found}"
        );
    }
}

#[test]
fn finishing_keeps_every_rule_path_so_layouts_carry_in_the_same_directories() {
    let (_dir, ws) = workspace();
    let cwd = format!("file://{}", ws.display());
    let sandbox = spec(json!({"profile": "workspace-write", "cwd": cwd}));
    let full = sandbox.resolve_with(&ctx()).unwrap();
    let reads = sandbox
        .resolve_reads_with(&ctx())
        .unwrap()
        .narrow(|policy| Ok::<_, ()>(policy.with_hidden_path(&ws.join("token"))))
        .unwrap()
        .finish();
    let paths = |policy: &ResolvedPolicy| -> Vec<PathBuf> {
        policy
            .rules()
            .iter()
            .map(|rule| rule.path.clone())
            .collect()
    };
    let mut expected = paths(&full.with_hidden_path(&ws.join("token")));
    expected.retain(|path| !path.ends_with(".git"));
    assert_eq!(paths(&reads), expected);
    assert!(reads.hidden_paths().contains(&ws.join("token")));
    assert!(!reads.can_read(&ws.join("token")));
}
