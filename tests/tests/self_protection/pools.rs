//! Per-uid kernel pools: a sandbox holding its share leaves some for the host and another
//! session, and limits bound it below its share, never above.

use super::*;

/// Takes POOL (`inotify`; `watches`: every file of `./watch`, else every entry of /usr/share, in
/// one inotify instance after another; `timers`; `pty`; `keys`) until refused or CAP were taken,
/// prints `took N then ERRNO`, and holds them for HOLD seconds (a minute). argv: POOL CAP [HOLD].
const POOL_HOG: &str = r#"
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
what, cap = sys.argv[1], int(sys.argv[2])
n, err, held = 0, "", []
if os.path.isdir("watch"):
    entries = sorted(os.path.join("watch", e) for e in os.listdir("watch"))
else:
    entries = ["/usr/share/" + e for e in sorted(os.listdir("/usr/share"))]
at = 0
while n < cap:
    if what == "inotify":
        ok = libc.inotify_init1(0o2000000) >= 0
    elif what == "watches":
        if not held or at >= len(entries):
            held.append(libc.inotify_init1(0o2000000))
            at = 0
        # IN_CREATE | IN_DONT_FOLLOW: each entry its own inode, never a link's target twice.
        ok = held[-1] >= 0 and libc.inotify_add_watch(held[-1], entries[at].encode(), 0x100 | 0x2000000) >= 0
        at += ok
    elif what == "keys":
        desc = ("execward-%d-%d" % (os.getpid(), n)).encode()
        ok = libc.syscall(248, b"user", desc, b"k" * 1000, 1000, ctypes.c_int(-2)) >= 0
    elif what == "timers":
        ok = libc.timer_create(1, None, ctypes.byref(ctypes.c_void_p())) == 0
    elif what == "threads":
        # Tasks (the host's process IDs): threads parked in pause(2) on small stacks.
        if not held:
            held.append(ctypes.create_string_buffer(128))
            libc.pthread_attr_init(held[0])
            libc.pthread_attr_setstacksize(held[0], ctypes.c_size_t(65536))
        rc = libc.pthread_create(ctypes.byref(ctypes.c_ulong()), held[0], ctypes.cast(libc.pause, ctypes.c_void_p), None)
        ok = rc == 0
        if not ok:
            ctypes.set_errno(rc)
    else:
        try:
            held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)); ok = True
        except OSError as e:
            ctypes.set_errno(e.errno); ok = False
    if not ok:
        err = errno.errorcode.get(ctypes.get_errno(), "?"); break
    n += 1
print("took %d then %s" % (n, err), flush=True)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 60)
"#;

/// A sandbox's default share of the host's tasks, as `sandbox::limits::host_processes_share`
/// computes it (an eighth of the fewest of pid_max, threads-max and RLIMIT_NPROC, at most 8,192).
fn processes_share() -> u64 {
    let read = |path: &str| -> u64 {
        std::fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (nproc, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC).unwrap();
    let fewest = read("/proc/sys/kernel/pid_max")
        .min(read("/proc/sys/kernel/threads-max"))
        .min(nproc);
    (fewest / 8).clamp(1, 8192)
}

/// Issue 31, through the server on both launch paths, as root and as uid 65534: while one
/// session's sandboxed command holds all it can of a kernel pool the host shares, a sandboxed
/// command of another session and a host process of the server's uid still get one. (The
/// unsandboxed controls, which starve the host, are in `sandbox/run/tests/pools.rs`.)
#[tokio::test]
async fn a_sandbox_holding_its_share_of_a_pool_leaves_one_for_the_host_and_another_session() {
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let setup = Setup::new(uid);
            let script = setup.workspace.join("hog.py");
            std::fs::write(&script, POOL_HOG).unwrap();
            // Enough files that the sandbox's inotify instances can hold its share of watches.
            let watch = setup.workspace.join("watch");
            std::fs::create_dir(&watch).unwrap();
            for i in 0..8192 {
                std::fs::write(watch.join(i.to_string()), "").unwrap();
            }
            let server = setup.start(uid, args);
            let mut holder = server.client().await;
            let mut other = server.client().await;
            for (pool, refused) in [
                ("inotify", "EMFILE"),
                ("watches", "ENOSPC"),
                ("timers", "EAGAIN"),
                ("pty", "ENOSPC"),
                // The sandbox's default share of the host's tasks (pids.max of its tree).
                ("threads", "EAGAIN"),
                // Refused outright (seccomp): the key quota is the host uid's.
                ("keys", "EPERM"),
            ] {
                let context = format!("{pool} as {uid:?} with {args:?}");
                let argv = [
                    "/usr/bin/python3",
                    script.to_str().unwrap(),
                    pool,
                    "1000000",
                ];
                let extra = json!({
                    "sandbox": {"profile": "workspace-write", "cwd": file_uri(&setup.workspace)},
                    "cwd": file_uri(&setup.workspace),
                });
                let (hog, taker) = (format!("hog-{pool}"), format!("one-{pool}"));
                holder.start(&hog, &argv, extra.clone()).await.unwrap();
                let report = holder.wait_for_output(&hog, "took").await;
                assert!(
                    report.contains(&format!("then {refused}")),
                    "{context}: the sandbox was not stopped by its bound: {report}"
                );
                if pool == "threads" {
                    let took: u64 = report
                        .split_whitespace()
                        .nth(1)
                        .and_then(|n| n.parse().ok())
                        .unwrap();
                    let share = processes_share();
                    assert!(
                        took < share && took + 16 >= share,
                        "{context}: took {took} threads, the share is {share}"
                    );
                }
                let one = ["/usr/bin/python3", script.to_str().unwrap(), pool, "1", "0"];
                other.start(&taker, &one, extra).await.unwrap();
                let got = other.wait_for_output(&taker, "took").await;
                let expected = if pool == "keys" {
                    "took 0 then EPERM"
                } else {
                    "took 1 then"
                };
                assert!(got.contains(expected), "{context}: another session: {got}");
                let mut host = std::process::Command::new("/usr/bin/timeout");
                host.args(["5"])
                    .args(one)
                    .stdout(std::process::Stdio::piped());
                if let Some(uid) = uid {
                    host.uid(uid).gid(uid);
                }
                let host = host.output().unwrap();
                let got = String::from_utf8_lossy(&host.stdout);
                assert!(
                    got.contains("took 1 then"),
                    "{context}: the host got none: {got}"
                );
                assert_eq!(other.collect(&taker).await.exit_code, Some(0), "{context}");
                holder
                    .call("process/terminate", json!({"processId": hog}))
                    .await;
                holder.collect(&hog).await;
            }
        }
    }
}

/// Runs the pool hog sandboxed (workspace-write) under `limits`, until refused; its report.
async fn pool_hog_under(
    client: &mut tests::Client,
    id: &str,
    script: &Path,
    workspace: &Path,
    pool: &str,
    limits: Option<Value>,
) -> String {
    let mut extra = json!({
        "sandbox": {"profile": "workspace-write", "cwd": file_uri(workspace)},
        "cwd": file_uri(workspace),
    });
    if let Some(limits) = limits {
        extra["limits"] = limits;
    }
    let argv = [
        "/usr/bin/python3",
        script.to_str().unwrap(),
        pool,
        "1000000",
        "0",
    ];
    let out = client.run(id, &argv, extra).await;
    assert_eq!(
        out.exit_code,
        Some(0),
        "{id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The number a hog report (`took N then ERRNO`) took.
fn took(report: &str) -> u64 {
    report
        .strip_prefix("took ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a hog report: {report:?}"))
}

/// Issue 31: `limits` bounds a sandboxed command below its share of each pool
/// (`inotifyInstances`, `inotifyWatches`, `ptys`, which the sandbox's setup holds, so such a
/// start runs one-shot; `pendingSignals` and `messageQueueBytes`, rlimits set at the command's
/// start, through the launcher too), never above it; on both launch paths, under a root and an
/// unprivileged server. Controls: the same command without the limit takes more (its share). A
/// start without a sandbox is refused such a limit.
#[tokio::test]
async fn limits_bound_a_sandbox_below_its_share_of_each_pool_and_never_above() {
    for uid in identities() {
        for args in [&[][..], &["--one-shot-sandbox"][..]] {
            let context = format!("as {uid:?} with {args:?}");
            let setup = Setup::new(uid);
            let script = setup.workspace.join("hog.py");
            std::fs::write(&script, POOL_HOG).unwrap();
            let server = setup.start(uid, args);
            let mut client = server.client().await;
            let ws = &setup.workspace;
            for (pool, key, bound, refused) in [
                ("inotify", "inotifyInstances", 3, "EMFILE"),
                ("watches", "inotifyWatches", 3, "ENOSPC"),
                ("pty", "ptys", 2, "ENOSPC"),
                ("timers", "pendingSignals", 5, "EAGAIN"),
            ] {
                let context = format!("{context}, {key}");
                let bounded = pool_hog_under(
                    &mut client,
                    &format!("bounded-{pool}"),
                    &script,
                    ws,
                    pool,
                    Some(json!({ key: bound })),
                )
                .await;
                assert_eq!(
                    bounded,
                    format!("took {bound} then {refused}"),
                    "{context}: the limit did not bound the sandbox"
                );
                let control = pool_hog_under(
                    &mut client,
                    &format!("share-{pool}"),
                    &script,
                    ws,
                    pool,
                    None,
                )
                .await;
                assert!(
                    took(&control) > bound,
                    "{context}: without the limit the sandbox took no more ({control})"
                );
                // Asking for more than the share gets the share, not more.
                let above = pool_hog_under(
                    &mut client,
                    &format!("above-{pool}"),
                    &script,
                    ws,
                    pool,
                    Some(json!({ key: 1u64 << 40 })),
                )
                .await;
                assert!(
                    took(&above) <= took(&control) + 1,
                    "{context}: a limit above the share raised the sandbox: {above} against {control}"
                );
            }
            // RLIMIT_MSGQUEUE (Landlock refuses creating a queue at all; the bound is the rlimit).
            let limits_of = |limits: Option<Value>| {
                let mut extra = json!({
                    "sandbox": {"profile": "workspace-write", "cwd": file_uri(ws)},
                    "cwd": file_uri(ws),
                });
                if let Some(limits) = limits {
                    extra["limits"] = limits;
                }
                extra
            };
            let read_limits = [
                "/bin/grep",
                "-E",
                "msgqueue|pending signals",
                "/proc/self/limits",
            ];
            let out = client
                .run(
                    "mq",
                    &read_limits,
                    limits_of(Some(
                        json!({"messageQueueBytes": 4096, "pendingSignals": 7}),
                    )),
                )
                .await;
            let text = String::from_utf8_lossy(&out.stdout);
            let row = |name: &str| -> Vec<String> {
                text.lines()
                    .find(|line| line.contains(name))
                    .unwrap_or_else(|| panic!("{context}: no {name} in {text}"))
                    .split_whitespace()
                    .filter(|word| word.parse::<u64>().is_ok())
                    .map(str::to_owned)
                    .collect()
            };
            assert_eq!(row("msgqueue"), ["4096", "4096"], "{context}: {text}");
            assert_eq!(row("pending signals"), ["7", "7"], "{context}: {text}");
            let out = client.run("mq-share", &read_limits, limits_of(None)).await;
            let control = String::from_utf8_lossy(&out.stdout);
            assert!(
                !control.contains(" 4096 "),
                "{context}: the control has the bound too: {control}"
            );
            // Which path served them: a launcher's commands run under a clone of it as PID 1.
            let pid_1 = ["/bin/cat", "/proc/1/cmdline"];
            let launched = |out: &tests::ProcessOutput| {
                String::from_utf8_lossy(&out.stdout).contains("--launcher")
            };
            let rlimit_only = client
                .run(
                    "pid1-rlimit",
                    &pid_1,
                    limits_of(Some(json!({"pendingSignals": 7}))),
                )
                .await;
            assert_eq!(
                launched(&rlimit_only),
                args.is_empty(),
                "{context}: a start bounding only rlimits goes through the launcher where there is one"
            );
            let at_setup = client
                .run("pid1-setup", &pid_1, limits_of(Some(json!({"ptys": 2}))))
                .await;
            assert!(
                !launched(&at_setup) && at_setup.exit_code == Some(0),
                "{context}: a start bounding its devpts ran in a launcher's sandbox"
            );
            // Without a sandbox nothing holds a pool bound: refused, naming it.
            let error = client
                .start(
                    "unsandboxed",
                    &["/bin/true"],
                    json!({"cwd": file_uri(ws), "limits": {"ptys": 2}}),
                )
                .await
                .expect_err("a pool bound without a sandbox was accepted");
            assert!(
                error.message.contains("limits.ptys") && error.message.contains("no sandbox"),
                "{context}: {error:?}"
            );
        }
    }
}
