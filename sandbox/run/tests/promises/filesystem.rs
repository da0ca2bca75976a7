//! Files: read-only protected paths, deny globs, extra writable roots and the documented limits.

use super::*;

#[test]
fn agents_and_codex_stay_read_only_like_git() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        for dir in [".agents", ".codex"] {
            let path = fx.ws.join(dir);
            std::fs::create_dir(&path).unwrap();
            chown_to(uid, &[&path]);
            let file = path.join("instructions.md");
            assert_blocked(
                &probe(WW, &["write", s(&file)], uid, &fx.ws),
                &[],
                &format!("{dir} as {uid:?}"),
            );
            assert!(!file.exists());
        }
        assert_allowed(
            &probe(WW, &["write", s(&fx.ws.join("ok.txt"))], uid, &fx.ws),
            "a sibling stays writable",
        );
    }
}

#[test]
fn chown_utime_and_xattrs_outside_the_roots_are_refused() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let before = std::fs::metadata(&fx.outside_file).unwrap();
        for op in ["chown", "utime", "setxattr"] {
            let result = probe(WW, &[op, s(&fx.outside_file)], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("{op} outside as {uid:?}"));
        }
        let after = std::fs::metadata(&fx.outside_file).unwrap();
        assert_eq!(
            (after.uid(), after.gid(), after.mtime(), after.mtime_nsec()),
            (
                before.uid(),
                before.gid(),
                before.mtime(),
                before.mtime_nsec()
            ),
            "the outside file changed"
        );
        fx.assert_outside_untouched(&format!("metadata as {uid:?}"));
        // Control: the same calls inside the workspace work.
        let inside = fx.ws.join("inside.txt");
        for op in ["utime", "chown"] {
            assert_allowed(&probe(WW, &[op, s(&inside)], uid, &fx.ws), op);
        }
    }
}

/// A profile (outside the workspace, where the command cannot rewrite it) denying `*.pem`.
fn pem_profile(fx: &Fixture) -> String {
    let profile = fx.outside.join("deny-pem.toml");
    std::fs::write(
        &profile,
        "[filesystem]\n\":root\" = \"read\"\n\":project_roots\" = \"write\"\n\"**/*.pem\" = \"deny\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&profile, std::fs::Permissions::from_mode(0o644)).unwrap();
    profile.to_str().unwrap().to_owned()
}

#[test]
fn a_deny_glob_hides_matching_files_and_globs_are_expanded_once() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let keys = fx.ws.join("keys");
        std::fs::create_dir(&keys).unwrap();
        std::fs::write(keys.join("server.pem"), "PRIVATE").unwrap();
        std::fs::write(keys.join("README"), "public").unwrap();
        chown_to(
            uid,
            &[&keys, &keys.join("server.pem"), &keys.join("README")],
        );
        let profile = pem_profile(&fx);
        let args = ["--policy", profile.as_str()];
        assert_blocked(
            &probe(&args, &["read", s(&keys.join("server.pem"))], uid, &fx.ws),
            &[],
            &format!("deny glob as {uid:?}"),
        );
        assert_allowed(
            &probe(&args, &["read", s(&keys.join("README"))], uid, &fx.ws),
            "a file the glob does not match",
        );
        // Known limit: a matching file created after the policy was resolved is not hidden.
        let later = keys.join("later.pem");
        let steps = probe(
            &args,
            &["sequence", "write", s(&later), ";", "read", s(&later)],
            uid,
            &fx.ws,
        );
        for step in steps["detail"].as_array().unwrap() {
            assert_allowed(step, "a .pem made after resolution (documented limit)");
        }
    }
}

#[test]
fn a_deny_glob_that_cannot_read_a_directory_fails_closed() {
    let fx = Fixture::new(Some(NOBODY));
    let locked = fx.ws.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("hidden.pem"), "k").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let profile = pem_profile(&fx);
    let out = sandbox_run(
        &["--policy", &profile],
        &["/bin/true"],
        Some(NOBODY),
        &fx.ws,
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot read"), "{stderr}");
}

#[test]
fn the_directory_a_gitdir_pointer_names_stays_read_only() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let real = fx.ws.join("modules/sub");
        std::fs::create_dir_all(&real).unwrap();
        let sub = fx.ws.join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join(".git"), "gitdir: ../modules/sub\n").unwrap();
        chown_to(uid, &[&fx.ws.join("modules"), &real, &sub]);
        let hook = real.join("post-checkout");
        assert_blocked(
            &probe(WW, &["write", s(&hook)], uid, &fx.ws),
            &[],
            &format!("gitdir target as {uid:?}"),
        );
        assert!(!hook.exists());
    }
}

#[test]
fn documented_limits_hold_as_documented() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        // A .git made inside the sandbox is not protected (it did not exist at the start).
        let fresh = fx.ws.join("new-repo");
        let steps = probe(
            WW,
            &[
                "sequence",
                "mkdir",
                s(&fresh),
                ";",
                "mkdir",
                s(&fresh.join(".git")),
                ";",
                "write",
                s(&fresh.join(".git/config")),
            ],
            uid,
            &fx.ws,
        );
        for step in steps["detail"].as_array().unwrap() {
            assert_allowed(step, "a .git created inside (documented limit)");
        }
        // Renames between two writable roots (the workspace and /tmp) fail with EXDEV.
        let file = fx.ws.join("inside.txt");
        let result = probe(WW, &["rename", s(&file), "/tmp/moved.txt"], uid, &fx.ws);
        assert_eq!(result["error"], "EXDEV", "as {uid:?}: {result}");
        assert!(file.exists());
    }
}

#[test]
fn an_extra_writable_root_is_writable_and_keeps_its_git_read_only() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let extra = fx.outside.join("extra");
        std::fs::create_dir_all(extra.join(".git")).unwrap();
        chown_to(uid, &[&extra, &extra.join(".git")]);
        let args = ["--policy", "workspace-write", "--writable-root", s(&extra)];
        let inside = extra.join("built.o");
        assert_allowed(
            &probe(&args, &["write", s(&inside)], uid, &fx.ws),
            &format!("write in --writable-root as {uid:?}"),
        );
        assert!(inside.exists(), "the write in the extra root landed");
        let git = extra.join(".git/config");
        assert_blocked(
            &probe(&args, &["write", s(&git)], uid, &fx.ws),
            &[],
            &format!("--writable-root's .git as {uid:?}"),
        );
        assert!(!git.exists());
        // Its parent (the outside directory) is not widened.
        std::fs::remove_file(&inside).unwrap();
        std::fs::remove_dir_all(&extra).unwrap();
        std::fs::create_dir_all(&extra).unwrap();
        chown_to(uid, &[&extra]);
        let beside = fx.outside.join("beside.txt");
        assert_blocked(
            &probe(&args, &["write", s(&beside)], uid, &fx.ws),
            &[],
            &format!("beside --writable-root as {uid:?}"),
        );
        assert!(!beside.exists());
        // Without the flag the extra root is as read-only as any outside path.
        assert_blocked(
            &probe(WW, &["write", s(&inside)], uid, &fx.ws),
            &[],
            &format!("the same write without --writable-root as {uid:?}"),
        );
        assert!(!inside.exists());
    }
}
