//! Golden tests: every change to what a profile allows shows up in review as a diff of the
//! checked-in files under `tests/golden/`. Regenerate with `UPDATE_GOLDEN=1 cargo test -p execward-sandbox --test golden`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support functions outside #[test]

use std::path::{Path, PathBuf};

use sandbox::policy::{ResolveContext, SandboxSpec};

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing {}; run with UPDATE_GOLDEN=1", path.display()));
    pretty_assertions::assert_eq!(expected, actual, "golden file {name}");
}

/// A workspace with a `.git`, at a path the renderings replace with `$WS`.
///
/// Rules, mount operations and Seatbelt parameters are ordered by path, so where `$WS` lands in
/// the golden files depends on where the workspace sorts against `/dev`, `/etc`, `/usr`... The
/// workspace lives at a fixed place rather than under the target directory, whose location
/// differs between a developer's checkout and a CI clone. On Linux that is `/dev/shm`: it exists
/// on every machine and, unlike `/tmp`, is not itself a writable root of any profile, so the
/// workspace's own rules stay visible instead of being folded into an enclosing one.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let base = if cfg!(target_os = "linux") {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = tempfile::Builder::new()
        .prefix("golden-")
        .tempdir_in(&base)
        .unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(ws.join(".git")).unwrap();
    (dir, ws)
}

fn render(spec: &SandboxSpec, ws: &Path) -> String {
    let ctx = ResolveContext {
        tmpdir: Some(PathBuf::from("/var/tmp")),
        // A home that exists nowhere: the credential deny set shows, the same on every host.
        homes: vec![PathBuf::from("/home/golden")],
        ..Default::default()
    };
    render_policy(&spec.resolve_with(&ctx).unwrap(), ws)
}

fn render_policy(policy: &sandbox::ResolvedPolicy, ws: &Path) -> String {
    let policy = policy.clone();
    let mut out = String::from("# resolved rules\n");
    for rule in policy.rules() {
        out.push_str(&format!("{:?} {}\n", rule.access, rule.path.display()));
    }
    out.push_str(&format!(
        "restricts_filesystem={} network={}\n",
        policy.restricts_filesystem(),
        policy.network_allowed()
    ));
    for path in policy.hidden_paths() {
        out.push_str(&format!("hidden {}\n", path.display()));
    }
    for path in policy.read_only_paths() {
        out.push_str(&format!("read-only {}\n", path.display()));
    }
    for port in &policy.denied_tcp_ports {
        out.push_str(&format!("denied tcp port {port}\n"));
    }
    #[cfg(target_os = "linux")]
    {
        use sandbox::linux::{command_layout, landlock, mounts};
        out.push_str("\n# landlock rules (the sandbox's own /dev/tty and devpts)\n");
        for rule in landlock::rules_for(&policy, &landlock::private_ttys()) {
            out.push_str(&format!("{:?} {}\n", rule.access, rule.path.display()));
        }
        out.push_str("\n# mount plan of a command whose cwd is the workspace\n");
        for op in mounts::mount_plan(&policy, &command_layout(&policy, ws)) {
            out.push_str(&format!("{}\n", serde_json::to_string(&op).unwrap()));
        }
    }
    out.push_str("\n# seatbelt\n");
    match sandbox::macos::seatbelt_profile(&policy) {
        None => out.push_str("(no profile: unrestricted)\n"),
        Some(profile) => {
            out.push_str(&profile.text);
            for (name, path) in &profile.params {
                out.push_str(&format!("-D{name}={}\n", path.display()));
            }
        }
    }
    out.replace(&ws.display().to_string(), "$WS")
}

#[test]
fn read_only_profile_golden() {
    let (_dir, ws) = workspace();
    let spec = SandboxSpec::named("read-only", Some(ws.clone()));
    golden("read-only.txt", &render(&spec, &ws));
}

#[test]
fn workspace_write_profile_golden() {
    let (_dir, ws) = workspace();
    let spec = SandboxSpec::named("workspace-write", Some(ws.clone()));
    golden("workspace-write.txt", &render(&spec, &ws));
}

#[test]
fn danger_full_access_profile_golden() {
    let (_dir, ws) = workspace();
    let spec = SandboxSpec::named("danger-full-access", Some(ws.clone()));
    golden("danger-full-access.txt", &render(&spec, &ws));
}

#[test]
fn permissions_profile_with_deny_golden() {
    let (_dir, ws) = workspace();
    std::fs::create_dir(ws.join("secrets")).unwrap();
    std::fs::write(ws.join("secrets/key.pem"), "").unwrap();
    let json = serde_json::json!({
        "permissions": {"type": "managed", "network": "enabled", "file_system": {
            "type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "minimal"}}, "access": "read"},
                {"path": {"type": "special", "value": {"kind": "project_roots"}}, "access": "write"},
                {"path": {"type": "glob_pattern", "pattern": "**/*.pem"}, "access": "deny"}
            ]}},
        "cwd": ws.display().to_string(),
    });
    let spec: SandboxSpec = serde_json::from_value(json).unwrap();
    golden("permissions-deny.txt", &render(&spec, &ws));
}

#[test]
fn supervisor_protections_golden() {
    let (_dir, ws) = workspace();
    std::fs::create_dir(ws.join("tools")).unwrap();
    std::fs::write(ws.join("token"), "t").unwrap();
    let ctx = ResolveContext {
        tmpdir: Some(PathBuf::from("/var/tmp")),
        // A home that exists nowhere: the credential deny set shows, the same on every host.
        homes: vec![PathBuf::from("/home/golden")],
        ..Default::default()
    };
    let json = serde_json::json!({
        "profile": "workspace-write", "cwd": ws.display().to_string(), "networkAccess": true,
    });
    let spec: SandboxSpec = serde_json::from_value(json).unwrap();
    let policy = spec
        .resolve_with(&ctx)
        .unwrap()
        .with_hidden_path(&ws.join("token"))
        .with_read_only_path(&ws.join("tools"))
        .with_denied_tcp_port(4000);
    golden("supervisor-protections.txt", &render_policy(&policy, &ws));
}

#[test]
fn network_allowlist_golden() {
    let (_dir, ws) = workspace();
    let json = serde_json::json!({
        "profile": "workspace-write", "cwd": ws.display().to_string(),
        "network": {"allow": ["pypi.org", "*.crates.io", "127.0.0.1:8080"], "deny": ["evil.crates.io"]},
    });
    let spec: SandboxSpec = serde_json::from_value(json).unwrap();
    let ctx = ResolveContext {
        tmpdir: Some(PathBuf::from("/var/tmp")),
        // A home that exists nowhere: the credential deny set shows, the same on every host.
        homes: vec![PathBuf::from("/home/golden")],
        ..Default::default()
    };
    let policy = spec.resolve_with(&ctx).unwrap().with_denied_tcp_port(4000);
    let mut out = format!(
        "# network
{}

",
        serde_json::to_string_pretty(&policy.network).unwrap()
    );
    out.push_str(
        "# seatbelt with the egress proxy on loopback port 41000
",
    );
    let profile = sandbox::macos::seatbelt_profile_with_egress(&policy, Some(41000)).unwrap();
    out.push_str(&profile.text);
    golden(
        "network-allowlist.txt",
        &out.replace(&ws.display().to_string(), "$WS"),
    );
}

#[cfg(target_os = "linux")]
#[test]
fn seccomp_rule_lists_golden() {
    use sandbox::linux::seccomp;
    let variant = |network_allowed, audit| seccomp::Variant {
        network_allowed,
        audit,
    };
    for (file, network, audit) in [
        ("seccomp-network-off.txt", false, false),
        ("seccomp-network-on.txt", true, false),
        ("seccomp-audit-network-off.txt", false, true),
    ] {
        golden(
            file,
            &seccomp::render_variant(variant(network, audit)).unwrap(),
        );
    }
}

/// The filter each command installs on itself before it execs (x86_64 numbers): with the
/// seccomp-notify mechanism (`connect` notifies the holder, no `AF_UNIX` datagram sockets) and
/// where Landlock keeps the unix-socket rule (only `pidfd_getfd` refused).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn command_filter_golden() {
    use sandbox::linux::unix_sockets;
    let mut out = String::from("[command: seccomp-notify]\n");
    out.push_str(&unix_sockets::render_command_filter(true));
    out.push_str("[command: landlock]\n");
    out.push_str(&unix_sockets::render_command_filter(false));
    golden("seccomp-command.txt", &out);
}
