//! What a launched command's PID 1 prepares ahead of it: cgroups of its own, a replacement when
//! a waiting PID 1 died, the main seccomp filter it inherits.

use super::*;

/// The host directory of the pids cgroup a process is in, from its `/proc/PID/cgroup` text:
/// the v1 pids hierarchy when there is one, else the unified (v2) one.
fn pids_cgroup_of(proc_cgroup: &str) -> std::path::PathBuf {
    if let Some(path) = proc_cgroup
        .lines()
        .find_map(|line| line.split_once(":pids:").map(|(_, path)| path.to_owned()))
    {
        return format!("/sys/fs/cgroup/pids{path}").into();
    }
    let path = proc_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup in {proc_cgroup:?}"));
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|line| {
            let (mount, filesystem) = line.split_once(" - ")?;
            filesystem
                .starts_with("cgroup2 ")
                .then(|| mount.split(' ').nth(4).unwrap().to_owned())
        })
        .expect("a cgroup2 mount");
    format!("{mount}{path}").into()
}

#[tokio::test]
async fn each_command_is_born_in_cgroups_of_its_own_that_its_pid_1_joined_ahead() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&["--default-limits", "processes=40"]);
    let mut client = server.client().await;
    let mut params = policy(&dirs);
    params["pipeStdin"] = json!(true);
    let mut used: Vec<std::path::PathBuf> = Vec::new();
    // The tree the launcher's waiting PID 1 joined.
    let mut ready: Option<std::path::PathBuf> = None;
    for n in 0..3 {
        let id = format!("c{n}");
        client
            .start(&id, &sh("cat /proc/self/cgroup; read line"), params.clone())
            .await
            .unwrap();
        let tree = pids_cgroup_of(&client.wait_for_output(&id, "0::").await);
        assert_eq!(
            std::fs::read_to_string(tree.join("pids.max"))
                .unwrap()
                .trim(),
            "40",
            "{} has the default limit",
            tree.display()
        );
        assert!(!used.contains(&tree), "{} is new", tree.display());
        if let Some(ready) = &ready {
            assert_eq!(
                &tree, ready,
                "the command runs in the tree its PID 1 joined ahead"
            );
        }
        // The next PID 1 joins the next command's tree before any start asks for it.
        let launcher = helpers_of(&server, "--launcher")[0];
        let base = tree.parent().unwrap().to_owned();
        ready = Some(
            eventually("the next PID 1 sits in a tree of its own", || {
                children_of(launcher).into_iter().find_map(|pid| {
                    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                    let joined = pids_cgroup_of(&cgroup);
                    (joined != tree && joined.parent() == Some(base.as_path())).then_some(joined)
                })
            })
            .await,
        );
        used.push(tree);
        terminated_by_sigterm(&mut client, &id).await;
    }
    // Other limits than the defaults: not the waiting PID 1's tree, but one with its own.
    let mut limited = params.clone();
    limited["limits"] = json!({"processes": 8});
    client
        .start("limited", &sh("cat /proc/self/cgroup; read line"), limited)
        .await
        .unwrap();
    let tree = pids_cgroup_of(&client.wait_for_output("limited", "0::").await);
    assert_eq!(
        std::fs::read_to_string(tree.join("pids.max"))
            .unwrap()
            .trim(),
        "8",
        "a start's own limits hold"
    );
    assert_ne!(Some(&tree), ready.as_ref(), "not the tree made ahead");
    terminated_by_sigterm(&mut client, "limited").await;
    let base = used[0].parent().unwrap().to_owned();
    client.close().await;
    eventually("every tree is removed once the session is gone", || {
        let left = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .count();
        (left == 0).then_some(())
    })
    .await;
}

/// A PID 1 that died while it waited for its command (killed from outside) costs nothing but a
/// new one: the same launcher prepares another and the command runs.
#[tokio::test]
async fn a_waiting_pid_1_that_died_is_replaced_and_the_command_runs() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let first = client.run("first", &["/bin/true"], policy(&dirs)).await;
    assert_eq!(first.exit_code, Some(0), "{}", first.stderr_text());
    let launcher = eventually("a launcher runs", || {
        helpers_of(&server, "--launcher").first().copied()
    })
    .await;
    // Once the first command's PID 1 is gone, the launcher's only child is the next one,
    // waiting for its command.
    let waiting = eventually("one PID 1 waits", || match children_of(launcher)[..] {
        [only] => Some(only),
        _ => None,
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiting),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    tests::wait_process_dead(waiting, tests::DEADLINE, "the waiting PID 1");
    let out = client
        .run("second", &["/bin/echo", "ran"], policy(&dirs))
        .await;
    assert_eq!(out.stdout_text(), "ran\n", "{}", out.stderr_text());
    assert_eq!(out.exit_code, Some(0));
    assert_eq!(
        helpers_of(&server, "--launcher"),
        vec![launcher],
        "the same launcher served it"
    );
}

/// A launcher's PID 1 installs the sandbox's seccomp program while it prepares, before its
/// command arrives, and the command inherits it: the command runs under exactly that program
/// and its own filter (two), from its first instruction (`Seccomp_filters` before any code of
/// its own could add one; one when PID 1 does not install it, checked); and its own filter's
/// listener still reaches PID 1 (a connect to a named socket outside the policy is refused, not
/// left hanging).
#[tokio::test]
async fn a_launched_command_inherits_the_main_filter_its_pid_1_installed_ahead_and_adds_its_own() {
    let _serial = SERIAL.lock().await;
    let dirs = tests::SandboxDirs::new();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let outside = tempfile::Builder::new()
        .prefix("execward-launcher-sock")
        .tempdir_in("/tmp")
        .unwrap();
    let socket_path = outside.path().join("host.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    let script = format!(
        "grep Seccomp_filters /proc/self/status; unshare -U true 2>/dev/null; echo unshare=$?; \
         python3 -c 'import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]); print(\"connect=ok\")\nexcept OSError as e:\n print(\"connect=\", e.errno)' {}",
        socket_path.display()
    );
    for round in 0..2 {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            client.run(&format!("probe-{round}"), &sh(&script), policy(&dirs)),
        )
        .await
        .expect("a connect held by a listener nobody serves would hang here");
        let text = out.stdout_text();
        assert!(
            text.contains("Seccomp_filters:\t2"),
            "round {round}: {text}"
        );
        assert!(
            text.contains("unshare=1"),
            "unshare must be refused: {text}"
        );
        assert!(
            text.contains("connect=") && !text.contains("connect=ok"),
            "a socket outside the policy must not be reachable: {text}"
        );
    }
    assert_eq!(
        helpers_of(&server, "--launcher").len(),
        1,
        "both through the launcher"
    );
}
