//! `/tmp`: what a command writes there stays private, and `--explain` says what it is.

use super::*;

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
