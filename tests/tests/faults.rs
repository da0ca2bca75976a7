//! Failing parts under the real server: helpers and children killed with SIGKILL, the server
//! itself killed, a full disk, a read-only filesystem, and no descriptors left. Each gives a
//! clear error, no crash, nothing half-written, and the server recovers when the fault goes.
//!
//! The filesystem faults mount small tmpfs instances and so need root; they fail with a message
//! saying so otherwise. (tests/tests/sandboxed/helpers.rs already kills a pooled helper blocked
//! before it read its request; here one dies in the middle of writing.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tests::{
    Client, DEADLINE, ExecServer, RpcError, b64, cmdline, descendants, error_kind, fd_count,
    file_uri, process_is_dead, require_root, sh, unb64, wait_process_dead,
};

/// Prefix of the temporary file an atomic `fs/writeFile` writes beside its target.
const ATOMIC_TEMP_PREFIX: &str = ".execward-write-";

fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ew-faults-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn write_policy(dir: &Path) -> Value {
    json!({"profile": "workspace-write", "cwd": file_uri(dir)})
}

/// Pooled fs-helpers of the server (its children running `fs-helper --serve`).
fn helper_pids(server: &ExecServer) -> Vec<i32> {
    descendants(server.pid())
        .into_iter()
        .filter(|&pid| cmdline(pid).contains("--serve"))
        .collect()
}

/// Names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn write_file(
    client: &mut Client,
    path: &Path,
    data: &[u8],
    atomic: bool,
    sandbox: Value,
) -> Result<Value, RpcError> {
    client
        .request(
            "fs/writeFile",
            json!({"path": file_uri(path), "dataBase64": b64(data), "atomic": atomic,
                   "sandbox": sandbox}),
        )
        .await
}

// ---------------------------------------------------------------------------------------------
// SIGKILL of helpers, children and the server
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn helper_killed_in_the_middle_of_an_atomic_write_leaves_the_target_whole() {
    let dir = workspace();
    let target = dir.path().join("target.bin");
    std::fs::write(&target, b"old content").unwrap();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let policy = write_policy(dir.path());
    // Warm the pool: one helper for this (session, policy).
    client
        .call(
            "fs/getMetadata",
            json!({"path": file_uri(dir.path()), "sandbox": policy}),
        )
        .await;
    let data = vec![0x5a_u8; 8 * 1024 * 1024];
    // Kill the helper the moment it holds its temporary file open: it is writing the new
    // content. The file is anonymous (O_TMPFILE, shown as "DIR/#INODE (deleted)" in
    // /proc/PID/fd) or, where that is not available, a named `.execward-write-*` file. A tight
    // race, so a lost one (the write finished first) is retried.
    let mut killed_mid_write = false;
    for _attempt in 0..5 {
        let helpers = helper_pids(&server);
        assert_eq!(helpers.len(), 1, "one pooled helper: {helpers:?}");
        let helper = helpers[0];
        let watched = dir.path().to_path_buf();
        let watcher = std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if holds_temp_file(helper, &watched) {
                    let _ = kill(Pid::from_raw(helper), Signal::SIGKILL);
                    return true;
                }
                if process_is_dead(helper) {
                    return false;
                }
            }
            false
        });
        let result = write_file(&mut client, &target, &data, true, policy.clone()).await;
        let fired = watcher.join().unwrap();
        match result {
            Err(error) if fired => {
                assert_eq!(error_kind(&error), "helperFailed", "{error:?}");
                assert!(error.message.contains("fs-helper"), "{error:?}");
                killed_mid_write = true;
                eprintln!("killed the helper mid-write on attempt {}", _attempt + 1);
                break;
            }
            Ok(_) => {
                // The write won the race; put the old content back and try again.
                wait_process_dead(helper, DEADLINE, "the helper killed after its write");
                std::fs::write(&target, b"old content").unwrap();
                let _ = client
                    .request(
                        "fs/getMetadata",
                        json!({"path": file_uri(dir.path()), "sandbox": policy}),
                    )
                    .await;
            }
            Err(error) => panic!("the write failed without the helper being killed: {error:?}"),
        }
    }
    assert!(
        killed_mid_write,
        "never caught the helper mid-write in 5 attempts"
    );
    // The target is whole: the old file, or (killed after the rename) the new one.
    let content = std::fs::read(&target).unwrap();
    assert!(
        content == b"old content" || content == data,
        "target is neither the old nor the new content ({} bytes)",
        content.len()
    );
    for name in names(dir.path()) {
        assert!(
            name == "target.bin" || name.starts_with(ATOMIC_TEMP_PREFIX),
            "unexpected entry {name}"
        );
    }
    // The pool replaces the helper: the same write now succeeds, and no temporary file of the
    // dead helper is left once it did (anonymous files vanish with their writer; a named one
    // is swept by the next atomic write in the directory).
    write_file(&mut client, &target, b"new content", true, policy)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"new content");
    assert_eq!(names(dir.path()), ["target.bin"]);
}

/// Whether process `pid` has a temporary file of an atomic write in `dir` open: an anonymous
/// O_TMPFILE file ("DIR/#INODE (deleted)") or a named `.execward-write-*` one.
fn holds_temp_file(pid: i32, dir: &Path) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            target.parent() == Some(dir)
                && target.file_name().is_some_and(|name| {
                    let name = name.to_string_lossy();
                    name.starts_with('#') || name.starts_with(ATOMIC_TEMP_PREFIX)
                })
        })
    })
}

#[tokio::test]
async fn sandboxed_child_killed_with_sigkill_is_reported_and_reaped() {
    let dir = workspace();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let sandbox = json!({"sandbox": write_policy(dir.path()), "cwd": file_uri(dir.path())});
    client
        .start(
            "victim",
            &sh("echo ready; exec /bin/sleep 1000"),
            sandbox.clone(),
        )
        .await
        .unwrap();
    client.wait_for_output("victim", "ready").await;
    // "ready" is printed just before `exec` replaces the shell: poll until the sleep exists.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let sleeper = loop {
        if let Some(pid) = descendants(server.pid())
            .into_iter()
            .find(|&pid| cmdline(pid) == "/bin/sleep 1000")
        {
            break pid;
        }
        assert!(
            std::time::Instant::now() < until,
            "the sandboxed sleep among the server's descendants within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    kill(Pid::from_raw(sleeper), Signal::SIGKILL).unwrap();
    let out = client.collect("victim").await;
    assert_eq!(
        (out.exit_code, out.signal),
        (Some(137), Some(9)),
        "{:?}",
        out.events
    );
    wait_process_dead(sleeper, DEADLINE, "the killed sandboxed child");
    assert!(
        !descendants(server.pid())
            .iter()
            .any(|&pid| cmdline(pid).contains("sleep")),
        "nothing of the killed child is left"
    );
    // The server carries on, sandboxed starts included.
    let out = client
        .run(
            "next",
            &sh("echo again > again.txt; cat again.txt"),
            sandbox,
        )
        .await;
    assert_eq!(out.stdout_text(), "again\n");
}

#[tokio::test]
async fn server_killed_with_sigkill_takes_children_grandchildren_and_helpers_along() {
    let dir = workspace();
    let mut server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let starts = [
        ("plain", sh("echo ready; exec /bin/sleep 1000"), json!({})),
        (
            "tty",
            sh("echo ready; exec /bin/sleep 1000"),
            json!({"tty": true}),
        ),
        (
            "family",
            sh("/bin/sleep 1000 & /bin/sleep 1000 & echo ready; wait"),
            json!({}),
        ),
        (
            "sandboxed",
            sh("echo ready; exec /bin/sleep 1000"),
            json!({"sandbox": write_policy(dir.path())}),
        ),
        (
            "ignores-term",
            sh("trap '' TERM HUP; echo ready; /bin/sleep 1000; echo"),
            json!({}),
        ),
    ];
    for (id, argv, extra) in &starts {
        let argv: Vec<&str> = argv.clone();
        client.start(id, &argv, extra.clone()).await.unwrap();
        client.wait_for_output(id, "ready").await;
    }
    // A pooled fs-helper too.
    client
        .call(
            "fs/readDirectory",
            json!({"path": file_uri(dir.path()), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    // Six sleeps: one each, two in the family, one behind the trap (forked after its echo).
    let started = Instant::now();
    let everything = loop {
        let everything = descendants(server.pid());
        let sleeps = everything
            .iter()
            .filter(|&&pid| cmdline(pid) == "/bin/sleep 1000")
            .count();
        if sleeps == 6 {
            break everything;
        }
        assert!(started.elapsed() < DEADLINE, "{sleeps} of 6 sleeps running");
        std::thread::sleep(Duration::from_millis(10)); // polling interval
    };
    assert!(!helper_pids(&server).is_empty(), "a pooled helper exists");
    server.signal(Signal::SIGKILL);
    server.wait_exit(DEADLINE);
    // Everything the server started (the guardian, which acts and exits, included) is gone.
    let started = Instant::now();
    loop {
        let alive: Vec<(i32, String)> = everything
            .iter()
            .filter(|&&pid| !process_is_dead(pid))
            .map(|&pid| (pid, cmdline(pid)))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "still alive {DEADLINE:?} after the server was killed: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20)); // polling interval
    }
}

// ---------------------------------------------------------------------------------------------
// Full and read-only filesystems
// ---------------------------------------------------------------------------------------------

/// A tmpfs of `size` mounted on a fresh directory under /tmp; unmounted (lazily, so a busy
/// mount never survives the test) and removed on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        require_root("mounting a tmpfs");
        let dir = tempfile::Builder::new()
            .prefix("ew-tmpfs-")
            .tempdir_in("/tmp")
            .unwrap();
        let options = format!("size={size},mode=0755");
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount -t tmpfs -o {options} on {:?}: {e}", dir.path()));
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) {
        use nix::mount::MsFlags;
        nix::mount::mount(
            None::<&str>,
            self.path(),
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("mount -o remount,ro {:?}: {e}", self.path()));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The error must be an I/O failure naming the operation, the path and ENOSPC.
#[track_caller]
fn assert_disk_full(result: Result<Value, RpcError>, path: &Path, what: &str) {
    let error = match result {
        Ok(value) => panic!("{what}: a write larger than the filesystem succeeded: {value}"),
        Err(error) => error,
    };
    assert_eq!(
        (error.code, error_kind(&error).as_str()),
        (-32603, "io"),
        "{what}: {error:?}"
    );
    assert!(
        error.message.contains("No space left on device"),
        "{what}: the message must name the cause: {error:?}"
    );
    let data = error.data.clone().expect("fs errors carry data");
    assert_eq!(data.operation.as_deref(), Some("fs/writeFile"), "{what}");
    assert_eq!(data.path, Some(file_uri(path)), "{what}");
}

#[tokio::test]
async fn disk_full_during_write_file_is_a_clear_error_and_atomic_writes_keep_the_old_file() {
    let disk = Tmpfs::mount("1m");
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let old = vec![b'o'; 100 * 1024];
    let too_big = vec![b'n'; 2 * 1024 * 1024];
    for (how, sandbox) in [
        ("unsandboxed", Value::Null),
        ("sandboxed", write_policy(disk.path())),
    ] {
        let target = disk.path().join(format!("{how}.bin"));
        std::fs::write(&target, &old).unwrap();
        // Atomic: the temporary file fills the disk, the write fails, the target is untouched
        // and the temporary file is gone.
        let r = write_file(&mut client, &target, &too_big, true, sandbox.clone()).await;
        assert_disk_full(r, &target, &format!("{how} atomic"));
        assert_eq!(
            std::fs::read(&target).unwrap(),
            old,
            "{how} atomic: target changed"
        );
        assert!(
            !names(disk.path())
                .iter()
                .any(|n| n.starts_with(ATOMIC_TEMP_PREFIX)),
            "{how}: temporary file left behind: {:?}",
            names(disk.path())
        );
        // In place: the same clear error; the file holds what fit (that is what non-atomic means).
        let r = write_file(&mut client, &target, &too_big, false, sandbox.clone()).await;
        assert_disk_full(r, &target, &format!("{how} in place"));
        let partial = std::fs::metadata(&target).unwrap().len();
        assert!(partial < too_big.len() as u64, "{how}: {partial} bytes");
        // Space freed: writes work again.
        std::fs::remove_file(&target).unwrap();
        write_file(&mut client, &target, &old, true, sandbox.clone())
            .await
            .unwrap_or_else(|e| panic!("{how}: write after freeing space: {e:?}"));
        assert_eq!(std::fs::read(&target).unwrap(), old);
        std::fs::remove_file(&target).unwrap();
    }
    // A process that fills the disk gets ENOSPC itself; the server is unaffected.
    let out = client
        .run(
            "fill",
            &sh("head -c 2000000 /dev/zero > big; echo status $?"),
            json!({"cwd": file_uri(disk.path())}),
        )
        .await;
    assert!(out.stdout_text().starts_with("status 1"), "{out:?}");
    client
        .call(
            "fs/remove",
            json!({"path": file_uri(disk.path().join("big"))}),
        )
        .await;
}

#[tokio::test]
async fn read_only_filesystem_refuses_every_write_by_name_and_still_reads() {
    let disk = Tmpfs::mount("1m");
    let file = disk.path().join("kept.txt");
    std::fs::write(&file, b"kept").unwrap();
    std::fs::create_dir(disk.path().join("sub")).unwrap();
    disk.remount_read_only();
    let server = ExecServer::start(&[]);
    let mut client = server.client().await;
    let uri = |name: &str| file_uri(disk.path().join(name));
    let attempts = [
        (
            "fs/writeFile",
            json!({"path": uri("kept.txt"), "dataBase64": b64("x")}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri("kept.txt"), "dataBase64": b64("x"), "atomic": true}),
        ),
        (
            "fs/writeFile",
            json!({"path": uri("new.txt"), "dataBase64": b64("x")}),
        ),
        ("fs/createDirectory", json!({"path": uri("dir")})),
        ("fs/remove", json!({"path": uri("kept.txt")})),
        ("fs/remove", json!({"path": uri("sub")})),
        (
            "fs/copy",
            json!({"sourcePath": uri("kept.txt"), "destinationPath": uri("copy.txt")}),
        ),
    ];
    for (how, sandbox) in [
        ("unsandboxed", Value::Null),
        ("sandboxed", write_policy(disk.path())),
    ] {
        for (method, params) in &attempts {
            let mut params = params.clone();
            params["sandbox"] = sandbox.clone();
            let r = client.request(method, params.clone()).await;
            let error = match r {
                Ok(value) => panic!("{how} {method} {params} succeeded: {value}"),
                Err(error) => error,
            };
            // Unsandboxed EROFS is permissionDenied. Inside the sandbox read-only bind mounts
            // are how denials look, so the helper reports sandboxDenied: either way -32600
            // with the OS text.
            let kind = error_kind(&error);
            assert!(
                error.code == -32600
                    && (kind == "permissionDenied"
                        || (how == "sandboxed" && kind == "sandboxDenied")),
                "{how} {method}: {error:?}"
            );
            assert!(
                tests::error_text(&error).contains("Read-only file system"),
                "{how} {method}: the message must name the cause: {error:?}"
            );
        }
        let read = client
            .call(
                "fs/readFile",
                json!({"path": uri("kept.txt"), "sandbox": sandbox}),
            )
            .await;
        assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"kept");
    }
    assert_eq!(names(disk.path()), vec!["kept.txt", "sub"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"kept");
}

// ---------------------------------------------------------------------------------------------
// Descriptor exhaustion
// ---------------------------------------------------------------------------------------------

/// RLIMIT_NOFILE (soft and hard) of the server in the exhaustion test: room for its own
/// descriptors (listener, epoll, guardian pipe, a few connections) and some handles, far fewer
/// than MAX_OPEN_HANDLES (128), so the limit is reached before the protocol's own caps.
const LOW_NOFILE: u64 = 64;

fn server_with_nofile(limit: u64) -> ExecServer {
    use std::os::unix::process::CommandExt;
    ExecServer::start_with(&[], |command| {
        // SAFETY: the closure runs in the forked child before exec and only calls setrlimit(2),
        // which is async-signal-safe and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    limit,
                    limit,
                )
                .map_err(std::io::Error::from)
            });
        }
    })
}

#[tokio::test]
async fn running_out_of_descriptors_gives_clear_errors_and_recovers_when_they_free_up() {
    let dir = workspace();
    let file = dir.path().join("f.txt");
    std::fs::write(&file, b"data").unwrap();
    let server = server_with_nofile(LOW_NOFILE);
    let mut client = server.client().await;
    let baseline = fd_count(server.pid());
    // Open handles until the process runs out of descriptors (before MAX_OPEN_HANDLES).
    let mut opened = 0;
    let exhausted = loop {
        let r = client
            .request(
                "fs/open",
                json!({"handleId": format!("h{opened}"), "path": file_uri(&file)}),
            )
            .await;
        match r {
            Ok(_) => opened += 1,
            Err(error) => break error,
        }
        assert!(
            opened < 128,
            "never ran out with RLIMIT_NOFILE {LOW_NOFILE}"
        );
    };
    assert_eq!(
        (exhausted.code, error_kind(&exhausted).as_str()),
        (-32603, "io"),
        "{exhausted:?}"
    );
    assert!(
        exhausted.message.contains("Too many open files"),
        "the message must name the cause: {exhausted:?}"
    );
    // Everything that needs a descriptor fails the same clear way; nothing crashes.
    let r = client.start("p", &["/bin/true"], json!({})).await;
    let error = r.expect_err("a start without descriptors");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    let r = client
        .request("fs/readFile", json!({"path": file_uri(&file)}))
        .await;
    let error = r.expect_err("a read without descriptors");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    let r = client
        .request(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    let error = r.expect_err("a sandboxed read without descriptors");
    assert_eq!(error_kind(&error), "helperFailed", "{error:?}");
    assert!(error.message.contains("Too many open files"), "{error:?}");
    // A new connection cannot even be accepted now; it waits in the listen backlog.
    let url = server.url().to_owned();
    let waiting = tokio::spawn(async move { Client::connect(&url).await.map(|_| ()) });
    // Descriptors free up: the waiting connection is accepted and everything works again.
    for i in 0..opened {
        client
            .call("fs/close", json!({"handleId": format!("h{i}")}))
            .await;
    }
    tokio::time::timeout(DEADLINE, waiting)
        .await
        .expect("the waiting connection is accepted once descriptors are free")
        .unwrap()
        .expect("handshake");
    let out = client.run("p", &sh("echo back"), json!({})).await;
    assert_eq!(out.stdout_text(), "back\n");
    let read = client
        .call(
            "fs/readFile",
            json!({"path": file_uri(&file), "sandbox": {"profile": "read-only"}}),
        )
        .await;
    assert_eq!(unb64(read["dataBase64"].as_str().unwrap()), b"data");
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    // No leak: with the extra connection gone and the helper retired, back to the baseline
    // (plus the pooled helper's socket and stderr pipe).
    let started = Instant::now();
    while fd_count(server.pid()) > baseline + 2 {
        assert!(
            started.elapsed() < DEADLINE,
            "descriptors: {} now, {baseline} at the start",
            fd_count(server.pid())
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval
    }
}
