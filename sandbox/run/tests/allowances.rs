//! `sandbox-run --allow toolchain-caches` for real: under workspace-write, the caches of a home
//! directory become writable and its programs, configuration and shell start-up files do not.
//! Each case is a fresh `sandbox-run` running this binary as the probe, as root and as uid
//! 65534, with `HOME` pointing at a fixture home outside every writable root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

/// A home directory with caches, programs, configuration and start-up files, owned by `uid`.
struct Home {
    _base: tempfile::TempDir,
    home: PathBuf,
    ws: PathBuf,
}

/// Files of the fixture home, relative to it.
const FILES: &[&str] = &[
    ".cargo/registry/cache/index/crate-1.0.0.crate",
    ".cargo/git/db/repo/HEAD",
    ".cargo/bin/cargo",
    ".cargo/env",
    ".cargo/.package-cache",
    ".cargo/.package-cache-mutate",
    ".cargo/.global-cache",
    ".cache/pip/http/entry",
    ".cache/ccache/ccache.conf",
    ".cache/other-tool/state",
    ".npm/_cacache/index-v5/entry",
    ".npm/_npx/1/package.json",
    ".config/pip/pip.conf",
    ".bashrc",
    ".profile",
];

impl Home {
    fn new(uid: Option<u32>) -> Self {
        let base = scratch::scratch_dir("allow-");
        let root = std::fs::canonicalize(base.path()).unwrap();
        let home = root.join("home");
        let ws = root.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        for file in FILES {
            let path = home.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "original\n").unwrap();
        }
        scratch::assert_outside_writable_roots(&home);
        if let Some(uid) = uid {
            chown_tree(&root, uid);
        }
        Self {
            _base: base,
            home,
            ws,
        }
    }

    /// Runs probe `op` under `sandbox-run --policy workspace-write --allow toolchain-caches`
    /// with `HOME` set to the fixture home.
    fn probe(&self, op: &[&str], uid: Option<u32>) -> Value {
        let ws = self.ws.display().to_string();
        probe_with_env(
            &[
                "--policy",
                "workspace-write",
                "--allow",
                "toolchain-caches",
                "--cwd",
                &ws,
            ],
            op,
            uid,
            &self.ws,
            &[("HOME", &self.home)],
        )
    }

    fn path(&self, relative: &str) -> String {
        self.home.join(relative).display().to_string()
    }
}

fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

#[test]
fn toolchain_caches_are_writable_and_programs_configuration_and_start_up_files_are_not() {
    for uid in identities() {
        let home = Home::new(uid);
        for (op, path) in [
            ("write", ".cargo/registry/cache/index/new-2.0.0.crate"),
            ("append", ".cargo/registry/cache/index/crate-1.0.0.crate"),
            ("mkdir", ".cargo/git/checkouts"),
            ("append", ".cargo/.package-cache"),
            ("append", ".cargo/.package-cache-mutate"),
            ("append", ".cargo/.global-cache"),
            ("write", ".cache/pip/http/new"),
            ("write", ".cache/ccache/new"),
            ("write", ".npm/_cacache/index-v5/new"),
        ] {
            let result = home.probe(&[op, &home.path(path)], uid);
            assert_allowed(&result, &format!("{op} {path} as {uid:?}"));
        }
        for (op, path) in [
            ("append", ".cargo/bin/cargo"),
            ("write", ".cargo/bin/new-tool"),
            ("append", ".cargo/env"),
            ("write", ".cargo/config.toml"),
            ("write", ".cargo/credentials.toml"),
            ("write", ".cargo/.global-cache-journal"),
            ("append", ".cache/ccache/ccache.conf"),
            ("write", ".cache/other-tool/state"),
            ("write", ".npm/_npx/1/package.json"),
            ("write", ".npmrc"),
            ("append", ".bashrc"),
            ("append", ".profile"),
            ("write", ".config/pip/pip.conf"),
        ] {
            let result = home.probe(&[op, &home.path(path)], uid);
            assert_blocked(&result, &[], &format!("{op} {path} as {uid:?}"));
        }
        for file in [
            ".cargo/bin/cargo",
            ".cargo/env",
            ".cache/ccache/ccache.conf",
            ".cache/other-tool/state",
            ".npm/_npx/1/package.json",
            ".config/pip/pip.conf",
            ".bashrc",
            ".profile",
        ] {
            let text = std::fs::read_to_string(home.home.join(file)).unwrap();
            assert_eq!(text, "original\n", "{file} changed as {uid:?}");
        }
        for created in [
            ".cargo/bin/new-tool",
            ".cargo/config.toml",
            ".cargo/credentials.toml",
            ".cargo/.global-cache-journal",
            ".npmrc",
        ] {
            assert!(
                !home.home.join(created).exists(),
                "{created} was created as {uid:?}"
            );
        }
    }
}

#[test]
fn explain_lists_the_allowance_and_its_resolved_paths() {
    let home = Home::new(None);
    let output = Command::new(sandbox_run_exe())
        .args(["--policy", "workspace-write", "--allow", "toolchain-caches"])
        .arg("--cwd")
        .arg(&home.ws)
        .args(["--explain", "--", "true"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home.home)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let explain: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        explain["allowances"],
        serde_json::json!(["toolchain-caches"])
    );
    let rules = explain["policy"]["filesystem"]["rules"].as_array().unwrap();
    let write = |relative: &str| {
        let path = home.path(relative);
        rules
            .iter()
            .any(|rule| rule["path"] == path.as_str() && rule["access"] == "write")
    };
    assert!(write(".cargo/registry"), "{rules:?}");
    assert!(write(".cargo/.package-cache"), "{rules:?}");
    assert!(!write(".cargo"), "{rules:?}");
}

#[test]
fn an_unknown_allowance_is_a_setup_error_naming_the_known_ones() {
    let home = Home::new(None);
    let output = Command::new(sandbox_run_exe())
        .args(["--policy", "workspace-write", "--allow", "everything"])
        .arg("--cwd")
        .arg(&home.ws)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown allowance \"everything\"") && stderr.contains("toolchain-caches"),
        "{stderr}"
    );
}
