//! README promises of the sandbox that had no test of their own (issue 20), each checked on the
//! host as root and as uid 65534, with the known limits pinned down as they are documented.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

const WW: &[&str] = &["--policy", "workspace-write"];

fn chown_to(uid: Option<u32>, paths: &[&std::path::Path]) {
    if let Some(uid) = uid {
        for path in paths {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
    }
}

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

#[test]
fn socket_families_are_refused_by_network_mode() {
    let refused_always = [
        libc::AF_PACKET,
        libc::AF_VSOCK,
        libc::AF_ALG,
        libc::AF_BLUETOOTH,
    ];
    for uid in identities() {
        let fx = Fixture::new(uid);
        let family = |f: i32| f.to_string();
        for f in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]
            .into_iter()
            .chain(refused_always)
        {
            let result = probe(WW, &["socket", &family(f)], uid, &fx.ws);
            assert_blocked(
                &result,
                &[],
                &format!("family {f}, network off, as {uid:?}"),
            );
        }
        // Stream: AF_UNIX datagram sockets are refused where the unix-socket notifier runs
        // (sandbox/tests/unix_sockets.rs).
        assert_allowed(
            &probe(WW, &["unix-socket", "stream"], uid, &fx.ws),
            "AF_UNIX",
        );
        let on = &["--policy", "workspace-write", "--allow-network"];
        for f in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
            assert_allowed(
                &probe(on, &["socket", &family(f)], uid, &fx.ws),
                "network on",
            );
        }
        for f in refused_always {
            let result = probe(on, &["socket", &family(f)], uid, &fx.ws);
            assert_blocked(&result, &[], &format!("family {f}, network on, as {uid:?}"));
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

#[test]
fn explain_prints_the_policy_and_its_layers_and_runs_nothing() {
    let fx = Fixture::new(None);
    let extra = fx.outside.join("extra");
    std::fs::create_dir(&extra).unwrap();
    let marker = fx.ws.join("ran");
    let out = sandbox_run(
        &[
            "--policy",
            "workspace-write",
            "--writable-root",
            s(&extra),
            "--deny",
            s(&fx.outside_file),
            "--explain",
        ],
        &["/usr/bin/touch", s(&marker)],
        None,
        &fx.ws,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "--explain ran the command");
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rules = explain["policy"]["filesystem"]["rules"].as_array().unwrap();
    let access_of = |path: &std::path::Path| {
        rules
            .iter()
            .find(|rule| rule["path"] == s(path))
            .map(|rule| rule["access"].as_str().unwrap().to_owned())
    };
    assert_eq!(access_of(&fx.ws).as_deref(), Some("write"), "{explain}");
    assert_eq!(access_of(&extra).as_deref(), Some("write"), "{explain}");
    assert_eq!(
        access_of(&fx.ws.join(".git")).as_deref(),
        Some("read"),
        "{explain}"
    );
    assert_eq!(
        explain["command"],
        serde_json::json!(["/usr/bin/touch", s(&marker)])
    );
    assert_eq!(explain["cwd"], s(&fx.ws));
    assert!(
        explain["layers"]["landlock"]["abi"].as_u64().unwrap_or(0) >= 1,
        "{explain}"
    );
    assert!(
        explain.to_string().contains(s(&fx.outside_file)),
        "the denied path is listed: {explain}"
    );
}

/// As uid 65534 only: as root `--audit` switches the kernel audit on for the whole machine.
#[test]
fn the_audit_report_is_opened_before_the_command_so_a_planted_symlink_is_not_followed() {
    let fx = Fixture::new(Some(NOBODY));
    let report = fx.ws.join("denials.jsonl");
    let kept = fx.ws.join("kept.jsonl");
    // The command moves the report aside and plants a symlink to a file outside at its name.
    let script = format!(
        "mv {report} {kept} && ln -s {outside} {report}",
        report = s(&report),
        kept = s(&kept),
        outside = s(&fx.outside_file)
    );
    let out = sandbox_run(
        &["--policy", "workspace-write", "--audit", s(&report)],
        &["/bin/sh", "-c", &script],
        Some(NOBODY),
        &fx.ws,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::symlink_metadata(&report)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the command planted its symlink"
    );
    fx.assert_outside_untouched("the report followed the planted symlink");
    // The report went to the file opened before the command ran, now at the moved-aside name.
    let written = std::fs::read_to_string(&kept).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(written.lines().last().expect("a non-empty report")).unwrap();
    assert_eq!(last["kind"], "coverage", "{written}");
}

#[test]
fn a_file_written_to_tmp_is_neither_on_the_host_nor_seen_by_the_next_command() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let name = format!("/tmp/execward-private-tmp-{}-{uid:?}", std::process::id());
        let name = name.replace(['(', ')'], "");
        let write = sandbox_run(
            WW,
            &[
                "/bin/sh",
                "-c",
                &format!("echo secret > {name} && cat {name}"),
            ],
            uid,
            &fx.ws,
        );
        assert_eq!(
            String::from_utf8_lossy(&write.stdout),
            "secret\n",
            "the command could write its /tmp ({uid:?}): {}",
            String::from_utf8_lossy(&write.stderr)
        );
        assert!(
            !std::path::Path::new(&name).exists(),
            "{name} leaked to the host's /tmp ({uid:?})"
        );
        let next = sandbox_run(
            WW,
            &[
                "/bin/sh",
                "-c",
                &format!("test -e {name} && echo seen || echo absent"),
            ],
            uid,
            &fx.ws,
        );
        assert_eq!(
            String::from_utf8_lossy(&next.stdout),
            "absent\n",
            "the next command saw {name} ({uid:?}): {}",
            String::from_utf8_lossy(&next.stderr)
        );
    }
}

/// A directory under the host's `/tmp` holding a script, a file it reads and a secret, owned
/// by `uid`; removed when dropped.
fn host_tmp_dir(uid: Option<u32>) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("execward-host-tmp-")
        .tempdir_in("/tmp")
        .unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(path.join("data"), "host-data\n").unwrap();
    std::fs::write(path.join("secret"), "k\n").unwrap();
    let script = path.join("run.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran\ncat {}/data\n", path.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    chown_to(
        uid,
        &[&path, &path.join("data"), &path.join("secret"), &script],
    );
    dir
}

/// What a command sees at `/tmp`, measured from inside: whether a host script there runs,
/// whether a write there succeeds, and (on the host) whether it reached the host; named as
/// `--explain` names the views.
fn probed_tmp_view(
    args: &[&str],
    uid: Option<u32>,
    cwd: &std::path::Path,
    host: &std::path::Path,
) -> String {
    let written = host.join("written");
    let script = format!(
        "{dir}/run.sh >/dev/null 2>&1 && echo visible || echo invisible; \
         (echo mine > {dir}/written) 2>/dev/null && echo wrote || echo refused",
        dir = host.display()
    );
    let out = sandbox_run(args, &["/bin/sh", "-c", &script], uid, cwd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let visible = stdout.contains("visible\n") && !stdout.contains("invisible");
    let wrote = stdout.contains("wrote");
    let reached = written.exists();
    let _ = std::fs::remove_file(&written);
    match (visible, wrote, reached) {
        (true, true, false) => "host /tmp read-only, private writable layer on top",
        (true, false, false) => "host /tmp read-only",
        (false, true, false) => "private, empty",
        (true, true, true) => "host /tmp, writes reach the host",
        (false, false, false) => "host /tmp, unreadable",
        _ => panic!("{args:?} as {uid:?}: an impossible /tmp: {stdout}"),
    }
    .to_owned()
}

#[test]
fn a_script_in_host_tmp_runs_and_explain_says_what_tmp_is_as_a_probe_sees_it() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let host = host_tmp_dir(uid);
        let host = std::fs::canonicalize(host.path()).unwrap();
        let secret = host.join("secret");
        let cases: [(&[&str], &str); 3] = [
            (
                &["--policy", "workspace-write", "--deny", s(&secret)],
                "host /tmp read-only, private writable layer on top",
            ),
            (
                &["--policy", "read-only", "--deny", s(&secret)],
                "host /tmp read-only",
            ),
            (
                // Without namespaces the workspace's .git cannot be kept read-only: best effort.
                &[
                    "--policy",
                    "workspace-write",
                    "--no-namespaces",
                    "--best-effort",
                ],
                "host /tmp, writes reach the host",
            ),
        ];
        for (args, expected) in cases {
            let context = format!("{args:?} as {uid:?}");
            let explain_args: Vec<&str> = args.iter().copied().chain(["--explain"]).collect();
            let out = sandbox_run(&explain_args, &["true"], uid, &fx.ws);
            assert!(
                out.status.success(),
                "{context}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let explain: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let said = explain["layers"]["tmp"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert_eq!(said, expected, "{context}: --explain");
            assert_eq!(
                probed_tmp_view(args, uid, &fx.ws, &host),
                said,
                "{context}: --explain's /tmp is not what the sandbox sees"
            );
        }
        // The script itself, run directly from the host's /tmp.
        let run = sandbox_run(WW, &[s(&host.join("run.sh"))], uid, &fx.ws);
        assert_eq!(
            String::from_utf8_lossy(&run.stdout),
            "ran\nhost-data\n",
            "as {uid:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        // A denied file under /tmp stays unreadable in the merged view; the control reads it.
        let denied = ["--policy", "workspace-write", "--deny", s(&secret)];
        let result = probe(&denied, &["read", s(&secret)], uid, &fx.ws);
        assert_eq!(result["error"], "EACCES", "as {uid:?}: {result}");
        let control = probe(WW, &["read", s(&secret)], uid, &fx.ws);
        assert_allowed(
            &control,
            &format!("reading the secret without --deny as {uid:?}"),
        );
        // An overwrite of a host file stays in the private layer.
        let overwrite = sandbox_run(
            WW,
            &[
                "/bin/sh",
                "-c",
                &format!("echo changed > {0} && cat {0}", host.join("data").display()),
            ],
            uid,
            &fx.ws,
        );
        assert_eq!(
            String::from_utf8_lossy(&overwrite.stdout),
            "changed\n",
            "as {uid:?}"
        );
        assert_eq!(
            std::fs::read_to_string(host.join("data")).unwrap(),
            "host-data\n",
            "as {uid:?}: the overwrite reached the host"
        );
        // A host daemon's socket under /tmp, seen through the overlay: refused. The gate
        // (seccomp-notify) judges it by where its inode lives (EACCES); Landlock ABI 9 lets
        // /tmp's write right pass and the kernel finds no listener on the overlay's inode.
        let socket = host.join("daemon.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let expected = match sandbox::linux::unix_sockets::Mechanism::of_this_host() {
            sandbox::linux::unix_sockets::Mechanism::SeccompNotify => "EACCES",
            sandbox::linux::unix_sockets::Mechanism::Landlock => "ECONNREFUSED",
        };
        let result = probe(WW, &["unix-connect", s(&socket)], uid, &fx.ws);
        assert_eq!(result["error"], expected, "as {uid:?}: {result}");
        assert!(listener.accept().is_err(), "as {uid:?}: reached the daemon");
        let control = probe(
            &["--policy", "danger-full-access"],
            &["unix-connect", s(&socket)],
            uid,
            &fx.ws,
        );
        assert_allowed(&control, &format!("control connect as {uid:?}"));
        assert!(listener.accept().is_ok(), "as {uid:?}: the control counts");
        // Its own socket in /tmp (the upper layer) is reachable.
        let own = probe(WW, &["unix-bind-connect", "/tmp/own.sock"], uid, &fx.ws);
        assert_allowed(&own, &format!("own socket in /tmp as {uid:?}"));
    }
}

/// x86_64's `uretprobe` (335) and `uprobe` (336) pass every seccomp filter by the kernel's
/// design (the syscall sweep skips them); called inside the sandbox from an ordinary caller they
/// must be refused by the kernel: `uprobe` with ENXIO, `uretprobe` with SIGILL, in a child
/// process.
#[cfg(target_arch = "x86_64")]
#[test]
fn uprobe_and_uretprobe_refuse_an_ordinary_caller_inside_the_sandbox() {
    const ENXIO: i32 = 6;
    const SIGILL: i32 = 4;
    let script = "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
                  print(\"uprobe\", l.syscall(336), ctypes.get_errno())'; \
                  python3 -c 'import ctypes; ctypes.CDLL(None).syscall(335); print(\"returned\")'; \
                  echo \"uretprobe status $?\"";
    for uid in identities() {
        let fx = Fixture::new(uid);
        let out = sandbox_run(WW, &["/bin/sh", "-c", script], uid, &fx.ws);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("uprobe -1 {ENXIO}\nuretprobe status {}\n", 128 + SIGILL),
            "as {uid:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn secrets_in_the_callers_environment_reach_the_command_only_when_named() {
    let run = |extra: &[&str]| {
        let output = std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/"])
            .args(extra)
            .args(["--", "/usr/bin/env"])
            .env("MY_SECRET_TOKEN", "hunter2")
            .env("aws_access_key_id", "AKIAEXAMPLE")
            .env("EXECWARD_REGISTRY_TOKEN", "registry")
            .env("PLAIN_SETTING", "kept")
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let default = run(&[]);
    assert!(default.contains("PLAIN_SETTING=kept"), "{default}");
    for secret in ["hunter2", "AKIAEXAMPLE", "registry"] {
        assert!(
            !default.contains(secret),
            "{secret} reached the command: {default}"
        );
    }
    // Named, it passes; the others stay out.
    let named = run(&["--env", "MY_SECRET_TOKEN"]);
    assert!(named.contains("MY_SECRET_TOKEN=hunter2"), "{named}");
    assert!(!named.contains("AKIAEXAMPLE"), "{named}");
    // --clearenv: only what is named or set.
    let cleared = run(&["--clearenv", "--env", "PLAIN_SETTING", "--setenv", "A=b=c"]);
    let mut lines: Vec<&str> = cleared.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["A=b=c", "PLAIN_SETTING=kept"], "{cleared}");
    let unset = run(&["--unsetenv", "PLAIN_SETTING"]);
    assert!(!unset.contains("PLAIN_SETTING"), "{unset}");
}

#[test]
fn repeated_interrupts_stop_a_command_that_ignores_them() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    // (extra interrupts sent, longest time to stop): two wait for the grace, three kill at once.
    for (interrupts, within) in [(2, 6), (3, 2)] {
        let mut child = std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/", "--"])
            .args([
                "/bin/sh",
                "-c",
                "trap '' INT TERM; echo ready; sleep 311.5; echo survived",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut ready = [0u8; 6];
        stdout.read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"ready\n");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let started = std::time::Instant::now();
        for _ in 0..interrupts {
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
        let status = child.wait().unwrap();
        let took = started.elapsed();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "{interrupts} interrupts: {status:?} {stderr}"
        );
        assert!(!rest.contains("survived"), "the command went on: {rest}");
        assert!(
            took < std::time::Duration::from_secs(within),
            "{interrupts} interrupts took {took:?}"
        );
        assert!(stderr.contains("forwarded to the command"), "{stderr}");
        assert!(stderr.contains("terminating the command"), "{stderr}");
        assert_eq!(
            stderr.contains("killing the command"),
            interrupts == 3,
            "{stderr}"
        );
    }
}

#[test]
fn a_deny_of_a_missing_path_warns_and_an_existing_one_does_not() {
    let run = |deny: &std::path::Path| {
        std::process::Command::new(sandbox_run_exe())
            .args(["--policy", "read-only", "--cwd", "/", "--deny"])
            .arg(deny)
            .args(["--", "/bin/true"])
            .output()
            .unwrap()
    };
    let dir = scratch::scratch_dir("deny-missing-");
    let missing = run(&dir.path().join("no-such-secret"));
    assert!(missing.status.success(), "{missing:?}");
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(
        stderr.contains("warning: --deny") && stderr.contains("no such file or directory"),
        "{stderr}"
    );
    let present = run(dir.path());
    assert!(present.status.success(), "{present:?}");
    assert_eq!(String::from_utf8_lossy(&present.stderr), "");
}

#[test]
fn a_command_without_the_separator_gets_a_hint() {
    let output = std::process::Command::new(sandbox_run_exe())
        .args(["--policy", "read-only", "ls", "-la"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("hint: the command goes after `--`"),
        "{stderr}"
    );
}

#[test]
fn a_users_own_profiles_are_listed_and_taken_by_name_and_built_ins_win() {
    let config = scratch::scratch_dir("user-profiles-");
    let profiles = config.path().join("execward/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("mine.toml"),
        "description = \"Mine: read everything, write nothing\"\n[filesystem]\n\":root\" = \"read\"\n",
    )
    .unwrap();
    // A file cannot redefine a built-in name.
    std::fs::write(
        profiles.join("read-only.toml"),
        "description = \"Sneaky\"\nfull_filesystem_access = true\n",
    )
    .unwrap();
    let sandbox_run = |args: &[&str]| {
        std::process::Command::new(sandbox_run_exe())
            .env("XDG_CONFIG_HOME", config.path())
            .args(args)
            .output()
            .unwrap()
    };
    let listed = sandbox_run(&["--list-profiles"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("workspace-write"), "{listed}");
    assert!(
        listed.contains("mine") && listed.contains("Mine: read everything"),
        "{listed}"
    );
    assert!(
        listed.contains("(ignored: a built-in has this name)"),
        "{listed}"
    );

    let out = scratch::scratch_dir("user-profile-out-");
    let target = out.path().join("written.txt");
    let script = format!("echo x > {} && echo wrote || echo denied", target.display());
    for policy in ["mine", "read-only"] {
        let result = sandbox_run(&[
            "--policy", policy, "--cwd", "/", "--", "/bin/sh", "-c", &script,
        ]);
        assert_eq!(
            String::from_utf8_lossy(&result.stdout),
            "denied\n",
            "{policy}: {result:?}"
        );
        assert!(!target.exists(), "{policy} let the write land");
    }
    // Control: with the directory writable the same command writes.
    let out_dir = out.path().to_str().unwrap();
    let result = sandbox_run(&[
        "--policy",
        "workspace-write",
        "--cwd",
        "/",
        "--writable-root",
        out_dir,
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&result.stdout),
        "wrote\n",
        "{result:?}"
    );
}
