//! The keys beside a wire `sandbox` object's source that give the server what `sandbox-run`'s
//! flags give the command line: `profileToml`, `writableRoots`, `denyPaths`, `allowances`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;

fn ctx() -> ResolveContext {
    ResolveContext {
        tmpdir: None,
        homes: Vec::new(),
        ..Default::default()
    }
}

/// A directory outside /tmp (every sandbox's private layer), on disk.
fn disk_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("wire-test-")
        .tempdir_in("/srv")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    (dir, path)
}

fn resolve(value: serde_json::Value) -> Result<ResolvedPolicy, PolicyError> {
    SandboxSpec::try_from(value)?.resolve_with(&ctx())
}

#[test]
fn profile_toml_resolves_as_the_same_file_does() {
    let (_dir, ws) = disk_dir();
    let text = "description = \"test\"\n[filesystem]\n\"/usr\" = \"read\"\n\":cwd\" = \"write\"\n";
    let on_the_wire = resolve(json!({"profileToml": text, "cwd": ws})).unwrap();
    let from_the_file = ProfileFile::parse(text, "file")
        .unwrap()
        .resolve(Some(&ws), &[], &ctx())
        .unwrap();
    assert_eq!(on_the_wire, from_the_file);
    assert!(on_the_wire.can_write(&ws.join("x")));
    assert!(on_the_wire.can_read(Path::new("/usr/bin")));
    assert!(!on_the_wire.can_read(Path::new("/etc/passwd")));
}

#[test]
fn a_profile_toml_that_does_not_parse_is_refused_when_read_naming_the_key() {
    let error = SandboxSpec::try_from(json!({"profileToml": "[filesystem]\n\"/usr\" = \"rwx\""}))
        .unwrap_err()
        .to_string();
    assert!(error.contains("profileToml"), "{error}");
    let error = SandboxSpec::try_from(json!({"profileToml": 3}))
        .unwrap_err()
        .to_string();
    assert!(error.contains("profileToml must be a string"), "{error}");
    let error = SandboxSpec::try_from(json!({"profileToml": "", "type": "read-only"}))
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown key \"type\""), "{error}");
}

#[test]
fn deny_paths_hide_a_path_inside_a_writable_workspace() {
    let (_dir, ws) = disk_dir();
    let secret = ws.join("secrets");
    std::fs::create_dir(&secret).unwrap();
    let plain = resolve(json!({"profile": "workspace-write", "cwd": ws})).unwrap();
    assert!(plain.can_read(&secret.join("key")), "control: readable");
    let denied = resolve(json!({
        "profile": "workspace-write", "cwd": ws, "denyPaths": [secret],
    }))
    .unwrap();
    assert!(!denied.can_read(&secret.join("key")));
    assert!(!denied.can_write(&secret.join("key")));
    assert!(denied.can_write(&ws.join("other")));
    let error = resolve(json!({"profile": "read-only", "denyPaths": ["relative"]}))
        .unwrap_err()
        .to_string();
    assert!(error.contains("denyPaths[]"), "{error}");
}

#[test]
fn writable_roots_beside_permissions_and_toml_are_writable() {
    let (_dir, ws) = disk_dir();
    let (_other_dir, other) = disk_dir();
    let permissions = json!({"network": {"enabled": false}, "file_system": {"entries": [
        {"path": {"type": "special", "value": {"kind": "minimal"}}, "access": "read"}]}});
    let without = resolve(json!({"permissions": permissions, "cwd": ws})).unwrap();
    assert!(
        !without.can_write(&other.join("f")),
        "control: not writable"
    );
    let with = resolve(json!({
        "permissions": permissions, "cwd": ws, "writableRoots": [other],
    }))
    .unwrap();
    assert!(with.can_write(&other.join("f")));
    let toml = resolve(json!({
        "profileToml": "[filesystem]\n\"/usr\" = \"read\"\n", "writableRoots": [other],
    }))
    .unwrap();
    assert!(toml.can_write(&other.join("f")));
}

#[test]
fn allowances_widen_the_policy_and_an_unknown_one_is_named() {
    let error = resolve(json!({"profile": "read-only", "allowances": ["toolchain-cachez"]}))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("toolchain-cachez") && error.contains("toolchain-caches"),
        "{error}"
    );
    let error = resolve(json!({"profile": "read-only", "allowances": "toolchain-caches"}))
        .unwrap_err()
        .to_string();
    assert!(error.contains("allowances must be an array"), "{error}");
}

#[test]
fn the_new_keys_survive_a_round_trip_through_json() {
    let spec = SandboxSpec::try_from(json!({
        "profileToml": "[filesystem]\n\"/usr\" = \"read\"\n",
        "writableRoots": ["/srv/a"],
        "denyPaths": ["/srv/a/secret"],
        "allowances": ["toolchain-caches"],
        "cwd": "/srv",
    }))
    .unwrap();
    let again = SandboxSpec::try_from(serde_json::Value::from(spec.clone())).unwrap();
    assert_eq!(again, spec);
    assert_eq!(spec.allowances, ["toolchain-caches"]);
    assert_eq!(spec.denied_paths, [PathBuf::from("/srv/a/secret")]);
    assert_eq!(spec.writable_roots, [PathBuf::from("/srv/a")]);
}

#[test]
fn allowances_resolve_under_the_contexts_home_not_the_environment() {
    let (_dir, home) = disk_dir();
    std::fs::create_dir_all(home.join(".cargo/registry")).unwrap();
    let ctx = ResolveContext {
        homes: vec![home.clone()],
        ..ctx()
    };
    let spec = |allowances: serde_json::Value| {
        SandboxSpec::try_from(json!({"profile": "read-only", "allowances": allowances}))
            .unwrap()
            .resolve_with(&ctx)
            .unwrap()
    };
    let registry = home.join(".cargo/registry/x");
    assert!(
        !spec(json!([])).can_write(&registry),
        "control: not writable"
    );
    assert!(spec(json!(["toolchain-caches"])).can_write(&registry));
}
