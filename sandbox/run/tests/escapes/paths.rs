//! Protected and denied paths stay so: `.git` at any depth, profiles in writable roots, and
//! renames of the path or an ancestor from under the next command or a host `git status`.

use super::*;

#[test]
fn a_git_directory_at_any_depth_stays_read_only() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let hooks = fx.ws.join("vendor/lib/.git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        if let Some(uid) = uid {
            for dir in [
                "vendor",
                "vendor/lib",
                "vendor/lib/.git",
                "vendor/lib/.git/hooks",
            ] {
                std::os::unix::fs::chown(fx.ws.join(dir), Some(uid), Some(uid)).unwrap();
            }
        }
        let hook = hooks.join("post-checkout");
        let result = probe(WW, &["write", s(&hook)], uid, &fx.ws);
        assert_blocked(&result, &[], &format!("nested hook as {uid:?}"));
        assert!(!hook.exists(), "the nested hook was written");
        let config = fx.ws.join("vendor/lib/.git/config");
        assert_blocked(
            &probe(WW, &["write", s(&config)], uid, &fx.ws),
            &[],
            "nested config",
        );
        assert!(!config.exists());
        // Its siblings stay writable.
        assert_allowed(
            &probe(
                WW,
                &["write", s(&fx.ws.join("vendor/lib/src.rs"))],
                uid,
                &fx.ws,
            ),
            "sibling",
        );
    }
}

#[test]
fn a_profile_inside_a_writable_root_is_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let profile = fx.ws.join("my-profile.toml");
        std::fs::write(
            &profile,
            "[filesystem]\n\":root\" = \"read\"\n\":project_roots\" = \"write\"\n",
        )
        .unwrap();
        let out = sandbox_run(
            &["--policy", "./my-profile.toml"],
            &["/bin/true"],
            uid,
            &fx.ws,
        );
        assert_eq!(out.status.code(), Some(125), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("lies inside a writable root"), "{stderr}");
        // The same profile outside the workspace is fine.
        let outside_profile = fx.outside.join("my-profile.toml");
        std::fs::copy(&profile, &outside_profile).unwrap();
        let out = sandbox_run(
            &["--policy", s(&outside_profile)],
            &["/bin/true"],
            uid,
            &fx.ws,
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}

#[test]
fn a_denied_path_cannot_be_moved_from_under_the_next_command() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let sub = fx.ws.join("sub");
        std::fs::create_dir_all(sub.join("keys")).unwrap();
        std::fs::write(sub.join("keys/secret.pem"), "PRIVATE").unwrap();
        if let Some(uid) = uid {
            for path in ["sub", "sub/keys", "sub/keys/secret.pem"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        let secret = sub.join("keys/secret.pem");
        let args = ["--policy", "workspace-write", "--deny", s(&secret)];
        assert_blocked(
            &probe(&args, &["read", s(&secret)], uid, &fx.ws),
            &[],
            "read",
        );
        // Renaming an ancestor of the denied file is refused (it is a mount point inside).
        for from in [&sub, &sub.join("keys")] {
            let to = fx.ws.join("moved");
            let result = probe(&args, &["rename", s(from), s(&to)], uid, &fx.ws);
            assert_blocked(
                &result,
                &["EBUSY", "EXDEV"],
                &format!("rename {from:?} as {uid:?}"),
            );
            assert!(from.exists() && !to.exists());
        }
        assert_blocked(
            &probe(&args, &["read", s(&secret)], uid, &fx.ws),
            &[],
            "read after the rename attempts",
        );
    }
}

#[test]
fn a_protected_repository_cannot_be_moved_from_under_its_path_by_renaming_an_ancestor() {
    // vendor/lib/.git (a nested repository) and sub/.git (a submodule's gitfile) are kept
    // read-only by binds; renaming vendor/lib, vendor or sub would carry the bind away and
    // leave the path an ordinary directory the command could refill with a .git of its own.
    for uid in identities() {
        let fx = Fixture::new(uid);
        for dir in ["vendor/lib/.git", "sub"] {
            std::fs::create_dir_all(fx.ws.join(dir)).unwrap();
        }
        std::fs::write(fx.ws.join("vendor/lib/.git/config"), "[core]\n").unwrap();
        std::fs::write(fx.ws.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        std::fs::create_dir_all(fx.ws.join(".git/modules/sub")).unwrap();
        if let Some(uid) = uid {
            for path in ["vendor", "vendor/lib", "vendor/lib/.git", "sub", "sub/.git"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        for from in ["vendor/lib", "vendor", "sub"] {
            let (from, to) = (fx.ws.join(from), fx.ws.join("moved"));
            let result = probe(WW, &["rename", s(&from), s(&to)], uid, &fx.ws);
            assert_blocked(
                &result,
                &["EBUSY", "EXDEV"],
                &format!("rename {from:?} as {uid:?}"),
            );
            assert!(from.exists() && !to.exists(), "{from:?} moved as {uid:?}");
            // Control: without the sandbox the same rename moves it (and it is put back).
            let free = probe(
                &["--policy", "danger-full-access"],
                &["rename", s(&from), s(&to)],
                uid,
                &fx.ws,
            );
            assert_allowed(&free, &format!("unsandboxed rename {from:?} as {uid:?}"));
            std::fs::rename(&to, &from).unwrap();
        }
    }
}

#[test]
fn a_deny_below_a_read_entry_cannot_be_moved_by_renaming_the_entrys_parent() {
    // services/api is a read entry inside the writable workspace, services/api/.env is denied;
    // renaming services would carry both away, and the next command (or this one) would read
    // the secret at the moved path.
    for uid in identities() {
        let fx = Fixture::new(uid);
        let api = fx.ws.join("services/api");
        std::fs::create_dir_all(&api).unwrap();
        let env = api.join(".env");
        std::fs::write(&env, "TOKEN=secret").unwrap();
        if let Some(uid) = uid {
            for path in ["services", "services/api", "services/api/.env"] {
                std::os::unix::fs::chown(fx.ws.join(path), Some(uid), Some(uid)).unwrap();
            }
        }
        let entry = |path: &Path, access: &str| serde_json::json!({"path": {"type": "path", "path": path}, "access": access});
        let policy = serde_json::json!({"permissions": {"type": "managed", "file_system": {
        "type": "restricted", "entries": [
            entry(Path::new("/"), "read"),
            entry(&fx.ws, "write"),
            entry(&api, "read"),
            entry(&env, "deny"),
        ]}}})
        .to_string();
        let args = ["--policy", policy.as_str()];
        assert_blocked(&probe(&args, &["read", s(&env)], uid, &fx.ws), &[], "read");
        let (from, to) = (fx.ws.join("services"), fx.ws.join("moved"));
        let result = probe(&args, &["rename", s(&from), s(&to)], uid, &fx.ws);
        assert_blocked(&result, &["EBUSY", "EXDEV"], &format!("rename as {uid:?}"));
        assert!(from.exists() && !to.exists(), "services moved as {uid:?}");
        let free = probe(
            &["--policy", "danger-full-access"],
            &["rename", s(&from), s(&to)],
            uid,
            &fx.ws,
        );
        assert_allowed(&free, &format!("unsandboxed rename as {uid:?}"));
        std::fs::rename(&to, &from).unwrap();
    }
}

#[test]
fn a_host_git_status_runs_nothing_a_command_planted_behind_a_renamed_repository() {
    // The whole attack of issue 31, end to end as root (the rename itself is refused for both
    // identities above): the command moves vendor/lib away and makes vendor/lib a repository of
    // its own whose core.fsmonitor is its program; the user's next `git status` there would run
    // it unsandboxed.
    let fx = Fixture::new(None);
    let lib = fx.ws.join("vendor/lib");
    let git = |dir: &Path, args: &[&str]| {
        std::process::Command::new("git")
            .args(["-c", "safe.directory=*", "-C"])
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", fx.outside.as_os_str())
            .output()
            .unwrap()
    };
    std::fs::create_dir_all(&lib).unwrap();
    assert!(
        git(&lib, &["init", "-q"]).status.success(),
        "git init vendor/lib"
    );
    let marker = fx.outside.join("fsmonitor-ran");
    let attack = format!(
        "mv vendor/lib vendor/lib.moved && mkdir vendor/lib && git init -q vendor/lib && \
         git -C vendor/lib config core.fsmonitor 'touch {}; false'",
        marker.display()
    );
    let run = |policy: &str| {
        std::process::Command::new(sandbox_run_exe())
            .args(["--policy", policy, "--cwd"])
            .arg(&fx.ws)
            .args(["--", "/bin/sh", "-c", &attack])
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", fx.outside.as_os_str())
            .output()
            .unwrap()
    };
    let sandboxed = run("workspace-write");
    assert!(
        !sandboxed.status.success(),
        "the attack went through: {sandboxed:?}"
    );
    assert!(lib.join(".git").is_dir() && !fx.ws.join("vendor/lib.moved").exists());
    let _ = git(&lib, &["status", "--short"]);
    assert!(
        !marker.exists(),
        "host git status ran the command's fsmonitor"
    );
    // Control: without the sandbox the same script plants the hook and git status runs it.
    let free = run("danger-full-access");
    assert!(free.status.success(), "{free:?}");
    let _ = git(&lib, &["status", "--short"]);
    assert!(
        marker.exists(),
        "the control plant did not run: the test proves nothing"
    );
}
