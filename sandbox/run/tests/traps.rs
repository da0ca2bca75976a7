//! The known traps of this kernel, one test each (see policies/README.md "Known limits").
#![cfg(target_os = "linux")]

mod common;

use common::*;

/// Not a test: the entry point of this binary re-executed as the in-sandbox probe.
#[test]
#[ignore = "entry point of the in-sandbox probe, run by the tests themselves"]
fn probe_entry() {
    common::probe_entry();
}

#[test]
fn exec_failure_is_reported_by_sandbox_run_itself() {
    let fx = Fixture::new(None);
    let out = sandbox_run(
        &["--policy", "workspace-write"],
        &["/nonexistent/program"],
        None,
        &fx.ws,
    );
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot execute /nonexistent/program"));
}

#[test]
fn setup_failure_exits_125_with_the_reason() {
    let fx = Fixture::new(None);
    let out = sandbox_run(
        &["--policy", "no-such-profile"],
        &["/bin/true"],
        None,
        &fx.ws,
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown sandbox profile"));
    let out = sandbox_run(
        &["--cwd", "/nonexistent/dir", "--policy", "workspace-write"],
        &["/bin/true"],
        None,
        &fx.ws,
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cwd /nonexistent/dir does not exist"),
        "{out:?}"
    );
}

#[test]
fn a_json_policy_without_cwd_uses_the_current_directory_as_its_workspace() {
    let fx = Fixture::new(None);
    let out = sandbox_run(
        &["--policy", "{\"profile\":\"workspace-write\"}"],
        &["/bin/sh", "-c", "pwd; echo in > made.txt"],
        None,
        &fx.ws,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        fx.ws.to_str().unwrap()
    );
    assert!(fx.ws.join("made.txt").exists());
}

#[test]
fn cwd_changes_the_commands_directory_and_is_its_workspace() {
    let fx = Fixture::new(None);
    let sub = fx.ws.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = sandbox_run(
        &[
            "--policy",
            "workspace-write",
            "--cwd",
            sub.to_str().unwrap(),
        ],
        &[
            "/bin/sh",
            "-c",
            "pwd; echo x > here.txt; echo y > ../up.txt; echo rc=$?",
        ],
        None,
        &fx.outside,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("{}\n", sub.display())),
        "{out:?}"
    );
    assert!(sub.join("here.txt").exists());
    assert!(
        !stdout.contains("rc=0"),
        "the write above --cwd landed: {out:?}"
    );
    assert!(!fx.ws.join("up.txt").exists());
}

#[test]
fn a_rule_only_namespaces_enforce_fails_closed_without_them() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let args = ["--policy", "workspace-write", "--no-namespaces"];
        let out = sandbox_run(&args, &["/bin/true"], uid, &fx.ws);
        assert_eq!(out.status.code(), Some(125), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(".git") && stderr.contains("--best-effort"),
            "{stderr}"
        );
        let args = [
            "--policy",
            "workspace-write",
            "--no-namespaces",
            "--best-effort",
        ];
        let out = sandbox_run(&args, &["/bin/true"], uid, &fx.ws);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("is not enforced"));
    }
}

#[test]
fn landlock_alone_enforces_what_it_can_express() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        std::fs::remove_dir_all(fx.ws.join(".git")).unwrap();
        let args = ["--policy", "workspace-write", "--no-namespaces"];
        let inside = fx.ws.join("new.txt");
        assert_allowed(&probe(&args, &["write", s(&inside)], uid, &fx.ws), "inside");
        let outside = fx.outside.join("new.txt");
        let result = probe(&args, &["write", s(&outside)], uid, &fx.ws);
        assert_eq!(result["error"], "EACCES", "Landlock denial: {result}");
        fx.assert_outside_untouched("landlock only");
    }
}

#[test]
fn every_layer_reports_full_enforcement() {
    let fx = Fixture::new(None);
    let out = sandbox_run(
        &["--policy", "workspace-write", "--report"],
        &["/bin/true"],
        None,
        &fx.ws,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_str(stderr.lines().last().unwrap()).unwrap();
    assert_eq!(report["landlock"]["status"], "full", "{report}");
    assert!(report["landlock"]["abi"].as_i64().unwrap() >= 1);
    assert_eq!(report["namespaces"]["mount"], true, "{report}");
    assert_eq!(report["no_new_privs"], true);
    assert_eq!(
        report["seccomp"],
        serde_json::json!(["x32_guard", "restrictions", "allow"]),
        "{report}"
    );
}

#[test]
fn abstract_unix_sockets_outside_the_sandbox_are_unreachable() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("execward-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    for uid in identities() {
        let fx = Fixture::new(uid);
        // Network allowed: no network namespace, so Landlock's scope is what refuses it.
        let open = ["--policy", "workspace-write", "--allow-network"];
        let result = probe(&open, &["abstract-connect", &name], uid, &fx.ws);
        assert_blocked(&result, &[], "abstract socket, scoped");
        // Network off: also in another network namespace.
        let result = probe(
            &["--policy", "workspace-write"],
            &["abstract-connect", &name],
            uid,
            &fx.ws,
        );
        assert!(result["ok"] == false, "{result}");
        let free = ["--policy", "danger-full-access"];
        assert_allowed(
            &probe(&free, &["abstract-connect", &name], uid, &fx.ws),
            "control",
        );
    }
}

#[test]
fn a_denied_pathname_unix_socket_is_masked() {
    for uid in identities() {
        let fx = Fixture::new(uid);
        let socket = fx.outside.join("server.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&socket, Some(uid), Some(uid)).unwrap();
        }
        let spec = serde_json::json!({"permissions": {"type": "managed", "network": "restricted",
            "file_system": {"type": "restricted", "entries": [
                {"path": {"type": "special", "value": {"kind": "root"}}, "access": "read"},
                {"path": {"type": "path", "path": s(&socket)}, "access": "deny"}]}}});
        let policy = spec.to_string();
        let result = probe(
            &["--policy", &policy],
            &["unix-connect", s(&socket)],
            uid,
            &fx.ws,
        );
        assert!(result["ok"] == false, "masked socket reached: {result}");
        // Without a deny entry: outside every writable root and not named, so refused
        // (Landlock from ABI 9, the unix-socket notifier before; sandbox/run/tests/unix_sockets.rs).
        let result = probe(
            &["--policy", "read-only"],
            &["unix-connect", s(&socket)],
            uid,
            &fx.ws,
        );
        assert_eq!(
            result["error"], "EACCES",
            "unmasked pathname socket: {result}"
        );
    }
}

#[test]
fn preexisting_hard_link_reaches_its_outside_inode_known_limit() {
    let fx = Fixture::new(None);
    std::fs::hard_link(&fx.outside_file, fx.ws.join("link")).unwrap();
    let result = probe(
        &["--policy", "workspace-write"],
        &["append", s(&fx.ws.join("link"))],
        None,
        &fx.ws,
    );
    // Documented limit: path-based layers see the link's path, which is inside the root.
    assert_allowed(&result, "pre-existing hard link");
    assert_ne!(
        std::fs::read_to_string(&fx.outside_file).unwrap(),
        "original\n"
    );
}

#[test]
fn helper_mode_clears_the_environment_and_closes_descriptors() {
    let exe = common::probe_exe();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "helper_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("HELPER_ENTRY", "1")
        .env("HOME", "/root")
        .env("API_TOKEN", "secret")
        .env("TMPDIR", "/tmp")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("HELPER_RESULT "))
        .unwrap_or_else(|| {
            panic!(
                "no result: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let result: serde_json::Value = serde_json::from_str(line).unwrap();
    let keys: Vec<&str> = result["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(
        keys.iter()
            .all(|k| ["PATH", "TMPDIR", "TMP", "TEMP"].contains(k)),
        "{keys:?}"
    );
    assert!(keys.contains(&"TMPDIR"));
    assert_eq!(result["dropped_fd_open"], false, "{result}");
    assert_eq!(result["kept_fd_open"], true, "{result}");
    assert_eq!(
        result["scm_rights"], true,
        "SCM_RIGHTS must work for the fs-helper: {result}"
    );
}

/// Not a test on its own: the helper-mode entry point `helper_mode_...` re-executes.
#[test]
#[ignore = "entry point re-executed by helper_mode_clears_the_environment_and_closes_descriptors"]
fn helper_entry() {
    use nix::sys::socket::{
        AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    };
    use std::os::fd::{AsRawFd, IntoRawFd};
    if std::env::var_os("HELPER_ENTRY").is_none() {
        return;
    }
    let dropped = nix::unistd::dup(std::io::stdout()).unwrap().into_raw_fd();
    let kept = nix::unistd::dup(std::io::stdout()).unwrap().into_raw_fd();
    // No home: this checks the environment and descriptors, and a credential store of the
    // host's home would need the mount layer, which a test process's threads cannot unshare.
    let context = sandbox::policy::ResolveContext::default();
    let policy = sandbox::SandboxSpec::named("read-only", None)
        .resolve_with(&context)
        .unwrap();
    sandbox::linux::restrict_current_process(
        &policy,
        &sandbox::linux::EnforceOptions::for_helper(&[kept]),
    )
    .unwrap();
    let is_open = |fd| nix::fcntl::fcntl(unsafe_fd(fd), nix::fcntl::FcntlArg::F_GETFD).is_ok();
    // Checked before anything new is opened (which would reuse the number).
    let (dropped_open, kept_open) = (is_open(dropped), is_open(kept));
    let (a, b) = nix::sys::socket::socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::empty(),
    )
    .unwrap();
    let file = std::fs::File::open("/etc/hostname").unwrap();
    let fds = [file.as_raw_fd()];
    let sent = nix::sys::socket::sendmsg::<()>(
        a.as_raw_fd(),
        &[std::io::IoSlice::new(b"x")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .is_ok();
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let received = nix::sys::socket::recvmsg::<()>(
        b.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )
    .map(|msg| {
        msg.cmsgs()
            .unwrap()
            .any(|c| matches!(c, ControlMessageOwned::ScmRights(_)))
    })
    .unwrap_or(false);
    let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
    let result = serde_json::json!({"env": env, "dropped_fd_open": dropped_open,
        "kept_fd_open": kept_open, "scm_rights": sent && received});
    println!("HELPER_RESULT {result}");
    std::process::exit(0);
}

fn unsafe_fd(fd: std::os::fd::RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: only used with F_GETFD to ask whether `fd` is open; a closed fd yields EBADF.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}
